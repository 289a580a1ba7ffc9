package amqp10

import (
	"encoding/hex"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"warren/amqp"
)

// Message091 is an AMQP 0-9-1 message: where it was published (or, delivered, where it is said
// to come from), its basic properties with headers, and its body.
type Message091 struct {
	Exchange   string
	RoutingKey string
	Properties amqp.Properties
	Body       []byte
}

// The mapping between AMQP 0-9-1 and AMQP 1.0, as RabbitMQ 4.x does it (mc_amqpl.erl,
// mc_amqp.erl; the stream queue stores the result of the first direction and converts back
// with the second). FromAMQP091 is what a message published over 0-9-1 to a stream becomes;
// ToAMQP091 is what a 0-9-1 consumer of a stream receives.
//
//	AMQP 0-9-1 (basic properties)   AMQP 1.0 section and field
//	delivery-mode 2 / other         header.durable true / false (always written)
//	priority                        header.priority (ubyte)
//	expiration "N"                  header.ttl N (uint)
//	(publish)                       header.first-acquirer true, header.delivery-count 0
//	message-id "urn:uuid:<uuid>"    properties.message-id uuid
//	message-id other                properties.message-id string
//	correlation-id                  properties.correlation-id (uuid or string, as message-id)
//	user-id                         properties.user-id binary
//	reply-to Q                      properties.reply-to "/queues/" + percent-encoded Q
//	content-type / content-encoding properties.content-type / content-encoding (symbol)
//	timestamp S (seconds)           properties.creation-time S*1000 (timestamp, ms)
//	app-id                          properties.group-id (string)
//	type                            message-annotations x-basic-type (string)
//	exchange                        message-annotations x-exchange (string)
//	routing key                     message-annotations x-routing-key (string)
//	header "x-..." (any type)       message-annotations x-... (symbol key)
//	header CC (array)               message-annotations x-cc (list)
//	header BCC                      dropped (as RabbitMQ strips it)
//	other header, not array/table   application-properties (string key)
//	other header, array or table    dropped
//	header x-amqp-1.0-properties,   the section itself, decoded from the header's binary value
//	  -app-properties, -message-annotations, -footer (left by a 1.0 -> 0-9-1 conversion)
//	type "amqp-1.0"                 the body is AMQP 1.0 encoded sections, written as they are
//	body                            one data section
//
// Header values, 0-9-1 -> 1.0: longstr -> string when valid UTF-8 without NUL and at most
// 4096 bytes, else binary; bytes -> binary; long -> long; int -> int; short -> short;
// byte -> byte; unsigned byte/short/int -> ubyte/ushort/uint; float/double -> float/double;
// bool -> boolean; timestamp S -> timestamp S*1000; void -> null; array -> list; table -> map
// with symbol keys. A decimal has no AMQP 1.0 counterpart in RabbitMQ's mapping (it fails
// there); Warren drops such a header.
//
// 1.0 -> 0-9-1 (ToAMQP091):
//
//	header.durable true / false     delivery-mode 2 / 1; no header: x-basic-delivery-mode,
//	                                else absent
//	header.priority                 priority; else x-basic-priority
//	header.ttl N                    expiration "N"; else x-basic-expiration
//	properties.message-id           message-id: uuid -> "urn:uuid:<lower-case hex>", ulong ->
//	                                decimal, string under 256 bytes -> as is; a longer string
//	                                -> header x-message-id (longstr), binary -> header
//	                                x-message-id (bytes)
//	properties.correlation-id       correlation-id, the same way (header x-correlation-id)
//	properties.user-id              user-id when a valid short string, else dropped
//	properties.reply-to             reply-to ("/queues/Q" -> Q percent-decoded) when under 256
//	properties.content-type/-encoding  content-type / content-encoding
//	properties.creation-time ms     timestamp ms/1000
//	properties.group-id             app-id (when under 256 bytes)
//	properties.to, subject, ...     dropped
//	x-basic-type                    type (data bodies)
//	x-exchange / x-routing-key      the delivery's exchange / routing key (else "" and the
//	                                stream's name); not headers
//	x-cc                            header CC
//	x-opt-rabbitmq-received-time    header timestamp_in_ms (long)
//	x-opt-deaths                    header x-death
//	other x-... annotation          header of that name (x-basic-*, x-death excluded)
//	application-properties          headers (keys under 256 bytes)
//	(stream delivery)               header x-stream-offset (long)
//	data sections                   body: their bytes concatenated; the footer is dropped
//	amqp-sequence / amqp-value      body: the body and footer sections as encoded; type
//	                                "amqp-1.0"
//
// Values, 1.0 -> 0-9-1: string, symbol and binary -> longstr; long and ulong -> long; int,
// short, byte, uint, ushort, ubyte, float, double, boolean keep their type; timestamp ms ->
// timestamp ms/1000 s; null -> void; list and array -> array; map -> table. char, uuid,
// decimal and described values have no mapping in RabbitMQ (the conversion fails there);
// Warren drops such a header. Headers come out sorted by name, as RabbitMQ sorts them once it
// adds x-stream-offset; on a duplicate name the first of: x-stream-offset, annotations,
// x-correlation-id, x-message-id, application properties wins.

// maxShortStr is the longest AMQP 0-9-1 short string.
const maxShortStr = 255

// utf8ScanLimit is the longest longstr RabbitMQ checks for UTF-8 (longer ones become binary).
const utf8ScanLimit = 4096

const (
	amqp10Type          = "amqp-1.0"
	headerAMQP10Props   = "x-amqp-1.0-properties"
	headerAMQP10AppProp = "x-amqp-1.0-app-properties"
	headerAMQP10MsgAnns = "x-amqp-1.0-message-annotations"
	headerAMQP10Footer  = "x-amqp-1.0-footer"
)

func isXHeader(k string) bool { return strings.HasPrefix(k, "x-") }

// present reports which basic properties are set: Flags when non-zero, else the non-zero
// fields (as amqp.Properties.Append decides).
func present(p *amqp.Properties) uint16 {
	if p.Flags != 0 {
		return p.Flags
	}
	var f uint16
	set := func(c bool, flag uint16) {
		if c {
			f |= flag
		}
	}
	set(p.ContentType != "", amqp.FlagContentType)
	set(p.ContentEncoding != "", amqp.FlagContentEncoding)
	set(p.Headers != nil, amqp.FlagHeaders)
	set(p.DeliveryMode != 0, amqp.FlagDeliveryMode)
	set(p.Priority != 0, amqp.FlagPriority)
	set(p.CorrelationID != "", amqp.FlagCorrelationID)
	set(p.ReplyTo != "", amqp.FlagReplyTo)
	set(p.Expiration != "", amqp.FlagExpiration)
	set(p.MessageID != "", amqp.FlagMessageID)
	set(!p.Timestamp.IsZero(), amqp.FlagTimestamp)
	set(p.Type != "", amqp.FlagType)
	set(p.UserID != "", amqp.FlagUserID)
	set(p.AppID != "", amqp.FlagAppID)
	set(p.ClusterID != "", amqp.FlagClusterID)
	return f
}

// sortedKeys returns a table's keys in order (a Go map has no wire order; RabbitMQ keeps the
// publisher's, Warren sorts).
func sortedKeys(t amqp.Table) []string {
	keys := make([]string, 0, len(t))
	for k := range t {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// FromAMQP091 converts a message published over AMQP 0-9-1 into the AMQP 1.0 message RabbitMQ
// 4.x stores in a stream for it (mc_amqpl:convert_to/3 then mc_amqp:protocol_state/2).
func FromAMQP091(m *Message091) (*Message, error) {
	p := &m.Properties
	flags := present(p)
	has := func(f uint16) bool { return flags&f != 0 }

	out := &Message{}
	h := &Header{Durable: Ptr(has(amqp.FlagDeliveryMode) && p.DeliveryMode == 2)}
	if has(amqp.FlagPriority) {
		h.Priority = Ptr(p.Priority)
	}
	if has(amqp.FlagExpiration) {
		ttl, err := strconv.ParseUint(p.Expiration, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("amqp10: expiration %q is not a TTL in milliseconds: %w", p.Expiration, ErrUnsupported)
		}
		h.TTL = Ptr(uint32(ttl))
	}
	h.FirstAcquirer = Ptr(true)
	h.DeliveryCount = Ptr(uint32(0))
	out.Header = h

	var headers amqp.Table
	if has(amqp.FlagHeaders) {
		headers = p.Headers
	}
	keys := sortedKeys(headers)

	// Sections carried in x-amqp-1.0-* headers (a message that came from AMQP 1.0 and went
	// through a 0-9-1 conversion) take the place of the mapped ones.
	embedded := func(name string) (any, bool, error) {
		v, ok := headers[name]
		if !ok {
			return nil, false, nil
		}
		var raw []byte
		switch x := v.(type) {
		case []byte:
			raw = x
		case string:
			raw = []byte(x)
		default:
			return nil, false, nil
		}
		sm, err := Decode(raw)
		if err != nil {
			return nil, false, fmt.Errorf("amqp10: header %s: %w", name, err)
		}
		return sm, true, nil
	}

	props := &Properties{}
	if s, ok, err := embedded(headerAMQP10Props); err != nil {
		return nil, err
	} else if ok && s.(*Message).Properties != nil {
		props = s.(*Message).Properties
	} else {
		if has(amqp.FlagMessageID) {
			props.MessageID = idFrom091(p.MessageID)
		}
		if has(amqp.FlagUserID) {
			props.UserID = []byte(p.UserID)
		}
		if has(amqp.FlagReplyTo) {
			props.ReplyTo = Ptr("/queues/" + uriQuote(p.ReplyTo))
		}
		if has(amqp.FlagCorrelationID) {
			props.CorrelationID = idFrom091(p.CorrelationID)
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
		if has(amqp.FlagAppID) {
			props.GroupID = Ptr(p.AppID)
		}
	}
	if !props.empty() {
		out.Properties = props
	}

	if s, ok, err := embedded(headerAMQP10AppProp); err != nil {
		return nil, err
	} else if ok {
		out.ApplicationProperties = s.(*Message).ApplicationProperties
	} else {
		var ap Map
		for _, k := range keys {
			v := headers[k]
			if isXHeader(k) || k == "BCC" {
				continue
			}
			switch v.(type) {
			case []any, amqp.Table:
				continue // not supported as application properties
			}
			if av, ok := valueFrom091(v); ok {
				ap = append(ap, KeyValue{k, av})
			}
		}
		out.ApplicationProperties = ap
	}
	if len(out.ApplicationProperties) == 0 {
		out.ApplicationProperties = nil
	}

	ma := Map{{Symbol("x-exchange"), m.Exchange}, {Symbol("x-routing-key"), m.RoutingKey}}
	if s, ok, err := embedded(headerAMQP10MsgAnns); err != nil {
		return nil, err
	} else if ok {
		for _, kv := range s.(*Message).MessageAnnotations {
			if kv.Key != Symbol("x-exchange") && kv.Key != Symbol("x-routing-key") {
				ma = append(ma, kv)
			}
		}
	} else {
		if has(amqp.FlagType) {
			ma = append(ma, KeyValue{Symbol("x-basic-type"), p.Type})
		}
		for _, k := range keys {
			v := headers[k]
			switch {
			case k == "x-exchange" || k == "x-routing-key":
				// replaced by the delivery's own
			case isXHeader(k):
				if av, ok := valueFrom091(v); ok {
					ma = append(ma, KeyValue{Symbol(k), av})
				}
			case k == "CC":
				if _, isArr := v.([]any); isArr {
					if av, ok := valueFrom091(v); ok {
						ma = append(ma, KeyValue{Symbol("x-cc"), av})
					}
				}
			}
		}
	}
	out.MessageAnnotations = ma

	if has(amqp.FlagType) && p.Type == amqp10Type {
		body, err := Decode(m.Body)
		if err != nil {
			return nil, fmt.Errorf("amqp10: body of a message of type %s: %w", amqp10Type, err)
		}
		out.Body, out.Data, out.Sequence, out.Value = body.Body, body.Data, body.Sequence, body.Value
		out.Footer = body.Footer
	} else {
		out.Body = BodyData
		out.Data = [][]byte{m.Body}
	}
	if s, ok, err := embedded(headerAMQP10Footer); err != nil {
		return nil, err
	} else if ok && s.(*Message).Footer != nil {
		out.Footer = s.(*Message).Footer
	}
	if len(out.Footer) == 0 {
		out.Footer = nil
	}
	return out, nil
}

func (p *Properties) empty() bool {
	return p.MessageID == nil && p.UserID == nil && p.To == nil && p.Subject == nil && p.ReplyTo == nil &&
		p.CorrelationID == nil && p.ContentType == nil && p.ContentEncoding == nil &&
		p.AbsoluteExpiryTime == nil && p.CreationTime == nil && p.GroupID == nil &&
		p.GroupSequence == nil && p.ReplyToGroupID == nil
}

// idFrom091 maps a 0-9-1 message or correlation id: "urn:uuid:" + a canonical UUID becomes a
// uuid, anything else a string. (RabbitMQ accepts any 36 characters after "urn:uuid:" and fails
// on ones that are not hex; Warren keeps those as strings.)
func idFrom091(s string) any {
	if u, ok := parseURNUUID(s); ok {
		return u
	}
	return s
}

func parseURNUUID(s string) (UUID, bool) {
	var u UUID
	const prefix = "urn:uuid:"
	if len(s) != len(prefix)+36 || !strings.HasPrefix(s, prefix) {
		return u, false
	}
	h := s[len(prefix):]
	if h[8] != '-' || h[13] != '-' || h[18] != '-' || h[23] != '-' {
		return u, false
	}
	hexs := h[0:8] + h[9:13] + h[14:18] + h[19:23] + h[24:36]
	if _, err := hex.Decode(u[:], []byte(hexs)); err != nil {
		return u, false
	}
	return u, true
}

func urnString(u UUID) string {
	h := hex.EncodeToString(u[:])
	return "urn:uuid:" + h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// uriQuote percent-encodes every byte outside the URI unreserved set (as uri_string:quote/1).
func uriQuote(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// uriUnquote decodes percent escapes (cow_uri:urldecode); ok is false on a bad escape.
func uriUnquote(s string) (string, bool) {
	if !strings.Contains(s, "%") && !strings.Contains(s, "+") {
		return s, true
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%':
			if i+2 >= len(s) {
				return "", false
			}
			v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
			if err != nil {
				return "", false
			}
			b.WriteByte(byte(v))
			i += 2
		case '+':
			b.WriteByte(' ')
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), true
}

func utf8NoNull(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// valueFrom091 maps a 0-9-1 field value to AMQP 1.0 (mc_amqpl:from_091/2).
func valueFrom091(v any) (any, bool) {
	switch x := v.(type) {
	case bool:
		return Boolean(x), true // RabbitMQ writes {boolean, V}: 0x56 and a byte
	case string:
		if len(x) <= utf8ScanLimit && utf8NoNull(x) {
			return x, true
		}
		return []byte(x), true
	case []byte:
		return x, true
	case int8, uint8, int16, uint16, int32, uint32, int64, float32, float64:
		return x, true
	case nil:
		return nil, true
	case time.Time:
		return Timestamp(x.Unix() * 1000), true
	case []any:
		l := make(List, 0, len(x))
		for _, el := range x {
			if av, ok := valueFrom091(el); ok {
				l = append(l, av)
			}
		}
		return l, true
	case amqp.Table:
		m := make(Map, 0, len(x))
		for _, k := range sortedKeys(x) {
			if av, ok := valueFrom091(x[k]); ok {
				m = append(m, KeyValue{Symbol(k), av})
			}
		}
		return m, true
	}
	return nil, false // amqp.Decimal and anything else
}

// ToAMQP091 converts a message read from stream at offset into the AMQP 0-9-1 message RabbitMQ
// 4.x delivers to a 0-9-1 consumer of that stream (mc_amqp:init_from_stream/2,
// mc_amqpl:convert_from/3, mc_amqpl:protocol_state/2).
func ToAMQP091(m *Message, stream string, offset uint64) (*Message091, error) {
	out := &Message091{Exchange: "", RoutingKey: stream}
	ma := m.MessageAnnotations
	if v, ok := ma.Get(Symbol("x-exchange")); ok {
		if s, ok := v.(string); ok {
			out.Exchange = s
		}
	}
	if v, ok := ma.Get(Symbol("x-routing-key")); ok {
		if s, ok := v.(string); ok {
			out.RoutingKey = s
		}
	}

	p := &out.Properties
	var flags uint16
	hdr := m.Header

	// Delivery mode, priority, expiration: header first, then the x-basic-* annotations a
	// 3.x conversion left.
	switch {
	case hdr != nil && hdr.Durable != nil && *hdr.Durable:
		p.DeliveryMode, flags = 2, flags|amqp.FlagDeliveryMode
	case hdr != nil && hdr.Durable != nil:
		p.DeliveryMode, flags = 1, flags|amqp.FlagDeliveryMode
	default:
		if v, ok := ma.Get(Symbol("x-basic-delivery-mode")); ok {
			if n, ok := smallUint(v); ok {
				p.DeliveryMode, flags = uint8(n), flags|amqp.FlagDeliveryMode
			}
		}
	}
	if hdr != nil && hdr.Priority != nil {
		p.Priority, flags = *hdr.Priority, flags|amqp.FlagPriority
	} else if v, ok := ma.Get(Symbol("x-basic-priority")); ok {
		if n, ok := smallUint(v); ok {
			p.Priority, flags = uint8(n), flags|amqp.FlagPriority
		}
	}
	if hdr != nil && hdr.TTL != nil {
		p.Expiration, flags = strconv.FormatUint(uint64(*hdr.TTL), 10), flags|amqp.FlagExpiration
	} else if v, ok := ma.Get(Symbol("x-basic-expiration")); ok {
		if s, ok := v.(string); ok && len(s) <= maxShortStr {
			p.Expiration, flags = s, flags|amqp.FlagExpiration
		}
	}

	// first-wins header assembly: x-stream-offset, annotations, ids, application properties.
	headers := amqp.Table{}
	add := func(k string, v any) {
		if _, dup := headers[k]; !dup {
			headers[k] = v
		}
	}
	add("x-stream-offset", int64(offset))
	for _, kv := range ma {
		k, ok := kv.Key.(Symbol)
		if !ok {
			continue
		}
		switch ks := string(k); {
		case ks == "x-cc":
			if v, ok := valueTo091(kv.Value); ok {
				add("CC", v)
			}
		case ks == "x-opt-rabbitmq-received-time":
			if ts, ok := kv.Value.(Timestamp); ok {
				add("timestamp_in_ms", int64(ts))
			}
		case ks == "x-opt-deaths":
			if v, ok := deathsTo091(kv.Value); ok {
				add("x-death", v)
			}
		case strings.HasPrefix(ks, "x-") && len(ks) <= maxShortStr && !isInternalHeader(ks):
			if v, ok := valueTo091(kv.Value); ok {
				add(ks, v)
			}
		}
	}

	props := m.Properties
	if props == nil {
		props = &Properties{}
	}
	if id, hv, ok := idTo091(props.CorrelationID); ok {
		p.CorrelationID, flags = id, flags|amqp.FlagCorrelationID
	} else if hv != nil {
		add("x-correlation-id", hv)
	}
	if id, hv, ok := idTo091(props.MessageID); ok {
		p.MessageID, flags = id, flags|amqp.FlagMessageID
	} else if hv != nil {
		add("x-message-id", hv)
	}
	for _, kv := range m.ApplicationProperties {
		k, ok := kv.Key.(string)
		if !ok || len(k) > maxShortStr {
			continue
		}
		if v, ok := valueTo091(kv.Value); ok {
			add(k, v)
		}
	}

	if props.UserID != nil && len(props.UserID) <= maxShortStr && utf8NoNull(string(props.UserID)) {
		p.UserID, flags = string(props.UserID), flags|amqp.FlagUserID
	}
	if props.ReplyTo != nil && len(*props.ReplyTo) <= maxShortStr {
		rt := *props.ReplyTo
		ok := true
		if q, isQueue := strings.CutPrefix(rt, "/queues/"); isQueue {
			rt, ok = uriUnquote(q)
		}
		if ok && len(rt) <= maxShortStr {
			p.ReplyTo, flags = rt, flags|amqp.FlagReplyTo
		}
	}
	if props.ContentType != nil && len(*props.ContentType) <= maxShortStr {
		p.ContentType, flags = string(*props.ContentType), flags|amqp.FlagContentType
	}
	if props.ContentEncoding != nil && len(*props.ContentEncoding) <= maxShortStr {
		p.ContentEncoding, flags = string(*props.ContentEncoding), flags|amqp.FlagContentEncoding
	}
	if props.CreationTime != nil {
		p.Timestamp, flags = time.Unix(int64(*props.CreationTime)/1000, 0).UTC(), flags|amqp.FlagTimestamp
	}
	if props.GroupID != nil && len(*props.GroupID) <= maxShortStr {
		p.AppID, flags = *props.GroupID, flags|amqp.FlagAppID
	}

	switch m.Body {
	case BodyData:
		size := 0
		for _, d := range m.Data {
			size += len(d)
		}
		body := make([]byte, 0, size)
		for _, d := range m.Data {
			body = append(body, d...)
		}
		out.Body = body
		if v, ok := ma.Get(Symbol("x-basic-type")); ok {
			if s, ok := v.(string); ok && len(s) <= maxShortStr {
				p.Type, flags = s, flags|amqp.FlagType
			}
		}
	default:
		// Anything but data sections travels AMQP 1.0 encoded, with its footer.
		bm := Message{Body: m.Body, Sequence: m.Sequence, Value: m.Value, Footer: m.Footer}
		if m.Body == BodyNone {
			bm.Body, bm.Value = BodyValue, nil
		}
		body, err := bm.Encode(nil)
		if err != nil {
			return nil, err
		}
		out.Body = body
		p.Type, flags = amqp10Type, flags|amqp.FlagType
	}

	p.Headers = headers
	flags |= amqp.FlagHeaders
	p.Flags = flags
	return out, nil
}

func isInternalHeader(k string) bool {
	return strings.HasPrefix(k, "x-basic-") || k == "x-routing-key" || k == "x-exchange" || k == "x-death"
}

func smallUint(v any) (uint64, bool) {
	switch x := v.(type) {
	case uint8:
		return uint64(x), true
	case uint16:
		return uint64(x), x <= math.MaxUint8
	case uint32:
		return uint64(x), x <= math.MaxUint8
	case uint64:
		return x, x <= math.MaxUint8
	case int64:
		return uint64(x), x >= 0 && x <= math.MaxUint8
	case int32:
		return uint64(x), x >= 0 && x <= math.MaxUint8
	}
	return 0, false
}

// idTo091 maps a message or correlation id: ok with the property value, or a header value for
// ids that do not fit a short string (nil when the id is absent).
func idTo091(id any) (prop string, header any, ok bool) {
	switch x := id.(type) {
	case UUID:
		return urnString(x), nil, true
	case uint64:
		return strconv.FormatUint(x, 10), nil, true
	case []byte:
		return "", x, false
	case string:
		if len(x) <= maxShortStr {
			return x, nil, true
		}
		return "", x, false
	}
	return "", nil, false
}

// valueTo091 maps an AMQP 1.0 value to a 0-9-1 field value (mc_amqpl:to_091/2). ok is false
// for the types RabbitMQ has no mapping for.
func valueTo091(v any) (any, bool) {
	switch x := v.(type) {
	case Boolean:
		return bool(x), true
	case string:
		return x, true
	case Symbol:
		return string(x), true
	case []byte:
		return string(x), true // binary becomes longstr
	case int64:
		return x, true
	case uint64:
		return int64(x), true
	case bool, int8, uint8, int16, uint16, int32, uint32, float32, float64:
		return x, true
	case Timestamp:
		return time.Unix(int64(x)/1000, 0).UTC(), true
	case nil:
		return nil, true
	case List:
		return listTo091(x), true
	case Array:
		return listTo091(x), true
	case Map:
		t := amqp.Table{}
		for _, kv := range x {
			var k string
			switch kk := kv.Key.(type) {
			case string:
				k = kk
			case Symbol:
				k = string(kk)
			default:
				continue
			}
			if vv, ok := valueTo091(kv.Value); ok {
				t[k] = vv
			}
		}
		return t, true
	}
	return nil, false
}

func listTo091[L ~[]any](l L) []any {
	out := make([]any, 0, len(l))
	for _, el := range l {
		if v, ok := valueTo091(el); ok {
			out = append(out, v)
		}
	}
	return out
}

// deathsTo091 maps x-opt-deaths (an array of maps) to the x-death header RabbitMQ builds.
func deathsTo091(v any) (any, bool) {
	arr, ok := v.(Array)
	if !ok {
		return nil, false
	}
	var out []any
	for _, el := range arr {
		m, ok := el.(Map)
		if !ok {
			return nil, false
		}
		get := func(k string) any { v, _ := m.Get(Symbol(k)); return v }
		t := amqp.Table{}
		if c, ok := get("count").(uint64); ok {
			t["count"] = int64(c)
		}
		if r, ok := get("reason").(Symbol); ok {
			t["reason"] = string(r)
		}
		if q, ok := get("queue").(string); ok {
			t["queue"] = q
		}
		if ft, ok := get("first-time").(Timestamp); ok {
			t["time"] = time.Unix(int64(ft)/1000, 0).UTC()
		}
		if x, ok := get("exchange").(string); ok {
			t["exchange"] = x
		}
		var rks []any
		if a, ok := get("routing-keys").(Array); ok {
			for _, k := range a {
				if s, ok := k.(string); ok {
					rks = append(rks, s)
				}
			}
		}
		t["routing-keys"] = rks
		if ttl, ok := get("ttl").(uint32); ok {
			t["original-expiration"] = strconv.FormatUint(uint64(ttl), 10)
		}
		out = append(out, t)
	}
	return out, true
}
