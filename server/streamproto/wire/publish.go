package wire

import "math"

// DeclarePublisher registers publisher id PublisherID (per connection) on a stream. A non-empty
// Reference (at most 256 bytes, checked by the server) turns on deduplication.
type DeclarePublisher struct {
	CorrelationID uint32
	PublisherID   uint8
	Reference     string
	Stream        string
}

func (*DeclarePublisher) Key() Key        { return CommandDeclarePublisher }
func (*DeclarePublisher) Version() uint16 { return Version1 }

func (c *DeclarePublisher) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.u8(c.PublisherID)
	e.str(c.Reference)
	e.str(c.Stream)
	return e.end()
}

func (c *DeclarePublisher) Decode(frame []byte) error {
	d, _, err := start(frame, CommandDeclarePublisher, Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.PublisherID = d.u8("publisher id")
	c.Reference = d.str("publisher reference")
	c.Stream = d.str("stream")
	return d.finish()
}

// DeletePublisher removes a publisher.
type DeletePublisher struct {
	CorrelationID uint32
	PublisherID   uint8
}

func (*DeletePublisher) Key() Key        { return CommandDeletePublisher }
func (*DeletePublisher) Version() uint16 { return Version1 }

func (c *DeletePublisher) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.u8(c.PublisherID)
	return e.end()
}

func (c *DeletePublisher) Decode(frame []byte) error {
	d, _, err := start(frame, CommandDeletePublisher, Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.PublisherID = d.u8("publisher id")
	return d.finish()
}

// QueryPublisherSequence asks for the highest publishing id stored for a publisher reference.
type QueryPublisherSequence struct {
	CorrelationID uint32
	Reference     string
	Stream        string
}

func (*QueryPublisherSequence) Key() Key        { return CommandQueryPublisherSequence }
func (*QueryPublisherSequence) Version() uint16 { return Version1 }

func (c *QueryPublisherSequence) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.str(c.Reference)
	e.str(c.Stream)
	return e.end()
}

func (c *QueryPublisherSequence) Decode(frame []byte) error {
	d, _, err := start(frame, CommandQueryPublisherSequence, Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.Reference = d.str("publisher reference")
	c.Stream = d.str("stream")
	return d.finish()
}

// QueryPublisherSequenceResponse carries the sequence (0 when the reference is unknown).
type QueryPublisherSequenceResponse struct {
	CorrelationID uint32
	Code          ResponseCode
	Sequence      uint64
}

func (*QueryPublisherSequenceResponse) Key() Key {
	return CommandQueryPublisherSequence.Response()
}
func (*QueryPublisherSequenceResponse) Version() uint16 { return Version1 }

func (c *QueryPublisherSequenceResponse) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.u16(uint16(c.Code))
	e.u64(c.Sequence)
	return e.end()
}

func (c *QueryPublisherSequenceResponse) Decode(frame []byte) error {
	d, _, err := start(frame, CommandQueryPublisherSequence.Response(), Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.Code = ResponseCode(d.u16("response code"))
	c.Sequence = d.u64("sequence")
	return d.finish()
}

// PublishedMessage is one entry of a Publish frame. After Decode, FilterValue and Data are
// slices of the frame (valid until the next read).
//
// A simple entry has Data = one AMQP 1.0 encoded message. A sub-entry batch (publish version 1
// only; SubBatch true) has Data = the batch body as the client sent it: Records messages, each
// a uint32 length and the message, the whole compressed with Compression (UncompressedSize is
// the length before compression). It is stored as one chunk entry and counts as Records
// offsets but one publishing id.
type PublishedMessage struct {
	PublishingID uint64
	// FilterValue is the message's filter value (version 2); nil when absent (length -1).
	FilterValue []byte
	Data        []byte
	// Entry is how Decode found the message in the frame, after its publishing id and filter
	// value: a sub-entry batch's 11-byte header (flags, record count, uncompressed and stored
	// sizes) followed by Data, or Data alone for a simple entry. A caller that keeps its own copy
	// of the frame can store a sub-entry batch from it as osiris does without building the header
	// again. Append ignores it.
	Entry []byte

	SubBatch         bool
	Compression      Compression
	Records          uint16
	UncompressedSize uint32
}

// Publish carries messages of one publisher. Version is Version1 or Version2 (filter values);
// Append picks Version2 when Version is 0 and any message has a filter value.
//
// Decode appends to Messages[:0], so a Publish reused across frames decodes without allocating
// once Messages has grown to the largest batch.
type Publish struct {
	PublisherID uint8
	Messages    []PublishedMessage
	// Vers is the version decoded, or the one to encode (0 = choose).
	Vers uint16
}

func (*Publish) Key() Key { return CommandPublish }

// Version is the version Append uses.
func (c *Publish) Version() uint16 {
	if c.Vers != 0 {
		return c.Vers
	}
	for i := range c.Messages {
		if c.Messages[i].FilterValue != nil {
			return Version2
		}
	}
	return Version1
}

// maxEntrySize is the largest simple entry (a 31-bit length).
const maxEntrySize = math.MaxInt32

func (c *Publish) Append(b []byte) ([]byte, error) {
	v := c.Version()
	if v != Version1 && v != Version2 {
		return b, errorf("publish version %d", v)
	}
	e := begin(b, CommandPublish, v)
	e.u8(c.PublisherID)
	e.count(len(c.Messages))
	for i := range c.Messages {
		m := &c.Messages[i]
		e.u64(m.PublishingID)
		if v == Version2 {
			if m.SubBatch {
				e.fail("a sub-entry batch cannot be published with version 2")
				break
			}
			if m.FilterValue == nil {
				e.u16(0xFFFF)
			} else {
				e.strBytes(m.FilterValue)
			}
		} else if m.FilterValue != nil {
			e.fail("a filter value needs publish version 2")
			break
		}
		if m.SubBatch {
			appendSubBatchHeader(&e, m.Compression, m.Records, m.UncompressedSize, len(m.Data))
		} else {
			if len(m.Data) > maxEntrySize {
				e.fail("message of %d bytes is over the 31-bit limit", len(m.Data))
				break
			}
			e.u32(uint32(len(m.Data)))
		}
		e.b = append(e.b, m.Data...)
	}
	return e.end()
}

func appendSubBatchHeader(e *encoder, comp Compression, records uint16, uncompressed uint32, size int) {
	if comp > 7 {
		e.fail("compression %d does not fit 3 bits", comp)
		return
	}
	if uint64(size) > math.MaxUint32 {
		e.fail("sub-entry batch of %d bytes", size)
		return
	}
	e.u8(0x80 | byte(comp)<<4)
	e.u16(records)
	e.u32(uncompressed)
	e.u32(uint32(size))
}

// Decode reads a publish frame of version 1 or 2. It checks every entry (lengths within the
// frame, the count of entries equal to the count field, sub-entry batches only in version 1,
// compression type known) so that a caller can store what it yields without further checks.
func (c *Publish) Decode(frame []byte) error {
	d, v, err := start(frame, CommandPublish, Version1, Version2)
	if err != nil {
		return err
	}
	c.Vers = v
	c.PublisherID = d.u8("publisher id")
	minEntry := 12 // publishing id + length
	if v == Version2 {
		minEntry = 14
	}
	n := d.count("message count", minEntry)
	msgs := c.Messages[:0]
	for i := 0; i < n && d.err == nil; i++ {
		var m PublishedMessage
		m.PublishingID = d.u64("publishing id")
		if v == Version2 {
			m.FilterValue = d.filterValue()
		}
		d.entry(&m, v)
		msgs = append(msgs, m)
	}
	c.Messages = msgs
	return d.finish()
}

// filterValue reads a publish v2 filter value: a uint16 length, 0xFFFF (-1) for none.
func (d *decoder) filterValue() []byte {
	n := d.u16("filter value")
	if d.err != nil || n == 0xFFFF {
		return nil
	}
	return d.take("filter value", int(n))
}

// entry reads a simple entry or (version 1) a sub-entry batch.
func (d *decoder) entry(m *PublishedMessage, v uint16) {
	if d.err != nil {
		return
	}
	if d.remaining() < 1 {
		d.fail("message", "truncated")
		return
	}
	if d.b[d.off]&0x80 == 0 {
		size := d.u32("message size")
		m.Data = d.take("message", int(size))
		m.Entry = m.Data
		return
	}
	start := d.off
	if v != Version1 {
		d.fail("message", "sub-entry batch in publish version %d", v)
		return
	}
	flags := d.u8("sub-entry flags")
	m.SubBatch = true
	m.Compression = Compression(flags >> 4 & 0x7)
	m.Records = d.u16("sub-entry record count")
	m.UncompressedSize = d.u32("sub-entry uncompressed size")
	size := d.u32("sub-entry size")
	m.Data = d.take("sub-entry batch", int(size))
	if d.err != nil {
		return
	}
	m.Entry = d.b[start:d.off:d.off]
	switch {
	case m.Compression > MaxKnownCompression:
		d.fail("sub-entry compression", "unknown compression type %d", m.Compression)
	case m.Records == 0:
		d.fail("sub-entry record count", "zero records")
	case uint64(m.Records)*4 > uint64(m.UncompressedSize):
		d.fail("sub-entry record count", "%d records cannot fit in %d uncompressed bytes", m.Records, m.UncompressedSize)
	case size == 0 && m.Compression != CompressionNone:
		d.fail("sub-entry batch", "empty batch with compression %d", m.Compression)
	}
}

// PublishConfirm tells a publisher which publishing ids are stored.
type PublishConfirm struct {
	PublisherID   uint8
	PublishingIDs []uint64
}

func (*PublishConfirm) Key() Key        { return CommandPublishConfirm }
func (*PublishConfirm) Version() uint16 { return Version1 }

func (c *PublishConfirm) Append(b []byte) ([]byte, error) {
	return AppendPublishConfirm(b, c.PublisherID, c.PublishingIDs)
}

// AppendPublishConfirm appends a publish-confirm frame without building a PublishConfirm.
func AppendPublishConfirm(b []byte, publisherID uint8, ids []uint64) ([]byte, error) {
	e := begin(b, CommandPublishConfirm, Version1)
	e.u8(publisherID)
	e.count(len(ids))
	for _, id := range ids {
		e.u64(id)
	}
	return e.end()
}

func (c *PublishConfirm) Decode(frame []byte) error {
	d, _, err := start(frame, CommandPublishConfirm, Version1)
	if err != nil {
		return err
	}
	c.PublisherID = d.u8("publisher id")
	n := d.count("publishing id count", 8)
	ids := c.PublishingIDs[:0]
	for i := 0; i < n && d.err == nil; i++ {
		ids = append(ids, d.u64("publishing id"))
	}
	c.PublishingIDs = ids
	return d.finish()
}

// PublishingError is one rejected message.
type PublishingError struct {
	PublishingID uint64
	Code         ResponseCode
}

// PublishError tells a publisher which messages were not stored and why (unknown publisher,
// access refused, stream not available, ...).
type PublishError struct {
	PublisherID uint8
	Errors      []PublishingError
}

func (*PublishError) Key() Key        { return CommandPublishError }
func (*PublishError) Version() uint16 { return Version1 }

func (c *PublishError) Append(b []byte) ([]byte, error) {
	e := begin(b, CommandPublishError, Version1)
	e.u8(c.PublisherID)
	e.count(len(c.Errors))
	for _, pe := range c.Errors {
		e.u64(pe.PublishingID)
		e.u16(uint16(pe.Code))
	}
	return e.end()
}

func (c *PublishError) Decode(frame []byte) error {
	d, _, err := start(frame, CommandPublishError, Version1)
	if err != nil {
		return err
	}
	c.PublisherID = d.u8("publisher id")
	n := d.count("error count", 10)
	errs := c.Errors[:0]
	for i := 0; i < n && d.err == nil; i++ {
		id := d.u64("publishing id")
		code := ResponseCode(d.u16("error code"))
		errs = append(errs, PublishingError{PublishingID: id, Code: code})
	}
	c.Errors = errs
	return d.finish()
}

// PublishingIDs walks the publishing ids of a publish frame's entries without decoding the
// rest, as RabbitMQ does to reject a whole frame (publish-error for every id). It stops at the
// first entry it cannot read.
func PublishingIDs(frame []byte, fn func(id uint64)) {
	d, v, err := start(frame, CommandPublish, Version1, Version2)
	if err != nil {
		return
	}
	d.u8("publisher id")
	n := d.u32("message count")
	for i := uint32(0); i < n; i++ {
		var m PublishedMessage
		m.PublishingID = d.u64("publishing id")
		if v == Version2 {
			d.filterValue()
		}
		d.entry(&m, v)
		if d.err != nil {
			return
		}
		fn(m.PublishingID)
	}
}
