package dlq

import (
	"errors"
	"reflect"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func death(queue, reason, exchange string, keys ...string) amqp.Table {
	ks := make([]any, len(keys))
	for i, k := range keys {
		ks[i] = k
	}
	return amqp.Table{"queue": queue, "reason": reason, "exchange": exchange, "routing-keys": ks, "count": int64(1)}
}

func TestOriginOf(t *testing.T) {
	tests := []struct {
		name    string
		headers amqp.Table
		want    origin
		wantErr error
	}{
		{
			name: "one death",
			headers: amqp.Table{
				"x-death":                []any{death("orders", "rejected", "shop", "new", "audit")},
				"x-first-death-queue":    "orders",
				"x-first-death-reason":   "rejected",
				"x-first-death-exchange": "shop",
			},
			want: origin{Reason: "rejected", Queue: "orders", Exchange: "shop", Keys: []string{"new", "audit"}},
		},
		{
			// x-death is newest first: the first death is the last element, and the
			// x-first-death-* headers name it directly.
			name: "two deaths, newest first",
			headers: amqp.Table{
				"x-death": []any{
					death("retry", "expired", "dlx", "new"),
					death("orders", "rejected", "shop", "new"),
				},
				"x-first-death-queue":    "orders",
				"x-first-death-reason":   "rejected",
				"x-first-death-exchange": "shop",
			},
			want: origin{Reason: "rejected", Queue: "orders", Exchange: "shop", Keys: []string{"new"}},
		},
		{
			name: "no x-first-death headers: last element",
			headers: amqp.Table{
				"x-death": []any{
					death("retry", "expired", "dlx", "k2"),
					death("orders", "maxlen", "", "orders"),
				},
			},
			want: origin{Reason: "maxlen", Queue: "orders", Exchange: "", Keys: []string{"orders"}},
		},
		{
			name: "x-first-death names an entry that is not there: last element",
			headers: amqp.Table{
				"x-death":                []any{death("b", "expired", "e2", "k2"), death("a", "rejected", "e1", "k1")},
				"x-first-death-queue":    "gone",
				"x-first-death-reason":   "rejected",
				"x-first-death-exchange": "e0",
			},
			want: origin{Reason: "rejected", Queue: "a", Exchange: "e1", Keys: []string{"k1"}},
		},
		{
			name:    "no x-death",
			headers: amqp.Table{"x-first-death-queue": "a"},
			wantErr: errNoDeath,
		},
		{
			name:    "nil headers",
			wantErr: errNoDeath,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := originOf(tt.headers)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("originOf: err %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("originOf: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("originOf = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestRepublishingSetsCC(t *testing.T) {
	d := &amqp.Delivery{
		Headers: amqp.Table{"CC": []any{"old"}, "x-death": []any{death("q", "rejected", "x", "a", "b")}, "app": "v",
			"x-delivery-count": int64(3)},
		DeliveryMode: 2,
		MessageId:    "m1",
		Timestamp:    time.Unix(1700000000, 0),
		Body:         []byte("body"),
	}
	p := republishing(d, target{Exchange: "x", Key: "a", CC: []string{"b"}})
	if !reflect.DeepEqual(p.Headers["CC"], []any{"b"}) {
		t.Errorf("CC = %v, want [b]", p.Headers["CC"])
	}
	if p.Headers["x-death"] == nil || p.Headers["app"] != "v" {
		t.Errorf("headers not kept: %v", p.Headers)
	}
	if _, ok := p.Headers["x-delivery-count"]; ok {
		t.Errorf("x-delivery-count kept: %v", p.Headers)
	}
	if p.DeliveryMode != 2 || p.MessageId != "m1" || string(p.Body) != "body" || !p.Timestamp.Equal(d.Timestamp) {
		t.Errorf("properties not kept: %+v", p)
	}
	p = republishing(d, target{Key: "other"})
	if _, ok := p.Headers["CC"]; ok {
		t.Errorf("CC kept for a single-key target: %v", p.Headers)
	}
	if _, ok := d.Headers["CC"]; !ok {
		t.Error("republishing changed the delivery's headers")
	}
}

func TestFingerprintSurvivesWidthChanges(t *testing.T) {
	p := amqp.Publishing{Headers: amqp.Table{"n": int64(5), "t": amqp.Table{"b": 1, "a": "x"}}, Body: []byte("b")}
	q := amqp.Publishing{Headers: amqp.Table{"n": int32(5), "t": amqp.Table{"a": "x", "b": int8(1)}}, Body: []byte("b")}
	if fingerprint("e", "k", p) != fingerprint("e", "k", q) {
		t.Error("fingerprints differ for equal values of different widths")
	}
	q.Body = []byte("c")
	if fingerprint("e", "k", p) == fingerprint("e", "k", q) {
		t.Error("fingerprints equal for different bodies")
	}
}

func TestTargetString(t *testing.T) {
	for _, tt := range []struct {
		t    target
		want string
	}{
		{target{Exchange: "shop", Key: "new"}, `exchange "shop", routing key "new"`},
		{target{Exchange: "shop", Key: "a", CC: []string{"b", "c"}}, `exchange "shop", routing keys "a", "b", "c"`},
		{target{Key: "orders"}, `default exchange, routing key "orders"`},
	} {
		if got := tt.t.String(); got != tt.want {
			t.Errorf("String() = %s, want %s", got, tt.want)
		}
	}
}
