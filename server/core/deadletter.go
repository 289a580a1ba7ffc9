package core

import (
	"sync"
	"sync/atomic"
	"time"

	"warren/amqp"
	"warren/exchange"
	"warren/server/queue"
	"warren/server/stats"
)

// deadLetterMessage returns the copy of msg that is republished to a dead-letter exchange: the
// x-death header updated as RabbitMQ writes it, the x-first-death-* and x-last-death-* headers, and
// no expiration (it is kept in x-death as original-expiration). It also returns the routing keys the
// message was published with (routing key plus CC), which are used when the queue has no
// x-dead-letter-routing-key.
func deadLetterMessage(msg *queue.Message, queueName string, reason queue.Reason, now time.Time) (*queue.Message, []string) {
	props, err := amqp.DecodeProperties(msg.Props)
	if err != nil {
		props = amqp.Properties{}
	}
	keys := append([]string{msg.RoutingKey}, exchange.AppendKeys(nil, props.Headers["CC"])...)
	headers := amqp.Table{}
	for k, v := range props.Headers {
		headers[k] = v
	}
	deaths, _ := headers["x-death"].([]any)
	var entry amqp.Table
	rest := make([]any, 0, len(deaths)+1)
	for _, d := range deaths {
		t, ok := d.(amqp.Table)
		if ok && entry == nil && t["queue"] == queueName && t["reason"] == string(reason) {
			entry = t
			continue
		}
		rest = append(rest, d)
	}
	if entry == nil {
		entry = amqp.Table{
			"count":        int64(0),
			"reason":       string(reason),
			"queue":        queueName,
			"exchange":     msg.Exchange,
			"routing-keys": stringsToArray(keys),
		}
		if props.Expiration != "" {
			entry["original-expiration"] = props.Expiration
		}
	} else {
		cp := amqp.Table{}
		for k, v := range entry {
			cp[k] = v
		}
		entry = cp
	}
	count, _ := amqp.AsInt64(entry["count"])
	entry["count"] = count + 1
	if _, ok := entry["time"]; !ok {
		// RabbitMQ keeps the time of the first death in a collapsed entry.
		entry["time"] = now.Truncate(time.Second).UTC()
	}
	// The newest death comes first.
	headers["x-death"] = append([]any{entry}, rest...)
	if _, ok := headers["x-first-death-queue"]; !ok {
		headers["x-first-death-queue"] = queueName
		headers["x-first-death-reason"] = string(reason)
		headers["x-first-death-exchange"] = msg.Exchange
	}
	headers["x-last-death-queue"] = queueName
	headers["x-last-death-reason"] = string(reason)
	headers["x-last-death-exchange"] = msg.Exchange
	props.Headers = headers
	props.Expiration = ""
	props.Flags = 0
	out := &queue.Message{
		Exchange:   msg.Exchange,
		RoutingKey: msg.RoutingKey,
		Props:      props.Append(nil),
		Body:       msg.Body,
		Persistent: msg.Persistent,
		Priority:   msg.Priority,
	}
	return out, keys
}

func stringsToArray(ss []string) []any {
	a := make([]any, len(ss))
	for i, s := range ss {
		a[i] = s
	}
	return a
}

// deadLetterCycle reports whether republishing to target would loop: RabbitMQ drops a
// dead-lettered message that would reach a queue it already died in, unless a client rejected it
// somewhere on the way (a rejection means someone decided, so it is not an automatic loop).
func deadLetterCycle(props []byte, target string, reason queue.Reason) bool {
	if reason == queue.ReasonRejected {
		return false
	}
	p, err := amqp.DecodeProperties(props)
	if err != nil {
		return false
	}
	deaths, _ := p.Headers["x-death"].([]any)
	seen := false
	for _, d := range deaths {
		t, ok := d.(amqp.Table)
		if !ok {
			continue
		}
		if t["reason"] == string(queue.ReasonRejected) {
			return false
		}
		if t["queue"] == target {
			seen = true
		}
	}
	return seen
}

// deadLetter republishes messages that died in src to its dead-letter exchange, as RabbitMQ does:
// x-death updated, routed with the queue's x-dead-letter-routing-key or the message's own keys,
// never back into a queue it already died in unless a client rejected it on the way. done, if
// not nil, runs once every target queue reported its write (the first error, if any): a quorum
// queue removes its dead-letter records only then.
func (v *VHost) deadLetter(src *Queue, dead []queue.Dead, done func(error)) {
	st := src.effective()
	now := time.Now()
	w := &fanout{done: done}
	var handedOver uint64 // dead letters given to at least one target
	if done != nil {
		// At least once: the targets' confirms are awaited, so count what they confirmed.
		w.done = func(err error) {
			if err == nil && handedOver > 0 {
				src.counters.Add(stats.DeadLetteredConfirmed, handedOver)
			}
			done(err)
		}
	}
	w.pending.Store(1) // held until every target has been handed its copy
	for _, d := range dead {
		src.counters.Inc(deadLetterKind(d.Reason))
		if !st.hasDLX {
			if d.Reason == queue.ReasonDeliveryLimit {
				n := src.droppedDeliveryLimit.Add(1)
				v.b.log.Warn("message over the delivery limit dropped: the queue has no dead-letter exchange",
					"vhost", v.name, "queue", src.name, "delivery_count", d.DeliveryCount, "dropped_total", n)
			}
			continue
		}
		if _, ok := v.ex.Get(st.dlx); !ok {
			v.b.log.Debug("dead-letter exchange missing; message dropped", "vhost", v.name, "queue", src.name, "dlx", st.dlx, "reason", d.Reason)
			continue
		}
		msg, keys := deadLetterMessage(d.Msg, src.name, d.Reason, now)
		keys = append(keys, d.Msg.BCC...) // routed with, but not recorded in x-death
		if st.hasDLRK {
			keys = []string{st.dlrk}
			msg.Props = amqp.WithHeader(msg.Props, "CC", nil) // as RabbitMQ: the CC keys no longer apply
		}
		msg.Exchange = st.dlx
		msg.RoutingKey = keys[0]
		msg.Dedupe = d.Key // targets take a dead letter handed over twice (a leader change) once
		var headers amqp.Table
		if props, err := amqp.DecodeProperties(msg.Props); err == nil {
			headers = props.Headers
		}
		msg.FilterValue = FilterValue(headers)
		targets, _, _ := v.Route(nil, nil, st.dlx, keys[0], keys[1:], headers)
		handed := false
		for _, t := range targets {
			if deadLetterCycle(msg.Props, t.name, d.Reason) {
				v.b.log.Debug("dead-letter cycle: message dropped", "vhost", v.name, "queue", src.name, "target", t.name)
				continue
			}
			w.pending.Add(1)
			handed = true
			t.Publish(msg, w)
		}
		if handed {
			handedOver++
		}
	}
	w.Done(nil)
}

// deadLetterKind is the counter of a dead-letter reason.
func deadLetterKind(r queue.Reason) stats.Kind {
	switch r {
	case queue.ReasonExpired:
		return stats.DeadLetteredExpired
	case queue.ReasonMaxLen:
		return stats.DeadLetteredMaxLen
	case queue.ReasonDeliveryLimit:
		return stats.DeadLetteredDeliveryLimit
	}
	return stats.DeadLetteredRejected
}

// fanout collects the outcomes of one dead-lettering's target publishes.
type fanout struct {
	done    func(error)
	pending atomic.Int32
	mu      sync.Mutex
	err     error
}

// Done implements queue.Done.
func (w *fanout) Done(err error) {
	if err != nil {
		w.mu.Lock()
		if w.err == nil {
			w.err = err
		}
		w.mu.Unlock()
	}
	if w.pending.Add(-1) != 0 || w.done == nil {
		return
	}
	w.mu.Lock()
	err = w.err
	w.mu.Unlock()
	w.done(err)
}

// FilterValue is the x-stream-filter-value header of a publish (streams index it).
func FilterValue(h amqp.Table) string {
	switch v := h["x-stream-filter-value"].(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}

// MaxPublisherIDLen bounds x-publisher-id (as RabbitMQ bounds a stream publisher's reference).
const MaxPublisherIDLen = 256

// PublisherDedupe reads the deduplication headers of a publish to a stream: x-publisher-id (a
// string of at most 256 bytes) and x-publishing-id (an integer, increasing per publisher). Both
// must be present for the publish to be deduplicated. A malformed value is RabbitMQ's 406 with
// the reason, raised by the session when the publish reaches a stream.
func PublisherDedupe(h amqp.Table) (id string, seq uint64, err *amqp.Error) {
	pv, hasP := h["x-publisher-id"]
	sv, hasS := h["x-publishing-id"]
	if !hasP && !hasS {
		return "", 0, nil
	}
	if hasS {
		n, ok := amqp.AsInt64(sv)
		if !ok {
			return "", 0, amqp.Errorf(amqp.PreconditionFailed, "invalid header 'x-publishing-id': must be an integer, got %s", amqp.TypeName(sv))
		}
		if n < 0 {
			return "", 0, amqp.Errorf(amqp.PreconditionFailed, "invalid header 'x-publishing-id': must not be negative, got %d", n)
		}
		seq = uint64(n)
	}
	if hasP {
		switch v := pv.(type) {
		case string:
			id = v
		case []byte:
			id = string(v)
		default:
			return "", 0, amqp.Errorf(amqp.PreconditionFailed, "invalid header 'x-publisher-id': must be a string, got %s", amqp.TypeName(pv))
		}
		if len(id) > MaxPublisherIDLen {
			return "", 0, amqp.Errorf(amqp.PreconditionFailed, "invalid header 'x-publisher-id': %d bytes, longer than %d", len(id), MaxPublisherIDLen)
		}
	}
	if !hasP || !hasS || id == "" {
		return "", 0, nil
	}
	return id, seq, nil
}
