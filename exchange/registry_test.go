package exchange

import (
	"slices"
	"testing"

	"warren/amqp"
)

func TestParseKind(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Kind
		ok   bool
	}{
		{"direct", Direct, true},
		{"fanout", Fanout, true},
		{"topic", Topic, true},
		{"headers", Headers, true},
		{"Direct", 0, false},
		{"", 0, false},
		{"x-consistent-hash", 0, false},
	} {
		got, ok := ParseKind(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ParseKind(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
		if ok && got.String() != tc.in {
			t.Errorf("%v.String() = %q", got, got.String())
		}
	}
	if s := Kind(9).String(); s != "Kind(9)" {
		t.Errorf("Kind(9).String() = %q", s)
	}
}

func TestNewRegistryDefaults(t *testing.T) {
	r := NewRegistry("/")
	want := []struct {
		name string
		kind Kind
	}{{"", Direct}, {"amq.direct", Direct}, {"amq.fanout", Fanout}, {"amq.headers", Headers}, {"amq.match", Headers}, {"amq.topic", Topic}}
	got := r.Exchanges()
	if len(got) != len(want) {
		t.Fatalf("got %d exchanges, want %d", len(got), len(want))
	}
	for i, w := range want {
		x := got[i]
		if x.Name != w.name || x.Kind != w.kind || !x.Durable || x.AutoDelete || x.Internal {
			t.Errorf("exchange %d = %+v, want durable %s %q", i, x, w.kind, w.name)
		}
	}
	if x, ok := r.Get(""); !ok || x.Kind != Direct {
		t.Errorf(`Get("") = %v, %v`, x, ok)
	}
	if len(r.Bindings()) != 0 {
		t.Errorf("new registry has bindings: %v", r.Bindings())
	}
}

// The expected texts below were produced by RabbitMQ 3.10.8.
func TestDeclare(t *testing.T) {
	ae := func(v any) amqp.Table { return amqp.Table{"alternate-exchange": v} }
	type decl struct {
		name, kind                             string
		durable, autoDelete, internal, passive bool
		args                                   amqp.Table
	}
	// Every case starts from a registry holding direct exchange "e.x"
	// (not durable, alternate-exchange "a", x-foo "1") and direct "e.ae".
	cases := []struct {
		name    string
		d       decl
		want    string
		created bool
	}{
		{"redeclare same", decl{name: "e.x", kind: "direct", args: amqp.Table{"alternate-exchange": "a", "x-foo": "1"}}, "ok", false},
		{"other args ignored", decl{name: "e.x", kind: "direct", args: amqp.Table{"alternate-exchange": "a", "x-foo": "2"}}, "ok", false},
		{"type", decl{name: "e.x", kind: "fanout", args: ae("a")},
			"406 PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'e.x' in vhost '/': received 'fanout' but current is 'direct'", false},
		{"type before durable", decl{name: "e.x", kind: "topic", durable: true, args: ae("a")},
			"406 PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'e.x' in vhost '/': received 'topic' but current is 'direct'", false},
		{"durable", decl{name: "e.x", kind: "direct", durable: true, args: ae("a")},
			"406 PRECONDITION_FAILED - inequivalent arg 'durable' for exchange 'e.x' in vhost '/': received 'true' but current is 'false'", false},
		{"auto_delete", decl{name: "e.x", kind: "direct", autoDelete: true, args: ae("a")},
			"406 PRECONDITION_FAILED - inequivalent arg 'auto_delete' for exchange 'e.x' in vhost '/': received 'true' but current is 'false'", false},
		{"internal", decl{name: "e.x", kind: "direct", internal: true, args: ae("a")},
			"406 PRECONDITION_FAILED - inequivalent arg 'internal' for exchange 'e.x' in vhost '/': received 'true' but current is 'false'", false},
		{"alternate differs", decl{name: "e.x", kind: "direct", args: ae("b")},
			"406 PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange 'e.x' in vhost '/': received 'b' but current is 'a'", false},
		{"alternate missing in request", decl{name: "e.x", kind: "direct"},
			"406 PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange 'e.x' in vhost '/': received none but current is the value 'a' of type 'longstr'", false},
		{"alternate missing in current", decl{name: "e.ae", kind: "direct", args: ae("z")},
			"406 PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange 'e.ae' in vhost '/': received the value 'z' of type 'longstr' but current is none", false},
		{"alternate as bytes, same", decl{name: "e.x", kind: "direct", args: ae([]byte("a"))}, "ok", false},
		{"alternate as bytes, differs", decl{name: "e.x", kind: "direct", args: ae([]byte("b"))},
			"406 PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange 'e.x' in vhost '/': received 'b' but current is 'a'", false},
		{"alternate as int", decl{name: "e.x", kind: "direct", args: ae(int32(5))},
			"406 PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange 'e.x' in vhost '/': received '5' but current is 'a'", false},
		{"unknown type on existing", decl{name: "e.x", kind: "bogus"}, "503 COMMAND_INVALID - unknown exchange type 'bogus'", false},
		{"unknown type", decl{name: "e.new", kind: "bogus"}, "503 COMMAND_INVALID - unknown exchange type 'bogus'", false},
		{"unknown type on default", decl{name: "", kind: "bogus", durable: true}, "503 COMMAND_INVALID - unknown exchange type 'bogus'", false},
		{"unknown type on amq.", decl{name: "amq.foo", kind: "bogus", durable: true}, "503 COMMAND_INVALID - unknown exchange type 'bogus'", false},
		{"new with int alternate", decl{name: "e.aeint", kind: "direct", args: ae(int32(5))},
			"406 PRECONDITION_FAILED - invalid type 'signedint' for arg 'alternate-exchange' in exchange 'e.aeint' in vhost '/'", false},
		{"new with bytes alternate", decl{name: "e.aebytes", kind: "direct", args: ae([]byte("z"))},
			"406 PRECONDITION_FAILED - invalid type 'binary' for arg 'alternate-exchange' in exchange 'e.aebytes' in vhost '/'", false},
		{"new with empty alternate", decl{name: "e.aeempty", kind: "direct", args: ae("")}, "ok", true},
		{"default", decl{name: "", kind: "direct", durable: true}, "403 ACCESS_REFUSED - operation not permitted on the default exchange", false},
		{"default passive", decl{name: "", kind: "direct", passive: true}, "403 ACCESS_REFUSED - operation not permitted on the default exchange", false},
		{"passive missing", decl{name: "nope", kind: "direct", passive: true}, "404 NOT_FOUND - no exchange 'nope' in vhost '/'", false},
		{"passive missing bad type", decl{name: "nope", kind: "foo", passive: true}, "404 NOT_FOUND - no exchange 'nope' in vhost '/'", false},
		{"passive ignores type and flags", decl{name: "e.x", kind: "fanout", durable: true, autoDelete: true, internal: true, passive: true}, "ok", false},
		{"passive amq.foo", decl{name: "amq.foo", kind: "direct", passive: true}, "404 NOT_FOUND - no exchange 'amq.foo' in vhost '/'", false},
		{"passive amq.direct", decl{name: "amq.direct", kind: "direct", passive: true}, "ok", false},
		{"amq.direct equivalent", decl{name: "amq.direct", kind: "direct", durable: true}, "ok", false},
		{"amq.match equivalent", decl{name: "amq.match", kind: "headers", durable: true}, "ok", false},
		{"amq.direct other type", decl{name: "amq.direct", kind: "fanout", durable: true},
			"406 PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'amq.direct' in vhost '/': received 'fanout' but current is 'direct'", false},
		{"amq.topic not durable", decl{name: "amq.topic", kind: "topic"},
			"406 PRECONDITION_FAILED - inequivalent arg 'durable' for exchange 'amq.topic' in vhost '/': received 'false' but current is 'true'", false},
		{"new amq.", decl{name: "amq.foo", kind: "direct", durable: true}, "403 ACCESS_REFUSED - exchange name 'amq.foo' contains reserved prefix 'amq.*'", false},
		{"prefix is case-sensitive", decl{name: "AMQ.foo", kind: "direct", autoDelete: true}, "ok", true},
		{"prefix needs the dot", decl{name: "amqfoo", kind: "direct"}, "ok", true},
		{"new", decl{name: "e.new", kind: "headers", durable: true, autoDelete: true, internal: true, args: amqp.Table{"k": "v"}}, "ok", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRegistry("/")
			mustDeclareArgs(t, r, "e.x", "direct", false, amqp.Table{"alternate-exchange": "a", "x-foo": "1"})
			mustDeclare(t, r, "e.ae", "direct")
			d := tc.d
			x, created, err := r.Declare(d.name, d.kind, d.durable, d.autoDelete, d.internal, d.passive, d.args)
			if got := outcome(err); got != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
			if created != tc.created {
				t.Errorf("created = %v, want %v", created, tc.created)
			}
			if err != nil {
				if x != nil {
					t.Errorf("exchange %v returned with an error", x)
				}
				if exists(r, d.name) && !slices.Contains([]string{"", "e.x", "e.ae", "amq.direct", "amq.topic"}, d.name) {
					t.Errorf("failed declare created %q", d.name)
				}
				return
			}
			if x == nil || x.Name != d.name {
				t.Fatalf("returned exchange %v", x)
			}
			if got, _ := r.Get(d.name); got != x {
				t.Errorf("Get(%q) = %p, Declare returned %p", d.name, got, x)
			}
			if tc.created {
				k, _ := ParseKind(d.kind)
				if x.Kind != k || x.Durable != d.durable || x.AutoDelete != d.autoDelete || x.Internal != d.internal || !amqp.TablesEqual(x.Args, d.args) {
					t.Errorf("created %+v from %+v", x, d)
				}
			}
		})
	}
}

func TestDeclareCopiesArgs(t *testing.T) {
	r := NewRegistry("/")
	args := amqp.Table{"alternate-exchange": "ae"}
	mustDeclareArgs(t, r, "x", "direct", false, args)
	args["alternate-exchange"] = "other"
	if _, _, err := r.Declare("x", "direct", false, false, false, false, amqp.Table{"alternate-exchange": "ae"}); err != nil {
		t.Errorf("caller's later change to args leaked into the exchange: %v", err)
	}
}

func TestDeclareVhostInTexts(t *testing.T) {
	r := NewRegistry("prod")
	if r.Vhost() != "prod" {
		t.Errorf("Vhost() = %q", r.Vhost())
	}
	_, _, err := r.Declare("nope", "direct", false, false, false, true, nil)
	if got, want := outcome(err), "404 NOT_FOUND - no exchange 'nope' in vhost 'prod'"; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

// The expected texts below were produced by RabbitMQ 3.10.8.
func TestDelete(t *testing.T) {
	cases := []struct {
		name     string
		ex       string
		ifUnused bool
		want     string
		gone     bool
	}{
		{"default", "", false, "403 ACCESS_REFUSED - operation not permitted on the default exchange", false},
		{"amq.direct", "amq.direct", false, "403 ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed", false},
		{"missing amq.", "amq.foo", false, "403 ACCESS_REFUSED - deletion of system exchange 'amq.foo' in vhost '/' not allowed", true},
		{"missing", "nope", false, "ok", true},
		{"missing if-unused", "nope", true, "ok", true},
		{"bound if-unused", "e.bound", true, "406 PRECONDITION_FAILED - exchange 'e.bound' in vhost '/' in use", false},
		{"bound", "e.bound", false, "ok", true},
		{"only a destination, if-unused", "e.dst", true, "ok", true},
		{"unbound if-unused", "e.free", true, "ok", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRegistry("/")
			for _, n := range []string{"e.bound", "e.src", "e.dst", "e.free"} {
				mustDeclare(t, r, n, "direct")
			}
			mustBind(t, r, qb("e.bound", "q", "k"))
			mustBind(t, r, xb("e.src", "e.dst", "k"))
			if got := outcome(r.Delete(tc.ex, tc.ifUnused)); got != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
			if exists(r, tc.ex) == tc.gone {
				t.Errorf("exists(%q) = %v after delete", tc.ex, !tc.gone)
			}
		})
	}
}

func TestDeleteRemovesBindingsBothWays(t *testing.T) {
	r := NewRegistry("/")
	for _, n := range []string{"a", "b", "c"} {
		mustDeclare(t, r, n, "direct")
	}
	mustBind(t, r, xb("a", "b", "k"))
	mustBind(t, r, xb("b", "c", "k"))
	mustBind(t, r, qb("b", "q", "k"))
	mustBind(t, r, qb("a", "q2", "k"))
	if err := r.Delete("b", false); err != nil {
		t.Fatal(err)
	}
	want := []Binding{qb("a", "q2", "k")}
	if got := r.Bindings(); !bindingsEqual(got, want) {
		t.Errorf("bindings after delete = %v, want %v", got, want)
	}
	if got, _ := r.Route(nil, "a", "k", nil, nil, nil); !slices.Equal(got, []string{"q2"}) {
		t.Errorf("route after delete = %v", got)
	}
	// A re-declared "b" starts without bindings.
	mustDeclare(t, r, "b", "direct")
	if got, _ := r.Route(nil, "b", "k", nil, nil, nil); len(got) != 0 {
		t.Errorf("re-declared exchange routes to %v", got)
	}
	if err := r.Delete("a", true); err == nil {
		t.Error("a still has bindings but if-unused delete succeeded")
	}
}

func bindingsEqual(a, b []Binding) bool {
	return slices.EqualFunc(a, b, func(x, y Binding) bool {
		return x.Source == y.Source && x.Dest == y.Dest && x.DestKind == y.DestKind && x.Key == y.Key && amqp.TablesEqual(x.Args, y.Args)
	})
}

// The expected texts below were produced by RabbitMQ 3.10.8.
func TestBindErrors(t *testing.T) {
	h := func(v any) amqp.Table { return amqp.Table{"x-match": v} }
	cases := []struct {
		name string
		b    Binding
		want string
	}{
		{"queue from default", qb("", "e.q", "k"), "403 ACCESS_REFUSED - operation not permitted on the default exchange"},
		{"exchange to default", xb("e.bound", "", "k"), "403 ACCESS_REFUSED - operation not permitted on the default exchange"},
		{"default to default", xb("", "", "k"), "403 ACCESS_REFUSED - operation not permitted on the default exchange"},
		{"missing source to default", xb("nos", "", "k"), "403 ACCESS_REFUSED - operation not permitted on the default exchange"},
		{"source and destination missing", xb("nos", "nod", "k"), "404 NOT_FOUND - no exchange 'nos' in vhost '/'"},
		{"destination missing", xb("e.bound", "nod", "k"), "404 NOT_FOUND - no exchange 'nod' in vhost '/'"},
		{"source missing", xb("nos", "e.bound", "k"), "404 NOT_FOUND - no exchange 'nos' in vhost '/'"},
		{"queue, source missing", qb("nos", "e.q", "k"), "404 NOT_FOUND - no exchange 'nos' in vhost '/'"},
		{"self", xb("e.bound", "e.bound", "k"), "ok"},
		{"x-match foo", Binding{Source: "e.h", Dest: "e.q", DestKind: ToQueue, Args: h("foo")},
			`406 PRECONDITION_FAILED - Invalid x-match field value <<"foo">>; expected all, any, all-with-x, or any-with-x`},
		{"x-match empty", Binding{Source: "e.h", Dest: "e.q", DestKind: ToQueue, Args: h("")},
			`406 PRECONDITION_FAILED - Invalid x-match field value <<>>; expected all, any, all-with-x, or any-with-x`},
		{"x-match ALL", Binding{Source: "e.h", Dest: "e.q", DestKind: ToQueue, Args: h("ALL")},
			`406 PRECONDITION_FAILED - Invalid x-match field value <<"ALL">>; expected all, any, all-with-x, or any-with-x`},
		{"x-match non-printable", Binding{Source: "e.h", Dest: "e.q", DestKind: ToQueue, Args: h("a\x01b")},
			`406 PRECONDITION_FAILED - Invalid x-match field value <<97,1,98>>; expected all, any, all-with-x, or any-with-x`},
		{"x-match DEL and 0xff", Binding{Source: "e.h", Dest: "e.q", DestKind: ToQueue, Args: h("a\xffb\x7f")},
			`406 PRECONDITION_FAILED - Invalid x-match field value <<97,255,98,127>>; expected all, any, all-with-x, or any-with-x`},
		{"x-match escapes", Binding{Source: "e.h", Dest: "e.q", DestKind: ToQueue, Args: h("a\"b\\c")},
			`406 PRECONDITION_FAILED - Invalid x-match field value <<"a\"b\\c">>; expected all, any, all-with-x, or any-with-x`},
		{"x-match tab newline", Binding{Source: "e.h", Dest: "e.q", DestKind: ToQueue, Args: h("a\tb\nc")},
			`406 PRECONDITION_FAILED - Invalid x-match field value <<"a\tb\nc">>; expected all, any, all-with-x, or any-with-x`},
		{"x-match utf8", Binding{Source: "e.h", Dest: "e.q", DestKind: ToQueue, Args: h("é")},
			`406 PRECONDITION_FAILED - Invalid x-match field value <<"é">>; expected all, any, all-with-x, or any-with-x`},
		{"x-match int", Binding{Source: "e.h", Dest: "e.q", DestKind: ToQueue, Args: h(int32(1))},
			`406 PRECONDITION_FAILED - Invalid x-match field type signedint (value 1); expected longstr`},
		{"x-match long", Binding{Source: "e.h", Dest: "e.q", DestKind: ToQueue, Args: h(int64(7))},
			`406 PRECONDITION_FAILED - Invalid x-match field type long (value 7); expected longstr`},
		{"x-match unsigned byte", Binding{Source: "e.h", Dest: "e.q", DestKind: ToQueue, Args: h(uint8(3))},
			`406 PRECONDITION_FAILED - Invalid x-match field type unsignedbyte (value 3); expected longstr`},
		{"x-match bool", Binding{Source: "e.h", Dest: "e.q", DestKind: ToQueue, Args: h(true)},
			`406 PRECONDITION_FAILED - Invalid x-match field type bool (value true); expected longstr`},
		{"x-match bytes", Binding{Source: "e.h", Dest: "e.q", DestKind: ToQueue, Args: h([]byte("all"))},
			`406 PRECONDITION_FAILED - Invalid x-match field type binary (value <<"all">>); expected longstr`},
		{"x-match void", Binding{Source: "e.h", Dest: "e.q", DestKind: ToQueue, Args: h(nil)},
			`406 PRECONDITION_FAILED - Invalid x-match field type void (value undefined); expected longstr`},
		{"x-match double", Binding{Source: "e.h", Dest: "e.q", DestKind: ToQueue, Args: h(1.5)},
			`406 PRECONDITION_FAILED - Invalid x-match field type double (value 1.5); expected longstr`},
		{"x-match double integral", Binding{Source: "e.h", Dest: "e.q", DestKind: ToQueue, Args: h(2.0)},
			`406 PRECONDITION_FAILED - Invalid x-match field type double (value 2.0); expected longstr`},
		{"x-match decimal", Binding{Source: "e.h", Dest: "e.q", DestKind: ToQueue, Args: h(amqp.Decimal{Scale: 2, Value: 150})},
			`406 PRECONDITION_FAILED - Invalid x-match field type decimal (value {2,150}); expected longstr`},
		{"x-match table", Binding{Source: "e.h", Dest: "e.q", DestKind: ToQueue, Args: h(amqp.Table{"k": "v"})},
			`406 PRECONDITION_FAILED - Invalid x-match field type table (value [{<<"k">>,longstr,<<"v">>}]); expected longstr`},
		{"x-match array", Binding{Source: "e.h", Dest: "e.q", DestKind: ToQueue, Args: h([]any{"all"})},
			`406 PRECONDITION_FAILED - Invalid x-match field type array (value [{longstr,<<"all">>}]); expected longstr`},
		{"x-match e2e", Binding{Source: "e.h", Dest: "e.bound", DestKind: ToExchange, Args: h("foo")},
			`406 PRECONDITION_FAILED - Invalid x-match field value <<"foo">>; expected all, any, all-with-x, or any-with-x`},
		{"missing destination before x-match", Binding{Source: "e.h", Dest: "nod", DestKind: ToExchange, Args: h("foo")},
			"404 NOT_FOUND - no exchange 'nod' in vhost '/'"},
		{"x-match ignored on direct", Binding{Source: "e.bound", Dest: "e.q", DestKind: ToQueue, Args: h("foo")}, "ok"},
		{"x-match valid", Binding{Source: "e.h", Dest: "e.q", DestKind: ToQueue, Args: h("any-with-x")}, "ok"},
		{"no destination kind", Binding{Source: "e.bound", Dest: "e.q"}, "541 INTERNAL_ERROR - invalid binding destination kind 0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRegistry("/")
			mustDeclare(t, r, "e.bound", "direct")
			mustDeclare(t, r, "e.h", "headers")
			err := r.Bind(tc.b)
			if got := outcome(err); got != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
			if n := len(r.Bindings()); (err == nil) != (n == 1) {
				t.Errorf("%d bindings after bind returning %v", n, err)
			}
		})
	}
}

func TestBindIsIdempotentAndArgsAreIdentity(t *testing.T) {
	r := NewRegistry("/")
	mustDeclare(t, r, "d", "direct")
	mustBind(t, r, qb("d", "q", "k"))
	mustBind(t, r, qb("d", "q", "k"))
	if n := len(r.Bindings()); n != 1 {
		t.Fatalf("binding twice made %d bindings", n)
	}
	// Arguments are part of a binding's identity, with their field types.
	b32 := Binding{Source: "d", Dest: "q", DestKind: ToQueue, Key: "k", Args: amqp.Table{"a": int32(6)}}
	b64 := Binding{Source: "d", Dest: "q", DestKind: ToQueue, Key: "k", Args: amqp.Table{"a": int64(6)}}
	mustBind(t, r, b32)
	if n := len(r.Bindings()); n != 2 {
		t.Fatalf("binding with other args made %d bindings, want 2", n)
	}
	// RabbitMQ 3.10.8: unbinding int64 6 leaves the int32 6 binding.
	mustUnbind(t, r, b64)
	if n := len(r.Bindings()); n != 2 {
		t.Fatalf("unbind with another arg type removed a binding")
	}
	// Removing one of two equal-route bindings keeps the route.
	mustUnbind(t, r, qb("d", "q", "k"))
	if got, _ := r.Route(nil, "d", "k", nil, nil, nil); !slices.Equal(got, []string{"q"}) {
		t.Errorf("route = %v, want [q]", got)
	}
	mustUnbind(t, r, b32)
	if got, _ := r.Route(nil, "d", "k", nil, nil, nil); len(got) != 0 {
		t.Errorf("route after last unbind = %v", got)
	}
	if n := len(r.Bindings()); n != 0 {
		t.Errorf("%d bindings left", n)
	}
}

func TestBindCopiesArgs(t *testing.T) {
	r := NewRegistry("/")
	mustDeclare(t, r, "h", "headers")
	args := amqp.Table{"a": int32(1)}
	mustBind(t, r, Binding{Source: "h", Dest: "q", DestKind: ToQueue, Args: args})
	args["a"] = int32(2)
	if got, _ := r.Route(nil, "h", "", nil, amqp.Table{"a": int32(1)}, nil); !slices.Equal(got, []string{"q"}) {
		t.Errorf("caller's change to args changed the binding: route = %v", got)
	}
}

// The expected outcomes below were produced by RabbitMQ 3.10.8: unbinding
// what is not bound, even from or to a missing exchange, succeeds.
func TestUnbindErrors(t *testing.T) {
	cases := []struct {
		name string
		b    Binding
		want string
	}{
		{"queue from default", qb("", "e.q", "k"), "403 ACCESS_REFUSED - operation not permitted on the default exchange"},
		{"exchange to default", xb("e.src", "", "zzz"), "403 ACCESS_REFUSED - operation not permitted on the default exchange"},
		{"missing binding", qb("e.src", "e.q", "zzz"), "ok"},
		{"missing exchange", qb("nos", "e.q", "zzz"), "ok"},
		{"missing e2e binding", xb("e.src", "e.dst", "zzz"), "ok"},
		{"missing e2e source", xb("nos", "e.dst", "zzz"), "ok"},
		{"missing e2e destination", xb("e.src", "nod", "zzz"), "ok"},
		{"invalid x-match is not checked", Binding{Source: "e.h", Dest: "e.q", DestKind: ToQueue, Args: amqp.Table{"x-match": "foo"}}, "ok"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRegistry("/")
			for _, n := range []string{"e.src", "e.dst"} {
				mustDeclare(t, r, n, "direct")
			}
			mustDeclare(t, r, "e.h", "headers")
			mustBind(t, r, xb("e.src", "e.dst", "k"))
			if got := outcome(r.Unbind(tc.b)); got != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
			if n := len(r.Bindings()); n != 1 {
				t.Errorf("%d bindings left, want 1", n)
			}
		})
	}
}

// Each case was run on RabbitMQ 3.10.8; want lists the exchanges that still
// exist afterwards (of those named in check).
func TestAutoDelete(t *testing.T) {
	type step func(t *testing.T, r *Registry)
	declare := func(name string, autoDelete bool) step {
		return func(t *testing.T, r *Registry) { mustDeclareArgs(t, r, name, "direct", autoDelete, nil) }
	}
	bind := func(b Binding) step { return func(t *testing.T, r *Registry) { mustBind(t, r, b) } }
	unbind := func(b Binding) step { return func(t *testing.T, r *Registry) { mustUnbind(t, r, b) } }
	removeQueue := func(q string) step { return func(t *testing.T, r *Registry) { r.RemoveQueue(q) } }
	deleteX := func(x string) step {
		return func(t *testing.T, r *Registry) {
			if err := r.Delete(x, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	cases := []struct {
		name  string
		steps []step
		check []string
		want  []string
	}{
		{"never bound", []step{declare("ad", true)}, []string{"ad"}, []string{"ad"}},
		{"one of two unbound", []step{declare("ad", true), bind(qb("ad", "q", "k")), bind(qb("ad", "q", "k2")), unbind(qb("ad", "q", "k"))},
			[]string{"ad"}, []string{"ad"}},
		{"last unbound", []step{declare("ad", true), bind(qb("ad", "q", "k")), bind(qb("ad", "q", "k2")), unbind(qb("ad", "q", "k")), unbind(qb("ad", "q", "k2"))},
			[]string{"ad"}, nil},
		{"unbinding a missing binding", []step{declare("ad", true), unbind(qb("ad", "q", "zz"))}, []string{"ad"}, []string{"ad"}},
		{"not auto-delete", []step{declare("x", false), bind(qb("x", "q", "k")), unbind(qb("x", "q", "k"))}, []string{"x"}, []string{"x"}},
		{"queue deleted", []step{declare("ad", true), bind(qb("ad", "q", "k")), bind(qb("ad", "q", "k2")), removeQueue("q")},
			[]string{"ad"}, nil},
		{"other queue deleted", []step{declare("ad", true), bind(qb("ad", "q", "k")), removeQueue("q2")}, []string{"ad"}, []string{"ad"}},
		{"cascade through e2e on queue delete", []step{declare("adA", true), declare("adB", true), bind(xb("adA", "adB", "k")), bind(qb("adB", "q", "k")), removeQueue("q")},
			[]string{"adA", "adB"}, nil},
		{"cascade through e2e on unbind", []step{declare("adP", true), declare("adC", true), bind(xb("adP", "adC", "k")), bind(qb("adC", "q", "k")), unbind(qb("adC", "q", "k"))},
			[]string{"adP", "adC"}, nil},
		{"destination exchange deleted", []step{declare("adS", true), declare("X", false), bind(xb("adS", "X", "k")), deleteX("X")},
			[]string{"adS"}, nil},
		{"e2e source unbound", []step{declare("adE", true), declare("F", false), bind(xb("adE", "F", "k")), unbind(xb("adE", "F", "k"))},
			[]string{"adE", "F"}, []string{"F"}},
		{"only a destination", []step{declare("src", false), declare("adD", true), bind(xb("src", "adD", "k")), unbind(xb("src", "adD", "k"))},
			[]string{"src", "adD"}, []string{"src", "adD"}},
		{"incoming binding does not keep it", []step{declare("src", false), declare("adD", true), bind(xb("src", "adD", "k")), bind(qb("adD", "q", "k")), unbind(qb("adD", "q", "k"))},
			[]string{"src", "adD"}, []string{"src"}},
		{"self binding keeps it", []step{declare("adSelf", true), bind(xb("adSelf", "adSelf", "k")), bind(qb("adSelf", "q", "k")), removeQueue("q")},
			[]string{"adSelf"}, []string{"adSelf"}},
		{"non-auto-delete middle stops cascade", []step{declare("adA", true), declare("M", false), declare("adB", true), bind(xb("adA", "M", "k")), bind(xb("M", "adB", "k")), bind(qb("adB", "q", "k")), removeQueue("q")},
			[]string{"adA", "M", "adB"}, []string{"adA", "M"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRegistry("/")
			for _, s := range tc.steps {
				s(t, r)
			}
			var got []string
			for _, n := range tc.check {
				if exists(r, n) {
					got = append(got, n)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("existing = %v, want %v", got, tc.want)
			}
			// No binding may refer to a deleted exchange.
			for _, b := range r.Bindings() {
				if !exists(r, b.Source) || (b.DestKind == ToExchange && !exists(r, b.Dest)) {
					t.Errorf("dangling binding %+v", b)
				}
			}
		})
	}
}

func TestRemoveQueue(t *testing.T) {
	r := NewRegistry("/")
	mustDeclare(t, r, "d", "direct")
	mustDeclare(t, r, "t", "topic")
	mustDeclare(t, r, "h", "headers")
	mustBind(t, r, qb("d", "q", "k"))
	mustBind(t, r, qb("d", "other", "k"))
	mustBind(t, r, qb("t", "q", "#"))
	mustBind(t, r, Binding{Source: "h", Dest: "q", DestKind: ToQueue, Args: amqp.Table{"x-match": "all"}})
	mustBind(t, r, qb("amq.fanout", "q", ""))
	r.RemoveQueue("q")
	want := []Binding{qb("d", "other", "k")}
	if got := r.Bindings(); !bindingsEqual(got, want) {
		t.Errorf("bindings = %v, want %v", got, want)
	}
	for _, ex := range []string{"d", "t", "h", "amq.fanout"} {
		if got, _ := r.Route(nil, ex, "k", nil, nil, nil); slices.Contains(got, "q") {
			t.Errorf("%s still routes to the removed queue: %v", ex, got)
		}
	}
	r.RemoveQueue("never-bound")
}

func TestBindingsSorted(t *testing.T) {
	r := NewRegistry("/")
	mustDeclare(t, r, "b", "direct")
	mustDeclare(t, r, "a", "fanout")
	mustBind(t, r, qb("b", "q2", "k"))
	mustBind(t, r, xb("b", "a", "k"))
	mustBind(t, r, qb("b", "q1", "z"))
	mustBind(t, r, qb("b", "q1", "k"))
	mustBind(t, r, Binding{Source: "b", Dest: "q1", DestKind: ToQueue, Key: "k", Args: amqp.Table{"x": int32(1)}})
	mustBind(t, r, qb("a", "q9", ""))
	want := []Binding{
		qb("a", "q9", ""),
		qb("b", "q1", "k"),
		{Source: "b", Dest: "q1", DestKind: ToQueue, Key: "k", Args: amqp.Table{"x": int32(1)}},
		qb("b", "q1", "z"),
		qb("b", "q2", "k"),
		xb("b", "a", "k"),
	}
	for i := 0; i < 3; i++ {
		if got := r.Bindings(); !bindingsEqual(got, want) {
			t.Fatalf("Bindings() = %v\nwant %v", got, want)
		}
	}
}

// RabbitMQ 3.10.8 drops CR and LF from names in exchange.declare, delete and
// bind (not in basic.publish).
func TestNamesDropCRLF(t *testing.T) {
	r := NewRegistry("/")
	if _, created, err := r.Declare("cr\r\nlf.x", "fanout", false, false, false, false, nil); err != nil || !created {
		t.Fatalf("declare: %v, %v", created, err)
	}
	if !exists(r, "crlf.x") {
		t.Fatal("declared name not stripped")
	}
	if _, _, err := r.Declare("cr\r\nlf.x", "fanout", false, false, false, true, nil); err != nil {
		t.Errorf("passive: %v", err)
	}
	if got, want := outcome(func() *amqp.Error {
		_, _, err := r.Declare("am\nq.foo", "direct", false, false, false, false, nil)
		return err
	}()),
		"403 ACCESS_REFUSED - exchange name 'amq.foo' contains reserved prefix 'amq.*'"; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
	if got, want := outcome(func() *amqp.Error {
		_, _, err := r.Declare("\r\n", "direct", false, false, false, false, nil)
		return err
	}()),
		"403 ACCESS_REFUSED - operation not permitted on the default exchange"; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
	mustBind(t, r, qb("crlf.x\r", "q\n", ""))
	if got, _ := r.Route(nil, "crlf.x", "", nil, nil, nil); !slices.Equal(got, []string{"q"}) {
		t.Errorf("route = %v", got)
	}
	if _, ok := r.Route(nil, "crlf.x\n", "", nil, nil, nil); ok {
		t.Error("publish names must not be stripped")
	}
	mustUnbind(t, r, qb("\ncrlf.x", "q", ""))
	if n := len(r.Bindings()); n != 0 {
		t.Errorf("%d bindings after unbind", n)
	}
	if err := r.Delete("crlf.x\n", false); err != nil || exists(r, "crlf.x") {
		t.Errorf("delete: %v, exists %v", err, exists(r, "crlf.x"))
	}
	if got := stripCRLF("a\xff\r\nb"); got != "a\xffb" {
		t.Errorf("stripCRLF kept invalid UTF-8 badly: %q", got)
	}
}
