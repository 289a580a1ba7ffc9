package amqp

import (
	"math"
	"time"
)

// TypeName returns RabbitMQ's name of the AMQP field type of v, as used in
// reply texts ("longstr", "signedint", "binary", ...).
func TypeName(v any) string {
	switch v := v.(type) {
	case nil:
		return "void"
	case bool:
		return "bool"
	case int8:
		return "byte"
	case uint8:
		return "unsignedbyte"
	case int16:
		return "short"
	case uint16:
		return "unsignedshort"
	case int32:
		return "signedint"
	case uint32:
		return "unsignedint"
	case int:
		if v >= math.MinInt32 && v <= math.MaxInt32 {
			return "signedint"
		}
		return "long"
	case int64, uint, uint64:
		return "long"
	case float32:
		return "float"
	case float64:
		return "double"
	case Decimal:
		return "decimal"
	case string:
		return "longstr"
	case []byte:
		return "binary"
	case time.Time:
		return "timestamp"
	case Table, map[string]any:
		return "table"
	case []any, []string, []Table:
		return "array"
	}
	return "unknown"
}
