package server

import (
	"sync/atomic"
	"time"

	"warren/amqp"
	"warren/server/queue"
)

// queueConfig turns validated queue arguments into the queue machine's lifecycle configuration.
func (st queueSettings) queueConfig() *queue.Config {
	cfg := queue.DefaultConfig()
	cfg.MessageTTL = st.messageTTL
	cfg.MaxLength = st.maxLength
	cfg.MaxLengthBytes = st.maxLengthBytes
	switch st.overflow {
	case "reject-publish":
		cfg.Overflow = queue.RejectPublish
	case "reject-publish-dlx":
		cfg.Overflow = queue.RejectPublishDLX
	default:
		cfg.Overflow = queue.DropHead
	}
	cfg.MaxPriority = st.maxPriority
	cfg.DeliveryLimit = st.deliveryLimit
	cfg.SingleActiveConsumer = st.singleActive
	return &cfg
}

// queueHooks connect a queue's lifecycle events to the broker: dead-lettering through the vhost's
// exchanges, consumer timeouts, and x-expires deletion.
type queueHooks struct {
	s *Server
	v *vhost
	e atomic.Pointer[queueEntry]

	droppedDeliveryLimit atomic.Uint64 // messages over the delivery limit dropped for lack of a DLX
}

// newQueueOptions builds the queue options of a declared queue.
func (s *Server) newQueueOptions(v *vhost, name string, durable, exclusive, autoDelete bool, st queueSettings, id uint64) (queue.Options, *queueHooks) {
	h := &queueHooks{s: s, v: v}
	timeout := st.consumerTimeout
	if timeout < 0 {
		timeout = s.cfg.ConsumerTimeout.Milliseconds()
	}
	return queue.Options{
		Name: name, Durable: durable, Exclusive: exclusive, AutoDelete: autoDelete,
		ID: id, DB: v.db, Logger: s.log, Config: st.queueConfig(),
		Expires: st.expires, ConsumerTimeout: timeout, Hooks: h,
	}, h
}

// DeadLetter republishes dead messages to the queue's dead-letter exchange, as RabbitMQ does.
func (h *queueHooks) DeadLetter(q *queue.Classic, dead []queue.Dead) {
	e := h.e.Load()
	if e == nil {
		return
	}
	st := e.settings
	now := time.Now()
	for _, d := range dead {
		if !st.hasDLX {
			if d.Reason == queue.ReasonDeliveryLimit {
				n := h.droppedDeliveryLimit.Add(1)
				h.s.log.Warn("message over the delivery limit dropped: the queue has no dead-letter exchange",
					"queue", q.Name, "delivery_count", d.DeliveryCount, "dropped_total", n)
			}
			continue
		}
		if _, ok := h.v.exchanges.Get(st.dlx); !ok {
			h.s.log.Debug("dead-letter exchange missing; message dropped", "queue", q.Name, "dlx", st.dlx, "reason", d.Reason)
			continue
		}
		msg, keys := deadLetterMessage(d.Msg, q.Name, d.Reason, now)
		keys = append(keys, d.Msg.BCC...) // routed with, but not recorded in x-death
		if st.hasDLRK {
			keys = []string{st.dlrk}
			msg.Props = withHeader(msg.Props, "CC", nil) // as RabbitMQ: the CC keys no longer apply
		}
		msg.Exchange = st.dlx
		msg.RoutingKey = keys[0]
		var headers amqp.Table
		if props, err := amqp.DecodeProperties(msg.Props); err == nil {
			headers = props.Headers
		}
		targets, _, _ := h.v.route(nil, nil, st.dlx, keys[0], keys[1:], headers)
		for _, t := range targets {
			if deadLetterCycle(msg.Props, t.name, d.Reason) {
				h.s.log.Debug("dead-letter cycle: message dropped", "queue", q.Name, "target", t.name)
				continue
			}
			t.publish(msg, filterValue(headers), nil)
		}
	}
}

// ConsumerTimedOut cancels one consumer whose delivery was not acknowledged in time and requeues its
// unacked messages; its channel stays open (RabbitMQ closes the whole channel).
func (h *queueHooks) ConsumerTimedOut(q *queue.Classic, c queue.ConsumerV1) {
	cs, ok := c.(*consumer)
	if !ok {
		return
	}
	cs.ch.timeoutConsumer(cs)
}

// Expired deletes a queue unused for longer than its x-expires, off the dispatcher's goroutine.
func (h *queueHooks) Expired(q *queue.Classic) {
	if e := h.e.Load(); e != nil {
		h.s.deleteLater(e)
	}
}

// deleteLater hands a queue to the janitor goroutine for deletion (callers that run on the queue's own
// dispatcher cannot wait for it to stop).
func (s *Server) deleteLater(e *queueEntry) {
	select {
	case s.janitor <- e:
	case <-s.janitorQuit:
	}
}

// runJanitor deletes queues handed to deleteLater.
func (s *Server) runJanitor() {
	defer s.wg.Done()
	for {
		select {
		case e := <-s.janitor:
			if e.owner != nil {
				// Exclusive queues belong to their connection's goroutine; x-expires on them is rare:
				// deleting here is still safe because the owner only reads its map on close.
				s.log.Debug("exclusive queue expired", "queue", e.name)
			}
			e.v.deleteQueue(e)
			if err := e.v.syncMeta(); err != nil {
				s.log.Error("cannot store metadata", "err", err)
			}
			s.log.Info("queue deleted", "queue", e.name, "reason", "expired or auto-delete")
		case <-s.janitorQuit:
			return
		}
	}
}

// timeoutConsumer cancels a consumer after a delivery timeout: the client gets basic.cancel (when it
// supports it), the consumer's unacked messages go back to the queue, and acks for their old delivery
// tags are ignored rather than failing the channel.
func (ch *channel) timeoutConsumer(cs *consumer) {
	ch.mu.Lock()
	if ch.closed || cs.cancelled {
		ch.mu.Unlock()
		return
	}
	cs.cancelled = true
	delete(ch.consumers, cs.tag)
	entries := ch.unacked.takeConsumer(nil, cs)
	for _, e := range entries {
		if ch.revoked == nil {
			ch.revoked = make(map[uint64]struct{})
		}
		ch.revoked[e.tag] = struct{}{}
	}
	if ch.c.capCancelNotify {
		ch.c.out.sendMethod(ch.id, &amqp.BasicCancel{ConsumerTag: cs.tag, NoWait: true})
	}
	ch.mu.Unlock()
	ch.c.log.Warn("consumer cancelled: delivery not acknowledged in time", "channel", ch.id, "consumer", cs.tag,
		"queue", cs.entry.q.Name, "requeued", len(entries))
	ch.releaseGlobal(entries)
	if cs.entry.q.RemoveConsumer(cs.id) {
		ch.c.s.deleteLater(cs.entry)
	}
	returnEntries(entries, true)
}
