package wire

// Command is one frame's content. Append adds the whole frame (size prefix included) to b;
// Decode fills the value from a frame as ReadFrame returns it, checking key and version.
type Command interface {
	// Key is the key as on the wire, response bit included.
	Key() Key
	// Version is the command version the value encodes as.
	Version() uint16
	Append(b []byte) ([]byte, error)
	Decode(frame []byte) error
}

// Property is a key/value string pair (peer properties, open's connection properties,
// subscribe and resolve-offset-spec properties, create arguments). A slice keeps the order of
// the wire; Lookup finds a key.
type Property struct {
	Key, Value string
}

// Lookup returns the value of the first property named key.
func Lookup(ps []Property, key string) (string, bool) {
	for _, p := range ps {
		if p.Key == key {
			return p.Value, true
		}
	}
	return "", false
}

// start checks the key and version of a frame and returns a decoder positioned after them.
// versions lists the versions the command has; the one found is returned.
func start(frame []byte, want Key, versions ...uint16) (decoder, uint16, error) {
	h, err := PeekHeader(frame)
	if err != nil {
		return decoder{}, 0, err
	}
	d := newDecoder(frame)
	d.off = 4
	d.key, d.version = h.Key, h.Version
	if h.Key != want {
		return d, 0, &DecodeError{Key: h.Key, Version: h.Version,
			Reason: "frame is not a " + want.String(), Err: ErrUnknownCommand}
	}
	for _, v := range versions {
		if v == h.Version {
			return d, v, nil
		}
	}
	return d, 0, &DecodeError{Key: h.Key, Version: h.Version, Reason: "version not supported", Err: ErrUnsupportedVersion}
}

// ---- peer properties -------------------------------------------------------------------------

// PeerProperties is the client's first frame: its properties (product, version, platform,
// connection_name, ...).
type PeerProperties struct {
	CorrelationID uint32
	Properties    []Property
}

func (*PeerProperties) Key() Key        { return CommandPeerProperties }
func (*PeerProperties) Version() uint16 { return Version1 }

func (c *PeerProperties) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.props(c.Properties)
	return e.end()
}

func (c *PeerProperties) Decode(frame []byte) error {
	d, _, err := start(frame, CommandPeerProperties, Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.Properties = d.props("properties", c.Properties[:0])
	return d.finish()
}

// PeerPropertiesResponse carries the server's properties.
type PeerPropertiesResponse struct {
	CorrelationID uint32
	Code          ResponseCode
	Properties    []Property
}

func (*PeerPropertiesResponse) Key() Key        { return CommandPeerProperties.Response() }
func (*PeerPropertiesResponse) Version() uint16 { return Version1 }

func (c *PeerPropertiesResponse) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.u16(uint16(c.Code))
	e.props(c.Properties)
	return e.end()
}

func (c *PeerPropertiesResponse) Decode(frame []byte) error {
	d, _, err := start(frame, CommandPeerProperties.Response(), Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.Code = ResponseCode(d.u16("response code"))
	c.Properties = d.props("properties", c.Properties[:0])
	return d.finish()
}

// ---- SASL ------------------------------------------------------------------------------------

// SASLHandshake asks which SASL mechanisms the server offers.
type SASLHandshake struct {
	CorrelationID uint32
}

func (*SASLHandshake) Key() Key        { return CommandSASLHandshake }
func (*SASLHandshake) Version() uint16 { return Version1 }

func (c *SASLHandshake) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	return e.end()
}

func (c *SASLHandshake) Decode(frame []byte) error {
	d, _, err := start(frame, CommandSASLHandshake, Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	return d.finish()
}

// SASLHandshakeResponse lists the mechanisms (PLAIN, AMQPLAIN, EXTERNAL, ANONYMOUS, ...).
type SASLHandshakeResponse struct {
	CorrelationID uint32
	Code          ResponseCode
	Mechanisms    []string
}

func (*SASLHandshakeResponse) Key() Key        { return CommandSASLHandshake.Response() }
func (*SASLHandshakeResponse) Version() uint16 { return Version1 }

func (c *SASLHandshakeResponse) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.u16(uint16(c.Code))
	e.strs(c.Mechanisms)
	return e.end()
}

func (c *SASLHandshakeResponse) Decode(frame []byte) error {
	d, _, err := start(frame, CommandSASLHandshake.Response(), Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.Code = ResponseCode(d.u16("response code"))
	c.Mechanisms = d.strs("mechanisms", c.Mechanisms[:0])
	return d.finish()
}

// SASLAuthenticate carries the chosen mechanism and the client's response. Data is nil when
// the client sent none (length -1). For PLAIN it is "\x00user\x00password".
type SASLAuthenticate struct {
	CorrelationID uint32
	Mechanism     string
	Data          []byte // slice of the frame after Decode
}

func (*SASLAuthenticate) Key() Key        { return CommandSASLAuthenticate }
func (*SASLAuthenticate) Version() uint16 { return Version1 }

func (c *SASLAuthenticate) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.str(c.Mechanism)
	e.blob(c.Data)
	return e.end()
}

func (c *SASLAuthenticate) Decode(frame []byte) error {
	d, _, err := start(frame, CommandSASLAuthenticate, Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.Mechanism = d.str("mechanism")
	c.Data = d.blob("sasl data")
	return d.finish()
}

// SASLAuthenticateResponse answers SASLAuthenticate; Challenge is set only with
// ResponseSASLChallenge. As RabbitMQ encodes it, the challenge is a uint16-length string (not
// the int32-length bytes the spec shows) and is left out entirely when empty.
type SASLAuthenticateResponse struct {
	CorrelationID uint32
	Code          ResponseCode
	Challenge     []byte
}

func (*SASLAuthenticateResponse) Key() Key        { return CommandSASLAuthenticate.Response() }
func (*SASLAuthenticateResponse) Version() uint16 { return Version1 }

func (c *SASLAuthenticateResponse) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.u16(uint16(c.Code))
	if len(c.Challenge) > 0 {
		e.strBytes(c.Challenge)
	}
	return e.end()
}

func (c *SASLAuthenticateResponse) Decode(frame []byte) error {
	d, _, err := start(frame, CommandSASLAuthenticate.Response(), Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.Code = ResponseCode(d.u16("response code"))
	c.Challenge = nil
	if d.err == nil && d.remaining() > 0 {
		c.Challenge = d.strBytes("challenge")
	}
	return d.finish()
}

// ---- tune, open, close, heartbeat ------------------------------------------------------------

// Tune is sent by the server after authentication (FrameMax in bytes and Heartbeat in seconds,
// 0 = no limit / none) and echoed by the client with the values it agrees on. The client's
// answer has the response bit set (Response true), as the Go and Java clients send it;
// RabbitMQ accepts it with or without. There is no correlation id.
type Tune struct {
	FrameMax  uint32
	Heartbeat uint32
	Response  bool
}

func (c *Tune) Key() Key {
	if c.Response {
		return CommandTune.Response()
	}
	return CommandTune
}
func (*Tune) Version() uint16 { return Version1 }

func (c *Tune) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.FrameMax)
	e.u32(c.Heartbeat)
	return e.end()
}

func (c *Tune) Decode(frame []byte) error {
	h, err := PeekHeader(frame)
	if err != nil {
		return err
	}
	d, _, err := start(frame, h.Key, Version1)
	if err != nil {
		return err
	}
	if h.Key.Command() != CommandTune {
		return &DecodeError{Key: h.Key, Version: h.Version, Reason: "frame is not a tune", Err: ErrUnknownCommand}
	}
	c.Response = h.Key.IsResponse()
	c.FrameMax = d.u32("frame max")
	c.Heartbeat = d.u32("heartbeat")
	return d.finish()
}

// Open picks the virtual host.
type Open struct {
	CorrelationID uint32
	VirtualHost   string
}

func (*Open) Key() Key        { return CommandOpen }
func (*Open) Version() uint16 { return Version1 }

func (c *Open) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.str(c.VirtualHost)
	return e.end()
}

func (c *Open) Decode(frame []byte) error {
	d, _, err := start(frame, CommandOpen, Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.VirtualHost = d.str("virtual host")
	return d.finish()
}

// OpenResponse answers Open; on success RabbitMQ sends advertised_host and advertised_port.
// With no properties the count is left out, as RabbitMQ does (on failure).
type OpenResponse struct {
	CorrelationID uint32
	Code          ResponseCode
	Properties    []Property
}

func (*OpenResponse) Key() Key        { return CommandOpen.Response() }
func (*OpenResponse) Version() uint16 { return Version1 }

func (c *OpenResponse) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.u16(uint16(c.Code))
	if len(c.Properties) > 0 {
		e.props(c.Properties)
	}
	return e.end()
}

func (c *OpenResponse) Decode(frame []byte) error {
	d, _, err := start(frame, CommandOpen.Response(), Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.Code = ResponseCode(d.u16("response code"))
	c.Properties = d.optProps("connection properties", c.Properties[:0])
	return d.finish()
}

// Close asks the peer to close the connection, from either side. RabbitMQ sends it with
// correlation id 1 (ResponseCodeUnknownFrame "unknown frame", ResponseCodeFrameTooLarge "frame
// too large", ...). The answer is a Response.
type Close struct {
	CorrelationID uint32
	Code          ResponseCode
	Reason        string
}

func (*Close) Key() Key        { return CommandClose }
func (*Close) Version() uint16 { return Version1 }

func (c *Close) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.u16(uint16(c.Code))
	e.str(c.Reason)
	return e.end()
}

func (c *Close) Decode(frame []byte) error {
	d, _, err := start(frame, CommandClose, Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.Code = ResponseCode(d.u16("closing code"))
	c.Reason = d.str("closing reason")
	return d.finish()
}

// Heartbeat keeps an idle connection alive, from either side.
type Heartbeat struct{}

func (*Heartbeat) Key() Key        { return CommandHeartbeat }
func (*Heartbeat) Version() uint16 { return Version1 }

func (c *Heartbeat) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	return e.end()
}

func (c *Heartbeat) Decode(frame []byte) error {
	d, _, err := start(frame, CommandHeartbeat, Version1)
	if err != nil {
		return err
	}
	return d.finish()
}

// ---- generic response ------------------------------------------------------------------------

// Response is the answer that carries only a response code: to declare_publisher,
// delete_publisher, subscribe, unsubscribe, create_stream, delete_stream, close,
// create_super_stream and delete_super_stream.
type Response struct {
	Command       Key // the command answered, without the response bit
	CorrelationID uint32
	Code          ResponseCode
}

func (c *Response) Key() Key      { return c.Command.Command().Response() }
func (*Response) Version() uint16 { return Version1 }

func (c *Response) Append(b []byte) ([]byte, error) {
	if !isGenericResponse(c.Command.Command()) {
		return b, errorf("%s has no code-only response", c.Command.Command())
	}
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.u16(uint16(c.Code))
	return e.end()
}

func (c *Response) Decode(frame []byte) error {
	h, err := PeekHeader(frame)
	if err != nil {
		return err
	}
	if !h.Key.IsResponse() || !isGenericResponse(h.Key.Command()) {
		return &DecodeError{Key: h.Key, Version: h.Version, Reason: "frame is not a code-only response", Err: ErrUnknownCommand}
	}
	d, _, err := start(frame, h.Key, Version1)
	if err != nil {
		return err
	}
	c.Command = h.Key.Command()
	c.CorrelationID = d.u32("correlation id")
	c.Code = ResponseCode(d.u16("response code"))
	return d.finish()
}

func isGenericResponse(k Key) bool {
	switch k {
	case CommandDeclarePublisher, CommandDeletePublisher, CommandSubscribe, CommandUnsubscribe,
		CommandCreateStream, CommandDeleteStream, CommandClose, CommandCreateSuperStream,
		CommandDeleteSuperStream:
		return true
	}
	return false
}
