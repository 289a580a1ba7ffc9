package dlq

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// origin is where a dead-lettered message first died, read from its x-death history.
type origin struct {
	Reason   string   // why it first died: rejected, expired, maxlen, delivery_limit
	Queue    string   // the queue it first died in
	Exchange string   // the exchange it had been published to before that death
	Keys     []string // the routing keys it had been published with (routing key, then CC)
}

// errNoDeath says a message carries no usable x-death history.
var errNoDeath = errors.New("no x-death header")

// originOf reads a message's first death from its headers.
//
// RabbitMQ keeps x-death newest first, one entry per {queue, reason}, and names the first death
// directly in x-first-death-queue, -reason and -exchange. The entry with that queue and reason gives
// the routing keys; without the x-first-death-* headers (or without a matching entry) the last
// element of x-death, the oldest death, is used.
func originOf(h amqp.Table) (origin, error) {
	raw, ok := h["x-death"].([]any)
	if !ok || len(raw) == 0 {
		return origin{}, errNoDeath
	}
	deaths := make([]amqp.Table, 0, len(raw))
	for _, d := range raw {
		if t, ok := d.(amqp.Table); ok {
			deaths = append(deaths, t)
		}
	}
	if len(deaths) == 0 {
		return origin{}, fmt.Errorf("x-death header holds no tables: %w", errNoDeath)
	}

	firstQueue, hasQueue := h["x-first-death-queue"].(string)
	firstReason, hasReason := h["x-first-death-reason"].(string)
	var entry amqp.Table
	if hasQueue && hasReason {
		for _, d := range deaths {
			if q, _ := d["queue"].(string); q != firstQueue {
				continue
			}
			if r, _ := d["reason"].(string); r == firstReason {
				entry = d
				break
			}
		}
	}
	o := origin{}
	if entry != nil {
		o.Queue, o.Reason = firstQueue, firstReason
		o.Exchange, ok = h["x-first-death-exchange"].(string)
		if !ok {
			o.Exchange, _ = entry["exchange"].(string)
		}
	} else {
		entry = deaths[len(deaths)-1]
		o.Queue, _ = entry["queue"].(string)
		o.Reason, _ = entry["reason"].(string)
		o.Exchange, _ = entry["exchange"].(string)
	}
	keys, _ := entry["routing-keys"].([]any)
	for _, k := range keys {
		switch v := k.(type) {
		case string:
			o.Keys = append(o.Keys, v)
		case []byte:
			o.Keys = append(o.Keys, string(v))
		}
	}
	if len(o.Keys) == 0 {
		return o, fmt.Errorf("x-death entry for queue %q has no routing-keys", o.Queue)
	}
	return o, nil
}

// target is where a message is republished to.
type target struct {
	Exchange string
	Key      string
	CC       []string // further routing keys, sent in the CC header
}

// String renders t for people: `exchange "orders", routing keys "a", "b"`.
func (t target) String() string {
	var b strings.Builder
	if t.Exchange == "" {
		b.WriteString("default exchange")
	} else {
		fmt.Fprintf(&b, "exchange %q", t.Exchange)
	}
	if len(t.CC) == 0 {
		fmt.Fprintf(&b, ", routing key %q", t.Key)
		return b.String()
	}
	fmt.Fprintf(&b, ", routing keys %q", t.Key)
	for _, k := range t.CC {
		fmt.Fprintf(&b, ", %q", k)
	}
	return b.String()
}

// republishing builds the message sent to t from the dead-lettered delivery d: every property and
// header kept as it is (x-death and x-first-death-* included), except CC and BCC, which are set to
// t's further routing keys or removed, so that the broker routes exactly as t says, and the
// delivery headers x-delivery-count and x-acquired-count: a broker adds them to a delivery, not to
// the message, so they describe the deliveries from the dead-letter queue and would mislead the
// consumers of the republished message.
func republishing(d *amqp.Delivery, t target) amqp.Publishing {
	headers := amqp.Table{}
	for k, v := range d.Headers {
		headers[k] = v
	}
	delete(headers, "BCC")
	delete(headers, "CC")
	for _, k := range []string{"x-delivery-count", "x-acquired-count"} {
		delete(headers, k)
	}
	if len(t.CC) > 0 {
		cc := make([]any, len(t.CC))
		for i, k := range t.CC {
			cc[i] = k
		}
		headers["CC"] = cc
	}
	if len(headers) == 0 {
		headers = nil
	}
	return amqp.Publishing{
		Headers:         headers,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    d.DeliveryMode,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		Expiration:      d.Expiration,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		UserId:          d.UserId,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}

// fingerprint identifies a published message by everything a basic.return echoes back: exchange,
// routing key, properties, headers and body. Returns carry no publish sequence number, so a
// return is matched to the oldest unconfirmed publish with the same fingerprint; two publishes
// that share one are indistinguishable copies, so the match cannot lose a message.
func fingerprint(exchange, key string, p amqp.Publishing) string {
	h := sha256.New()
	for _, s := range []string{exchange, key, p.ContentType, p.ContentEncoding, p.CorrelationId,
		p.ReplyTo, p.Expiration, p.MessageId, p.Type, p.UserId, p.AppId} {
		writeString(h, s)
	}
	fmt.Fprintf(h, "%d/%d/%d|", p.DeliveryMode, p.Priority, p.Timestamp.Unix())
	writeValue(h, p.Headers)
	writeString(h, string(p.Body))
	return hex.EncodeToString(h.Sum(nil))
}

// returnFingerprint is fingerprint for a message the broker returned.
func returnFingerprint(r amqp.Return) string {
	return fingerprint(r.Exchange, r.RoutingKey, amqp.Publishing{
		Headers: r.Headers, ContentType: r.ContentType, ContentEncoding: r.ContentEncoding,
		DeliveryMode: r.DeliveryMode, Priority: r.Priority, CorrelationId: r.CorrelationId,
		ReplyTo: r.ReplyTo, Expiration: r.Expiration, MessageId: r.MessageId, Timestamp: r.Timestamp,
		Type: r.Type, UserId: r.UserId, AppId: r.AppId, Body: r.Body,
	})
}

func writeString(w io.Writer, s string) {
	fmt.Fprintf(w, "%d:%s|", len(s), s)
}

// writeValue writes a field value canonically: tables with sorted keys, and numbers by value, so
// that an encode/decode round trip that changes a number's width does not change the result.
func writeValue(w io.Writer, v any) {
	switch x := v.(type) {
	case nil:
		io.WriteString(w, "V|")
	case amqp.Table:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(w, "F%d{", len(keys))
		for _, k := range keys {
			writeString(w, k)
			writeValue(w, x[k])
		}
		io.WriteString(w, "}")
	case []any:
		fmt.Fprintf(w, "A%d[", len(x))
		for _, e := range x {
			writeValue(w, e)
		}
		io.WriteString(w, "]")
	case string:
		io.WriteString(w, "S")
		writeString(w, x)
	case []byte:
		io.WriteString(w, "x")
		writeString(w, string(x))
	case time.Time:
		io.WriteString(w, "T"+strconv.FormatInt(x.Unix(), 10)+"|")
	default:
		fmt.Fprintf(w, "n%v|", x)
	}
}
