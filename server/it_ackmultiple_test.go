package server_test

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestITAckMultipleUnknownTag: basic.ack multiple=true with a tag that is not outstanding is 406
// even when earlier tags are (RabbitMQ's collect_acks; Bunny's own suite checks it).
func TestITAckMultipleUnknownTag(t *testing.T) {
	url := startBroker(t)
	c := mustDial(t, url)
	ch := mustChannel(t, c)
	q := declareQueue(t, url, ch, "q", nil)
	publish(t, ch, "", q, amqp.Publishing{Body: []byte("x")})
	d := mustGet(t, ch, q, false)
	if err := ch.Ack(d.DeliveryTag+81, true); err != nil {
		t.Fatal(err)
	}
	expectChannelClosed(t, ch, amqp.PreconditionFailed, "PRECONDITION_FAILED - unknown delivery tag 82")
}
