package httpapi

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
	"time"

	"warren/amqp"
	"warren/server"
	"warren/server/core"
	"warren/server/queue"
	"warren/server/stats"
)

// TestMarshalJSONMatchesEncodingJSON: the API's encoder writes what encoding/json writes for
// every shape the handlers build, and for shapes it hands on.
func TestMarshalJSONMatchesEncodingJSON(t *testing.T) {
	type named map[string]any
	for _, v := range []any{
		nil, "", "plain", `quote " backslash \ slash /`, "<html> & </html>", "tab\tnew\nline\x00",
		"caf\u00e9", "line\u2028sep\u2029", "bad \xff utf8", true, false,
		0, -1, int64(math.MinInt64), int32(7), int16(-3), int8(9), uint(3), uint64(math.MaxUint64), uint32(4), uint16(65535), uint8(5),
		0.0, -0.0, 1.5, 1e-7, 1e-6, 123456789.125, 1e20, 1e21, 1e100, -2.5e-10, math.SmallestNonzeroFloat64, math.MaxFloat64,
		float32(0.1), map[string]any(nil), map[string]any{}, []any(nil), []any{}, []string(nil), []string{"a", "<b>"},
		[]map[string]any(nil), []map[string]any{{}, nil, {"k": 1}},
		map[string]string{"b": "2", "a": "<1>"}, map[string]string(nil),
		map[string]any{"z": 1, "a": map[string]any{"y": []any{1, "x", nil, map[string]any{"q": 0.5}}, "b": nil}, "m": []string{}},
		named{"b": 1, "a": 2}, json.RawMessage(`{ "raw" : true }`), time.Unix(0, 0).UTC(), []int{1, 2},
		struct {
			A int `json:"a"`
		}{3},
		map[string]any{"nested": map[string]any{"k1": map[string]any{"k2": map[string]any{"k3": "deep"}}, "k0": 1}, "a": []map[string]any{{"x": 1}}},
	} {
		want, werr := json.Marshal(v)
		got, gerr := marshalJSON(v)
		if (werr != nil) != (gerr != nil) || !bytes.Equal(got, want) {
			t.Errorf("%#v: got %s (%v), want %s (%v)", v, got, gerr, want, werr)
		}
	}
	for _, bad := range []any{math.NaN(), math.Inf(1), map[string]any{"r": math.Inf(-1)}, []any{make(chan int)}} {
		if _, err := marshalJSON(bad); err == nil {
			t.Errorf("%#v: no error", bad)
		}
	}
}

// FuzzMarshalJSON compares the encoder with encoding/json on maps of arbitrary strings and
// float bits.
func FuzzMarshalJSON(f *testing.F) {
	f.Add("key", "value", uint64(0), int64(1))
	f.Add("<", "\xff\u2028", math.Float64bits(1e-7), int64(-5))
	f.Fuzz(func(t *testing.T, k, s string, bits uint64, n int64) {
		fl := math.Float64frombits(bits)
		v := map[string]any{k: s, "f": fl, "n": n, "l": []any{s, fl, map[string]any{s: k}}, "ss": []string{k, s}, "ms": map[string]string{s: k}}
		want, werr := json.Marshal(v)
		got, gerr := marshalJSON(v)
		if (werr != nil) != (gerr != nil) || !bytes.Equal(got, want) {
			t.Fatalf("got %s (%v), want %s (%v)", got, gerr, want, werr)
		}
	})
}

// asMap is o as the map encoding/json would write the same way.
func asMap(v any) any {
	switch v := v.(type) {
	case object:
		m := make(map[string]any, len(v))
		for _, f := range v {
			if _, dup := m[f.key]; dup {
				panic("duplicate key " + f.key)
			}
			m[f.key] = asMap(f.val)
		}
		return m
	case rateDetail:
		return map[string]any{"rate": float64(v)}
	case map[string]any:
		if v == nil {
			return v
		}
		m := make(map[string]any, len(v))
		for k, x := range v {
			m[k] = asMap(x)
		}
		return m
	}
	return v
}

// TestQueueObjectIsAMap: a queue's object (classic, stream, quorum with members) writes what
// the same fields in a map write: its keys are sorted and each appears once.
func TestQueueObjectIsAMap(t *testing.T) {
	var traffic stats.Snapshot
	for k := range traffic.Totals {
		traffic.Totals[k] = uint64(k) * 3
		traffic.Rates[k] = float64(k) / 4
	}
	for _, q := range []server.QueueInfo{
		{Name: "c", VHost: "/", Type: "classic", Durable: true, Arguments: amqp.Table{"x-max-length": int32(5)}, Ready: 3, Unacked: 1, Consumers: 2, Traffic: traffic},
		{Name: "s", VHost: "v", Type: "stream", Stats: queue.Stats{Messages: 7, FirstOffset: 1, LastOffset: 8, Segments: 2, Bytes: 99}, Policy: "p",
			EffectivePolicyDefinition: map[string]any{"max-age": "1D"}},
		{Name: "q", VHost: "/", Type: "quorum", Members: &core.QueueMembers{Leader: "n2", Members: []string{"n1", "n2"}, Online: []string{"n2"}}},
		{Name: "q0", VHost: "/", Type: "quorum", Members: &core.QueueMembers{}},
	} {
		o := queueObject(q, "n1")
		want, err := json.Marshal(asMap(o))
		if err != nil {
			t.Fatal(err)
		}
		got, err := marshalJSON(o)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: got %s (%v)\nwant %s", q.Name, got, err, want)
		}
		if viaStd, err := json.Marshal(o); err != nil || !bytes.Equal(viaStd, want) {
			t.Errorf("%s: encoding/json wrote %s (%v)", q.Name, viaStd, err)
		}
		if m := asMap(o).(map[string]any); q.Members != nil && q.Members.Leader != "" && m["node"] != q.Members.Leader {
			t.Errorf("%s: node %v, want the leader", q.Name, m["node"])
		}
	}
}
