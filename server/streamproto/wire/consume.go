package wire

import "encoding/binary"

// Subscribe starts a subscription (id per connection) on a stream at an offset, with Credit
// chunks of initial credit. Properties RabbitMQ understands: single-active-consumer ("true"),
// name (the consumer name, needed with single-active-consumer), super-stream (the super stream
// the stream is a partition of), filter.N (filter values), match-unfiltered ("true").
type Subscribe struct {
	CorrelationID  uint32
	SubscriptionID uint8
	Stream         string
	Offset         OffsetSpec
	Credit         uint16
	Properties     []Property // left out of the frame when empty, as RabbitMQ's encoder does
}

func (*Subscribe) Key() Key        { return CommandSubscribe }
func (*Subscribe) Version() uint16 { return Version1 }

func (c *Subscribe) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.u8(c.SubscriptionID)
	e.str(c.Stream)
	if c.Offset.Type == OffsetTypeNone {
		return b, errorf("subscribe needs an offset type")
	}
	e.offsetSpec(c.Offset)
	e.u16(c.Credit)
	if len(c.Properties) > 0 {
		e.props(c.Properties)
	}
	return e.end()
}

func (c *Subscribe) Decode(frame []byte) error {
	d, _, err := start(frame, CommandSubscribe, Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.SubscriptionID = d.u8("subscription id")
	c.Stream = d.str("stream")
	c.Offset = d.offsetSpec("offset specification", false)
	c.Credit = d.u16("credit")
	c.Properties = d.optProps("properties", c.Properties[:0])
	return d.finish()
}

// Unsubscribe ends a subscription.
type Unsubscribe struct {
	CorrelationID  uint32
	SubscriptionID uint8
}

func (*Unsubscribe) Key() Key        { return CommandUnsubscribe }
func (*Unsubscribe) Version() uint16 { return Version1 }

func (c *Unsubscribe) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.u8(c.SubscriptionID)
	return e.end()
}

func (c *Unsubscribe) Decode(frame []byte) error {
	d, _, err := start(frame, CommandUnsubscribe, Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.SubscriptionID = d.u8("subscription id")
	return d.finish()
}

// Credit gives a subscription more chunks. RabbitMQ answers only on a problem, with a
// CreditResponse. (RabbitMQ reads the credit as a signed int16; this codec keeps the uint16 of
// the spec and leaves the policy for values over 32767 to the server.)
type Credit struct {
	SubscriptionID uint8
	Credit         uint16
}

func (*Credit) Key() Key        { return CommandCredit }
func (*Credit) Version() uint16 { return Version1 }

func (c *Credit) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u8(c.SubscriptionID)
	e.u16(c.Credit)
	return e.end()
}

func (c *Credit) Decode(frame []byte) error {
	d, _, err := start(frame, CommandCredit, Version1)
	if err != nil {
		return err
	}
	c.SubscriptionID = d.u8("subscription id")
	c.Credit = d.u16("credit")
	return d.finish()
}

// CreditResponse reports a credit that could not be given (ResponseCodeSubscriptionIDDoesNotExist,
// or ResponseCodePreconditionFailed for an inactive single-active consumer). It has no
// correlation id: the code comes before the subscription id.
type CreditResponse struct {
	Code           ResponseCode
	SubscriptionID uint8
}

func (*CreditResponse) Key() Key        { return CommandCredit.Response() }
func (*CreditResponse) Version() uint16 { return Version1 }

func (c *CreditResponse) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u16(uint16(c.Code))
	e.u8(c.SubscriptionID)
	return e.end()
}

func (c *CreditResponse) Decode(frame []byte) error {
	d, _, err := start(frame, CommandCredit.Response(), Version1)
	if err != nil {
		return err
	}
	c.Code = ResponseCode(d.u16("response code"))
	c.SubscriptionID = d.u8("subscription id")
	return d.finish()
}

// Deliver sends one chunk to a subscription. Chunk is the chunk as stored (see package
// stream/osiris): its 48-byte header followed by its data entries, without the bloom filter and
// the trailer (the header still states their sizes; RabbitMQ sends user chunks that way and
// clients skip nothing). Version2 adds the committed chunk id (the id of the newest chunk a
// quorum of replicas has), which clients that announced deliver v2 in
// exchange-command-versions receive.
type Deliver struct {
	SubscriptionID   uint8
	CommittedChunkID uint64 // version 2 only
	Chunk            []byte // slice of the frame after Decode
	Vers             uint16 // Version1 (default when 0) or Version2
}

func (*Deliver) Key() Key { return CommandDeliver }

func (c *Deliver) Version() uint16 {
	if c.Vers == 0 {
		return Version1
	}
	return c.Vers
}

// DeliverHeaderSize returns the bytes AppendDeliverHeader writes for a version.
func DeliverHeaderSize(version uint16) int {
	if version == Version2 {
		return 4 + 2 + 2 + 1 + 8
	}
	return 4 + 2 + 2 + 1
}

// AppendDeliverHeader appends the start of a deliver frame (size prefix, key, version,
// subscription id and, for version 2, the committed chunk id) for a chunk of chunkSize bytes
// that the caller writes next, unchanged. It never allocates when b has room.
func AppendDeliverHeader(b []byte, version uint16, subscriptionID uint8, committedChunkID uint64, chunkSize uint32) []byte {
	size := uint32(2+2+1) + chunkSize
	if version == Version2 {
		size += 8
	} else {
		version = Version1
	}
	b = binary.BigEndian.AppendUint32(b, size)
	b = binary.BigEndian.AppendUint16(b, uint16(CommandDeliver))
	b = binary.BigEndian.AppendUint16(b, version)
	b = append(b, subscriptionID)
	if version == Version2 {
		b = binary.BigEndian.AppendUint64(b, committedChunkID)
	}
	return b
}

func (c *Deliver) Append(b []byte) ([]byte, error) {
	v := c.Version()
	if v != Version1 && v != Version2 {
		return b, errorf("deliver version %d", v)
	}
	if uint64(len(c.Chunk)) > uint64(^uint32(0))-13 {
		return b, errorf("chunk of %d bytes", len(c.Chunk))
	}
	b = AppendDeliverHeader(b, v, c.SubscriptionID, c.CommittedChunkID, uint32(len(c.Chunk)))
	return append(b, c.Chunk...), nil
}

// Decode reads a deliver frame; the chunk is not parsed (stream/osiris parses it).
func (c *Deliver) Decode(frame []byte) error {
	d, v, err := start(frame, CommandDeliver, Version1, Version2)
	if err != nil {
		return err
	}
	c.Vers = v
	c.SubscriptionID = d.u8("subscription id")
	c.CommittedChunkID = 0
	if v == Version2 {
		c.CommittedChunkID = d.u64("committed chunk id")
	}
	c.Chunk = d.take("chunk", d.remaining())
	return d.err
}

// StoreOffset stores a named consumer offset (no response).
type StoreOffset struct {
	Reference string
	Stream    string
	Offset    uint64
}

func (*StoreOffset) Key() Key        { return CommandStoreOffset }
func (*StoreOffset) Version() uint16 { return Version1 }

func (c *StoreOffset) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.str(c.Reference)
	e.str(c.Stream)
	e.u64(c.Offset)
	return e.end()
}

func (c *StoreOffset) Decode(frame []byte) error {
	d, _, err := start(frame, CommandStoreOffset, Version1)
	if err != nil {
		return err
	}
	c.Reference = d.str("reference")
	c.Stream = d.str("stream")
	c.Offset = d.u64("offset")
	return d.finish()
}

// QueryOffset asks for a stored consumer offset.
type QueryOffset struct {
	CorrelationID uint32
	Reference     string
	Stream        string
}

func (*QueryOffset) Key() Key        { return CommandQueryOffset }
func (*QueryOffset) Version() uint16 { return Version1 }

func (c *QueryOffset) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.str(c.Reference)
	e.str(c.Stream)
	return e.end()
}

func (c *QueryOffset) Decode(frame []byte) error {
	d, _, err := start(frame, CommandQueryOffset, Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.Reference = d.str("reference")
	c.Stream = d.str("stream")
	return d.finish()
}

// QueryOffsetResponse carries the offset (ResponseCodeNoOffset when none is stored).
type QueryOffsetResponse struct {
	CorrelationID uint32
	Code          ResponseCode
	Offset        uint64
}

func (*QueryOffsetResponse) Key() Key        { return CommandQueryOffset.Response() }
func (*QueryOffsetResponse) Version() uint16 { return Version1 }

func (c *QueryOffsetResponse) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.u16(uint16(c.Code))
	e.u64(c.Offset)
	return e.end()
}

func (c *QueryOffsetResponse) Decode(frame []byte) error {
	d, _, err := start(frame, CommandQueryOffset.Response(), Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.Code = ResponseCode(d.u16("response code"))
	c.Offset = d.u64("offset")
	return d.finish()
}

// ConsumerUpdate is sent by the server to a single-active consumer when it becomes active
// (Active true) or stops being active. The client answers with ConsumerUpdateResponse.
type ConsumerUpdate struct {
	CorrelationID  uint32
	SubscriptionID uint8
	Active         bool
}

func (*ConsumerUpdate) Key() Key        { return CommandConsumerUpdate }
func (*ConsumerUpdate) Version() uint16 { return Version1 }

func (c *ConsumerUpdate) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.u8(c.SubscriptionID)
	e.bool8(c.Active)
	return e.end()
}

func (c *ConsumerUpdate) Decode(frame []byte) error {
	d, _, err := start(frame, CommandConsumerUpdate, Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.SubscriptionID = d.u8("subscription id")
	c.Active = d.bool8("active")
	return d.finish()
}

// ConsumerUpdateResponse is the client's answer: where the newly active consumer starts
// (OffsetTypeNone keeps the subscription's own offset specification).
type ConsumerUpdateResponse struct {
	CorrelationID uint32
	Code          ResponseCode
	Offset        OffsetSpec
}

func (*ConsumerUpdateResponse) Key() Key        { return CommandConsumerUpdate.Response() }
func (*ConsumerUpdateResponse) Version() uint16 { return Version1 }

func (c *ConsumerUpdateResponse) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.u16(uint16(c.Code))
	e.offsetSpec(c.Offset)
	return e.end()
}

func (c *ConsumerUpdateResponse) Decode(frame []byte) error {
	d, _, err := start(frame, CommandConsumerUpdate.Response(), Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.Code = ResponseCode(d.u16("response code"))
	c.Offset = d.offsetSpec("offset specification", true)
	return d.finish()
}

// ResolveOffsetSpec asks the server to turn an offset specification into an offset (4.x).
// Properties: filter.N, match-unfiltered, chunk_selector.
type ResolveOffsetSpec struct {
	CorrelationID uint32
	Stream        string
	Offset        OffsetSpec
	Properties    []Property
}

func (*ResolveOffsetSpec) Key() Key        { return CommandResolveOffsetSpec }
func (*ResolveOffsetSpec) Version() uint16 { return Version1 }

func (c *ResolveOffsetSpec) Append(b []byte) ([]byte, error) {
	if c.Offset.Type == OffsetTypeNone {
		return b, errorf("resolve_offset_spec needs an offset type")
	}
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.str(c.Stream)
	e.offsetSpec(c.Offset)
	if len(c.Properties) > 0 {
		e.props(c.Properties)
	}
	return e.end()
}

func (c *ResolveOffsetSpec) Decode(frame []byte) error {
	d, _, err := start(frame, CommandResolveOffsetSpec, Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.Stream = d.str("stream")
	c.Offset = d.offsetSpec("offset specification", false)
	c.Properties = d.optProps("properties", c.Properties[:0])
	return d.finish()
}

// ResolveOffsetSpecResponse carries the resolved value (RabbitMQ always answers with
// OffsetTypeOffset).
type ResolveOffsetSpecResponse struct {
	CorrelationID uint32
	Code          ResponseCode
	OffsetType    OffsetType
	Offset        uint64
}

func (*ResolveOffsetSpecResponse) Key() Key        { return CommandResolveOffsetSpec.Response() }
func (*ResolveOffsetSpecResponse) Version() uint16 { return Version1 }

func (c *ResolveOffsetSpecResponse) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.u16(uint16(c.Code))
	e.u16(uint16(c.OffsetType))
	e.u64(c.Offset)
	return e.end()
}

func (c *ResolveOffsetSpecResponse) Decode(frame []byte) error {
	d, _, err := start(frame, CommandResolveOffsetSpec.Response(), Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.Code = ResponseCode(d.u16("response code"))
	c.OffsetType = OffsetType(d.u16("offset type"))
	c.Offset = d.u64("offset")
	return d.finish()
}
