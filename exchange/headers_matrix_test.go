package exchange

import (
	"slices"
	"strings"
	"testing"

	"warren/amqp"
)

// The headers matrix was recorded on RabbitMQ 3.10.8: each binding below
// bound its own queue to a headers exchange, then one message was published
// with each header table; each row lists the bindings whose queue received
// it.
var headerBindings = []struct {
	name string
	args amqp.Table
}{
	{"all-only", amqp.Table{"x-match": "all"}},
	{"any-only", amqp.Table{"x-match": "any"}},
	{"empty", amqp.Table{}},
	{"a1-default", amqp.Table{"a": int32(1)}},
	{"all-a1-bx", amqp.Table{"x-match": "all", "a": int32(1), "b": "x"}},
	{"any-a1-bx", amqp.Table{"x-match": "any", "a": int32(1), "b": "x"}},
	{"all-avoid", amqp.Table{"x-match": "all", "a": nil}},
	{"any-avoid-cz", amqp.Table{"x-match": "any", "a": nil, "c": "z"}},
	{"all-xfoo", amqp.Table{"x-match": "all", "x-foo": "bar"}},
	{"allx-xfoo", amqp.Table{"x-match": "all-with-x", "x-foo": "bar"}},
	{"any-xfoo", amqp.Table{"x-match": "any", "x-foo": "bar"}},
	{"anyx-xfoo", amqp.Table{"x-match": "any-with-x", "x-foo": "bar"}},
	{"allx-a1", amqp.Table{"x-match": "all-with-x", "a": int32(1)}},
	{"anyx-a1", amqp.Table{"x-match": "any-with-x", "a": int32(1)}},
	{"allx-only", amqp.Table{"x-match": "all-with-x"}},
	{"anyx-only", amqp.Table{"x-match": "any-with-x"}},
	{"all-a1long", amqp.Table{"x-match": "all", "a": int64(1)}},
	{"all-astr1", amqp.Table{"x-match": "all", "a": "1"}},
	{"all-atrue", amqp.Table{"x-match": "all", "a": true}},
	{"all-afloat1", amqp.Table{"x-match": "all", "a": float64(1)}},
	{"all-bbytesx", amqp.Table{"x-match": "all", "b": []byte("x")}},
	{"all-tnested32", amqp.Table{"x-match": "all", "t": amqp.Table{"n": int32(1)}}},
	{"all-arr32", amqp.Table{"x-match": "all", "arr": []any{int32(1)}}},
	{"any-a1-xfoo", amqp.Table{"x-match": "any", "a": int32(1), "x-foo": "bar"}},
	{"anyx-a2-xfoo", amqp.Table{"x-match": "any-with-x", "a": int32(2), "x-foo": "bar"}},
	{"allx-a1-xfoo", amqp.Table{"x-match": "all-with-x", "a": int32(1), "x-foo": "bar"}},
	{"all-a1-xfoo", amqp.Table{"x-match": "all", "a": int32(1), "x-foo": "bar"}},
	{"all-abyte1", amqp.Table{"x-match": "all", "a": uint8(1)}},
	{"all-a0", amqp.Table{"x-match": "all", "a": int32(0)}},
	{"all-afalse", amqp.Table{"x-match": "all", "a": false}},
}

var headerMessages = map[string]amqp.Table{
	"nil":        nil,
	"empty":      {},
	"a1":         {"a": int32(1)},
	"a1long":     {"a": int64(1)},
	"a1int8":     {"a": int8(1)},
	"a1u16":      {"a": uint16(1)},
	"astr1":      {"a": "1"},
	"afloat1":    {"a": float64(1)},
	"afloat32_1": {"a": float32(1)},
	"a1-bx":      {"a": int32(1), "b": "x"},
	"a2-bx":      {"a": int32(2), "b": "x"},
	"bx":         {"b": "x"},
	"avoid":      {"a": nil},
	"xfoo":       {"x-foo": "bar"},
	"xfoo-a1":    {"x-foo": "bar", "a": int32(1)},
	"xmatch-a1":  {"x-match": "all-with-x", "a": int32(1)},
	"atrue":      {"a": true},
	"abytes1":    {"a": []byte("1")},
	"bbytesx-a1": {"b": []byte("x"), "a": int32(1)},
	"tnested64":  {"t": amqp.Table{"n": int64(1)}},
	"tnested32":  {"t": amqp.Table{"n": int32(1)}},
	"arr64":      {"arr": []any{int64(1)}},
	"arr32":      {"arr": []any{int32(1)}},
	"cz":         {"c": "z"},
	"a0":         {"a": int32(0)},
	"afalse":     {"a": false},
	"xfoo-other": {"x-foo": "other"},
	"xfoo-a2":    {"x-foo": "bar", "a": int32(2)},
}

var headersMatrix = []struct{ msg, want string }{
	{"nil", "all-only all-xfoo allx-only empty"},
	{"empty", "all-only all-xfoo allx-only empty"},
	{"a1", "a1-default all-a1-xfoo all-a1long all-abyte1 all-afloat1 all-avoid all-only all-xfoo allx-a1 allx-only any-a1-bx any-a1-xfoo any-avoid-cz anyx-a1 empty"},
	{"a1long", "a1-default all-a1-xfoo all-a1long all-abyte1 all-afloat1 all-avoid all-only all-xfoo allx-a1 allx-only any-a1-bx any-a1-xfoo any-avoid-cz anyx-a1 empty"},
	{"a1int8", "a1-default all-a1-xfoo all-a1long all-abyte1 all-afloat1 all-avoid all-only all-xfoo allx-a1 allx-only any-a1-bx any-a1-xfoo any-avoid-cz anyx-a1 empty"},
	{"a1u16", "a1-default all-a1-xfoo all-a1long all-abyte1 all-afloat1 all-avoid all-only all-xfoo allx-a1 allx-only any-a1-bx any-a1-xfoo any-avoid-cz anyx-a1 empty"},
	{"astr1", "all-astr1 all-avoid all-only all-xfoo allx-only any-avoid-cz empty"},
	{"afloat1", "a1-default all-a1-xfoo all-a1long all-abyte1 all-afloat1 all-avoid all-only all-xfoo allx-a1 allx-only any-a1-bx any-a1-xfoo any-avoid-cz anyx-a1 empty"},
	{"afloat32_1", "a1-default all-a1-xfoo all-a1long all-abyte1 all-afloat1 all-avoid all-only all-xfoo allx-a1 allx-only any-a1-bx any-a1-xfoo any-avoid-cz anyx-a1 empty"},
	{"a1-bx", "a1-default all-a1-bx all-a1-xfoo all-a1long all-abyte1 all-afloat1 all-avoid all-bbytesx all-only all-xfoo allx-a1 allx-only any-a1-bx any-a1-xfoo any-avoid-cz anyx-a1 empty"},
	{"a2-bx", "all-avoid all-bbytesx all-only all-xfoo allx-only any-a1-bx any-avoid-cz anyx-a2-xfoo empty"},
	{"bx", "all-bbytesx all-only all-xfoo allx-only any-a1-bx empty"},
	{"avoid", "all-avoid all-only all-xfoo allx-only any-avoid-cz empty"},
	{"xfoo", "all-only all-xfoo allx-only allx-xfoo anyx-a2-xfoo anyx-xfoo empty"},
	{"xfoo-a1", "a1-default all-a1-xfoo all-a1long all-abyte1 all-afloat1 all-avoid all-only all-xfoo allx-a1 allx-a1-xfoo allx-only allx-xfoo any-a1-bx any-a1-xfoo any-avoid-cz anyx-a1 anyx-a2-xfoo anyx-xfoo empty"},
	{"xmatch-a1", "a1-default all-a1-xfoo all-a1long all-abyte1 all-afloat1 all-avoid all-only all-xfoo allx-a1 allx-only any-a1-bx any-a1-xfoo any-avoid-cz anyx-a1 empty"},
	{"atrue", "all-atrue all-avoid all-only all-xfoo allx-only any-avoid-cz empty"},
	{"abytes1", "all-astr1 all-avoid all-only all-xfoo allx-only any-avoid-cz empty"},
	{"bbytesx-a1", "a1-default all-a1-bx all-a1-xfoo all-a1long all-abyte1 all-afloat1 all-avoid all-bbytesx all-only all-xfoo allx-a1 allx-only any-a1-bx any-a1-xfoo any-avoid-cz anyx-a1 empty"},
	{"tnested64", "all-only all-xfoo allx-only empty"},
	{"tnested32", "all-only all-tnested32 all-xfoo allx-only empty"},
	{"arr64", "all-only all-xfoo allx-only empty"},
	{"arr32", "all-arr32 all-only all-xfoo allx-only empty"},
	{"cz", "all-only all-xfoo allx-only any-avoid-cz empty"},
	{"a0", "all-a0 all-avoid all-only all-xfoo allx-only any-avoid-cz empty"},
	{"afalse", "all-afalse all-avoid all-only all-xfoo allx-only any-avoid-cz empty"},
	{"xfoo-other", "all-only all-xfoo allx-only empty"},
	{"xfoo-a2", "all-avoid all-only all-xfoo allx-only allx-xfoo any-avoid-cz anyx-a2-xfoo anyx-xfoo empty"},
}

func TestHeadersMatrixMatchesRabbitMQ(t *testing.T) {
	r := NewRegistry("/")
	mustDeclare(t, r, "h", "headers")
	for _, b := range headerBindings {
		mustBind(t, r, Binding{Source: "h", Dest: b.name, DestKind: ToQueue, Args: b.args})
	}
	for _, tc := range headersMatrix {
		t.Run(tc.msg, func(t *testing.T) {
			h, ok := headerMessages[tc.msg]
			if !ok {
				t.Fatalf("no message %q", tc.msg)
			}
			got, _ := r.Route(nil, "h", "ignored", []string{"cc"}, h, nil)
			want := strings.Fields(tc.want)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("headers %v matched %q, RabbitMQ matched %q", h, got, want)
			}
		})
	}
}
