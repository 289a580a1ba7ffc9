package exchange

import (
	"slices"
	"strconv"
	"strings"
	"time"

	"warren/amqp"
	"warren/amqp/erlterm"
)

// This file renders field values the way RabbitMQ's reply texts show them
// (Erlang's ~p of the decoded term), so that error texts match RabbitMQ's.

// erlTerm renders v as Erlang's ~p prints RabbitMQ's decoded value.
func erlTerm(v any) string {
	var b strings.Builder
	appendErlTerm(&b, v)
	return b.String()
}

func appendErlTerm(b *strings.Builder, v any) {
	switch v := v.(type) {
	case nil:
		b.WriteString("undefined")
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case float32:
		b.WriteString(erlterm.Float(float64(v)))
	case float64:
		b.WriteString(erlterm.Float(v))
	case amqp.Decimal:
		b.WriteString("{" + strconv.Itoa(int(v.Scale)) + "," + strconv.Itoa(int(v.Value)) + "}")
	case string:
		b.WriteString(erlBinary(v))
	case []byte:
		b.WriteString(erlBinary(string(v)))
	case time.Time:
		b.WriteString(strconv.FormatInt(v.Unix(), 10))
	case amqp.Table:
		appendErlTable(b, v)
	case map[string]any:
		appendErlTable(b, v)
	case []any:
		appendErlArray(b, len(v), func(i int) any { return v[i] })
	case []string:
		appendErlArray(b, len(v), func(i int) any { return v[i] })
	case []amqp.Table:
		appendErlArray(b, len(v), func(i int) any { return v[i] })
	case uint:
		b.WriteString(strconv.FormatUint(uint64(v), 10))
	case uint64:
		b.WriteString(strconv.FormatUint(v, 10))
	default:
		if i, ok := amqp.AsInt64(v); ok {
			b.WriteString(strconv.FormatInt(i, 10))
			return
		}
		b.WriteString("undefined")
	}
}

// appendErlTable renders a table as RabbitMQ's [{Key,Type,Value}] list. The
// wire order is not kept by amqp.Table, so keys are sorted.
func appendErlTable(b *strings.Builder, t map[string]any) {
	keys := make([]string, 0, len(t))
	for k := range t {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b.WriteByte('[')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("{" + erlBinary(k) + "," + amqp.TypeName(t[k]) + ",")
		appendErlTerm(b, t[k])
		b.WriteByte('}')
	}
	b.WriteByte(']')
}

func appendErlArray(b *strings.Builder, n int, elem func(int) any) {
	b.WriteByte('[')
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		v := elem(i)
		b.WriteString("{" + amqp.TypeName(v) + ",")
		appendErlTerm(b, v)
		b.WriteByte('}')
	}
	b.WriteByte(']')
}

// erlBinary renders s as an Erlang binary: <<"text">> when every byte is
// printable Latin-1 (with \" \\ \n and friends escaped), else <<1,2,3>>.
func erlBinary(s string) string {
	if s == "" {
		return "<<>>"
	}
	printable := true
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 32 && c <= 126 || c >= 160 || erlEscape(c) != 0) {
			printable = false
			break
		}
	}
	var b strings.Builder
	b.WriteString("<<")
	if printable {
		b.WriteByte('"')
		for i := 0; i < len(s); i++ {
			c := s[i]
			switch {
			case c == '"' || c == '\\':
				b.WriteByte('\\')
				b.WriteByte(c)
			case erlEscape(c) != 0:
				b.WriteByte('\\')
				b.WriteByte(erlEscape(c))
			default:
				b.WriteByte(c)
			}
		}
		b.WriteByte('"')
	} else {
		for i := 0; i < len(s); i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(int(s[i])))
		}
	}
	b.WriteString(">>")
	return b.String()
}

// erlEscape returns the escape letter of a printable control character, or 0.
func erlEscape(c byte) byte {
	switch c {
	case '\n':
		return 'n'
	case '\r':
		return 'r'
	case '\t':
		return 't'
	case '\v':
		return 'v'
	case '\b':
		return 'b'
	case '\f':
		return 'f'
	case 27:
		return 'e'
	}
	return 0
}
