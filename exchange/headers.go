package exchange

import (
	"bytes"
	"math"
	"reflect"
	"strings"
	"time"

	"warren/amqp"
)

// headersMatch is a headers-exchange binding's compiled x-match rule.
type headersMatch struct {
	any   bool
	pairs []headerPair
}

type headerPair struct {
	key   string
	value any
	void  bool // a void binding value matches any value of the key
}

// checkXMatch validates the x-match argument of a binding to a headers
// exchange, with RabbitMQ's reply texts.
func checkXMatch(args amqp.Table) *amqp.Error {
	v, ok := args["x-match"]
	if !ok {
		return nil
	}
	s, isStr := v.(string)
	if !isStr {
		return amqp.Errorf(amqp.PreconditionFailed,
			"Invalid x-match field type %s (value %s); expected longstr", amqp.TypeName(v), erlTerm(v))
	}
	switch s {
	case "all", "any", "all-with-x", "any-with-x":
		return nil
	}
	return amqp.Errorf(amqp.PreconditionFailed,
		"Invalid x-match field value %s; expected all, any, all-with-x, or any-with-x", erlBinary(s))
}

// compileHeadersMatch builds the matcher of validated binding arguments.
// Arguments whose key starts with "x-" take part only in the -with-x forms;
// x-match itself never does. A missing x-match means "all".
func compileHeadersMatch(args amqp.Table) *headersMatch {
	mode, _ := args["x-match"].(string)
	withX := strings.HasSuffix(mode, "-with-x")
	m := &headersMatch{any: strings.HasPrefix(mode, "any")}
	for k, v := range args {
		if k == "x-match" || (!withX && strings.HasPrefix(k, "x-")) {
			continue
		}
		m.pairs = append(m.pairs, headerPair{key: k, value: v, void: v == nil})
	}
	return m
}

// matches reports whether message headers h (possibly nil) satisfy m. With
// "all" every pair must be present with an equal value (so no pairs matches
// everything); with "any" at least one must (so no pairs matches nothing).
func (m *headersMatch) matches(h amqp.Table) bool {
	for i := range m.pairs {
		p := &m.pairs[i]
		v, ok := h[p.key]
		hit := ok && (p.void || headerValueEqual(p.value, v))
		if m.any && hit {
			return true
		}
		if !m.any && !hit {
			return false
		}
	}
	return !m.any
}

// headerValueEqual compares a binding value with a message header value the
// way RabbitMQ does (Erlang ==, ignoring the field types at the top level):
// numbers compare by value across integer widths and floats (1 == 1.0, and a
// timestamp is its integer seconds), string and []byte by content. Nested
// tables and arrays keep their field types in RabbitMQ, so they must be
// identical, type for type.
func headerValueEqual(a, b any) bool {
	if as, ok := a.(string); ok { // the common case first
		bs, ok := binaryValue(b)
		return ok && as == bs
	}
	if an, ok := number(a); ok {
		bn, ok := number(b)
		return ok && an.equal(bn)
	}
	if as, ok := binaryValue(a); ok {
		bs, ok := binaryValue(b)
		return ok && as == bs
	}
	return identical(a, b)
}

// num is an integer or float field value.
type num struct {
	isFloat bool
	big     bool // u holds an unsigned value above MaxInt64
	i       int64
	u       uint64
	f       float64
}

func number(v any) (num, bool) {
	switch v := v.(type) {
	case float32:
		return num{isFloat: true, f: float64(v)}, true
	case float64:
		return num{isFloat: true, f: v}, true
	case time.Time:
		return num{i: v.Unix()}, true
	case uint:
		if uint64(v) > math.MaxInt64 {
			return num{big: true, u: uint64(v)}, true
		}
	case uint64:
		if v > math.MaxInt64 {
			return num{big: true, u: v}, true
		}
	}
	if i, ok := amqp.AsInt64(v); ok {
		return num{i: i}, true
	}
	return num{}, false
}

func (a num) equal(b num) bool {
	switch {
	case a.isFloat && b.isFloat:
		return a.f == b.f
	case a.isFloat:
		return floatEqualsInt(a.f, b)
	case b.isFloat:
		return floatEqualsInt(b.f, a)
	}
	return a.big == b.big && a.i == b.i && a.u == b.u
}

// floatEqualsInt reports whether f has exactly the integer value of n.
func floatEqualsInt(f float64, n num) bool {
	if f != math.Trunc(f) {
		return false
	}
	if n.big {
		return f >= 1<<63 && f < 1<<64 && uint64(f) == n.u
	}
	return f >= -(1<<63) && f < 1<<63 && int64(f) == n.i
}

func binaryValue(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case []byte:
		return string(v), true
	}
	return "", false
}

// identical reports whether a and b are the same field value of the same
// field type, deeply: RabbitMQ's notion of equal binding arguments.
func identical(a, b any) bool {
	switch a := a.(type) {
	case nil:
		return b == nil
	case []byte:
		bb, ok := b.([]byte)
		return ok && bytes.Equal(a, bb)
	case amqp.Table:
		bt, ok := b.(amqp.Table)
		return ok && identicalTables(a, bt)
	case map[string]any:
		bt, ok := b.(map[string]any)
		return ok && identicalTables(a, bt)
	case []any:
		ba, ok := b.([]any)
		if !ok || len(a) != len(ba) {
			return false
		}
		for i := range a {
			if !identical(a[i], ba[i]) {
				return false
			}
		}
		return true
	case time.Time:
		bt, ok := b.(time.Time)
		return ok && a.Equal(bt)
	case float32:
		bf, ok := b.(float32)
		return ok && (a == bf || (math.IsNaN(float64(a)) && math.IsNaN(float64(bf))))
	case float64:
		bf, ok := b.(float64)
		return ok && (a == bf || (math.IsNaN(a) && math.IsNaN(bf)))
	case string, bool, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64, amqp.Decimal:
		return a == b
	}
	return reflect.DeepEqual(a, b)
}

func identicalTables(a, b map[string]any) bool {
	if len(a) != len(b) {
		return false
	}
	for k, av := range a {
		bv, ok := b[k]
		if !ok || !identical(av, bv) {
			return false
		}
	}
	return true
}
