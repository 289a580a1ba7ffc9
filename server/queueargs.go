package server

import (
	"fmt"
	"time"

	"warren/amqp"
)

// equivalenceArgs are the queue arguments RabbitMQ compares when a queue is redeclared; others are
// ignored, as in RabbitMQ.
var equivalenceArgs = [...]string{
	"x-queue-type", "x-message-ttl", "x-expires", "x-max-length", "x-max-length-bytes",
	"x-dead-letter-exchange", "x-dead-letter-routing-key", "x-max-priority", "x-overflow",
	"x-single-active-consumer", "x-delivery-limit", "x-queue-leader-locator",
	"x-quorum-initial-group-size", "x-max-age", "x-stream-max-segment-size-bytes",
}

func boolText(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

// checkQueueEquivalence compares a redeclaration with the existing queue, with RabbitMQ's texts.
func checkQueueEquivalence(e *queueEntry, m *amqp.QueueDeclare, vhost string) *amqp.Error {
	q := e.q
	ineq := func(arg string, received, current bool) *amqp.Error {
		return amqp.Errorf(amqp.PreconditionFailed, "inequivalent arg '%s' for queue '%s' in vhost '%s': received '%s' but current is '%s'",
			arg, q.Name, vhost, boolText(received), boolText(current))
	}
	if m.Durable != q.Durable {
		return ineq("durable", m.Durable, q.Durable)
	}
	if m.Exclusive != (e.owner != nil) {
		return &amqp.Error{Code: amqp.ResourceLocked}
	}
	if m.AutoDelete != q.AutoDelete {
		return ineq("auto_delete", m.AutoDelete, q.AutoDelete)
	}
	for _, k := range equivalenceArgs {
		rv, rok := m.Arguments[k]
		cv, cok := e.args[k]
		if k == "x-queue-type" {
			// A missing type means the default (classic).
			if !rok {
				rv, rok = "classic", true
			}
			if !cok {
				cv, cok = "classic", true
			}
		}
		if rok == cok && (!rok || amqp.ValuesEqual(rv, cv)) {
			continue
		}
		if rok && cok {
			// RabbitMQ shows bare values when both sides have the argument.
			return amqp.Errorf(amqp.PreconditionFailed, "inequivalent arg '%s' for queue '%s' in vhost '%s': received '%s' but current is '%s'",
				k, q.Name, vhost, argValueText(rv), argValueText(cv))
		}
		return amqp.Errorf(amqp.PreconditionFailed, "inequivalent arg '%s' for queue '%s' in vhost '%s': received %s but current is %s",
			k, q.Name, vhost, describeArg(rv, rok), describeArg(cv, cok))
	}
	return nil
}

// describeArg renders a value the way RabbitMQ's equivalence errors do.
func describeArg(v any, ok bool) string {
	if !ok {
		return "none"
	}
	return fmt.Sprintf("the value '%s' of type '%s'", argValueText(v), fieldTypeName(v))
}

func argValueText(v any) string {
	switch v := v.(type) {
	case []byte:
		return string(v)
	case time.Time:
		return fmt.Sprint(v.Unix())
	default:
		return fmt.Sprint(v)
	}
}

// fieldTypeName is RabbitMQ's name for a field-table value type.
func fieldTypeName(v any) string {
	switch v.(type) {
	case string:
		return "longstr"
	case []byte:
		return "binary"
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
	case int64, int:
		return "long"
	case float32:
		return "float"
	case float64:
		return "double"
	case amqp.Decimal:
		return "decimal"
	case time.Time:
		return "timestamp"
	case amqp.Table:
		return "table"
	case []any:
		return "array"
	case nil:
		return "void"
	default:
		return "unknown"
	}
}

// validateQueueArgs checks the arguments of a new queue. Queue types other than classic arrive with
// later work; refusing them is better than pretending to replicate.
func validateQueueArgs(name, vhost string, args amqp.Table) *amqp.Error {
	if v, ok := args["x-queue-type"]; ok {
		t, _ := v.(string)
		if b, isBytes := v.([]byte); isBytes {
			t = string(b)
		}
		switch t {
		case "classic":
		case "quorum", "stream":
			return amqp.Errorf(amqp.PreconditionFailed, "invalid arg 'x-queue-type' for queue '%s' in vhost '%s': queue type '%s' is not supported by this Warren version",
				name, vhost, t)
		default:
			return amqp.Errorf(amqp.PreconditionFailed, "invalid arg 'x-queue-type' for queue '%s' in vhost '%s': unknown queue type '%v'",
				name, vhost, v)
		}
	}
	return nil
}
