package dlq

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	wamqp "warren/amqp"
	"warren/server/core"
)

// origin is where a dead-lettered message first died, read from its x-death history.
type origin = core.DeathOrigin

// errNoDeath says a message carries no usable x-death history.
var errNoDeath = core.ErrNoDeath

// originOf reads a message's first death from its headers with the broker's own rule
// (core.FirstDeath, which the HTTP API's redrive uses too), on the client library's tables.
func originOf(h amqp.Table) (origin, error) {
	return core.FirstDeath(brokerTable(h))
}

// brokerTable converts a client library table to the broker's, nested tables and arrays included
// (the other values have the same Go types in both).
func brokerTable(t amqp.Table) wamqp.Table {
	if t == nil {
		return nil
	}
	out := make(wamqp.Table, len(t))
	for k, v := range t {
		out[k] = brokerValue(v)
	}
	return out
}

func brokerValue(v any) any {
	switch x := v.(type) {
	case amqp.Table:
		return brokerTable(x)
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = brokerValue(e)
		}
		return out
	}
	return v
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
		if !core.RedriveDropsHeader(k) {
			headers[k] = v
		}
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
