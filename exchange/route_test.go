package exchange

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"warren/amqp"
)

func TestRouteByKind(t *testing.T) {
	r := NewRegistry("/")
	mustDeclare(t, r, "d", "direct")
	mustDeclare(t, r, "f", "fanout")
	mustDeclare(t, r, "t", "topic")
	mustDeclare(t, r, "h", "headers")
	mustBind(t, r, qb("d", "q1", "k1"))
	mustBind(t, r, qb("d", "q2", "k2"))
	mustBind(t, r, qb("d", "q2", "k3"))
	mustBind(t, r, qb("d", "qe", ""))
	mustBind(t, r, qb("f", "q1", "ignored"))
	mustBind(t, r, qb("f", "q2", ""))
	mustBind(t, r, qb("f", "q2", "another key, same queue"))
	mustBind(t, r, qb("t", "q1", "a.*"))
	mustBind(t, r, qb("t", "q2", "#.b"))
	mustBind(t, r, qb("t", "q3", "a.b"))
	mustBind(t, r, Binding{Source: "h", Dest: "q1", DestKind: ToQueue, Args: amqp.Table{"k": "v"}})
	mustBind(t, r, Binding{Source: "h", Dest: "q2", DestKind: ToQueue, Args: amqp.Table{"x-match": "any", "k": "v", "n": int64(2)}})

	cases := []struct {
		name    string
		ex, key string
		extra   []string
		headers amqp.Table
		want    []string
	}{
		{"direct", "d", "k1", nil, nil, []string{"q1"}},
		{"direct other", "d", "k3", nil, nil, []string{"q2"}},
		{"direct empty key", "d", "", nil, nil, []string{"qe"}},
		{"direct no match", "d", "k9", nil, nil, nil},
		{"direct is exact", "d", "K1", nil, nil, nil},
		{"direct CC", "d", "k1", []string{"k2", "k3", "k9"}, nil, []string{"q1", "q2"}},
		{"direct CC only", "d", "k9", []string{"k3"}, nil, []string{"q2"}},
		{"direct repeated key", "d", "k1", []string{"k1", "k1"}, nil, []string{"q1"}},
		{"fanout", "f", "whatever", nil, nil, []string{"q1", "q2"}},
		{"fanout with CC delivers once", "f", "x", []string{"y", "z"}, nil, []string{"q1", "q2"}},
		{"topic", "t", "a.b", nil, nil, []string{"q1", "q2", "q3"}},
		{"topic one", "t", "a.c", nil, nil, []string{"q1"}},
		{"topic CC", "t", "x", []string{"c.b", "a.z"}, nil, []string{"q1", "q2"}},
		{"headers all", "h", "", nil, amqp.Table{"k": "v"}, []string{"q1", "q2"}},
		{"headers any", "h", "", nil, amqp.Table{"n": int8(2)}, []string{"q2"}},
		{"headers ignore keys and CC", "h", "k", []string{"a", "b"}, amqp.Table{"k": []byte("v")}, []string{"q1", "q2"}},
		{"headers nil", "h", "", nil, nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := r.Route(nil, tc.ex, tc.key, tc.extra, tc.headers, nil)
			if !ok {
				t.Fatal("exchange not found")
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestRouteDefaultExchange(t *testing.T) {
	r := NewRegistry("/")
	queues := map[string]bool{"q1": true, "q2": true}
	exists := func(q string) bool { return queues[q] }
	cases := []struct {
		name  string
		key   string
		extra []string
		want  []string
	}{
		{"existing", "q1", nil, []string{"q1"}},
		{"missing", "nosuch", nil, nil},
		{"empty key", "", nil, nil},
		// RabbitMQ 3.10.8: CC on the default exchange adds queues; missing
		// names are skipped and each queue gets one copy.
		{"CC", "q1", []string{"q2", "nosuch", "q1"}, []string{"q1", "q2"}},
		{"CC only", "nosuch", []string{"q2"}, []string{"q2"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := r.Route(nil, "", tc.key, tc.extra, nil, exists)
			if !ok || !slices.Equal(got, tc.want) {
				t.Errorf("got %v, %v; want %v, true", got, ok, tc.want)
			}
		})
	}
	if got, _ := r.Route(nil, "", "anything", nil, nil, nil); !slices.Equal(got, []string{"anything"}) {
		t.Errorf("nil queueExists: got %v", got)
	}
}

func TestRouteMissingExchange(t *testing.T) {
	r := NewRegistry("/")
	got, ok := r.Route([]string{"keep"}, "nope", "k", nil, nil, nil)
	if ok || !slices.Equal(got, []string{"keep"}) {
		t.Errorf("got %v, %v; want [keep], false", got, ok)
	}
}

func TestRouteAppendsToDst(t *testing.T) {
	r := NewRegistry("/")
	mustDeclare(t, r, "f", "fanout")
	for _, q := range []string{"c", "a", "b"} {
		mustBind(t, r, qb("f", q, ""))
	}
	buf := make([]string, 0, 16)
	got, _ := r.Route(buf, "f", "", nil, nil, nil)
	if !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("got %v", got)
	}
	// Names already in dst are not added again.
	got, _ = r.Route([]string{"b", "z"}, "f", "", nil, nil, nil)
	if !slices.Equal(got, []string{"b", "z", "a", "c"}) {
		t.Errorf("with prefix: got %v", got)
	}
}

// The scenarios of this test were run on RabbitMQ 3.10.8 (publishing with
// mandatory=true and publisher confirms); want is where the message went.
func TestRouteExchangeToExchangeAndAlternate(t *testing.T) {
	r := NewRegistry("/")
	ae := func(name string) amqp.Table { return amqp.Table{"alternate-exchange": name} }
	mustDeclare(t, r, "ae", "fanout")
	mustBind(t, r, qb("ae", "qae", ""))
	mustDeclareArgs(t, r, "X", "direct", false, ae("ae"))
	mustBind(t, r, qb("X", "q1", "k"))
	mustDeclare(t, r, "X2", "direct")
	mustBind(t, r, xb("X", "X2", "e2e"))

	mustDeclare(t, r, "ae2", "fanout")
	mustBind(t, r, qb("ae2", "qae2", ""))
	mustDeclare(t, r, "Y", "direct")
	mustDeclareArgs(t, r, "Y2", "direct", false, ae("ae2"))
	mustBind(t, r, xb("Y", "Y2", "k"))

	mustDeclareArgs(t, r, "M", "direct", false, ae("missing"))
	mustDeclareArgs(t, r, "C1", "direct", false, ae("C2"))
	mustDeclareArgs(t, r, "C2", "direct", false, ae("C1"))
	mustDeclare(t, r, "Z", "fanout")
	mustBind(t, r, qb("Z", "qz", ""))
	mustDeclareArgs(t, r, "H2", "direct", false, ae("Z"))
	mustDeclareArgs(t, r, "H1", "direct", false, ae("H2"))
	mustDeclareArgs(t, r, "self", "direct", false, ae("self"))
	mustDeclareArgs(t, r, "emptyae", "direct", false, ae(""))

	mustDeclare(t, r, "cA", "direct")
	mustDeclare(t, r, "cB", "direct")
	mustBind(t, r, xb("cA", "cB", "k"))
	mustBind(t, r, xb("cB", "cA", "k"))
	mustBind(t, r, qb("cA", "qcyc", "k"))
	mustBind(t, r, qb("cB", "qcyc", "k"))

	mustDeclareArgs(t, r, "fx", "fanout", false, ae("ae"))
	if _, _, err := r.Declare("int", "fanout", false, false, true, false, nil); err != nil {
		t.Fatal(err)
	}
	mustBind(t, r, qb("int", "qint", ""))
	mustDeclareArgs(t, r, "toint", "direct", false, ae("int"))

	// e2e chain of several kinds: topic -> headers -> fanout.
	mustDeclare(t, r, "ct", "topic")
	mustDeclare(t, r, "ch", "headers")
	mustDeclare(t, r, "cf", "fanout")
	mustBind(t, r, xb("ct", "ch", "a.#"))
	mustBind(t, r, Binding{Source: "ch", Dest: "cf", DestKind: ToExchange, Args: amqp.Table{"h": "1"}})
	mustBind(t, r, qb("ch", "qch", ""))
	mustBind(t, r, qb("cf", "qcf", ""))
	mustBind(t, r, qb("ct", "qcf", "a.b"))

	// A wide fan of exchange destinations, beyond the linear visited scan.
	mustDeclare(t, r, "wide", "fanout")
	var wideWant []string
	for i := range 40 {
		name := "w" + string(rune('A'+i))
		mustDeclare(t, r, name, "fanout")
		mustBind(t, r, xb("wide", name, ""))
		mustBind(t, r, xb(name, "wide", ""))
		mustBind(t, r, qb(name, "q"+name, ""))
		mustBind(t, r, qb(name, "qall", ""))
		wideWant = append(wideWant, "q"+name)
	}
	wideWant = append(wideWant, "qall")
	slices.Sort(wideWant)

	cases := []struct {
		name    string
		ex, key string
		headers amqp.Table
		want    []string
	}{
		{"matched, no AE", "X", "k", nil, []string{"q1"}},
		{"unmatched goes to AE", "X", "z", nil, []string{"qae"}},
		{"e2e match to an empty exchange is a match: no AE", "X", "e2e", nil, nil},
		{"AE of an exchange reached through e2e", "Y", "k", nil, []string{"qae2"}},
		{"missing AE", "M", "k", nil, nil},
		{"AE cycle", "C1", "k", nil, nil},
		{"AE chain", "H1", "k", nil, []string{"qz"}},
		{"AE is itself", "self", "k", nil, nil},
		{"AE empty name", "emptyae", "k", nil, nil},
		{"e2e cycle delivers once", "cA", "k", nil, []string{"qcyc"}},
		{"fanout without bindings uses AE", "fx", "k", nil, []string{"qae"}},
		{"internal AE", "toint", "k", nil, []string{"qint"}},
		{"chain topic->headers->fanout", "ct", "a.b", amqp.Table{"h": "1"}, []string{"qcf", "qch"}},
		{"chain stops at headers", "ct", "a.c", amqp.Table{"h": "2"}, []string{"qch"}},
		{"wide cyclic fan", "wide", "", nil, wideWant},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := r.Route(nil, tc.ex, tc.key, nil, tc.headers, nil)
			if !ok || !slices.Equal(got, tc.want) {
				t.Errorf("got %v, %v; want %v, true", got, ok, tc.want)
			}
		})
	}

	// The AE is looked up when routing: declaring it later makes it work.
	mustDeclare(t, r, "missing", "fanout")
	mustBind(t, r, qb("missing", "qlate", ""))
	if got, _ := r.Route(nil, "M", "k", nil, nil, nil); !slices.Equal(got, []string{"qlate"}) {
		t.Errorf("late AE: got %v", got)
	}
}

func TestTopicTriePrunes(t *testing.T) {
	r := NewRegistry("/")
	x := mustDeclare(t, r, "t", "topic")
	keys := []string{"a.b.c", "a.*.c", "a.#", "#.#", "#", "", "a..", "*"}
	for _, k := range keys {
		mustBind(t, r, qb("t", "q", k))
		mustBind(t, r, qb("t", "q2", k))
	}
	for _, k := range keys {
		mustUnbind(t, r, qb("t", "q", k))
	}
	if got, _ := r.Route(nil, "t", "a.b.c", nil, nil, nil); !slices.Equal(got, []string{"q2"}) {
		t.Errorf("got %v", got)
	}
	for _, k := range keys {
		mustUnbind(t, r, qb("t", "q2", k))
	}
	root := x.topic
	if root.star != nil || root.hash != nil || len(root.children) != 0 || !root.ds.empty() {
		t.Errorf("trie not pruned: %+v", root)
	}
}

func TestTopicManyHashesStaysFast(t *testing.T) {
	r := NewRegistry("/")
	mustDeclare(t, r, "t", "topic")
	mustBind(t, r, qb("t", "q", "#.#.#.#.#.#.#.#.z"))
	mustBind(t, r, qb("t", "q2", "#.a.#.a.#.a.#.a.#.a.#.b"))
	// Matching each "#" by trying every split is polynomial of degree
	// "number of #" in the number of words: minutes for this key.
	key := strings.Repeat("a.", 120) + "z"
	start := time.Now()
	got, _ := r.Route(nil, "t", key, nil, nil, nil)
	if !slices.Equal(got, []string{"q"}) {
		t.Errorf("got %v", got)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("routing a 121-word key took %v", d)
	}
}

// RabbitMQ 3.10.8 compares top-level header values with Erlang's ==:
// numbers by value across integer widths, floats and timestamps; string and
// binary by content; nested tables and arrays with their types.
func TestHeaderValueEqual(t *testing.T) {
	cases := []struct {
		a, b any
		want bool
	}{
		{int32(5), int64(5), true},
		{int32(5), uint8(5), true},
		{int32(5), float64(5), true},
		{int32(5), float32(5), true},
		{int32(5), 5.5, false},
		{int32(5), time.Unix(5, 0), true},
		{int32(5), amqp.Decimal{Value: 5}, false},
		{amqp.Decimal{Scale: 1, Value: 5}, amqp.Decimal{Scale: 1, Value: 5}, true},
		{int32(1), true, false},
		{true, true, true},
		{false, int32(0), false},
		{"x", []byte("x"), true},
		{"x", "y", false},
		{int32(1), "1", false},
		{int32(1), nil, false},
		{nil, nil, true},
		{uint64(math.MaxUint64), uint64(math.MaxUint64), true},
		{uint64(math.MaxUint64), int64(-1), false},
		{uint64(1 << 63), float64(1 << 63), true},
		{int64(math.MaxInt64), float64(math.MaxInt64), false},
		{int64(-1 << 63), float64(-1 << 63), true},
		{1.5, float32(1.5), true},
		{amqp.Table{"n": int32(1)}, amqp.Table{"n": int32(1)}, true},
		{amqp.Table{"n": int32(1)}, amqp.Table{"n": int64(1)}, false},
		{amqp.Table{"s": "x"}, amqp.Table{"s": []byte("x")}, false},
		{[]any{int32(1)}, []any{int32(1)}, true},
		{[]any{int32(1)}, []any{int64(1)}, false},
		{[]any{int32(1)}, []any{int32(1), int32(2)}, false},
	}
	for _, tc := range cases {
		if got := headerValueEqual(tc.a, tc.b); got != tc.want {
			t.Errorf("headerValueEqual(%#v, %#v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
		if got := headerValueEqual(tc.b, tc.a); got != tc.want {
			t.Errorf("headerValueEqual(%#v, %#v) = %v, want %v", tc.b, tc.a, got, tc.want)
		}
	}
}
