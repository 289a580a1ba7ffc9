package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"warren/amqp"
)

func mustParse(t testing.TB, c Component, vhost, name, body string) *Compiled {
	t.Helper()
	p, err := ParseBody(vhost, name, []byte(body))
	if err != nil {
		t.Fatalf("ParseBody(%s): %v", body, err)
	}
	cp, err := Compile(c, p)
	if err != nil {
		t.Fatalf("Compile(%s): %v", body, err)
	}
	return cp
}

// The reasons below are the ones RabbitMQ 3.10.8 returned for the same bodies (PUT
// /api/policies/{vhost}/{name}), with the management API's HTML escaping undone; the rows marked
// 4.x are from RabbitMQ's current source where 3.10.8 lacks the key or crashed.
func TestValidationErrors(t *testing.T) {
	cases := []struct {
		comp   Component
		body   string
		field  string
		reason string
	}{
		{ComponentPolicy, `nope`, "body", `not_json`},
		{ComponentPolicy, `[1]`, "body", `not_json`},
		{ComponentPolicy, `{}`, "pattern", `[{key_missing,pattern},{key_missing,definition}]`},
		{ComponentPolicy, `{"definition":{"max-length":1}}`, "pattern", `[{key_missing,pattern}]`},
		{ComponentPolicy, `{"pattern":"^a"}`, "definition", `[{key_missing,definition}]`},
		{ComponentPolicy, `{"pattern":5,"definition":{"max-length":1}}`, "pattern", `pattern should be a binary but was 5`},
		{ComponentPolicy, `{"pattern":"^a","priority":"x","definition":{"max-length":1}}`, "priority", `priority should be a number, actually was <<"x">>`},
		{ComponentPolicy, `{"pattern":"^a","priority":null,"definition":{"max-length":1}}`, "priority", `priority should be a number, actually was null`},
		{ComponentPolicy, `{"pattern":"^a","definition":{}}`, "definition", `no policy provided`},
		{ComponentPolicy, `{"pattern":"^a","definition":[1]}`, "definition", `definition must be a dictionary: [1]`},
		{ComponentPolicy, `{"pattern":"^a","apply-to":"bogus","definition":{"max-length":1}}`, "apply-to",
			`apply-to 'bogus' unrecognised; should be one of: 'queues', 'classic_queues',  'quorum_queues', 'streams', 'exchanges', or 'all'`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"message-ttl":-1}}`, "message-ttl", `-1 is not a valid message TTL`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"message-ttl":"x"}}`, "message-ttl", `<<"x">> is not a valid message TTL`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"message-ttl":null}}`, "message-ttl", `null is not a valid message TTL`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"message-ttl":true}}`, "message-ttl", `true is not a valid message TTL`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"message-ttl":1e3}}`, "message-ttl", `1.0e3 is not a valid message TTL`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"message-ttl":1000.0}}`, "message-ttl", `1.0e3 is not a valid message TTL`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"message-ttl":{"a":1}}}`, "message-ttl", `#{<<"a">> => 1} is not a valid message TTL`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"message-ttl":[1,"a"]}}`, "message-ttl", `[1,<<"a">>] is not a valid message TTL`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"expires":0}}`, "expires", `0 is not a valid queue expiry`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"max-length":1,"message-ttl":"bad","expires":0}}`, "expires", `0 is not a valid queue expiry`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"max-length":1.5}}`, "max-length", `1.5 is not a valid maximum length`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"max-in-memory-bytes":-2}}`, "max-in-memory-bytes", `-2 is not a valid maximum memory in bytes`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"max-age":"1x"}}`, "max-age", `<<"1x">> is not a valid max age`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"max-age":"0D"}}`, "max-age", `<<"0D">> is not a valid max age`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"max-age":5}}`, "max-age", `5 is not a valid max age`}, // 3.10.8: 500
		{ComponentPolicy, `{"pattern":"^a","definition":{"overflow":"bogus"}}`, "overflow", `<<"bogus">> is not a valid overflow value`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"stream-max-segment-size-bytes":4000000000}}`, "stream-max-segment-size-bytes", `4000000000 is not a valid segment size`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"stream-filter-size-bytes":8}}`, "stream-filter-size-bytes", `8 is not a valid filter size. Valid range is 16-255`}, // 4.x
		{ComponentPolicy, `{"pattern":"^a","definition":{"consumer-timeout":-1}}`, "consumer-timeout", `-1 is not a valid consumer timeout`},                                 // 4.x
		{ComponentPolicy, `{"pattern":"^a","definition":{"queue-version":3}}`, "queue-version", `3 is not a valid queue-version value`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"alternate-exchange":1}}`, "alternate-exchange", `1 is not a valid alternate exchange name`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"dead-letter-routing-key":5}}`, "dead-letter-routing-key", `5 is not a valid dead letter routing key`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"initial-cluster-size":-1}}`, "initial-cluster-size", `-1 is not a valid cluster size`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"queue-leader-locator":"x"}}`, "queue-leader-locator", `<<"x">> is not a valid queue leader locator value`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"dead-letter-strategy":"x"}}`, "dead-letter-strategy", `<<"x">> is not a valid dead letter strategy`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"queue-mode":"x"}}`, "queue-mode", `<<"x">> is not a valid queue-mode value`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"queue-master-locator":"x"}}`, "queue-master-locator", `<<"x">> invalid queue-master-locator value`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"ha-mode":"exactly"}}`, "ha-params", `ha-mode="exactly" takes an integer, none given`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"ha-sync-batch-size":0}}`, "ha-sync-batch-size", `ha-mode must be specified to specify ha-params, ha-sync-mode or ha-promote-on-shutdown`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"ha-mode":"nodes","ha-params":2}}`, "ha-params", `ha-mode="nodes" takes a list, 2 given`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"ha-mode":"exactly","ha-params":2,"ha-sync-mode":"x"}}`, "ha-sync-mode", `ha-sync-mode must be "manual" or "automatic", got <<"x">>`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"foo":1}}`, "foo", `[{<<"foo">>,1}] are not recognised policy settings`},
		{ComponentPolicy, `{"pattern":"^a","definition":{"foo":1,"bar":2}}`, "bar", `[{<<"bar">>,2},{<<"foo">>,1}] are not recognised policy settings`},
		{ComponentPolicy, `{"pattern":"(","definition":{"max-length":1}}`, "pattern", ""},
		{ComponentPolicy, `{"pattern":"a{2,1}","definition":{"max-length":1}}`, "pattern", ""},
		{ComponentOperatorPolicy, `{"pattern":"^a","definition":{"dead-letter-exchange":"x"}}`, "dead-letter-exchange", `[{<<"dead-letter-exchange">>,<<"x">>}] are not recognised policy settings`},
		{ComponentOperatorPolicy, `{"pattern":"^a","definition":{"expires":"x"}}`, "expires", `<<"x">> is not a valid queue expiry`},
		{ComponentOperatorPolicy, `{"pattern":"^a","definition":{"message-ttl":-1}}`, "message-ttl", `-1 is not a valid message TTL`},
		{ComponentOperatorPolicy, `{"pattern":"^a","definition":{"ha-mode":"all"}}`, "ha-mode", `[{<<"ha-mode">>,<<"all">>}] are not recognised policy settings`},
	}
	for _, tc := range cases {
		t.Run(tc.body, func(t *testing.T) {
			p, err := ParseBody("v", "p", []byte(tc.body))
			if err == nil {
				_, err = Compile(tc.comp, p)
			}
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("error = %v, want a *policy.Error", err)
			}
			if pe.Field != tc.field {
				t.Errorf("field = %q, want %q", pe.Field, tc.field)
			}
			if tc.reason != "" && pe.Reason != tc.reason {
				t.Errorf("reason = %q\n          want %q", pe.Reason, tc.reason)
			}
		})
	}
}

func TestManagementReason(t *testing.T) {
	_, err := Compile(ComponentPolicy, Policy{Pattern: "^a", Definition: Definition{"message-ttl": json.Number("-1")}})
	var pe *Error
	if !errors.As(err, &pe) || pe.ManagementReason() != "Validation failed\n\n-1 is not a valid message TTL\n" {
		t.Fatalf("ManagementReason = %q", pe.ManagementReason())
	}
	_, err = ParseBody("v", "p", []byte(`{"pattern":"a"}`))
	if !errors.As(err, &pe) || pe.ManagementReason() != "[{key_missing,definition}]" {
		t.Fatalf("ManagementReason = %q", pe.ManagementReason())
	}
}

func TestValidPolicies(t *testing.T) {
	cases := []struct {
		comp    Component
		body    string
		ignored []string
	}{
		{ComponentPolicy, `{"pattern":"^a","definition":{"ha-mode":"all"}}`, []string{"ha-mode"}},
		{ComponentPolicy, `{"pattern":"^a","definition":{"ha-mode":"exactly","ha-params":2,"ha-sync-mode":"automatic"}}`, []string{"ha-mode", "ha-params", "ha-sync-mode"}},
		{ComponentPolicy, `{"pattern":"^a","definition":{"ha-mode":"nodes","ha-params":["rabbit@a"]}}`, []string{"ha-mode", "ha-params"}},
		{ComponentPolicy, `{"pattern":"^(?!amq\\.).*","definition":{"max-length":1}}`, nil},
		{ComponentPolicy, `{"pattern":"(?<n>a)\\k<n>","definition":{"max-length":1}}`, nil},
		{ComponentPolicy, `{"pattern":"","definition":{"max-length":1}}`, nil},
		{ComponentPolicy, `{"pattern":"\\p{L}+","priority":1.5,"definition":{"max-length":1}}`, nil},
		{ComponentPolicy, `{"pattern":"^a","priority":-5,"definition":{"max-length":99999999999999999999999}}`, nil},
		{ComponentPolicy, `{"pattern":"^a","definition":{"queue-mode":"lazy","queue-version":2,"max-in-memory-length":10,"queue-master-locator":"min-masters"}}`,
			[]string{"max-in-memory-length", "queue-master-locator", "queue-mode", "queue-version"}},
		{ComponentPolicy, `{"pattern":"^a","definition":{"federation-upstream-set":"all"}}`, []string{"federation-upstream-set"}},
		{ComponentPolicy, `{"pattern":"^a","definition":{"delivery-limit":-1}}`, nil}, // 4.x (3.10.8 refuses it)
		{ComponentPolicy, `{"pattern":"^a","apply-to":"streams","definition":{"max-age":"7D","stream-max-segment-size-bytes":50000000,"stream-filter-size-bytes":32}}`, nil},
		{ComponentPolicy, `{"pattern":"^a","apply-to":"quorum_queues","definition":{"delivery-limit":5,"dead-letter-strategy":"at-least-once","overflow":"reject-publish","queue-leader-locator":"balanced","consumer-timeout":60000}}`, nil},
		{ComponentPolicy, `{"pattern":"^a","apply-to":"exchanges","definition":{"alternate-exchange":"ae"}}`, nil},
		{ComponentOperatorPolicy, `{"pattern":"^a","definition":{"max-in-memory-length":2}}`, []string{"max-in-memory-length"}},
		{ComponentOperatorPolicy, `{"pattern":"^a","apply-to":"queues","definition":{"message-ttl":1000,"max-length":10,"expires":1,"max-length-bytes":5,"delivery-limit":3,"overflow":"drop-head","queue-version":2}}`, []string{"queue-version"}},
	}
	for _, tc := range cases {
		t.Run(tc.body, func(t *testing.T) {
			cp := mustParse(t, tc.comp, "v", "p", tc.body)
			if !slices.Equal(cp.Ignored, tc.ignored) {
				t.Errorf("Ignored = %v, want %v", cp.Ignored, tc.ignored)
			}
		})
	}
}

func TestErlFloat(t *testing.T) {
	cases := map[float64]string{1.5: "1.5", 1000: "1.0e3", 100: "100.0", 0.1: "0.1", 0.0015: "0.0015",
		-2.5: "-2.5", 1e20: "1.0e20", 123456.0: "123456.0", 0: "0.0", 1.25e-7: "1.25e-7"}
	for f, want := range cases {
		if got := erlFloat(f); got != want {
			t.Errorf("erlFloat(%v) = %q, want %q", f, got, want)
		}
	}
}

func TestPatternMatching(t *testing.T) {
	cases := []struct {
		pattern string
		name    string
		want    bool
	}{
		{"^amq\\.", "amq.gen-1", true},
		{"^amq\\.", "x.amq.", false},
		{"amq", "x.amq.", true}, // unanchored, as re:run
		{"", "anything", true},
		{"^(?!amq\\.).*", "orders", true},
		{"^(?!amq\\.).*", "amq.gen-1", false},
		{"^(a)\\1$", "aa", true},
		{"^(a)\\1$", "ab", false},
		{"^app\\.limited$", "app.limited", true},
		{"^app\\.limited$", "app.limited.x", false},
	}
	for _, tc := range cases {
		p, err := CompilePattern(tc.pattern)
		if err != nil {
			t.Fatalf("CompilePattern(%q): %v", tc.pattern, err)
		}
		if got := p.MatchString(tc.name); got != tc.want {
			t.Errorf("%q matches %q = %v, want %v", tc.pattern, tc.name, got, tc.want)
		}
	}
	if _, err := CompilePattern(string(make([]byte, MaxPatternLength+1))); err == nil {
		t.Error("an over-long pattern compiled")
	}
}

// referenceSet is the set checked against RabbitMQ 3.10.8: operator policy o1 and policies pa
// (with ha-mode) and pb (with max-age) on "^a".
func referenceSet(t testing.TB) *Set {
	s := NewSet()
	s = s.With(mustParse(t, ComponentOperatorPolicy, "v", "o1", `{"pattern":"^a","apply-to":"queues","definition":{"message-ttl":1000,"max-length":10},"priority":0}`))
	s = s.With(mustParse(t, ComponentPolicy, "v", "pa", `{"pattern":"^a","definition":{"message-ttl":5000,"max-length":3,"dead-letter-exchange":"dlx","ha-mode":"all"},"priority":1}`))
	s = s.With(mustParse(t, ComponentPolicy, "v", "pb", `{"pattern":"^a","definition":{"max-age":"1D","max-length-bytes":1000},"priority":5}`))
	s = s.With(mustParse(t, ComponentPolicy, "v", "px", `{"pattern":"^x","apply-to":"exchanges","definition":{"alternate-exchange":"ae"}}`))
	s = s.With(mustParse(t, ComponentPolicy, "v", "pxq", `{"pattern":"^x","apply-to":"queues","definition":{"max-length":7},"priority":9}`))
	for _, n := range []string{"t3", "t1", "t6", "t2", "t5", "t4"} {
		s = s.With(mustParse(t, ComponentPolicy, "v", n, fmt.Sprintf(`{"pattern":"^t","apply-to":"queues","definition":{"max-length":%s},"priority":3}`, n[1:])))
	}
	return s
}

func effectiveJSON(t *testing.T, m Match) string {
	t.Helper()
	b, err := json.Marshal(m.EffectiveDefinition())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// What GET /api/queues/{vhost}/{name} showed on RabbitMQ 3.10.8 for the same policies.
func TestMatchLikeReference(t *testing.T) {
	s := referenceSet(t)
	cases := []struct {
		name      string
		typ       ObjectType
		policy    string
		operator  string
		effective string
	}{
		{"a.c", ClassicQueue, "pa", "o1", `{"dead-letter-exchange":"dlx","ha-mode":"all","max-length":3,"message-ttl":1000}`},
		{"a.q", QuorumQueue, "", "o1", `{"max-length":10,"message-ttl":1000}`},
		{"a.s", Stream, "pb", "", `{"max-age":"1D","max-length-bytes":1000}`},
		{"b.c", ClassicQueue, "", "", `{}`},
		{"x1", Exchange, "px", "", `{"alternate-exchange":"ae"}`},
		{"x1", ClassicQueue, "pxq", "", `{"max-length":7}`},
		// RabbitMQ chose t2 (ETS order); Warren chooses by name.
		{"tq", ClassicQueue, "t1", "", `{"max-length":1}`},
	}
	for _, tc := range cases {
		t.Run(tc.name+"/"+tc.typ.String(), func(t *testing.T) {
			m := s.Match("v", tc.name, tc.typ)
			if m.PolicyName() != tc.policy || m.OperatorPolicyName() != tc.operator {
				t.Errorf("policy, operator policy = %q, %q; want %q, %q", m.PolicyName(), m.OperatorPolicyName(), tc.policy, tc.operator)
			}
			if got := effectiveJSON(t, m); got != tc.effective {
				t.Errorf("effective_policy_definition = %s, want %s", got, tc.effective)
			}
		})
	}
	if m := s.Match("other", "a.c", ClassicQueue); m != (Match{}) {
		t.Errorf("a policy of vhost v matched in vhost other: %+v", m)
	}
}

func TestApplyTo(t *testing.T) {
	types := []ObjectType{Exchange, ClassicQueue, QuorumQueue, Stream}
	cases := map[ApplyTo][]bool{
		ApplyToAll:           {true, true, true, true},
		ApplyToExchanges:     {true, false, false, false},
		ApplyToQueues:        {false, true, true, true},
		ApplyToClassicQueues: {false, true, false, false},
		ApplyToQuorumQueues:  {false, false, true, false},
		ApplyToStreams:       {false, false, false, true},
	}
	for a, want := range cases {
		cp, err := Compile(ComponentPolicy, Policy{Pattern: "^q", ApplyTo: a, Definition: Definition{"queue-leader-locator": "balanced"}})
		if err != nil {
			t.Fatal(err)
		}
		for i, typ := range types {
			if got := cp.Matches("q1", typ); got != want[i] {
				t.Errorf("apply-to %s on %s = %v, want %v", a, typ, got, want[i])
			}
		}
	}
}

func TestPriorityAndReplacement(t *testing.T) {
	s := NewSet()
	low := mustParse(t, ComponentPolicy, "v", "low", `{"pattern":".*","definition":{"max-length":100},"priority":1}`)
	high := mustParse(t, ComponentPolicy, "v", "high", `{"pattern":"^orders","definition":{"max-length":5},"priority":10}`)
	s = s.With(low).With(high)
	if m := s.Match("v", "orders.eu", ClassicQueue); m.Policy != high {
		t.Fatalf("orders.eu got %q, want high", m.PolicyName())
	}
	if m := s.Match("v", "billing", ClassicQueue); m.Policy != low {
		t.Fatalf("billing got %q, want low", m.PolicyName())
	}
	// Lowering high's priority below low's hands orders.eu to low.
	high2 := mustParse(t, ComponentPolicy, "v", "high", `{"pattern":"^orders","definition":{"max-length":5},"priority":0}`)
	s2 := s.With(high2)
	if m := s2.Match("v", "orders.eu", ClassicQueue); m.Policy != low {
		t.Fatalf("after the change orders.eu got %q, want low", m.PolicyName())
	}
	if len(s2.List(ComponentPolicy, "v")) != 2 {
		t.Fatalf("With added a duplicate: %d policies", len(s2.List(ComponentPolicy, "v")))
	}
	// The old Set is unchanged.
	if m := s.Match("v", "orders.eu", ClassicQueue); m.Policy != high {
		t.Fatalf("the old Set changed: %q", m.PolicyName())
	}
	s3 := s2.Without(ComponentPolicy, "v", "low")
	if m := s3.Match("v", "billing", ClassicQueue); m.Policy != nil {
		t.Fatalf("deleted policy still matches")
	}
	if got := s3.WithoutVHost("v").VHosts(); len(got) != 0 {
		t.Fatalf("WithoutVHost left %v", got)
	}
}

func TestQueueSettings(t *testing.T) {
	pol := func(def string) *Compiled {
		return mustParse(t, ComponentPolicy, "v", "p", `{"pattern":".*","definition":`+def+`}`)
	}
	op := func(def string) *Compiled {
		return mustParse(t, ComponentOperatorPolicy, "v", "o", `{"pattern":".*","definition":`+def+`}`)
	}
	i := func(n int64) Int { return Int{Value: n, Set: true} }
	s := func(v string) String { return String{Value: v, Set: true} }
	cases := []struct {
		what string
		typ  ObjectType
		m    Match
		args amqp.Table
		want QueueSettings
	}{
		{"classic: lower of policy and argument for limits", ClassicQueue,
			Match{Policy: pol(`{"max-length":3,"message-ttl":5000,"expires":100000,"max-length-bytes":10}`)},
			amqp.Table{"x-max-length": int32(5), "x-message-ttl": int64(1000), "x-expires": int32(200000)},
			QueueSettings{MaxLength: i(3), MessageTTL: i(1000), Expires: i(100000), MaxLengthBytes: i(10)}},
		{"classic: the argument wins for dead-lettering and overflow", ClassicQueue,
			Match{Policy: pol(`{"dead-letter-exchange":"p.dlx","dead-letter-routing-key":"p","overflow":"reject-publish"}`)},
			amqp.Table{"x-dead-letter-exchange": "a.dlx", "x-overflow": "drop-head"},
			QueueSettings{DeadLetterExchange: s("a.dlx"), DeadLetterRoutingKey: s("p"), Overflow: s("drop-head")}},
		{"quorum: the policy wins for overflow, the argument for dead-lettering", QuorumQueue,
			Match{Policy: pol(`{"overflow":"reject-publish","dead-letter-strategy":"at-least-once","dead-letter-exchange":"p.dlx"}`)},
			amqp.Table{"x-overflow": "drop-head", "x-dead-letter-strategy": "at-most-once"},
			QueueSettings{Overflow: s("reject-publish"), DeadLetterStrategy: s("at-most-once"), DeadLetterExchange: s("p.dlx")}},
		{"quorum: delivery-limit, lower value", QuorumQueue,
			Match{Policy: pol(`{"delivery-limit":5}`)}, amqp.Table{"x-delivery-limit": int32(3)},
			QueueSettings{DeliveryLimit: i(3)}},
		{"quorum: delivery-limit, a negative (unlimited) side takes the higher", QuorumQueue,
			Match{Policy: pol(`{"delivery-limit":-1}`)}, amqp.Table{"x-delivery-limit": int32(3)},
			QueueSettings{DeliveryLimit: i(3)}},
		{"stream: the policy wins for retention", Stream,
			Match{Policy: pol(`{"max-age":"7D","max-length-bytes":1000,"stream-max-segment-size-bytes":500}`)},
			amqp.Table{"x-max-age": "1D", "x-max-length-bytes": int64(5), "x-stream-max-segment-size-bytes": int32(100)},
			QueueSettings{MaxAge: Duration{Value: 7 * 24 * time.Hour, Set: true}, MaxLengthBytes: i(1000), StreamMaxSegmentSizeBytes: i(500)}},
		{"stream: arguments alone", Stream, Match{}, amqp.Table{"x-max-age": "1h", "x-initial-cluster-size": int32(3)},
			QueueSettings{MaxAge: Duration{Value: time.Hour, Set: true}, InitialClusterSize: i(3)}},
		{"stream: keys of other types are not settings", Stream, Match{}, amqp.Table{"x-max-length": int32(5), "x-message-ttl": int32(5)},
			QueueSettings{}},
		{"classic: delivery-limit is not a classic setting", ClassicQueue, Match{}, amqp.Table{"x-delivery-limit": int32(5)},
			QueueSettings{}},
		{"operator policy and policy merge first, then meet the argument", ClassicQueue,
			Match{Policy: pol(`{"max-length":30,"message-ttl":500,"overflow":"drop-head"}`), OperatorPolicy: op(`{"max-length":10,"message-ttl":1000,"overflow":"reject-publish"}`)},
			amqp.Table{"x-max-length": int32(20), "x-message-ttl": int32(100)},
			QueueSettings{MaxLength: i(10), MessageTTL: i(100), Overflow: s("reject-publish")}},
		{"operator policy alone", QuorumQueue, Match{OperatorPolicy: op(`{"delivery-limit":10}`)}, nil,
			QueueSettings{DeliveryLimit: i(10)}},
		{"consumer-timeout is the lower of the two", QuorumQueue, Match{Policy: pol(`{"consumer-timeout":60000}`)},
			amqp.Table{"x-consumer-timeout": int64(30000)}, QueueSettings{ConsumerTimeout: i(30000)}},
		{"queue-leader-locator: the policy wins", QuorumQueue, Match{Policy: pol(`{"queue-leader-locator":"balanced"}`)},
			amqp.Table{"x-queue-leader-locator": "client-local"}, QueueSettings{QueueLeaderLocator: s("balanced")}},
	}
	for _, tc := range cases {
		t.Run(tc.what, func(t *testing.T) {
			if got := tc.m.Queue(tc.typ, tc.args); got != tc.want {
				t.Errorf("Queue() = %+v\n        want %+v", got, tc.want)
			}
		})
	}
}

func TestMergeOperator(t *testing.T) {
	cases := []struct {
		key      string
		pol, op  string
		want     string
		what     string
		opWinsOn bool
	}{
		{key: "message-ttl", pol: "5000", op: "1000", want: "1000"},
		{key: "message-ttl", pol: "500", op: "1000", want: "500"},
		{key: "expires", pol: "5000", op: "10000", want: "5000"},
		{key: "max-length-bytes", pol: "5", op: "10", want: "5"},
		{key: "delivery-limit", pol: "5", op: "10", want: "5"},
		{key: "delivery-limit", pol: "-1", op: "10", want: "10"},
		{key: "delivery-limit", pol: "5", op: "-1", want: "5"},
		{key: "overflow", pol: `"drop-head"`, op: `"reject-publish"`, want: `"reject-publish"`},
		{key: "queue-version", pol: "1", op: "2", want: "2"},
	}
	for _, tc := range cases {
		m := Match{
			Policy:         mustParse(t, ComponentPolicy, "v", "p", `{"pattern":".*","definition":{"`+tc.key+`":`+tc.pol+`}}`),
			OperatorPolicy: mustParse(t, ComponentOperatorPolicy, "v", "o", `{"pattern":".*","definition":{"`+tc.key+`":`+tc.op+`}}`),
		}
		v, _ := m.Get(tc.key)
		got, _ := json.Marshal(v)
		if string(got) != tc.want {
			t.Errorf("%s: policy %s, operator %s -> %s, want %s", tc.key, tc.pol, tc.op, got, tc.want)
		}
	}
}

func TestAlternateExchange(t *testing.T) {
	m := Match{Policy: mustParse(t, ComponentPolicy, "v", "p", `{"pattern":".*","apply-to":"exchanges","definition":{"alternate-exchange":"p.ae"}}`)}
	if ae, ok := m.AlternateExchange(nil); !ok || ae != "p.ae" {
		t.Errorf("policy alone: %q %v", ae, ok)
	}
	if ae, ok := m.AlternateExchange(amqp.Table{"alternate-exchange": "x.ae"}); !ok || ae != "x.ae" {
		t.Errorf("argument and policy: %q %v, want the argument", ae, ok)
	}
	if _, ok := (Match{}).AlternateExchange(nil); ok {
		t.Error("no policy, no argument: set")
	}
}

func TestReapply(t *testing.T) {
	s := NewSet()
	base := mustParse(t, ComponentPolicy, "v", "base", `{"pattern":".*","definition":{"max-length":100},"priority":0}`)
	s = s.With(base)
	var objs []Object
	for i := range 1000 {
		name := fmt.Sprintf("other.%d", i)
		if i%10 == 0 {
			name = fmt.Sprintf("orders.%d", i)
		}
		objs = append(objs, Object{Name: name, Type: ClassicQueue, Current: s.Match("v", name, ClassicQueue)})
	}
	run := func(s *Set, c Component, name string) map[string]Match {
		got := map[string]Match{}
		s.Reapply("v", c, name, slices.Values(objs), func(o Object, m Match) { got[o.Name] = m })
		for i := range objs {
			if m, ok := got[objs[i].Name]; ok {
				objs[i].Current = m
			}
		}
		return got
	}
	// A new, higher policy on orders.* changes exactly those 100 queues.
	orders := mustParse(t, ComponentPolicy, "v", "orders", `{"pattern":"^orders\\.","definition":{"max-length":5},"priority":5}`)
	s = s.With(orders)
	if got := run(s, ComponentPolicy, "orders"); len(got) != 100 || got["orders.10"].Policy != orders {
		t.Fatalf("put orders: %d updates, orders.10 -> %q", len(got), got["orders.10"].PolicyName())
	}
	// Changing base's definition updates the 900 queues on base, not the orders ones.
	base2 := mustParse(t, ComponentPolicy, "v", "base", `{"pattern":".*","definition":{"max-length":200},"priority":0}`)
	s = s.With(base2)
	if got := run(s, ComponentPolicy, "base"); len(got) != 900 || got["other.1"].Policy != base2 {
		t.Fatalf("change base: %d updates", len(got))
	}
	// An operator policy on everything updates all 1000.
	s = s.With(mustParse(t, ComponentOperatorPolicy, "v", "cap", `{"pattern":".*","definition":{"max-length":50}}`))
	if got := run(s, ComponentOperatorPolicy, "cap"); len(got) != 1000 {
		t.Fatalf("put operator policy: %d updates", len(got))
	}
	// Deleting orders hands its queues back to base.
	s = s.Without(ComponentPolicy, "v", "orders")
	if got := run(s, ComponentPolicy, "orders"); len(got) != 100 || got["orders.10"].Policy != base2 {
		t.Fatalf("delete orders: %d updates, orders.10 -> %q", len(got), got["orders.10"].PolicyName())
	}
	// A policy that matches nothing changes nothing.
	s = s.With(mustParse(t, ComponentPolicy, "v", "none", `{"pattern":"^nothing","definition":{"max-length":1},"priority":99}`))
	if got := run(s, ComponentPolicy, "none"); len(got) != 0 {
		t.Fatalf("non-matching policy: %d updates", len(got))
	}
}

func TestAnchoredPrefix(t *testing.T) {
	cases := map[string]string{`^orders\.`: "orders.", `^orders`: "orders", `orders`: "", `^(?i)orders`: "",
		`^a|^b`: "", `^app\.limited$`: "app.limited", `^(?:x)y`: "xy", `.*`: "", `^`: "", `(?m)^ab`: ""}
	for src, want := range cases {
		if got := anchoredPrefix(src); got != want {
			t.Errorf("anchoredPrefix(%q) = %q, want %q", src, got, want)
		}
	}
}
