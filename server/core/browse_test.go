package core

import (
	"errors"
	"reflect"
	"testing"

	"warren/amqp"
	"warren/server/queue"
)

func deathEntry(q, reason, ex string, keys ...any) amqp.Table {
	return amqp.Table{"queue": q, "reason": reason, "exchange": ex, "routing-keys": keys, "count": int64(1)}
}

// TestFirstDeath reads the first death as RabbitMQ records it (x-death newest first, the
// x-first-death-* headers naming it), with the broker's own value types ([]byte long strings
// included).
func TestFirstDeath(t *testing.T) {
	tests := []struct {
		name    string
		h       amqp.Table
		want    DeathOrigin
		wantErr bool
	}{
		{"named by x-first-death", amqp.Table{
			"x-death":                []any{deathEntry("retry", "expired", "dlx", "k"), deathEntry("orders", "rejected", "shop", "new", "audit")},
			"x-first-death-queue":    "orders",
			"x-first-death-reason":   "rejected",
			"x-first-death-exchange": "shop",
		}, DeathOrigin{Reason: "rejected", Queue: "orders", Exchange: "shop", Keys: []string{"new", "audit"}}, false},
		{"byte strings, no x-first-death: the oldest entry", amqp.Table{
			"x-death": []any{deathEntry("retry", "expired", "dlx", "k"), deathEntry("orders", "maxlen", "", []byte("orders"))},
		}, DeathOrigin{Reason: "maxlen", Queue: "orders", Keys: []string{"orders"}}, false},
		{"empty routing key kept", amqp.Table{"x-death": []any{deathEntry("q", "rejected", "", "")}},
			DeathOrigin{Reason: "rejected", Queue: "q", Keys: []string{""}}, false},
		{"no routing keys", amqp.Table{"x-death": []any{deathEntry("q", "rejected", "")}}, DeathOrigin{}, true},
		{"no x-death", amqp.Table{"x-first-death-queue": "q"}, DeathOrigin{}, true},
		{"x-death of the wrong type", amqp.Table{"x-death": "nope"}, DeathOrigin{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := FirstDeath(tt.h)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("FirstDeath = %+v, want an error", got)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("FirstDeath = %+v, %v, want %+v", got, err, tt.want)
			}
		})
	}
	if _, err := FirstDeath(nil); !errors.Is(err, ErrNoDeath) {
		t.Fatalf("FirstDeath(nil): %v", err)
	}
}

// TestRedriven builds the republished message: original exchange and keys (CC for the others),
// or the source queue, every header kept but CC, BCC and the delivery headers.
func TestRedriven(t *testing.T) {
	p := amqp.Properties{DeliveryMode: 2, Priority: 3, MessageID: "m-1", Headers: amqp.Table{
		"x-death":              []any{deathEntry("orders", "rejected", "shop", "new", "audit")},
		"x-first-death-queue":  "orders",
		"x-first-death-reason": "rejected",
		"CC":                   []any{"stale"}, "BCC": []any{"hidden"}, "x-delivery-count": int64(2), "app": "kept",
	}}
	m := &queue.Message{Exchange: "dlx", RoutingKey: "new", Props: p.Append(nil), Body: []byte("body")}
	out, headers, err := redriven(m, false)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := amqp.DecodeProperties(out.Props)
	if out.Exchange != "shop" || out.RoutingKey != "new" || !out.Persistent || out.Priority != 3 || string(out.Body) != "body" ||
		got.MessageID != "m-1" || got.Headers["app"] != "kept" || got.Headers["x-death"] == nil ||
		got.Headers["BCC"] != nil || got.Headers["x-delivery-count"] != nil ||
		!reflect.DeepEqual(headers["CC"], []any{"audit"}) || !reflect.DeepEqual(got.Headers["CC"], []any{"audit"}) {
		t.Fatalf("redriven: %+v, properties %+v, routing headers %v", out, got, headers)
	}
	out, headers, err = redriven(m, true)
	if err != nil || out.Exchange != "" || out.RoutingKey != "orders" || headers["CC"] != nil {
		t.Fatalf("redriven to the source queue: %+v %v %v", out, headers, err)
	}
	if _, _, err := redriven(&queue.Message{Props: []byte{0xff}}, false); err == nil {
		t.Fatal("redriven of unreadable properties: no error")
	}
}
