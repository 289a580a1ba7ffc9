package policy

import (
	"encoding/json"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// erlTerm renders a JSON-decoded value the way RabbitMQ's error texts show it: they format the
// decoded Erlang term with ~p, so a string is <<"x">>, null is the atom null, 1000.0 is 1.0e3 and
// an object is #{<<"k">> => v}. Clients and tests compare these texts, so the shapes matter more
// than Erlang's line wrapping of long terms, which is not reproduced.
func erlTerm(v any) string {
	var b strings.Builder
	writeErlTerm(&b, v)
	return b.String()
}

func writeErlTerm(b *strings.Builder, v any) {
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case string:
		writeErlBinary(b, v)
	case json.Number:
		if isIntLiteral(string(v)) {
			b.WriteString(string(v))
			return
		}
		f, err := v.Float64()
		if err != nil {
			b.WriteString(string(v))
			return
		}
		b.WriteString(erlFloat(f))
	case float64:
		b.WriteString(erlFloat(v))
	case float32:
		b.WriteString(erlFloat(float64(v)))
	case int:
		b.WriteString(strconv.Itoa(v))
	case int64:
		b.WriteString(strconv.FormatInt(v, 10))
	case int32:
		b.WriteString(strconv.FormatInt(int64(v), 10))
	case uint64:
		b.WriteString(strconv.FormatUint(v, 10))
	case []any:
		if s, ok := printableCharList(v); ok {
			// Erlang prints a list of character codes as a string.
			b.WriteString(strconv.Quote(s))
			return
		}
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			writeErlTerm(b, e)
		}
		b.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteString("#{")
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writeErlBinary(b, k)
			b.WriteString(" => ")
			writeErlTerm(b, v[k])
		}
		b.WriteByte('}')
	case Definition:
		writeErlTerm(b, map[string]any(v))
	default:
		b.WriteString(strconv.Quote(strings.TrimSpace(strings.ReplaceAll(jsonText(v), "\n", " "))))
	}
}

func jsonText(v any) string {
	out, err := json.Marshal(v)
	if err != nil {
		return "?"
	}
	return string(out)
}

// writeErlBinary writes <<"text">>, or <<"text"/utf8>> when the text is not plain ASCII (the ~tp
// form RabbitMQ 3.11+ uses).
func writeErlBinary(b *strings.Builder, s string) {
	b.WriteString(`<<"`)
	ascii := true
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c == '\n':
			b.WriteString(`\n`)
		case c == '\t':
			b.WriteString(`\t`)
		case c == '\r':
			b.WriteString(`\r`)
		case c < 0x20 || c == 0x7f:
			b.WriteString(`\` + strconv.FormatInt(int64(c), 8))
		case c >= 0x80:
			ascii = false
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	if !ascii && utf8.ValidString(s) {
		b.WriteString(`"/utf8>>`)
		return
	}
	b.WriteString(`">>`)
}

func printableCharList(v []any) (string, bool) {
	if len(v) == 0 {
		return "", false
	}
	var sb strings.Builder
	for _, e := range v {
		n, ok := e.(json.Number)
		if !ok || !isIntLiteral(string(n)) {
			return "", false
		}
		c, err := strconv.Atoi(string(n))
		if err != nil || c < 32 || c > 126 {
			return "", false
		}
		sb.WriteByte(byte(c))
	}
	return sb.String(), true
}

// erlFloat formats a float as Erlang's ~p does: the shortest digits that read back exactly, in
// fixed or scientific notation, whichever is shorter (fixed on a tie), always with a fraction.
func erlFloat(f float64) string {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return strconv.FormatFloat(f, 'g', -1, 64)
	}
	digits := strconv.FormatFloat(math.Abs(f), 'e', -1, 64) // d.ddde±XX
	mant, expText, _ := strings.Cut(digits, "e")
	exp, _ := strconv.Atoi(expText)
	ds := strings.Replace(mant, ".", "", 1)
	sign := ""
	if math.Signbit(f) {
		sign = "-"
	}
	// Scientific: d.ddd e X, with at least one digit after the point.
	sci := ds[:1] + "." + orZero(ds[1:]) + "e" + strconv.Itoa(exp)
	// Fixed: the digits placed around the point.
	var fixed string
	switch {
	case exp < 0:
		fixed = "0." + strings.Repeat("0", -exp-1) + ds
	case exp+1 >= len(ds):
		fixed = ds + strings.Repeat("0", exp+1-len(ds)) + ".0"
	default:
		fixed = ds[:exp+1] + "." + ds[exp+1:]
	}
	if len(sci) < len(fixed) {
		return sign + sci
	}
	return sign + fixed
}

func orZero(s string) string {
	if s == "" {
		return "0"
	}
	return s
}

// isIntLiteral reports whether a JSON number literal is an integer (Erlang's JSON decoders turn
// 1000 into an integer and 1000.0 or 1e3 into a float).
func isIntLiteral(s string) bool {
	return s != "" && !strings.ContainsAny(s, ".eE")
}
