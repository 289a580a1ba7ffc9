package amqp10

import "fmt"

// Header is the header section. Nil fields were absent (null) on the wire; the specification's
// defaults then apply (durable false, priority 4, first-acquirer false, delivery-count 0).
type Header struct {
	Durable       *bool
	Priority      *uint8
	TTL           *uint32 // milliseconds
	FirstAcquirer *bool
	DeliveryCount *uint32
}

// Properties is the properties section. MessageID and CorrelationID are nil when absent, else
// uint64, UUID, []byte or string. Other nil fields were absent.
type Properties struct {
	MessageID          any
	UserID             []byte
	To                 *string
	Subject            *string
	ReplyTo            *string
	CorrelationID      any
	ContentType        *Symbol
	ContentEncoding    *Symbol
	AbsoluteExpiryTime *Timestamp
	CreationTime       *Timestamp
	GroupID            *string
	GroupSequence      *uint32
	ReplyToGroupID     *string
}

// BodyKind says which body sections a message has.
type BodyKind uint8

// Body kinds: one or more data sections, one or more amqp-sequence sections, or one amqp-value.
const (
	BodyNone BodyKind = iota
	BodyData
	BodySequence
	BodyValue
)

// Message is an AMQP 1.0 message, section by section. Nil maps and pointers are sections that
// are absent; Encode writes the sections that are present, in the specification's order.
type Message struct {
	Header                *Header
	DeliveryAnnotations   Map // keys Symbol (or uint64)
	MessageAnnotations    Map // keys Symbol (or uint64)
	Properties            *Properties
	ApplicationProperties Map // keys string

	Body     BodyKind
	Data     [][]byte // BodyData: the data sections (Decode: slices of the input)
	Sequence []List   // BodySequence
	Value    any      // BodyValue

	Footer Map
}

// Encode appends the message's sections to b.
func (m *Message) Encode(b []byte) ([]byte, error) {
	e := encoder{b: b}
	m.encode(&e, false)
	if e.err != nil {
		return b, e.err
	}
	return e.b, nil
}

func (e *encoder) section(code uint64, v any) {
	e.u8(codeDescribed)
	e.value(code, 0)
	e.value(v, 1)
}

// encode writes the sections. allFields writes every field of header and properties (nulls
// included), as RabbitMQ 3.x did; otherwise trailing nulls are left out, as RabbitMQ 4.x does.
func (m *Message) encode(e *encoder, allFields bool) {
	if m.Header != nil {
		e.section(DescriptorHeader, fieldList(m.Header.fields(), allFields))
	}
	if m.DeliveryAnnotations != nil {
		e.section(DescriptorDeliveryAnnotations, m.DeliveryAnnotations)
	}
	if m.MessageAnnotations != nil {
		e.section(DescriptorMessageAnnotations, m.MessageAnnotations)
	}
	if m.Properties != nil {
		e.section(DescriptorProperties, fieldList(m.Properties.fields(), allFields))
	}
	if m.ApplicationProperties != nil {
		e.section(DescriptorApplicationProperties, m.ApplicationProperties)
	}
	switch m.Body {
	case BodyData:
		for _, d := range m.Data {
			e.u8(codeDescribed)
			e.value(uint64(DescriptorData), 0)
			e.variable(codeVbin8, codeVbin32, d)
		}
	case BodySequence:
		for _, s := range m.Sequence {
			if s == nil {
				s = List{}
			}
			e.section(DescriptorAmqpSequence, s)
		}
	case BodyValue:
		e.section(DescriptorAmqpValue, m.Value)
	case BodyNone:
	default:
		e.fail("body kind %d", m.Body)
	}
	if m.Footer != nil {
		e.section(DescriptorFooter, m.Footer)
	}
}

// fieldList turns fields into a List, dropping trailing nulls unless all is set.
func fieldList(fields []any, all bool) List {
	if !all {
		for len(fields) > 0 && fields[len(fields)-1] == nil {
			fields = fields[:len(fields)-1]
		}
	}
	return List(fields)
}

func opt[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

func (h *Header) fields() []any {
	return []any{opt(h.Durable), opt(h.Priority), opt(h.TTL), opt(h.FirstAcquirer), opt(h.DeliveryCount)}
}

func (p *Properties) fields() []any {
	var uid any
	if p.UserID != nil {
		uid = p.UserID
	}
	return []any{p.MessageID, uid, opt(p.To), opt(p.Subject), opt(p.ReplyTo), p.CorrelationID,
		opt(p.ContentType), opt(p.ContentEncoding), opt(p.AbsoluteExpiryTime), opt(p.CreationTime),
		opt(p.GroupID), opt(p.GroupSequence), opt(p.ReplyToGroupID)}
}

// Decode parses an encoded message (the bytes a stream-protocol publish carries, or a stream
// entry). Sections may come in any order but each of header, delivery annotations, message
// annotations, properties, application properties and footer at most once, and the body is
// data sections, amqp-sequence sections or a single amqp-value. Data sections alias b.
func Decode(b []byte) (*Message, error) {
	m := &Message{}
	var seen uint16 // bit (code - DescriptorHeader) per section seen
	for off := 0; off < len(b); {
		if b[off] != codeDescribed {
			return nil, malformed("section at offset %d is not a described value (0x%02x)", off, b[off])
		}
		d := decoder{b: b, off: off + 1}
		desc := d.value(1)
		if d.err != nil {
			return nil, fmt.Errorf("amqp10: section descriptor at offset %d: %w", off, d.err)
		}
		code, ok := sectionCode(desc)
		if !ok {
			return nil, malformed("unknown section descriptor %v at offset %d", desc, off)
		}
		start := d.off
		val := d.value(1)
		if d.err != nil {
			return nil, fmt.Errorf("amqp10: section 0x%02x at offset %d: %w", code, off, d.err)
		}
		repeatable := code == DescriptorData || code == DescriptorAmqpSequence
		bit := uint16(1) << (code - DescriptorHeader)
		if seen&bit != 0 && !repeatable {
			return nil, malformed("section 0x%02x appears twice", code)
		}
		seen |= bit
		if err := m.setSection(code, val, b[start:d.off]); err != nil {
			return nil, err
		}
		off = d.off
	}
	return m, nil
}

func sectionCode(desc any) (uint64, bool) {
	switch x := desc.(type) {
	case uint64:
		return x, x >= DescriptorHeader && x <= DescriptorFooter
	case Symbol:
		c, ok := sectionSymbols[x]
		return c, ok
	}
	return 0, false
}

func (m *Message) setBody(kind BodyKind) error {
	if m.Body != BodyNone && (m.Body != kind || kind == BodyValue) {
		return malformed("body mixes or repeats sections (a second %s section)", bodyName(kind))
	}
	m.Body = kind
	return nil
}

func bodyName(k BodyKind) string {
	return [...]string{"none", "data", "amqp-sequence", "amqp-value"}[k]
}

func (m *Message) setSection(code uint64, v any, raw []byte) error {
	switch code {
	case DescriptorHeader:
		h, err := decodeHeader(v)
		m.Header = h
		return err
	case DescriptorDeliveryAnnotations, DescriptorMessageAnnotations, DescriptorFooter:
		mp, ok := v.(Map)
		if !ok && v != nil {
			return malformed("annotations section 0x%02x is %T, not a map", code, v)
		}
		for _, kv := range mp {
			switch kv.Key.(type) {
			case Symbol, uint64:
			default:
				return malformed("annotation key of type %T", kv.Key)
			}
		}
		if mp == nil {
			mp = Map{}
		}
		switch code {
		case DescriptorDeliveryAnnotations:
			m.DeliveryAnnotations = mp
		case DescriptorMessageAnnotations:
			m.MessageAnnotations = mp
		default:
			m.Footer = mp
		}
	case DescriptorProperties:
		p, err := decodeProperties(v)
		m.Properties = p
		return err
	case DescriptorApplicationProperties:
		mp, ok := v.(Map)
		if !ok && v != nil {
			return malformed("application-properties is %T, not a map", v)
		}
		for _, kv := range mp {
			if _, ok := kv.Key.(string); !ok {
				return malformed("application-properties key of type %T", kv.Key)
			}
		}
		if mp == nil {
			mp = Map{}
		}
		m.ApplicationProperties = mp
	case DescriptorData:
		bin, ok := v.([]byte)
		if !ok {
			return malformed("data section is %T, not binary", v)
		}
		if err := m.setBody(BodyData); err != nil {
			return err
		}
		m.Data = append(m.Data, bin)
	case DescriptorAmqpSequence:
		l, ok := v.(List)
		if !ok {
			return malformed("amqp-sequence section is %T, not a list", v)
		}
		if err := m.setBody(BodySequence); err != nil {
			return err
		}
		m.Sequence = append(m.Sequence, l)
	case DescriptorAmqpValue:
		if err := m.setBody(BodyValue); err != nil {
			return err
		}
		m.Value = v
	}
	_ = raw
	return nil
}

func listFields(v any, what string, n int) (List, error) {
	if v == nil {
		return nil, nil
	}
	l, ok := v.(List)
	if !ok {
		return nil, malformed("%s is %T, not a list", what, v)
	}
	if len(l) > n {
		// More fields than the specification has: later versions may add some; ignore them.
		l = l[:n]
	}
	return l, nil
}

type fieldErr struct {
	what string
	err  error
}

func (f *fieldErr) check(i int, l List, name string, ok bool) {
	if f.err == nil && !ok {
		f.err = malformed("%s field %s has type %T", f.what, name, l[i])
	}
}

func get(l List, i int) any {
	if i < len(l) {
		return l[i]
	}
	return nil
}

func optField[T any](f *fieldErr, l List, i int, name string) *T {
	v := get(l, i)
	if v == nil {
		return nil
	}
	t, ok := v.(T)
	f.check(i, l, name, ok)
	if !ok {
		return nil
	}
	return &t
}

func decodeHeader(v any) (*Header, error) {
	l, err := listFields(v, "header", 5)
	if err != nil {
		return nil, err
	}
	f := fieldErr{what: "header"}
	h := &Header{
		Durable:       boolField(&f, l, 0, "durable"),
		Priority:      optField[uint8](&f, l, 1, "priority"),
		TTL:           optField[uint32](&f, l, 2, "ttl"),
		FirstAcquirer: boolField(&f, l, 3, "first-acquirer"),
		DeliveryCount: optField[uint32](&f, l, 4, "delivery-count"),
	}
	return h, f.err
}

func messageID(f *fieldErr, l List, i int, name string) any {
	v := get(l, i)
	switch v.(type) {
	case nil, uint64, UUID, []byte, string:
		return v
	}
	f.check(i, l, name, false)
	return nil
}

func decodeProperties(v any) (*Properties, error) {
	l, err := listFields(v, "properties", 13)
	if err != nil {
		return nil, err
	}
	f := fieldErr{what: "properties"}
	p := &Properties{
		MessageID:          messageID(&f, l, 0, "message-id"),
		To:                 optField[string](&f, l, 2, "to"),
		Subject:            optField[string](&f, l, 3, "subject"),
		ReplyTo:            optField[string](&f, l, 4, "reply-to"),
		CorrelationID:      messageID(&f, l, 5, "correlation-id"),
		ContentType:        optField[Symbol](&f, l, 6, "content-type"),
		ContentEncoding:    optField[Symbol](&f, l, 7, "content-encoding"),
		AbsoluteExpiryTime: optField[Timestamp](&f, l, 8, "absolute-expiry-time"),
		CreationTime:       optField[Timestamp](&f, l, 9, "creation-time"),
		GroupID:            optField[string](&f, l, 10, "group-id"),
		GroupSequence:      optField[uint32](&f, l, 11, "group-sequence"),
		ReplyToGroupID:     optField[string](&f, l, 12, "reply-to-group-id"),
	}
	if uid := optField[[]byte](&f, l, 1, "user-id"); uid != nil {
		p.UserID = *uid
	}
	return p, f.err
}

// boolField reads a boolean field in either encoding (bool or Boolean).
func boolField(f *fieldErr, l List, i int, name string) *bool {
	switch x := get(l, i).(type) {
	case nil:
		return nil
	case bool:
		return &x
	case Boolean:
		b := bool(x)
		return &b
	}
	f.check(i, l, name, false)
	return nil
}
