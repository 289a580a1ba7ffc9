package amqp

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestFastAppendersMatchGenerated(t *testing.T) {
	long := strings.Repeat("r", 300)
	for _, rk := range []string{"", "rk", long} {
		for _, flag := range []bool{false, true} {
			check := func(name string, fast []byte, m Method) {
				t.Helper()
				if slow := AppendMethodFrame([]byte{0xee}, 9, m); !bytes.Equal(fast, slow) {
					t.Fatalf("%s:\nfast % x\nslow % x", name, fast, slow)
				}
			}
			check("deliver", AppendBasicDeliver([]byte{0xee}, 9, "ctag", 42, flag, "ex", rk),
				&BasicDeliver{ConsumerTag: "ctag", DeliveryTag: 42, Redelivered: flag, Exchange: "ex", RoutingKey: rk})
			check("ack", AppendBasicAck([]byte{0xee}, 9, 42, flag), &BasicAck{DeliveryTag: 42, Multiple: flag})
			check("nack", AppendBasicNack([]byte{0xee}, 9, 42, flag, !flag), &BasicNack{DeliveryTag: 42, Multiple: flag, Requeue: !flag})
			check("return", AppendBasicReturn([]byte{0xee}, 9, NoRoute, "NO_ROUTE", "ex", rk),
				&BasicReturn{ReplyCode: NoRoute, ReplyText: "NO_ROUTE", Exchange: "ex", RoutingKey: rk})
			check("get-ok", AppendBasicGetOk([]byte{0xee}, 9, 42, flag, "ex", rk, 7),
				&BasicGetOk{DeliveryTag: 42, Redelivered: flag, Exchange: "ex", RoutingKey: rk, MessageCount: 7})
		}
	}
}

func TestFastParsersMatchGenerated(t *testing.T) {
	for _, bits := range []struct{ a, b bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		pub := &BasicPublish{Exchange: "amq.topic", RoutingKey: "a.b.c", Mandatory: bits.a, Immediate: bits.b}
		args := pub.AppendArgs(nil)
		pa, err := ParseBasicPublish(args)
		if err != nil || string(pa.Exchange) != pub.Exchange || string(pa.RoutingKey) != pub.RoutingKey ||
			pa.Mandatory != pub.Mandatory || pa.Immediate != pub.Immediate {
			t.Fatalf("ParseBasicPublish = %+v, %v", pa, err)
		}
		for cut := 0; cut < len(args); cut++ {
			if _, err := ParseBasicPublish(args[:cut]); !errors.Is(err, ErrMalformed) {
				t.Fatalf("publish cut at %d: %v", cut, err)
			}
		}

		tag, m, err := ParseBasicAck((&BasicAck{DeliveryTag: 1 << 50, Multiple: bits.a}).AppendArgs(nil))
		if err != nil || tag != 1<<50 || m != bits.a {
			t.Fatalf("ParseBasicAck = %d %v %v", tag, m, err)
		}
		tag, m, rq, err := ParseBasicNack((&BasicNack{DeliveryTag: 3, Multiple: bits.a, Requeue: bits.b}).AppendArgs(nil))
		if err != nil || tag != 3 || m != bits.a || rq != bits.b {
			t.Fatalf("ParseBasicNack = %d %v %v %v", tag, m, rq, err)
		}
		tag, rq, err = ParseBasicReject((&BasicReject{DeliveryTag: 4, Requeue: bits.b}).AppendArgs(nil))
		if err != nil || tag != 4 || rq != bits.b {
			t.Fatalf("ParseBasicReject = %d %v %v", tag, rq, err)
		}
	}
	for cut := 0; cut < 9; cut++ {
		b := make([]byte, cut)
		if _, _, err := ParseBasicAck(b); !errors.Is(err, ErrMalformed) {
			t.Fatalf("ack of %d bytes: %v", cut, err)
		}
		if _, _, _, err := ParseBasicNack(b); !errors.Is(err, ErrMalformed) {
			t.Fatalf("nack of %d bytes: %v", cut, err)
		}
		if _, _, err := ParseBasicReject(b); !errors.Is(err, ErrMalformed) {
			t.Fatalf("reject of %d bytes: %v", cut, err)
		}
	}
}

func TestParseBasicPublishAliases(t *testing.T) {
	args := (&BasicPublish{Exchange: "e", RoutingKey: "k"}).AppendArgs(nil)
	pa, err := ParseBasicPublish(args)
	if err != nil {
		t.Fatal(err)
	}
	args[3] = 'E'
	if string(pa.Exchange) != "E" {
		t.Fatal("Exchange does not alias the arguments")
	}
	if cap(pa.Exchange) != 1 {
		t.Fatal("Exchange capacity reaches into the routing key")
	}
}
