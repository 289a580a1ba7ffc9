package server_test

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A consumer that stops reading while deliveries trickle in, each after a quiet gap (so each
// is first written inline, without waiting, by the publisher's goroutine), fills its socket:
// one inline write then goes through only in part and the writer goroutine has to send the
// rest. Once the consumer reads again it must get every message whole and in order.
func TestITDeliveriesSurviveAFullSocket(t *testing.T) {
	u := startBroker(t)
	ch := mustChannel(t, mustDial(t, u))
	q := declareQueue(t, u, ch, "full-socket", nil)

	r := rawDial(t, u)
	r.open("guest", "guest")
	var consume rawBuf
	consume.u16(0).short(q).short("slow").u8(2).table(nil) // no-ack
	r.send(1, 60, 20, &consume)
	r.expect(60, 21)

	// 300 x 60 KB is more than loopback TCP buffers hold (a few MB each way), so the socket
	// fills while the raw consumer reads nothing.
	const n, size = 300, 60_000
	for i := 0; i < n; i++ {
		body := bytes.Repeat([]byte{byte(i)}, size)
		binary.BigEndian.PutUint32(body, uint32(i))
		publish(t, ch, "", q, amqp.Publishing{Body: body})
		time.Sleep(200 * time.Microsecond) // a quiet gap, so the next delivery is tried inline
	}

	_ = r.c.SetDeadline(time.Now().Add(4 * waitFor))
	for i := 0; i < n; i++ {
		r.expect(60, 60) // basic.deliver
		h, err := r.read()
		if err != nil || h.typ != 2 || len(h.args) < 12 {
			t.Fatalf("message %d: want a content header, got type %d (%v)", i, h.typ, err)
		}
		want := binary.BigEndian.Uint64(h.args[4:12])
		var body []byte
		for uint64(len(body)) < want {
			f, err := r.read()
			if err != nil || f.typ != 3 {
				t.Fatalf("message %d: want a body frame after %d of %d bytes, got type %d (%v)", i, len(body), want, f.typ, err)
			}
			body = append(body, f.args...)
		}
		if len(body) != size || binary.BigEndian.Uint32(body) != uint32(i) ||
			!bytes.Equal(body[4:], bytes.Repeat([]byte{byte(i)}, size-4)) {
			t.Fatalf("message %d: got %d bytes starting with sequence %d, want %d bytes of message %d",
				i, len(body), binary.BigEndian.Uint32(body), size, i)
		}
	}
}
