package server

import (
	"time"

	"warren/amqp"
	"warren/server/queue"
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
	keys := append([]string{msg.RoutingKey}, appendKeys(nil, props.Headers["CC"])...)
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

// withHeader returns raw properties with one header set to v, or removed when v is nil. The
// original bytes are never modified (other queues may share them); undecodable properties come back
// unchanged.
func withHeader(raw []byte, name string, v any) []byte {
	props, err := amqp.DecodeProperties(raw)
	if err != nil {
		return raw
	}
	if _, ok := props.Headers[name]; !ok && v == nil {
		return raw
	}
	h := make(amqp.Table, len(props.Headers)+1)
	for k, x := range props.Headers {
		h[k] = x
	}
	if v == nil {
		delete(h, name)
	} else {
		h[name] = v
	}
	props.Headers = h
	props.Flags = 0
	return props.Append(nil)
}
