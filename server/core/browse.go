package core

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"warren/amqp"
	"warren/server/queue"
	"warren/server/stats"
)

// This file is what the management API does to look into a queue without changing it (browse)
// and to move selected dead letters back where they came from (redrive).

// ErrNotBrowsable is Browse's error for a queue type that cannot be read without taking messages.
var ErrNotBrowsable = errors.New("queue type cannot be browsed")

// Browse returns up to n ready messages of q in delivery order without taking them: no delivery
// count, redelivered flag or order changes (queue.Browser). For a stream, from (if not nil) is the
// first offset to read; otherwise reading starts at the stream's first offset.
func (q *Queue) Browse(n int, from *uint64) ([]queue.Delivery, error) {
	if from != nil {
		if ob, ok := q.Queue.(queue.OffsetBrowser); ok {
			return ob.PeekFrom(*from, n)
		}
	}
	b, ok := q.Queue.(queue.Browser)
	if !ok {
		return nil, fmt.Errorf("queue '%s' (%s): %w", q.name, q.kind, ErrNotBrowsable)
	}
	return b.Peek(n)
}

// DeathOrigin is where a dead-lettered message first died, read from its x-death history: the
// rule `warren dlq redrive` follows over AMQP, on the broker's own tables.
type DeathOrigin struct {
	Reason   string   // why it first died: rejected, expired, maxlen, delivery_limit
	Queue    string   // the queue it first died in
	Exchange string   // the exchange it had been published to before that death
	Keys     []string // the routing keys it had been published with (routing key, then CC)
}

// ErrNoDeath says a message carries no usable x-death history.
var ErrNoDeath = errors.New("no x-death header")

// RedriveDropsHeader reports whether a redriven message loses header k: CC and BCC (set again
// from the target), and the delivery headers x-delivery-count and x-acquired-count, which a
// broker adds to deliveries from the dead-letter queue, not to the message.
func RedriveDropsHeader(k string) bool {
	switch k {
	case "CC", "BCC", "x-delivery-count", "x-acquired-count":
		return true
	}
	return false
}

// FirstDeath reads a message's first death from its headers. RabbitMQ keeps x-death newest first,
// one entry per {queue, reason}, and names the first death in x-first-death-queue, -reason and
// -exchange; the entry with that queue and reason gives the routing keys. Without those headers
// (or a matching entry) the last element of x-death, the oldest death, is used.
func FirstDeath(h amqp.Table) (DeathOrigin, error) {
	raw, _ := h["x-death"].([]any)
	var deaths []amqp.Table
	for _, d := range raw {
		if t, ok := d.(amqp.Table); ok {
			deaths = append(deaths, t)
		}
	}
	if len(deaths) == 0 {
		return DeathOrigin{}, ErrNoDeath
	}
	str := func(v any) string {
		switch s := v.(type) {
		case string:
			return s
		case []byte:
			return string(s)
		}
		return ""
	}
	firstQueue, firstReason := str(h["x-first-death-queue"]), str(h["x-first-death-reason"])
	var entry amqp.Table
	if firstQueue != "" && firstReason != "" {
		for _, d := range deaths {
			if str(d["queue"]) == firstQueue && str(d["reason"]) == firstReason {
				entry = d
				break
			}
		}
	}
	var o DeathOrigin
	if entry != nil {
		o.Queue, o.Reason = firstQueue, firstReason
		if x, ok := h["x-first-death-exchange"]; ok {
			o.Exchange = str(x)
		} else {
			o.Exchange = str(entry["exchange"])
		}
	} else {
		entry = deaths[len(deaths)-1]
		o.Queue, o.Reason, o.Exchange = str(entry["queue"]), str(entry["reason"]), str(entry["exchange"])
	}
	keys, _ := entry["routing-keys"].([]any)
	for _, k := range keys {
		switch k.(type) {
		case string, []byte:
			o.Keys = append(o.Keys, str(k))
		}
	}
	if len(o.Keys) == 0 {
		return o, fmt.Errorf("x-death entry for queue %q has no routing-keys", o.Queue)
	}
	return o, nil
}

// RedriveOptions say where Redrive sends messages and what the caller may publish to.
type RedriveOptions struct {
	// ToSourceQueue sends each message to the queue it first died in (through the default
	// exchange) instead of its original exchange and routing keys, which reach every queue bound
	// to them.
	ToSourceQueue bool
	// Allow checks that the caller may publish to an exchange ("" is the default exchange); nil
	// allows all.
	Allow func(exchange string) error
}

// RedriveOutcome is what happened to one message of a Redrive.
type RedriveOutcome struct {
	ID       uint64
	Exchange string   // where it was (or would have been) published
	Keys     []string // routing key, then CC keys
	Moved    bool
	Err      error // why it stays in the dead-letter queue
}

// Redrive moves the ready messages ids of the dead-letter queue q, in the order given, back to
// where they first died (their x-death history; see FirstDeath and RedriveOptions). Each message
// is taken from q as basic.get takes one (so no consumer gets it meanwhile), republished with
// every property and header (x-death included; CC set to its further keys, BCC and the delivery
// headers x-delivery-count and x-acquired-count dropped), and acknowledged in q only once every
// queue it was routed to has it as safe as its type promises (a publisher confirm). A message
// that is not ready, cannot be planned, routes nowhere or is refused stays in q: returned there
// (then redelivered) if it had been taken. The other messages of q are not touched.
func (q *Queue) Redrive(ctx context.Context, ids []uint64, opts RedriveOptions) ([]RedriveOutcome, error) {
	taker, ok := q.Queue.(queue.Taker)
	if !ok {
		return nil, fmt.Errorf("queue '%s' (%s): cannot take single messages", q.name, q.kind)
	}
	out := make([]RedriveOutcome, 0, len(ids))
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return out, fmt.Errorf("redrive interrupted: %w", err)
		}
		out = append(out, q.redriveOne(ctx, taker, id, opts))
	}
	return out, nil
}

func (q *Queue) redriveOne(ctx context.Context, taker queue.Taker, id uint64, opts RedriveOptions) RedriveOutcome {
	res := RedriveOutcome{ID: id}
	d, ok, err := taker.GetID(id)
	if err != nil {
		res.Err = fmt.Errorf("take message %d: %w", id, err)
		return res
	}
	if !ok {
		res.Err = fmt.Errorf("message %d is not ready in queue '%s' (delivered, moved or gone)", id, q.name)
		return res
	}
	q.counters.Inc(stats.GetAck)
	msg, headers, err := redriven(d.Msg, opts.ToSourceQueue)
	if err == nil && opts.Allow != nil {
		err = opts.Allow(msg.Exchange)
	}
	if msg != nil {
		res.Exchange, res.Keys = msg.Exchange, append([]string{msg.RoutingKey}, keysOf(headers)...)
	}
	if err == nil {
		var routed bool
		routed, err = q.vhost.publish(ctx, msg, headers)
		if err == nil && !routed {
			err = fmt.Errorf("unroutable: %s routes it to no queue", describeTarget(res.Exchange, res.Keys))
		}
	}
	op := queue.SettleAck
	if err != nil {
		op = queue.SettleRequeue
		res.Err = err
	}
	if serr := q.Settle(0, op, []queue.Tag{d.Tag()}); serr != nil {
		if err == nil {
			// Published and confirmed, but still in the dead-letter queue: at least once.
			res.Err = fmt.Errorf("republished, but acknowledging it in queue '%s' failed (it may be there twice): %w", q.name, serr)
			return res
		}
		res.Err = fmt.Errorf("%w; returning it to queue '%s' failed too: %v", err, q.name, serr)
		return res
	}
	if err == nil {
		q.counters.Inc(stats.Acknowledged)
		res.Moved = true
	}
	return res
}

// redriven is the message Redrive publishes for dead letter m, and the headers it routes with.
func redriven(m *queue.Message, toSourceQueue bool) (*queue.Message, amqp.Table, error) {
	props, err := amqp.DecodeProperties(m.Props)
	if err != nil {
		return nil, nil, fmt.Errorf("its properties cannot be read: %w", err)
	}
	o, err := FirstDeath(props.Headers)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot tell where it came from: %w", err)
	}
	exchangeName, key, cc := o.Exchange, o.Keys[0], o.Keys[1:]
	if toSourceQueue {
		exchangeName, key, cc = "", o.Queue, nil
	}
	headers := amqp.Table{}
	for k, v := range props.Headers {
		if !RedriveDropsHeader(k) {
			headers[k] = v
		}
	}
	if len(cc) > 0 {
		headers["CC"] = stringsToArray(cc)
	}
	props.Headers = headers
	props.Flags = 0
	out := &queue.Message{Exchange: exchangeName, RoutingKey: key, Props: props.Append(nil), Body: m.Body,
		Persistent: props.DeliveryMode == 2, Priority: props.Priority}
	return out, headers, nil
}

func keysOf(h amqp.Table) []string {
	cc, _ := h["CC"].([]any)
	var out []string
	for _, k := range cc {
		if s, ok := k.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// describeTarget renders a target for people: `exchange "orders", routing keys "a", "b"`.
func describeTarget(ex string, keys []string) string {
	var b strings.Builder
	if ex == "" {
		b.WriteString("the default exchange")
	} else {
		fmt.Fprintf(&b, "exchange %q", ex)
	}
	if len(keys) == 1 {
		fmt.Fprintf(&b, " with routing key %q", keys[0])
		return b.String()
	}
	b.WriteString(" with routing keys")
	for i, k := range keys {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, " %q", k)
	}
	return b.String()
}
