package core

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"warren/amqp"
	"warren/exchange"
	"warren/server/queue"
	"warren/server/stats"
)

// This file is what the management API does with messages: publish one through an exchange and
// get or purge a queue's messages, without a client connection.

// ErrNoExchange is Publish's error for an exchange that does not exist.
var ErrNoExchange = errors.New("no such exchange")

// Publish routes msg through msg.Exchange with msg.RoutingKey (and the CC and BCC keys of
// headers, as a client's publish) and waits, bounded by ctx, until every target queue has it as
// safe as its type promises. It reports whether a queue took it. It is the management API's
// publish: the message is counted on its queues, not on any channel.
func (v *VHost) Publish(ctx context.Context, msg *queue.Message, headers amqp.Table) (bool, error) {
	routed, err := v.publish(ctx, msg, headers)
	if errors.Is(err, queue.ErrRejected) {
		err = nil
	}
	return routed, err
}

// publish is Publish reporting every queue's refusal, ErrRejected (x-overflow) included: a
// redrive must know that a target did not take the message.
func (v *VHost) publish(ctx context.Context, msg *queue.Message, headers amqp.Table) (bool, error) {
	if aerr := v.CheckPublishExchange(msg.Exchange); aerr != nil {
		return false, aerr
	}
	var extra []string
	if headers != nil {
		extra = exchange.AppendKeys(extra, headers["CC"])
		if bcc, ok := headers["BCC"]; ok {
			n := len(extra)
			extra = exchange.AppendKeys(extra, bcc)
			msg.BCC = append([]string(nil), extra[n:]...)
		}
		msg.FilterValue = FilterValue(headers)
	}
	if msg.Exchange == "" && strings.HasPrefix(msg.RoutingKey, "amq.rabbitmq.reply-to") {
		return false, nil // direct reply-to needs a client's channel
	}
	targets, _, ok := v.Route(nil, nil, msg.Exchange, msg.RoutingKey, extra, headers)
	if !ok {
		return false, fmt.Errorf("exchange '%s' in vhost '%s': %w", msg.Exchange, v.name, ErrNoExchange)
	}
	w := &waitAll{done: make(chan struct{})}
	w.pending.Store(1)
	routed := false
	for _, q := range targets {
		w.pending.Add(1)
		q.Counters().Inc(stats.Published)
		if q.Publish(msg, w) == queue.Accepted {
			routed = true
		}
	}
	w.Done(nil)
	select {
	case <-w.done:
	case <-ctx.Done():
		return routed, fmt.Errorf("publish: waiting for the queues: %w", ctx.Err())
	}
	w.mu.Lock()
	err := w.err
	w.mu.Unlock()
	if err != nil {
		return routed, fmt.Errorf("publish: %w", err)
	}
	return routed, nil
}

// waitAll is a queue.Done that closes done once every count it holds is done.
type waitAll struct {
	pending atomic.Int32
	done    chan struct{}
	mu      sync.Mutex
	err     error
}

func (w *waitAll) Done(err error) {
	if err != nil {
		w.mu.Lock()
		if w.err == nil {
			w.err = err
		}
		w.mu.Unlock()
	}
	if w.pending.Add(-1) == 0 {
		close(w.done)
	}
}

// GetMode is what GetMessages does with the messages it takes (RabbitMQ's ackmode).
type GetMode int

// The get modes.
const (
	GetRequeue       GetMode = iota // ack_requeue_true / reject_requeue_true: back to the queue
	GetAck                          // ack_requeue_false: removed
	GetRejectDiscard                // reject_requeue_false: dead-lettered or dropped
)

// GetMessages takes up to count messages from q as basic.get would, then settles them all with
// mode, as the management API's get does: requeued messages come back redelivered.
func (q *Queue) GetMessages(count int, mode GetMode) ([]queue.Delivery, []int, error) {
	var got []queue.Delivery
	var remaining []int
	for len(got) < count {
		d, rem, ok, err := q.Get(false)
		if err != nil {
			q.settleGot(got, mode)
			return nil, nil, err
		}
		if !ok {
			if len(got) == 0 {
				q.counters.Inc(stats.GetEmpty)
			}
			break
		}
		q.counters.Inc(stats.GetAck)
		if d.Redelivered {
			q.counters.Inc(stats.Redelivered)
		}
		got = append(got, d)
		remaining = append(remaining, rem)
	}
	if err := q.settleGot(got, mode); err != nil {
		return nil, nil, err
	}
	return got, remaining, nil
}

func (q *Queue) settleGot(got []queue.Delivery, mode GetMode) error {
	if len(got) == 0 {
		return nil
	}
	tags := make([]queue.Tag, len(got))
	for i, d := range got {
		tags[i] = d.Tag()
	}
	op := queue.SettleRequeue
	switch mode {
	case GetAck:
		op = queue.SettleAck
		q.counters.Add(stats.Acknowledged, uint64(len(got)))
	case GetRejectDiscard:
		op = queue.SettleDiscard
	}
	if err := q.Settle(0, op, tags); err != nil {
		return fmt.Errorf("settle %d messages of queue '%s': %w", len(got), q.name, err)
	}
	return nil
}
