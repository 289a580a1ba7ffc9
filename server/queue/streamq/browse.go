package streamq

import (
	"warren/amqp"
	"warren/server/queue"
	"warren/stream"
)

// Peek implements queue.Browser: the first n committed records of this node's copy of the log,
// from its first offset. Reading a stream never changes it; the records carry x-stream-offset as
// a consumer's deliveries do.
func (q *Queue) Peek(n int) ([]queue.Delivery, error) { return q.PeekFrom(q.log.First(), n) }

// PeekFrom implements queue.OffsetBrowser: up to n committed records from offset from (clamped to
// the first offset still stored).
func (q *Queue) PeekFrom(from uint64, n int) ([]queue.Delivery, error) {
	q.mu.Lock()
	closed := q.closed
	q.mu.Unlock()
	if closed {
		return nil, queue.ErrGone
	}
	if n <= 0 {
		return nil, nil
	}
	entries, err := q.log.Read(nil, from, n)
	if err != nil {
		return nil, err
	}
	out := make([]queue.Delivery, 0, len(entries))
	for i := range entries {
		e := &entries[i]
		out = append(out, deliveryOf(e))
	}
	return out, nil
}

// deliveryOf is a record as a delivery: its offset as ID and in x-stream-offset.
func deliveryOf(e *stream.Entry) queue.Delivery {
	props := amqp.WithHeader(e.Props, "x-stream-offset", int64(e.Offset))
	return queue.Delivery{ID: e.Offset, Msg: &queue.Message{Exchange: e.Exchange, RoutingKey: e.RoutingKey, Props: props, Body: e.Body}}
}
