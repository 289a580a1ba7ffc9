package server_test

import (
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestITStreamPermissions checks that streams and super streams obey the permission rules of
// other queues: configure to declare and delete (for a super stream, configure on the exchange
// and on every partition, plus queue.bind's rule for the bindings it makes), write to publish,
// read to consume, and read on every partition to join a consumer group.
//
//	configure ^cfg\.   write ^(w\.|cfg\.|amq\.default)   read ^(r\.|cfg\.)
func TestITStreamPermissions(t *testing.T) {
	a := startAdmin(t)
	vhost := a.vhost("streams")
	user := a.newUser("su", "secret")
	a.permit(user, vhost, `^cfg\.`, `^(w\.|cfg\.|amq\.default)`, `^(r\.|cfg\.)`)
	e := &permEnv{a: a, vhost: vhost, user: user, url: a.url(user, "secret", vhost)}

	// The administrator's objects: streams w.s (write only), r.s (read only), a super stream r.ss
	// whose partitions the user may read, and one, w.ss, whose name but not partitions the user may
	// read.
	ach := mustChannel(t, mustDial(t, a.url(a.user, a.pass, vhost)))
	for _, s := range []string{"w.s", "r.s"} {
		if _, err := ach.QueueDeclare(s, true, false, false, false, amqp.Table{"x-queue-type": "stream"}); err != nil {
			t.Fatal(err)
		}
	}
	for _, x := range []string{"r.ss", "w.ss"} {
		if err := ach.ExchangeDeclare(x, "x-super-stream", true, false, false, false, amqp.Table{"x-partitions": int64(2)}); err != nil {
			t.Fatal(err)
		}
	}
	// A super stream whose exchange the user may configure but whose partitions it may not.
	a.permit(user, vhost, `^(cfg\.|ok\.ss$)`, `^(w\.|cfg\.|amq\.default)`, `^(r\.|cfg\.|ok\.|w\.ss$)`)

	stream := amqp.Table{"x-queue-type": "stream"}
	c := mustDial(t, e.url)
	for _, tc := range []struct {
		name string
		op   func(ch *itChan) error
		code int
		text string
	}{
		{"stream declare needs configure", func(ch *itChan) error {
			_, err := ch.QueueDeclare("x.s", true, false, false, false, stream)
			return err
		},
			403, e.refused("queue", "x.s")},
		{"stream declare allowed", func(ch *itChan) error {
			_, err := ch.QueueDeclare("cfg.s", true, false, false, false, stream)
			return err
		}, 0, ""},
		{"stream delete needs configure", func(ch *itChan) error { _, err := ch.QueueDelete("r.s", false, false, false); return err },
			403, e.refused("queue", "r.s")},
		{"stream consume needs read", func(ch *itChan) error {
			if err := ch.Qos(10, 0, false); err != nil {
				return err
			}
			_, err := ch.Consume("w.s", "", false, false, false, false, nil)
			return err
		}, 403, e.refused("queue", "w.s")},
		{"stream consume allowed", func(ch *itChan) error {
			if err := ch.Qos(10, 0, false); err != nil {
				return err
			}
			_, err := ch.Consume("r.s", "", false, false, false, false, nil)
			return err
		}, 0, ""},
		{"consumer group on a stream needs read", func(ch *itChan) error {
			if err := ch.Qos(10, 0, false); err != nil {
				return err
			}
			_, err := ch.Consume("w.s", "", false, false, false, false, amqp.Table{"x-stream-consumer-group": "g"})
			return err
		}, 403, e.refused("queue", "w.s")},
		{"consumer group needs read on every partition", func(ch *itChan) error {
			if err := ch.Qos(10, 0, false); err != nil {
				return err
			}
			_, err := ch.Consume("r.ss", "", false, false, false, false, amqp.Table{"x-stream-consumer-group": "g"})
			return err
		}, 0, ""},
		{"consumer group refused on a super stream it may not read", func(ch *itChan) error {
			if err := ch.Qos(10, 0, false); err != nil {
				return err
			}
			_, err := ch.Consume("w.ss", "", false, false, false, false, amqp.Table{"x-stream-consumer-group": "g"})
			return err
		}, 403, e.refused("queue", "w.ss-0")},
		{"super stream declare needs configure on its partitions", func(ch *itChan) error {
			return ch.ExchangeDeclare("ok.ss", "x-super-stream", true, false, false, false, amqp.Table{"x-partitions": int64(2)})
		}, 403, e.refused("queue", "ok.ss-0")},
		{"super stream declare allowed", func(ch *itChan) error {
			return ch.ExchangeDeclare("cfg.ss", "x-super-stream", true, false, false, false, amqp.Table{"x-partitions": int64(3)})
		}, 0, ""},
		{"super stream delete needs configure on the exchange", func(ch *itChan) error { return ch.ExchangeDelete("r.ss", false, false) },
			403, e.refused("exchange", "r.ss")},
		{"super stream delete allowed", func(ch *itChan) error { return ch.ExchangeDelete("cfg.ss", false, false) }, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch := mustChannel(t, c)
			err := tc.op(ch)
			if tc.code == 0 {
				if err != nil {
					t.Fatalf("want it allowed, got %v", err)
				}
				if _, err := ch.QueueDeclarePassive("r.s", true, false, false, false, stream); err != nil {
					t.Fatalf("channel should still work: %v", err)
				}
				return
			}
			if err != nil {
				var ae *amqp.Error
				if !errors.As(err, &ae) {
					t.Fatalf("error %v, want %d", err, tc.code)
				}
			}
			expectChannelClosed(t, ch, tc.code, tc.text)
		})
	}
	// Nothing of the refused super stream was created; the deleted one left no partition.
	for _, q := range []string{"ok.ss-0", "ok.ss-1", "cfg.ss-0", "cfg.ss-2"} {
		ch := mustChannel(t, mustDial(t, a.url(a.user, a.pass, vhost)))
		if _, err := ch.QueueDeclarePassive(q, true, false, false, false, stream); err == nil {
			t.Errorf("queue %s exists", q)
		}
	}
	// Publishing to a stream needs write on the exchange (the default one here), as for any queue:
	// the user may write to amq.default, so a publish with confirms to w.s is stored.
	ch := mustChannel(t, c)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1))
	if err := ch.Publish("", "w.s", false, false, amqp.Publishing{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	select {
	case cf := <-confirms:
		if !cf.Ack {
			t.Fatal("publish to w.s nacked")
		}
	case <-time.After(waitFor):
		t.Fatal("no confirm for the publish to w.s")
	}
}
