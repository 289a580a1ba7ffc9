package definitions

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"warren/amqp"
	"warren/server/policy"
)

func readFile(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func find[T any](t *testing.T, list []T, what string, f func(T) bool) T {
	t.Helper()
	for _, e := range list {
		if f(e) {
			return e
		}
	}
	t.Fatalf("%s not found", what)
	var zero T
	return zero
}

func skippedPaths(d *Definitions) []string {
	var out []string
	for _, s := range d.Skipped {
		out = append(out, s.Path)
	}
	slices.Sort(out)
	return out
}

// The export made by testdata/make-rabbitmq-export.sh on RabbitMQ 3.10.8.
func TestDecodeRabbitMQ3Export(t *testing.T) {
	d, err := Decode(readFile(t, "rabbitmq-3.10.8-export.json"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Validate(nil, nil); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if d.RabbitVersion != "3.10.8" || d.ProductName != "RabbitMQ" {
		t.Errorf("versions: %q %q", d.RabbitVersion, d.ProductName)
	}
	counts := map[string][2]int{
		"users": {len(d.Users), 6}, "vhosts": {len(d.VHosts), 3}, "permissions": {len(d.Permissions), 7},
		"topic_permissions": {len(d.TopicPermissions), 1}, "policies": {len(d.Policies), 7},
		"operator policies": {len(d.OperatorPolicies), 1}, "vhost limits": {len(d.VHostLimits), 1},
		"other parameters": {len(d.Parameters), 0}, "global parameters": {len(d.GlobalParameters), 2},
		"queues": {len(d.Queues), 7}, "bindings": {len(d.Bindings), 10},
		// 8 of the script's and one that another session had left in "/" of the shared broker.
		"exchanges": {len(d.Exchanges), 9},
	}
	for what, c := range counts {
		if c[0] != c[1] {
			t.Errorf("%s: %d, want %d", what, c[0], c[1])
		}
	}
	mon := find(t, d.Users, "wdefs-mon", func(u User) bool { return u.Name == "wdefs-mon" })
	if !slices.Equal(mon.Tags, []string{"monitoring", "policymaker"}) || mon.Algorithm(d.RabbitVersion) != HashSHA256 {
		t.Errorf("wdefs-mon: %+v", mon)
	}
	app := find(t, d.Users, "wdefs-app", func(u User) bool { return u.Name == "wdefs-app" })
	if app.Limits["max-connections"] != 10 || app.Limits["max-channels"] != 20 {
		t.Errorf("wdefs-app limits: %v", app.Limits)
	}
	sha := find(t, d.Users, "wdefs-sha512", func(u User) bool { return u.Name == "wdefs-sha512" })
	if sha.Algorithm(d.RabbitVersion) != HashSHA512 || !strings.HasPrefix(sha.PasswordHash, "AQIDB") {
		t.Errorf("wdefs-sha512: %+v", sha)
	}
	if l := d.VHostLimits[0]; l.VHost != "wdefs" || l.Limits["max-queues"] != 100 || l.Limits["max-connections"] != 50 {
		t.Errorf("vhost limits: %+v", l)
	}
	op := d.OperatorPolicies[0]
	if op.Name != "op-cap" || op.ApplyTo != policy.ApplyToQueues || op.Definition["delivery-limit"] != json.Number("10") {
		t.Errorf("operator policy: %+v", op)
	}
	types := map[string]string{}
	for _, q := range d.Queues {
		types[q.Name] = q.Type
	}
	if types["app.qq"] != "quorum" || types["app.stream"] != "stream" || types["app.work"] != "classic" {
		t.Errorf("queue types: %v", types)
	}
	auto := find(t, d.Queues, "app.auto", func(q Queue) bool { return q.Name == "app.auto" })
	if auto.Durable || !auto.AutoDelete {
		t.Errorf("app.auto: %+v", auto)
	}
	internal := find(t, d.Exchanges, "app.internal", func(x Exchange) bool { return x.Name == "app.internal" })
	if !internal.Internal || internal.Type != "topic" {
		t.Errorf("app.internal: %+v", internal)
	}
	hb := find(t, d.Bindings, "headers binding", func(b Binding) bool { return b.Source == "app.headers" })
	if hb.Arguments["x-match"] != "all" || hb.DestinationType != "queue" {
		t.Errorf("headers binding: %+v", hb)
	}
	xb := find(t, d.Bindings, "exchange binding", func(b Binding) bool { return b.DestinationType == "exchange" })
	if xb.Source != "app.topic" || xb.Destination != "app.internal" || xb.RoutingKey != "internal.*" {
		t.Errorf("exchange binding: %+v", xb)
	}
	wantSkipped := []string{"global_parameters[0]", "global_parameters[1]",
		"policies[0].definition.ha-mode", "policies[0].definition.ha-sync-mode",
		"policies[4].definition.max-in-memory-length", "policies[4].definition.queue-mode", "policies[4].definition.queue-version"}
	if got := skippedPaths(d); !slices.Equal(got, wantSkipped) {
		t.Errorf("skipped = %v\nwant %v", got, wantSkipped)
	}
}

func TestDecodeVHostExport(t *testing.T) {
	data := readFile(t, "rabbitmq-3.10.8-vhost-export.json")
	_, err := Decode(data, Options{})
	var de *Error
	if !errors.As(err, &de) || !strings.Contains(de.Problems[0].Reason, "exported from one virtual host") {
		t.Fatalf("a single-vhost export decoded without a vhost: %v", err)
	}
	d, err := Decode(data, Options{VHost: "target"})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Queues) != 7 || len(d.Exchanges) != 8 || len(d.Bindings) != 10 || len(d.Policies) != 7 || len(d.OperatorPolicies) != 1 {
		t.Fatalf("counts: %d queues %d exchanges %d bindings %d policies %d operator policies",
			len(d.Queues), len(d.Exchanges), len(d.Bindings), len(d.Policies), len(d.OperatorPolicies))
	}
	for _, q := range d.Queues {
		if q.VHost != "target" {
			t.Fatalf("queue %s in vhost %q", q.Name, q.VHost)
		}
	}
	// The operator policy's own "vhost" field (wdefs) gives way to the target vhost.
	if d.OperatorPolicies[0].VHost != "target" || d.VHostLimits[0].VHost != "target" {
		t.Fatalf("parameters not moved to the target vhost: %+v %+v", d.OperatorPolicies[0], d.VHostLimits[0])
	}
	if err := d.Validate(func(v string) bool { return v == "target" }, nil); err != nil {
		t.Fatal(err)
	}
}

// handwritten-4x-export.json follows the shape of RabbitMQ 4.x's export
// (rabbit_definitions:all_definitions and rabbit_mgmt_wm_definitions in the 4.x source: vhost
// limits and metadata, queue "type", rabbitmq_definition_format); there is no 4.x broker here
// to export one.
func TestDecode4xExport(t *testing.T) {
	d, err := Decode(readFile(t, "handwritten-4x-export.json"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Validate(nil, nil); err != nil {
		t.Fatal(err)
	}
	if d.DefinitionFormat != "cluster" || d.OriginalClusterName != "rabbit@prod-1" {
		t.Errorf("4.x metadata: %q %q", d.DefinitionFormat, d.OriginalClusterName)
	}
	prod := find(t, d.VHosts, "prod", func(v VHost) bool { return v.Name == "prod" })
	if prod.Description != "production" || !slices.Equal(prod.Tags, []string{"eu", "critical"}) || prod.DefaultQueueType != "quorum" {
		t.Errorf("vhost prod: %+v", prod)
	}
	if len(d.VHostLimits) != 1 || d.VHostLimits[0].Limits["max-queues"] != 500 {
		t.Errorf("vhost limits from vhosts[].limits: %+v", d.VHostLimits)
	}
	legacy := find(t, d.Users, "legacy", func(u User) bool { return u.Name == "legacy" })
	if !slices.Equal(legacy.Tags, []string{"monitoring", "management"}) || legacy.Algorithm(d.RabbitVersion) != HashSHA256 {
		t.Errorf("legacy: %+v", legacy)
	}
	if q := find(t, d.Queues, "events", func(q Queue) bool { return q.Name == "events" }); q.Type != "stream" {
		t.Errorf("events: %+v", q)
	}
	if len(d.Exchanges) != 2 || len(d.Bindings) != 1 {
		t.Errorf("the x-delayed-message exchange and its bindings were not skipped: %d exchanges, %d bindings", len(d.Exchanges), len(d.Bindings))
	}
	want := []string{"bindings[1]", "bindings[2]", "exchanges[1]", "parameters[0]", "parameters[1]",
		"policies[0].definition.target-group-size", "policies[2].definition.federation-upstream-set"}
	if got := skippedPaths(d); !slices.Equal(got, want) {
		t.Errorf("skipped = %v\nwant %v", got, want)
	}
	if len(d.GlobalParameters) != 1 || d.GlobalParameters[0].Name != "cluster_name" {
		t.Errorf("global parameters: %+v", d.GlobalParameters)
	}
}

func TestDecodeProblems(t *testing.T) {
	cases := []struct {
		what string
		doc  string
		opts Options
		want []string // "path: reason" prefixes, in order
	}{
		{"not JSON", `{"queues": [`, Options{}, []string{"not JSON: unexpected EOF"}},
		{"garbage after the object", `{} {}`, Options{}, []string{"not JSON: data after the top-level object"}},
		{"a list at the top", `[]`, Options{}, []string{"want a JSON object at the top level, got a list"}},
		{"a list of the wrong type", `{"queues": "x"}`, Options{}, []string{`queues: want a list, got the string "x"`}},
		{"an item of the wrong type", `{"queues": [5]}`, Options{}, []string{"queues[0]: want an object, got the number 5"}},
		{"wrong field types", `{"queues": [{"name": "q", "vhost": "/", "durable": "yes", "arguments": 3}]}`, Options{},
			[]string{`queues[0].durable: want true or false, got the string "yes"`, "queues[0].arguments: want an object, got the number 3"}},
		{"a missing name", `{"exchanges": [{"vhost": "/", "type": "direct"}]}`, Options{}, []string{"exchanges[0].name: missing"}},
		{"a missing vhost", `{"bindings": [{"source": "x", "destination": "q", "destination_type": "queue"}]}`, Options{},
			[]string{"bindings[0].vhost: missing: a file exported from one virtual host"}},
		{"a bad destination type", `{"bindings": [{"source": "x", "vhost": "/", "destination": "q", "destination_type": "stream"}]}`, Options{},
			[]string{`bindings[0].destination_type: want queue or exchange, got "stream"`}},
		{"a non-durable quorum queue", `{"queues": [{"name": "q", "vhost": "v", "durable": false, "arguments": {"x-queue-type": "quorum"}}]}`, Options{},
			[]string{"queues[0].durable: invalid property 'non-durable' for queue 'q' in vhost 'v'"}},
		{"type and x-queue-type disagree", `{"queues": [{"name": "q", "vhost": "v", "type": "stream", "arguments": {"x-queue-type": "quorum"}}]}`, Options{},
			[]string{`queues[0].type: "stream" disagrees with arguments.x-queue-type "quorum"`}},
		{"an unknown queue type", `{"queues": [{"name": "q", "vhost": "v", "arguments": {"x-queue-type": "lazy"}}]}`, Options{},
			[]string{`queues[0].type: unknown queue type "lazy"`}},
		{"a bad policy value", `{"policies": [{"vhost": "v", "name": "p", "pattern": "^a", "definition": {"message-ttl": -1}}]}`, Options{},
			[]string{"policies[0].definition.message-ttl: -1 is not a valid message TTL"}},
		{"a policy key RabbitMQ rejects", `{"policies": [{"vhost": "v", "name": "p", "pattern": "^a", "definition": {"foo": 1}}]}`, Options{},
			[]string{`policies[0].definition.foo: [{<<"foo">>,1}] are not recognised policy settings`}},
		{"a bad policy pattern", `{"policies": [{"vhost": "v", "name": "p", "pattern": "(", "definition": {"max-length": 1}}]}`, Options{},
			[]string{"policies[0].pattern: pattern should be regular expression but is invalid"}},
		{"a policy without a definition", `{"policies": [{"vhost": "v", "name": "p", "pattern": "^a"}]}`, Options{},
			[]string{"policies[0].definition: missing"}},
		{"an operator policy with a policy-only key", `{"parameters": [{"vhost": "v", "component": "operator_policy", "name": "o", "value": {"pattern": "^a", "definition": {"dead-letter-exchange": "x"}}}]}`, Options{},
			[]string{`parameters[0].value.definition.dead-letter-exchange: [{<<"dead-letter-exchange">>,<<"x">>}] are not recognised policy settings`}},
		{"a bad permission pattern", `{"permissions": [{"user": "u", "vhost": "v", "configure": "[", "write": ".*", "read": ".*"}]}`, Options{},
			[]string{`permissions[0].configure: "[" is not a valid regular expression`}},
		{"a bad password hash", `{"users": [{"name": "u", "password_hash": "!!", "tags": []}]}`, Options{}, []string{"users[0].password_hash: not base64"}},
		{"password and hash", `{"users": [{"name": "u", "password": "p", "password_hash": "", "tags": []}]}`, Options{},
			[]string{"users[0]: both password and password_hash are given"}},
		{"an unknown hashing algorithm", `{"users": [{"name": "u", "password_hash": "", "hashing_algorithm": "rot13", "tags": []}]}`, Options{},
			[]string{`users[0].hashing_algorithm: unknown hashing algorithm "rot13"`}},
		{"no tags", `{"users": [{"name": "u", "password_hash": ""}]}`, Options{}, []string{"users[0].tags: missing"}},
		{"tags of the wrong type", `{"users": [{"name": "u", "tags": [1]}]}`, Options{}, []string{"users[0].tags[0]: want a string, got the number 1"}},
		{"a user limit that is not an integer", `{"users": [{"name": "u", "tags": [], "limits": {"max-connections": "ten"}}]}`, Options{},
			[]string{`users[0].limits.max-connections: want an integer, got the string "ten"`}},
		{"an unknown vhost limit", `{"parameters": [{"vhost": "v", "component": "vhost-limits", "name": "limits", "value": {"max-exchanges": 3}}]}`, Options{},
			[]string{"parameters[0].value.max-exchanges: unknown limit"}},
		{"a bad default queue type", `{"vhosts": [{"name": "v", "default_queue_type": "lazy"}]}`, Options{},
			[]string{"vhosts[0].default_queue_type: lazy is not a valid queue type"}},
	}
	for _, tc := range cases {
		t.Run(tc.what, func(t *testing.T) {
			_, err := Decode([]byte(tc.doc), tc.opts)
			var de *Error
			if !errors.As(err, &de) {
				t.Fatalf("err = %v, want *definitions.Error", err)
			}
			if len(de.Problems) != len(tc.want) {
				t.Fatalf("problems = %v, want %d", de.Problems, len(tc.want))
			}
			for i, w := range tc.want {
				if got := de.Problems[i].String(); !strings.HasPrefix(got, w) {
					t.Errorf("problem %d = %q, want %q...", i, got, w)
				}
			}
		})
	}
}

func TestDecodeEmpty(t *testing.T) {
	for _, doc := range []string{"", "  \n", "\xef\xbb\xbf{}", "{}"} {
		d, err := Decode([]byte(doc), Options{})
		if err != nil || len(d.Queues) != 0 {
			t.Errorf("Decode(%q) = %+v, %v", doc, d, err)
		}
	}
}

func TestSkips(t *testing.T) {
	doc := `{
	  "some_plugin_key": 1,
	  "users": [{"name": "u", "password_hash": "", "tags": ""}],
	  "queues": [{"name": "amq.q", "vhost": "/", "durable": true, "auto_delete": false, "arguments": {}}],
	  "exchanges": [{"name": "", "vhost": "/", "type": "direct"}, {"name": "amq.direct", "vhost": "/", "type": "direct"}],
	  "bindings": [{"source": "", "vhost": "/", "destination": "q", "destination_type": "queue", "routing_key": "q", "arguments": {}}]
	}`
	d, err := Decode([]byte(doc), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Queues)+len(d.Exchanges)+len(d.Bindings) != 0 {
		t.Errorf("reserved objects were kept: %+v %+v %+v", d.Queues, d.Exchanges, d.Bindings)
	}
	want := []string{"bindings[0]", "exchanges[0]", "exchanges[1]", "queues[0]", "some_plugin_key"}
	if got := skippedPaths(d); !slices.Equal(got, want) {
		t.Errorf("skipped = %v, want %v", got, want)
	}
	// In a single-vhost document the cluster-wide lists are skipped whole.
	d, err = Decode([]byte(doc), Options{VHost: "v"})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Users) != 0 || !slices.Contains(skippedPaths(d), "users") {
		t.Errorf("users imported into a single vhost: %+v %v", d.Users, skippedPaths(d))
	}
}

func TestValidate(t *testing.T) {
	doc := `{
	  "users": [{"name": "new-user", "password_hash": "", "tags": []}],
	  "vhosts": [{"name": "new-vhost"}],
	  "permissions": [
	    {"user": "new-user", "vhost": "new-vhost", "configure": ".*", "write": ".*", "read": ".*"},
	    {"user": "old-user", "vhost": "old-vhost", "configure": ".*", "write": ".*", "read": ".*"},
	    {"user": "nobody", "vhost": "nowhere", "configure": ".*", "write": ".*", "read": ".*"}
	  ],
	  "topic_permissions": [{"user": "nobody", "vhost": "new-vhost", "exchange": "amq.topic", "write": ".*", "read": ".*"}],
	  "policies": [{"vhost": "nowhere", "name": "p", "pattern": ".*", "definition": {"max-length": 1}}],
	  "parameters": [{"vhost": "nowhere", "component": "operator_policy", "name": "o", "value": {"pattern": ".*", "definition": {"max-length": 1}}}],
	  "queues": [{"name": "q1", "vhost": "new-vhost"}, {"name": "q2", "vhost": "old-vhost"}, {"name": "q3", "vhost": "nowhere"}],
	  "exchanges": [{"name": "x", "vhost": "nowhere", "type": "direct"}],
	  "bindings": [{"source": "x", "vhost": "nowhere", "destination": "q3", "destination_type": "queue"}]
	}`
	d, err := Decode([]byte(doc), Options{})
	if err != nil {
		t.Fatal(err)
	}
	err = d.Validate(func(v string) bool { return v == "old-vhost" }, func(u string) bool { return u == "old-user" })
	var de *Error
	if !errors.As(err, &de) {
		t.Fatalf("Validate = %v", err)
	}
	var got []string
	for _, p := range de.Problems {
		got = append(got, p.String())
	}
	want := []string{
		"permissions[2]: vhost 'nowhere' does not exist and is not created by this file",
		"permissions[2]: user 'nobody' does not exist and is not created by this file",
		"topic_permissions[0]: user 'nobody' does not exist and is not created by this file",
		"policies[0]: vhost 'nowhere' does not exist and is not created by this file",
		"parameters[0]: vhost 'nowhere' does not exist and is not created by this file",
		"exchanges[0]: vhost 'nowhere' does not exist and is not created by this file",
		"queues[2]: vhost 'nowhere' does not exist and is not created by this file",
		"bindings[0]: vhost 'nowhere' does not exist and is not created by this file",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// Encoding a decoded document and decoding it again gives the same document, for both
// exports; the encoding is stable.
func TestEncodeRoundTrip(t *testing.T) {
	for _, name := range []string{"rabbitmq-3.10.8-export.json", "handwritten-4x-export.json"} {
		t.Run(name, func(t *testing.T) {
			d1, err := Decode(readFile(t, name), Options{})
			if err != nil {
				t.Fatal(err)
			}
			out1, err := Encode(d1)
			if err != nil {
				t.Fatal(err)
			}
			d2, err := Decode(out1, Options{})
			if err != nil {
				t.Fatalf("decoding our own export: %v\n%s", err, out1)
			}
			out2, err := Encode(d2)
			if err != nil {
				t.Fatal(err)
			}
			if string(out1) != string(out2) {
				t.Fatalf("the encoding changed on a round trip:\n%s\n---\n%s", out1, out2)
			}
			// Encode writes the algorithm a file without one implies; otherwise users are unchanged.
			for i := range d1.Users {
				d1.Users[i].HashingAlgorithm = d1.Users[i].Algorithm(d1.RabbitVersion)
			}
			for _, pair := range [][2]any{{d1.Users, d2.Users}, {d1.Policies, d2.Policies}, {d1.OperatorPolicies, d2.OperatorPolicies}} {
				if !reflect.DeepEqual(pair[0], pair[1]) {
					t.Errorf("round trip changed\n%+v\nto\n%+v", pair[0], pair[1])
				}
			}
			if len(d1.Queues) != len(d2.Queues) || len(d1.Bindings) != len(d2.Bindings) || len(d1.VHostLimits) != len(d2.VHostLimits) {
				t.Errorf("round trip changed the counts")
			}
			if strings.Contains(string(out1), `"password"`) {
				t.Errorf("an export carries a clear-text password field")
			}
		})
	}
}

func TestEncodeQueueType(t *testing.T) {
	d := &Definitions{Queues: []Queue{
		{Name: "qq", VHost: "v", Type: "quorum", Durable: true},
		{Name: "c", VHost: "v", Durable: true, Arguments: map[string]any{"x-max-length": int64(5)}},
	}}
	out, err := Encode(d)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Queues []struct {
			Name      string         `json:"name"`
			Type      string         `json:"type"`
			Arguments map[string]any `json:"arguments"`
		} `json:"queues"`
		Users []any `json:"users"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Queues[0].Arguments["x-queue-type"] != "quorum" || doc.Queues[1].Type != "classic" || doc.Queues[1].Arguments["x-queue-type"] != nil {
		t.Errorf("queues: %+v", doc.Queues)
	}
	if doc.Users == nil {
		t.Error("an empty list was encoded as null")
	}
}

func TestAlgorithm(t *testing.T) {
	cases := []struct {
		alg, version, want string
	}{
		{HashSHA512, "3.5.7", HashSHA512},
		{"", "3.5.7", HashMD5},
		{"", "3.0.4", HashMD5},
		{"", "3.6.0", HashSHA256},
		{"", "3.10.8", HashSHA256},
		{"", "", HashSHA256},
		{"", "4.1.0", HashSHA256},
	}
	for _, tc := range cases {
		if got := (User{HashingAlgorithm: tc.alg}).Algorithm(tc.version); got != tc.want {
			t.Errorf("Algorithm(%q) with %q = %s, want %s", tc.version, tc.alg, got, tc.want)
		}
	}
}

func TestTableConversion(t *testing.T) {
	var args map[string]any
	dec := json.NewDecoder(strings.NewReader(`{"x-max-length": 5, "x-ratio": 0.5, "x-dlx": "d", "x-flag": true, "x-list": [1, "a"], "x-nested": {"k": 2}, "x-none": null}`))
	dec.UseNumber()
	if err := dec.Decode(&args); err != nil {
		t.Fatal(err)
	}
	tab := Table(args)
	want := amqp.Table{"x-max-length": int64(5), "x-ratio": 0.5, "x-dlx": "d", "x-flag": true,
		"x-list": []any{int64(1), "a"}, "x-nested": amqp.Table{"k": int64(2)}, "x-none": nil}
	if !reflect.DeepEqual(tab, want) {
		t.Errorf("Table = %#v\nwant %#v", tab, want)
	}
	back := Arguments(amqp.Table{"b": []byte("bytes"), "t": time.Unix(1700000000, 0), "d": amqp.Decimal{Scale: 2, Value: 150}, "n": amqp.Table{"x": int32(1)}})
	wantBack := map[string]any{"b": "bytes", "t": int64(1700000000), "d": 1.5, "n": map[string]any{"x": int32(1)}}
	if !reflect.DeepEqual(back, wantBack) {
		t.Errorf("Arguments = %#v\nwant %#v", back, wantBack)
	}
}
