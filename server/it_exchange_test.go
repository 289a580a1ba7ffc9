package server_test

import (
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// routeCase is one publish and the queues (by index) it must reach.
type routeCase struct {
	key     string
	headers amqp.Table
	want    []int
}

// checkRoutes publishes each case through exchange and compares the queues
// reached with the expected ones.
func checkRoutes(t *testing.T, ch *itChan, exchange string, queues []string, labels []string, cases []routeCase) {
	t.Helper()
	for _, rc := range cases {
		var want []string
		for _, i := range rc.want {
			want = append(want, queues[i])
		}
		got := routedTo(t, ch, exchange, rc.key, rc.headers, queues)
		if !sameStrings(got, want) {
			t.Errorf("publish key %q headers %v: reached %q, want %q",
				rc.key, rc.headers, pick(labels, queues, got), pick(labels, queues, want))
		}
	}
}

// pick maps queue names back to human labels for error messages.
func pick(labels, queues, names []string) []string {
	out := []string{}
	for _, n := range names {
		for i, q := range queues {
			if q == n {
				out = append(out, labels[i])
			}
		}
	}
	return out
}

// bindQueues declares one queue per binding of exchange and returns their names.
func bindQueues(t *testing.T, u string, ch *itChan, exchange string, keys []string, args []amqp.Table) []string {
	t.Helper()
	qs := make([]string, len(keys))
	for i, k := range keys {
		qs[i] = declareQueue(t, u, ch, fmt.Sprintf("q%d", i), nil)
		var a amqp.Table
		if args != nil {
			a = args[i]
		}
		mustBind(t, ch, qs[i], k, exchange, a)
	}
	return qs
}

func TestITExchangeDirect(t *testing.T) {
	u := startBroker(t)
	ch := mustConfirmChannel(t, mustDial(t, u))
	x := declareExchange(t, u, ch, "x", "direct", nil)
	keys := []string{"a", "b", "a", ""}
	qs := bindQueues(t, u, ch, x, keys, nil)
	checkRoutes(t, ch, x, qs, keys, []routeCase{
		{key: "a", want: []int{0, 2}},
		{key: "b", want: []int{1}},
		{key: "", want: []int{3}},
		{key: "c"},
		{key: "A"},
	})
}

func TestITExchangeFanout(t *testing.T) {
	u := startBroker(t)
	ch := mustConfirmChannel(t, mustDial(t, u))
	x := declareExchange(t, u, ch, "x", "fanout", nil)
	keys := []string{"a", "b", ""}
	qs := bindQueues(t, u, ch, x, keys, nil)
	checkRoutes(t, ch, x, qs, keys, []routeCase{
		{key: "a", want: []int{0, 1, 2}},
		{key: "zzz", want: []int{0, 1, 2}},
		{key: "", want: []int{0, 1, 2}},
	})
}

func TestITExchangeTopic(t *testing.T) {
	u := startBroker(t)
	ch := mustConfirmChannel(t, mustDial(t, u))
	x := declareExchange(t, u, ch, "x", "topic", nil)
	patterns := []string{
		"#",     // 0
		"*",     // 1
		"a.#.b", // 2
		"a.*",   // 3
		"a.#",   // 4
		"#.b",   // 5
		"a.*.b", // 6
		"*.*",   // 7
		"a..b",  // 8
		"",      // 9
		"a.b",   // 10
		"#.#",   // 11
	}
	qs := bindQueues(t, u, ch, x, patterns, nil)
	checkRoutes(t, ch, x, qs, patterns, []routeCase{
		{key: "", want: []int{0, 9, 11}},
		{key: "a", want: []int{0, 1, 4, 11}},
		{key: "a.b", want: []int{0, 2, 3, 4, 5, 7, 10, 11}},
		{key: "a.x.b", want: []int{0, 2, 4, 5, 6, 11}},
		{key: "a.x.y.b", want: []int{0, 2, 4, 5, 11}},
		{key: "a..b", want: []int{0, 2, 4, 5, 6, 8, 11}},
		{key: "a.", want: []int{0, 3, 4, 7, 11}},
		{key: "b", want: []int{0, 1, 5, 11}},
		{key: ".b", want: []int{0, 5, 7, 11}},
		{key: "x.a.b", want: []int{0, 5, 11}},
		{key: "b.a", want: []int{0, 7, 11}},
	})
}

func TestITExchangeHeaders(t *testing.T) {
	u := startBroker(t)
	ch := mustConfirmChannel(t, mustDial(t, u))
	x := declareExchange(t, u, ch, "x", "headers", nil)
	labels := []string{
		"all a=1 b=x",              // 0
		"any a=1 b=x",              // 1
		"all-with-x x-foo=bar",     // 2
		"only x-match=all",         // 3
		"only x-match=any",         // 4
		"default(all) a=1",         // 5
		"any-with-x x-foo=bar a=2", // 6
		"all c=void",               // 7
		"all x-foo=bar",            // 8 (x- keys ignored by all)
		"any x-foo=bar a=2",        // 9 (x- keys ignored by any)
	}
	args := []amqp.Table{
		{"x-match": "all", "a": int32(1), "b": "x"},
		{"x-match": "any", "a": int32(1), "b": "x"},
		{"x-match": "all-with-x", "x-foo": "bar"},
		{"x-match": "all"},
		{"x-match": "any"},
		{"a": int32(1)},
		{"x-match": "any-with-x", "x-foo": "bar", "a": int32(2)},
		{"x-match": "all", "c": nil},
		{"x-match": "all", "x-foo": "bar"},
		{"x-match": "any", "x-foo": "bar", "a": int32(2)},
	}
	qs := bindQueues(t, u, ch, x, make([]string, len(args)), args)
	checkRoutes(t, ch, x, qs, labels, []routeCase{
		{headers: amqp.Table{"a": int32(1), "b": "x"}, want: []int{0, 1, 3, 5, 8}},
		// Values compare regardless of integer width.
		{headers: amqp.Table{"a": int64(1)}, want: []int{1, 3, 5, 8}},
		{headers: amqp.Table{"x-foo": "bar"}, want: []int{2, 3, 6, 8}},
		{headers: amqp.Table{"a": int32(2), "c": "anything"}, want: []int{3, 6, 7, 8, 9}},
		{headers: nil, want: []int{3, 8}},
		{headers: amqp.Table{"a": int32(1), "b": "y"}, want: []int{1, 3, 5, 8}},
	})
}

func TestITHeadersInvalidXMatch(t *testing.T) {
	u := startBroker(t)
	ch := mustChannel(t, mustDial(t, u))
	q := declareQueue(t, u, ch, "q", nil)
	err := ch.QueueBind(q, "", "amq.headers", false, amqp.Table{"x-match": "some"})
	want := "PRECONDITION_FAILED - Invalid x-match field value <<\"some\">>; expected all, any, all-with-x, or any-with-x"
	checkAMQPError(t, err, amqp.PreconditionFailed, want)
	expectChannelClosed(t, ch, amqp.PreconditionFailed, want)
}

func TestITDefaultExchange(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	q := declareQueue(t, u, ch, "q", nil)
	if got := routedTo(t, ch, "", q, nil, []string{q}); len(got) != 1 {
		t.Fatalf("default exchange did not route to queue %s by name", q)
	}
	if got := routedTo(t, ch, "", q+".nope", nil, []string{q}); len(got) != 0 {
		t.Fatalf("default exchange routed a non-matching key")
	}

	const refused = "ACCESS_REFUSED - operation not permitted on the default exchange"
	t.Run("bind", func(t *testing.T) {
		ch := mustChannel(t, c)
		err := ch.QueueBind(q, "k", "", false, nil)
		checkAMQPError(t, err, amqp.AccessRefused, refused)
		expectChannelClosed(t, ch, amqp.AccessRefused, refused)
	})
	t.Run("unbind", func(t *testing.T) {
		ch := mustChannel(t, c)
		err := ch.QueueUnbind(q, q, "", nil)
		checkAMQPError(t, err, amqp.AccessRefused, refused)
		expectChannelClosed(t, ch, amqp.AccessRefused, refused)
	})
	t.Run("delete", func(t *testing.T) {
		ch := mustChannel(t, c)
		err := ch.ExchangeDelete("", false, false)
		checkAMQPError(t, err, amqp.AccessRefused, refused)
		expectChannelClosed(t, ch, amqp.AccessRefused, refused)
	})
	t.Run("passive declare", func(t *testing.T) {
		ch := mustChannel(t, c)
		err := ch.ExchangeDeclarePassive("", "direct", true, false, false, false, nil)
		checkAMQPError(t, err, amqp.AccessRefused, refused)
		expectChannelClosed(t, ch, amqp.AccessRefused, refused)
	})
}

func TestITAmqExchanges(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	builtins := []struct{ name, kind, key string }{
		{"amq.direct", "direct", "k"},
		{"amq.fanout", "fanout", ""},
		{"amq.topic", "topic", "k.*"},
		{"amq.headers", "headers", ""},
		{"amq.match", "headers", ""},
	}
	for _, b := range builtins {
		if err := ch.ExchangeDeclarePassive(b.name, b.kind, true, false, false, false, nil); err != nil {
			t.Fatalf("passive declare %s: %v", b.name, err)
		}
		q := declareQueue(t, u, ch, b.name, nil)
		var args amqp.Table
		if b.kind == "headers" {
			args = amqp.Table{"x-match": "all", "h": "v"}
		}
		mustBind(t, ch, q, b.key, b.name, args)
		key := "k"
		if b.kind == "topic" {
			key = "k.x"
		}
		if got := routedTo(t, ch, b.name, key, amqp.Table{"h": "v"}, []string{q}); len(got) != 1 {
			t.Errorf("%s did not route to its bound queue", b.name)
		}
	}

	t.Run("declare reserved name", func(t *testing.T) {
		ch := mustChannel(t, c)
		name := "amq." + uniq(t, "x")
		err := ch.ExchangeDeclare(name, "direct", false, false, false, false, nil)
		want := fmt.Sprintf("ACCESS_REFUSED - exchange name '%s' contains reserved prefix 'amq.*'", name)
		checkAMQPError(t, err, amqp.AccessRefused, want)
		expectChannelClosed(t, ch, amqp.AccessRefused, want)
	})
	t.Run("redeclare builtin", func(t *testing.T) {
		// An equivalent redeclare is accepted; the reserved-name check only
		// applies to exchanges that do not exist yet.
		ch := mustChannel(t, c)
		if err := ch.ExchangeDeclare("amq.direct", "direct", true, false, false, false, nil); err != nil {
			t.Fatalf("equivalent redeclare of amq.direct: %v", err)
		}
		err := ch.ExchangeDeclare("amq.direct", "direct", false, false, false, false, nil)
		want := "PRECONDITION_FAILED - inequivalent arg 'durable' for exchange 'amq.direct' in vhost '/': " +
			"received 'false' but current is 'true'"
		checkAMQPError(t, err, amqp.PreconditionFailed, want)
		expectChannelClosed(t, ch, amqp.PreconditionFailed, want)
	})
	t.Run("delete builtin", func(t *testing.T) {
		ch := mustChannel(t, c)
		err := ch.ExchangeDelete("amq.fanout", false, false)
		want := "ACCESS_REFUSED - deletion of system exchange 'amq.fanout' in vhost '/' not allowed"
		checkAMQPError(t, err, amqp.AccessRefused, want)
		expectChannelClosed(t, ch, amqp.AccessRefused, want)
	})
}

func TestITExchangeDeclarePassive(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustChannel(t, c)
	x := declareExchange(t, u, ch, "x", "topic", nil)
	// Passive declare ignores the other fields.
	if err := ch.ExchangeDeclarePassive(x, "fanout", true, true, true, false, nil); err != nil {
		t.Fatalf("passive declare of existing exchange: %v", err)
	}
	missing := uniq(t, "missing")
	err := ch.ExchangeDeclarePassive(missing, "direct", false, false, false, false, nil)
	want := fmt.Sprintf("NOT_FOUND - no exchange '%s' in vhost '/'", missing)
	checkAMQPError(t, err, amqp.NotFound, want)
	expectChannelClosed(t, ch, amqp.NotFound, want)
	// It was not created by the passive declare.
	if exchangeExists(t, c, missing) {
		t.Fatalf("passive declare created exchange %s", missing)
	}
}

func TestITExchangeDeclareFlags(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustChannel(t, c)
	for _, f := range []struct {
		what                          string
		durable, autoDelete, internal bool
	}{
		{"durable", true, false, false},
		{"autodelete", false, true, false},
		{"internal", false, false, true},
		{"all", true, true, true},
	} {
		name := uniq(t, f.what)
		deleteAtEnd(t, u, nil, []string{name})
		if err := ch.ExchangeDeclare(name, "direct", f.durable, f.autoDelete, f.internal, false, nil); err != nil {
			t.Fatalf("declare %s: %v", f.what, err)
		}
		// Redeclaring with the same properties is fine.
		if err := ch.ExchangeDeclare(name, "direct", f.durable, f.autoDelete, f.internal, false, nil); err != nil {
			t.Fatalf("equivalent redeclare %s: %v", f.what, err)
		}
		if !exchangeExists(t, c, name) {
			t.Fatalf("exchange %s missing after declare", name)
		}
	}
}

func TestITExchangeEquivalence(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	setup := mustChannel(t, c)
	x := declareExchange(t, u, setup, "x", "direct", nil)
	ae := declareExchange(t, u, setup, "ae", "fanout", nil)
	xa := uniq(t, "xargs")
	deleteAtEnd(t, u, nil, []string{xa})
	if err := setup.ExchangeDeclare(xa, "direct", false, false, false, false, amqp.Table{"alternate-exchange": ae}); err != nil {
		t.Fatal(err)
	}
	prefix := func(name string) string {
		return fmt.Sprintf("PRECONDITION_FAILED - inequivalent arg '%%s' for exchange '%s' in vhost '/': ", name)
	}
	cases := []struct {
		name, kind                    string
		durable, autoDelete, internal bool
		args                          amqp.Table
		want                          string
	}{
		{x, "fanout", false, false, false, nil,
			fmt.Sprintf(prefix(x), "type") + "received 'fanout' but current is 'direct'"},
		{x, "direct", true, false, false, nil,
			fmt.Sprintf(prefix(x), "durable") + "received 'true' but current is 'false'"},
		{x, "direct", false, true, false, nil,
			fmt.Sprintf(prefix(x), "auto_delete") + "received 'true' but current is 'false'"},
		{x, "direct", false, false, true, nil,
			fmt.Sprintf(prefix(x), "internal") + "received 'true' but current is 'false'"},
		{x, "direct", false, false, false, amqp.Table{"alternate-exchange": ae},
			fmt.Sprintf(prefix(x), "alternate-exchange") + "received the value '" + ae + "' of type 'longstr' but current is none"},
		{xa, "direct", false, false, false, nil,
			fmt.Sprintf(prefix(xa), "alternate-exchange") + "received none but current is the value '" + ae + "' of type 'longstr'"},
		{xa, "direct", false, false, false, amqp.Table{"alternate-exchange": "other"},
			fmt.Sprintf(prefix(xa), "alternate-exchange") + "received 'other' but current is '" + ae + "'"},
	}
	for _, tc := range cases {
		ch := mustChannel(t, c)
		err := ch.ExchangeDeclare(tc.name, tc.kind, tc.durable, tc.autoDelete, tc.internal, false, tc.args)
		checkAMQPError(t, err, amqp.PreconditionFailed, tc.want)
		expectChannelClosed(t, ch, amqp.PreconditionFailed, tc.want)
	}
	// Unknown arguments do not take part in equivalence.
	ch := mustChannel(t, c)
	if err := ch.ExchangeDeclare(x, "direct", false, false, false, false, amqp.Table{"x-whatever": int32(1)}); err != nil {
		t.Fatalf("redeclare with an unknown argument: %v", err)
	}
}

func TestITExchangeUnknownType(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustChannel(t, c)
	x := uniq(t, "x")
	err := ch.ExchangeDeclare(x, "no-such-type", false, false, false, false, nil)
	if err == nil {
		deleteAtEnd(t, u, nil, []string{x})
	}
	want := "COMMAND_INVALID - unknown exchange type 'no-such-type'"
	checkAMQPError(t, err, amqp.CommandInvalid, want)
	expectConnClosed(t, c, amqp.CommandInvalid, want)
}

func TestITExchangeDeleteIfUnused(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustChannel(t, c)
	x := declareExchange(t, u, ch, "x", "direct", nil)
	q := declareQueue(t, u, ch, "q", nil)
	mustBind(t, ch, q, "k", x, nil)

	err := ch.ExchangeDelete(x, true, false)
	want := fmt.Sprintf("PRECONDITION_FAILED - exchange '%s' in vhost '/' in use", x)
	checkAMQPError(t, err, amqp.PreconditionFailed, want)
	expectChannelClosed(t, ch, amqp.PreconditionFailed, want)

	ch = mustChannel(t, c)
	if err := ch.QueueUnbind(q, "k", x, nil); err != nil {
		t.Fatalf("unbind: %v", err)
	}
	if err := ch.ExchangeDelete(x, true, false); err != nil {
		t.Fatalf("delete if-unused of an unused exchange: %v", err)
	}
	if exchangeExists(t, c, x) {
		t.Fatalf("exchange still exists after delete")
	}
	// Deleting a missing exchange is not an error.
	if err := ch.ExchangeDelete(x, false, false); err != nil {
		t.Fatalf("delete of a missing exchange: %v", err)
	}
}

func TestITExchangeDeleteRemovesBindings(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	x := declareExchange(t, u, ch, "x", "fanout", nil)
	q := declareQueue(t, u, ch, "q", nil)
	mustBind(t, ch, q, "", x, nil)
	if err := ch.ExchangeDelete(x, false, false); err != nil {
		t.Fatalf("delete: %v", err)
	}
	// Recreated, it has no bindings.
	if err := ch.ExchangeDeclare(x, "fanout", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if got := routedTo(t, ch, x, "", nil, []string{q}); len(got) != 0 {
		t.Fatalf("binding survived the exchange's deletion")
	}
}

func TestITExchangeToExchangeBinding(t *testing.T) {
	u := startBroker(t)
	ch := mustConfirmChannel(t, mustDial(t, u))
	src := declareExchange(t, u, ch, "src", "topic", nil)
	mid := declareExchange(t, u, ch, "mid", "fanout", nil)
	dst := declareExchange(t, u, ch, "dst", "direct", nil)
	qd := declareQueue(t, u, ch, "qd", nil)
	qm := declareQueue(t, u, ch, "qm", nil)
	mustBind(t, ch, qd, "a.b", dst, nil)
	mustBind(t, ch, qm, "", mid, nil)
	if err := ch.ExchangeBind(dst, "a.*", src, false, nil); err != nil {
		t.Fatalf("exchange.bind: %v", err)
	}
	if err := ch.ExchangeBind(mid, "#", src, false, nil); err != nil {
		t.Fatalf("exchange.bind: %v", err)
	}
	// Chain src -> dst -> qd (key must match at both hops) and src -> mid -> qm.
	qs := []string{qd, qm}
	if got := routedTo(t, ch, src, "a.b", nil, qs); !sameStrings(got, qs) {
		t.Errorf("a.b reached %v, want %v", got, qs)
	}
	if got := routedTo(t, ch, src, "a.c", nil, qs); !sameStrings(got, []string{qm}) {
		t.Errorf("a.c reached %v, want [%s]", got, qm)
	}
	// A cycle does not deliver twice.
	if err := ch.ExchangeBind(src, "", mid, false, nil); err != nil {
		t.Fatalf("exchange.bind (cycle): %v", err)
	}
	if got := routedTo(t, ch, src, "a.b", nil, qs); !sameStrings(got, qs) {
		t.Errorf("with a cycle a.b reached %v, want %v", got, qs)
	}
	if err := ch.ExchangeUnbind(dst, "a.*", src, false, nil); err != nil {
		t.Fatalf("exchange.unbind: %v", err)
	}
	if got := routedTo(t, ch, src, "a.b", nil, qs); !sameStrings(got, []string{qm}) {
		t.Errorf("after unbind a.b reached %v, want [%s]", got, qm)
	}
	// Binding to a missing source exchange is 404.
	missing := uniq(t, "missing")
	err := ch.ExchangeBind(dst, "", missing, false, nil)
	want := fmt.Sprintf("NOT_FOUND - no exchange '%s' in vhost '/'", missing)
	checkAMQPError(t, err, amqp.NotFound, want)
	expectChannelClosed(t, ch, amqp.NotFound, want)
}

func TestITAlternateExchange(t *testing.T) {
	u := startBroker(t)
	ch := mustConfirmChannel(t, mustDial(t, u))
	returns := ch.NotifyReturn(make(chan amqp.Return, 10))
	ae := declareExchange(t, u, ch, "ae", "fanout", nil)
	qae := declareQueue(t, u, ch, "qae", nil)
	mustBind(t, ch, qae, "", ae, nil)
	x := declareExchange(t, u, ch, "x", "direct", amqp.Table{"alternate-exchange": ae})
	q := declareQueue(t, u, ch, "q", nil)
	mustBind(t, ch, q, "k", x, nil)
	qs := []string{q, qae}

	if got := routedTo(t, ch, x, "k", nil, qs); !sameStrings(got, []string{q}) {
		t.Errorf("routable message reached %v, want [%s]", got, q)
	}
	if got := routedTo(t, ch, x, "other", nil, qs); !sameStrings(got, []string{qae}) {
		t.Errorf("unroutable message reached %v, want the alternate exchange's queue [%s]", got, qae)
	}
	// Mandatory: routed through the AE counts as routed, so no basic.return.
	publishConfirmed(t, ch, x, "other", true, amqp.Publishing{Body: []byte("via ae")})
	mustGetBody(t, ch, qae, true, "via ae")
	select {
	case r := <-returns:
		t.Fatalf("unexpected basic.return %d %s", r.ReplyCode, r.ReplyText)
	default:
	}
	// An alternate exchange that does not exist: mandatory messages come back.
	x2 := declareExchange(t, u, ch, "x2", "direct", amqp.Table{"alternate-exchange": uniq(t, "nope")})
	publishConfirmed(t, ch, x2, "k", true, amqp.Publishing{Body: []byte("lost")})
	select {
	case r := <-returns:
		if r.ReplyCode != 312 || r.ReplyText != "NO_ROUTE" || string(r.Body) != "lost" {
			t.Fatalf("basic.return %d %q body %q, want 312 NO_ROUTE lost", r.ReplyCode, r.ReplyText, r.Body)
		}
	default:
		t.Fatalf("no basic.return before the confirm for an unroutable mandatory message")
	}
}

func TestITInternalExchange(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	in := uniq(t, "internal")
	deleteAtEnd(t, u, nil, []string{in})
	if err := ch.ExchangeDeclare(in, "fanout", false, false, true, false, nil); err != nil {
		t.Fatal(err)
	}
	q := declareQueue(t, u, ch, "q", nil)
	mustBind(t, ch, q, "", in, nil)
	// Reachable through an exchange-to-exchange binding.
	front := declareExchange(t, u, ch, "front", "fanout", nil)
	if err := ch.ExchangeBind(in, "", front, false, nil); err != nil {
		t.Fatal(err)
	}
	if got := routedTo(t, ch, front, "", nil, []string{q}); len(got) != 1 {
		t.Fatalf("message did not reach the queue through the internal exchange")
	}
	// Not directly.
	pch := mustChannel(t, c)
	publish(t, pch, in, "", amqp.Publishing{Body: []byte("x")})
	want := fmt.Sprintf("ACCESS_REFUSED - cannot publish to internal exchange '%s' in vhost '/'", in)
	expectChannelClosed(t, pch, amqp.AccessRefused, want)
}

func TestITPublishToMissingExchange(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustChannel(t, c)
	missing := uniq(t, "missing")
	publish(t, ch, missing, "k", amqp.Publishing{Body: []byte("x")})
	want := fmt.Sprintf("NOT_FOUND - no exchange '%s' in vhost '/'", missing)
	expectChannelClosed(t, ch, amqp.NotFound, want)
}

func TestITAutoDeleteExchange(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustChannel(t, c)
	x := uniq(t, "x")
	deleteAtEnd(t, u, nil, []string{x})
	if err := ch.ExchangeDeclare(x, "direct", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	// Without ever having had a binding it stays.
	if !exchangeExists(t, c, x) {
		t.Fatalf("auto-delete exchange vanished before any binding")
	}
	q1 := declareQueue(t, u, ch, "q1", nil)
	q2 := declareQueue(t, u, ch, "q2", nil)
	mustBind(t, ch, q1, "a", x, nil)
	mustBind(t, ch, q2, "b", x, nil)
	if err := ch.QueueUnbind(q1, "a", x, nil); err != nil {
		t.Fatal(err)
	}
	if !exchangeExists(t, c, x) {
		t.Fatalf("auto-delete exchange deleted while it still has a binding")
	}
	// The last binding goes with its queue.
	if _, err := ch.QueueDelete(q2, false, false, false); err != nil {
		t.Fatal(err)
	}
	eventually(t, "auto-delete exchange deleted after its last binding", func() bool {
		return !exchangeExists(t, c, x)
	})

	// Same through unbind of the last binding.
	if err := ch.ExchangeDeclare(x, "direct", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	mustBind(t, ch, q1, "a", x, nil)
	if err := ch.QueueUnbind(q1, "a", x, nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, "auto-delete exchange deleted after unbind", func() bool {
		return !exchangeExists(t, c, x)
	})
}

func TestITSenderSelectedDistribution(t *testing.T) {
	u := startBroker(t)
	ch := mustConfirmChannel(t, mustDial(t, u))
	x := declareExchange(t, u, ch, "x", "direct", nil)
	keys := []string{"a", "b", "c", "d"}
	qs := bindQueues(t, u, ch, x, keys, nil)
	publishConfirmed(t, ch, x, "a", false, amqp.Publishing{
		Headers: amqp.Table{"CC": []any{"b"}, "BCC": []any{"c"}, "other": "kept"},
		Body:    []byte("cc"),
	})
	for i, q := range qs {
		m, ok, err := ch.Get(q, true)
		if err != nil {
			t.Fatal(err)
		}
		if keys[i] == "d" {
			if ok {
				t.Errorf("queue d got the message")
			}
			continue
		}
		if !ok {
			t.Errorf("queue %s did not get the message", keys[i])
			continue
		}
		if _, has := m.Headers["BCC"]; has {
			t.Errorf("queue %s: BCC header delivered: %v", keys[i], m.Headers)
		}
		cc, _ := m.Headers["CC"].([]any)
		if len(cc) != 1 || cc[0] != "b" {
			t.Errorf("queue %s: CC header %#v, want [b]", keys[i], m.Headers["CC"])
		}
		if m.Headers["other"] != "kept" {
			t.Errorf("queue %s: other header %#v, want kept", keys[i], m.Headers["other"])
		}
		if m.RoutingKey != "a" {
			t.Errorf("queue %s: routing key %q, want the published key a", keys[i], m.RoutingKey)
		}
	}
	// A message with only BCC routes to the BCC keys too.
	if got := routedTo(t, ch, x, "zzz", amqp.Table{"BCC": []any{"d"}}, qs); !sameStrings(got, []string{qs[3]}) {
		t.Errorf("BCC-only message reached %v, want [d]", pick(keys, qs, got))
	}
}
