package amqp10

import (
	"time"

	"warren/amqp"
)

// FromAMQP091V3 returns the bytes RabbitMQ 3.9-3.12 stored in a stream for a message published
// over AMQP 0-9-1 (rabbit_msg_record:from_amqp091/2 plus the x-routing-key and x-exchange
// annotations rabbit_stream_queue added), which is what their stream-protocol consumers read.
// Stream-protocol clients written against 3.x expect this layout; RabbitMQ 4.x (FromAMQP091)
// writes a header section and maps more properties:
//
//	AMQP 0-9-1                 RabbitMQ 3.x AMQP 1.0
//	message-id, correlation-id properties.message-id / correlation-id, always a string
//	user-id                    properties.user-id binary
//	reply-to                   properties.reply-to, as is
//	content-type / -encoding   properties.content-type / -encoding (symbol)
//	timestamp S                properties.creation-time S*1000
//	type / app-id              application-properties x-basic-type / x-basic-app-id
//	priority                   message-annotations x-basic-priority (ubyte)
//	delivery-mode              message-annotations x-basic-delivery-mode (ubyte)
//	expiration                 message-annotations x-basic-expiration (string)
//	routing key / exchange     message-annotations x-routing-key / x-exchange
//	every header (x- included) application-properties, except arrays and tables
//	body                       one data section
//
// There is no header section, and the properties section lists all 13 fields (nulls
// included). 3.x's reverse mapping (to a 0-9-1 consumer) took the x-basic-* entries back and
// added x-message-id-type / x-correlation-id-type headers for non-string ids.
func FromAMQP091V3(m *Message091) ([]byte, error) {
	p := &m.Properties
	flags := present(p)
	has := func(f uint16) bool { return flags&f != 0 }
	out := &Message{}

	props := &Properties{}
	if has(amqp.FlagMessageID) {
		props.MessageID = p.MessageID
	}
	if has(amqp.FlagUserID) {
		props.UserID = []byte(p.UserID)
	}
	if has(amqp.FlagReplyTo) {
		props.ReplyTo = Ptr(p.ReplyTo)
	}
	if has(amqp.FlagCorrelationID) {
		props.CorrelationID = p.CorrelationID
	}
	if has(amqp.FlagContentType) {
		props.ContentType = Ptr(Symbol(p.ContentType))
	}
	if has(amqp.FlagContentEncoding) {
		props.ContentEncoding = Ptr(Symbol(p.ContentEncoding))
	}
	if has(amqp.FlagTimestamp) {
		props.CreationTime = Ptr(Timestamp(p.Timestamp.Unix() * 1000))
	}
	if !props.empty() {
		out.Properties = props
	}

	var ap Map
	if has(amqp.FlagType) {
		ap = append(ap, KeyValue{"x-basic-type", p.Type})
	}
	if has(amqp.FlagAppID) {
		ap = append(ap, KeyValue{"x-basic-app-id", p.AppID})
	}
	if has(amqp.FlagHeaders) {
		for _, k := range sortedKeys(p.Headers) {
			if v, ok := valueFrom091V3(p.Headers[k]); ok {
				ap = append(ap, KeyValue{k, v})
			}
		}
	}
	out.ApplicationProperties = ap

	ma := Map{{Symbol("x-routing-key"), m.RoutingKey}, {Symbol("x-exchange"), m.Exchange}}
	if has(amqp.FlagPriority) {
		ma = append(ma, KeyValue{Symbol("x-basic-priority"), p.Priority})
	}
	if has(amqp.FlagDeliveryMode) {
		ma = append(ma, KeyValue{Symbol("x-basic-delivery-mode"), p.DeliveryMode})
	}
	if has(amqp.FlagExpiration) {
		ma = append(ma, KeyValue{Symbol("x-basic-expiration"), p.Expiration})
	}
	out.MessageAnnotations = ma
	out.Body, out.Data = BodyData, [][]byte{m.Body}

	e := encoder{}
	out.encode(&e, true)
	if e.err != nil {
		return nil, e.err
	}
	return e.b, nil
}

// valueFrom091V3 is 3.x's rabbit_msg_record:from_091/2: no arrays or tables, every longstr a
// string.
func valueFrom091V3(v any) (any, bool) {
	switch x := v.(type) {
	case bool:
		return Boolean(x), true
	case string, []byte, int8, uint8, int16, uint16, int32, uint32, int64, float32, float64, nil:
		return x, true
	case time.Time:
		return Timestamp(x.Unix() * 1000), true
	}
	return nil, false
}
