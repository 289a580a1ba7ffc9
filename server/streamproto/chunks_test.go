package streamproto_test

import (
	"testing"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/message"
)

// A batch published to an idle stream becomes more than one chunk (its first message is
// written at once), as in RabbitMQ: stream stats then report a last chunk id above 0.
func TestBatchAtIdleStreamMakesChunks(t *testing.T) {
	b := startBroker(t)
	e := env(t, b)
	name := declare(t, e, nil)
	p, err := e.NewProducer(name, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	msgs := make([]message.StreamMessage, 1000)
	for i := range msgs {
		msgs[i] = amqp.NewMessage([]byte("x"))
	}
	if err := p.BatchSend(msgs); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(waitFor)
	for {
		st, err := e.StreamStats(name)
		if err != nil {
			t.Fatal(err)
		}
		committed, _ := st.CommittedChunkId()
		last, _ := st.LastOffset()
		first, _ := st.FirstOffset()
		if committed > 0 && last > 0 && first == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("first %d, last chunk %d, committed chunk %d", first, last, committed)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
