package wire

// CreateStream declares a stream. Arguments as RabbitMQ takes them (string values):
// max-length-bytes, max-age, stream-max-segment-size-bytes, initial-cluster-size,
// queue-leader-locator, stream-filter-size-bytes.
type CreateStream struct {
	CorrelationID uint32
	Stream        string
	Arguments     []Property
}

func (*CreateStream) Key() Key        { return CommandCreateStream }
func (*CreateStream) Version() uint16 { return Version1 }

func (c *CreateStream) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.str(c.Stream)
	e.props(c.Arguments)
	return e.end()
}

func (c *CreateStream) Decode(frame []byte) error {
	d, _, err := start(frame, CommandCreateStream, Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.Stream = d.str("stream")
	c.Arguments = d.props("arguments", c.Arguments[:0])
	return d.finish()
}

// DeleteStream deletes a stream.
type DeleteStream struct {
	CorrelationID uint32
	Stream        string
}

func (*DeleteStream) Key() Key        { return CommandDeleteStream }
func (*DeleteStream) Version() uint16 { return Version1 }

func (c *DeleteStream) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.str(c.Stream)
	return e.end()
}

func (c *DeleteStream) Decode(frame []byte) error {
	d, _, err := start(frame, CommandDeleteStream, Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.Stream = d.str("stream")
	return d.finish()
}

// Metadata asks where streams live.
type Metadata struct {
	CorrelationID uint32
	Streams       []string
}

func (*Metadata) Key() Key        { return CommandMetadata }
func (*Metadata) Version() uint16 { return Version1 }

func (c *Metadata) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.strs(c.Streams)
	return e.end()
}

func (c *Metadata) Decode(frame []byte) error {
	d, _, err := start(frame, CommandMetadata, Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.Streams = d.strs("streams", c.Streams[:0])
	return d.finish()
}

// Broker is one node in a metadata response, referred to by its Reference (RabbitMQ numbers
// them 0, 1, ... in the order listed).
type Broker struct {
	Reference uint16
	Host      string
	Port      uint32
}

// NoLeader is the leader reference of a stream entry that has none (an error entry).
const NoLeader uint16 = 0xFFFF

// StreamMetadata is one stream's entry: a code (ResponseCodeOK, ResponseCodeStreamDoesNotExist,
// ResponseCodeStreamNotAvailable or ResponseCodeAccessRefused), its leader and replicas as
// broker references. RabbitMQ writes error entries with leader NoLeader and no replicas.
type StreamMetadata struct {
	Stream   string
	Code     ResponseCode
	Leader   uint16
	Replicas []uint16
}

// MetadataResponse answers Metadata. It has no response code of its own: each stream entry
// carries one.
type MetadataResponse struct {
	CorrelationID uint32
	Brokers       []Broker
	Streams       []StreamMetadata
}

func (*MetadataResponse) Key() Key        { return CommandMetadata.Response() }
func (*MetadataResponse) Version() uint16 { return Version1 }

func (c *MetadataResponse) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.count(len(c.Brokers))
	for _, br := range c.Brokers {
		e.u16(br.Reference)
		e.str(br.Host)
		e.u32(br.Port)
	}
	e.count(len(c.Streams))
	for _, s := range c.Streams {
		e.str(s.Stream)
		e.u16(uint16(s.Code))
		e.u16(s.Leader)
		e.count(len(s.Replicas))
		for _, r := range s.Replicas {
			e.u16(r)
		}
	}
	return e.end()
}

func (c *MetadataResponse) Decode(frame []byte) error {
	d, _, err := start(frame, CommandMetadata.Response(), Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	n := d.count("broker count", 8)
	brokers := c.Brokers[:0]
	for i := 0; i < n && d.err == nil; i++ {
		ref := d.u16("broker reference")
		host := d.str("broker host")
		port := d.u32("broker port")
		brokers = append(brokers, Broker{Reference: ref, Host: host, Port: port})
	}
	c.Brokers = brokers
	n = d.count("stream count", 10)
	streams := c.Streams[:0]
	for i := 0; i < n && d.err == nil; i++ {
		var s StreamMetadata
		s.Stream = d.str("stream")
		s.Code = ResponseCode(d.u16("stream response code"))
		s.Leader = d.u16("leader reference")
		m := d.count("replica count", 2)
		for j := 0; j < m && d.err == nil; j++ {
			s.Replicas = append(s.Replicas, d.u16("replica reference"))
		}
		streams = append(streams, s)
	}
	c.Streams = streams
	return d.finish()
}

// MetadataUpdate tells a client that a stream changed; RabbitMQ sends it with
// ResponseCodeStreamNotAvailable when a stream is deleted or its leader moves, and clients then
// drop their publishers and subscriptions on it.
type MetadataUpdate struct {
	Code   ResponseCode
	Stream string
}

func (*MetadataUpdate) Key() Key        { return CommandMetadataUpdate }
func (*MetadataUpdate) Version() uint16 { return Version1 }

func (c *MetadataUpdate) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u16(uint16(c.Code))
	e.str(c.Stream)
	return e.end()
}

func (c *MetadataUpdate) Decode(frame []byte) error {
	d, _, err := start(frame, CommandMetadataUpdate, Version1)
	if err != nil {
		return err
	}
	c.Code = ResponseCode(d.u16("code"))
	c.Stream = d.str("stream")
	return d.finish()
}

// Route asks which partitions of a super stream a routing key goes to (by the super stream
// exchange's bindings).
type Route struct {
	CorrelationID uint32
	RoutingKey    string
	SuperStream   string
}

func (*Route) Key() Key        { return CommandRoute }
func (*Route) Version() uint16 { return Version1 }

func (c *Route) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.str(c.RoutingKey)
	e.str(c.SuperStream)
	return e.end()
}

func (c *Route) Decode(frame []byte) error {
	d, _, err := start(frame, CommandRoute, Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.RoutingKey = d.str("routing key")
	c.SuperStream = d.str("super stream")
	return d.finish()
}

// Partitions asks for a super stream's partitions, in partition order.
type Partitions struct {
	CorrelationID uint32
	SuperStream   string
}

func (*Partitions) Key() Key        { return CommandPartitions }
func (*Partitions) Version() uint16 { return Version1 }

func (c *Partitions) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.str(c.SuperStream)
	return e.end()
}

func (c *Partitions) Decode(frame []byte) error {
	d, _, err := start(frame, CommandPartitions, Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.SuperStream = d.str("super stream")
	return d.finish()
}

// StreamsResponse answers Route or Partitions (Command says which) with a list of streams.
type StreamsResponse struct {
	Command       Key // CommandRoute or CommandPartitions
	CorrelationID uint32
	Code          ResponseCode
	Streams       []string
}

func (c *StreamsResponse) Key() Key      { return c.Command.Command().Response() }
func (*StreamsResponse) Version() uint16 { return Version1 }

func (c *StreamsResponse) Append(b []byte) ([]byte, error) {
	if k := c.Command.Command(); k != CommandRoute && k != CommandPartitions {
		return b, errorf("%s does not answer with streams", k)
	}
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.u16(uint16(c.Code))
	e.strs(c.Streams)
	return e.end()
}

func (c *StreamsResponse) Decode(frame []byte) error {
	h, err := PeekHeader(frame)
	if err != nil {
		return err
	}
	if k := h.Key; k != CommandRoute.Response() && k != CommandPartitions.Response() {
		return &DecodeError{Key: h.Key, Version: h.Version, Reason: "frame is not a route or partitions response", Err: ErrUnknownCommand}
	}
	d, _, err := start(frame, h.Key, Version1)
	if err != nil {
		return err
	}
	c.Command = h.Key.Command()
	c.CorrelationID = d.u32("correlation id")
	c.Code = ResponseCode(d.u16("response code"))
	c.Streams = d.strs("streams", c.Streams[:0])
	return d.finish()
}

// CommandVersion is a command and the range of versions a peer supports.
type CommandVersion struct {
	Key        Key
	MinVersion uint16
	MaxVersion uint16
}

// ServerCommandVersions is what RabbitMQ 4.x answers to exchange-command-versions
// (rabbit_stream_utils:command_versions/0). Deliver is not in it: a client announces deliver v2
// in its own list, and the server then delivers with version 2.
var ServerCommandVersions = []CommandVersion{
	{CommandDeclarePublisher, 1, 1},
	{CommandPublish, 1, 2},
	{CommandQueryPublisherSequence, 1, 1},
	{CommandDeletePublisher, 1, 1},
	{CommandSubscribe, 1, 1},
	{CommandCredit, 1, 1},
	{CommandStoreOffset, 1, 1},
	{CommandQueryOffset, 1, 1},
	{CommandUnsubscribe, 1, 1},
	{CommandCreateStream, 1, 1},
	{CommandDeleteStream, 1, 1},
	{CommandMetadata, 1, 1},
	{CommandClose, 1, 1},
	{CommandHeartbeat, 1, 1},
	{CommandRoute, 1, 1},
	{CommandPartitions, 1, 1},
	{CommandStreamStats, 1, 1},
	{CommandCreateSuperStream, 1, 1},
	{CommandDeleteSuperStream, 1, 1},
	{CommandResolveOffsetSpec, 1, 1},
}

// ExchangeCommandVersions tells the server which command versions the client supports.
type ExchangeCommandVersions struct {
	CorrelationID uint32
	Commands      []CommandVersion
}

func (*ExchangeCommandVersions) Key() Key        { return CommandExchangeCommandVersions }
func (*ExchangeCommandVersions) Version() uint16 { return Version1 }

func (c *ExchangeCommandVersions) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	appendCommandVersions(&e, c.Commands)
	return e.end()
}

func appendCommandVersions(e *encoder, cs []CommandVersion) {
	e.count(len(cs))
	for _, cv := range cs {
		e.u16(uint16(cv.Key))
		e.u16(cv.MinVersion)
		e.u16(cv.MaxVersion)
	}
}

func (d *decoder) commandVersions(dst []CommandVersion) []CommandVersion {
	n := d.count("command count", 6)
	for i := 0; i < n && d.err == nil; i++ {
		k := Key(d.u16("command key"))
		lo := d.u16("min version")
		hi := d.u16("max version")
		dst = append(dst, CommandVersion{Key: k, MinVersion: lo, MaxVersion: hi})
	}
	return dst
}

func (c *ExchangeCommandVersions) Decode(frame []byte) error {
	d, _, err := start(frame, CommandExchangeCommandVersions, Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.Commands = d.commandVersions(c.Commands[:0])
	return d.finish()
}

// ExchangeCommandVersionsResponse carries the server's list (ServerCommandVersions).
type ExchangeCommandVersionsResponse struct {
	CorrelationID uint32
	Code          ResponseCode
	Commands      []CommandVersion
}

func (*ExchangeCommandVersionsResponse) Key() Key {
	return CommandExchangeCommandVersions.Response()
}
func (*ExchangeCommandVersionsResponse) Version() uint16 { return Version1 }

func (c *ExchangeCommandVersionsResponse) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.u16(uint16(c.Code))
	appendCommandVersions(&e, c.Commands)
	return e.end()
}

func (c *ExchangeCommandVersionsResponse) Decode(frame []byte) error {
	d, _, err := start(frame, CommandExchangeCommandVersions.Response(), Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.Code = ResponseCode(d.u16("response code"))
	c.Commands = d.commandVersions(c.Commands[:0])
	return d.finish()
}

// StreamStats asks for a stream's statistics.
type StreamStats struct {
	CorrelationID uint32
	Stream        string
}

func (*StreamStats) Key() Key        { return CommandStreamStats }
func (*StreamStats) Version() uint16 { return Version1 }

func (c *StreamStats) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.str(c.Stream)
	return e.end()
}

func (c *StreamStats) Decode(frame []byte) error {
	d, _, err := start(frame, CommandStreamStats, Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.Stream = d.str("stream")
	return d.finish()
}

// Stat is one named statistic. RabbitMQ sends first_chunk_id, committed_chunk_id and
// (4.x) last_chunk_id, -1 when the stream is empty.
type Stat struct {
	Name  string
	Value int64
}

// StreamStatsResponse carries the statistics.
type StreamStatsResponse struct {
	CorrelationID uint32
	Code          ResponseCode
	Stats         []Stat
}

func (*StreamStatsResponse) Key() Key        { return CommandStreamStats.Response() }
func (*StreamStatsResponse) Version() uint16 { return Version1 }

func (c *StreamStatsResponse) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.u16(uint16(c.Code))
	e.count(len(c.Stats))
	for _, s := range c.Stats {
		e.str(s.Name)
		e.u64(uint64(s.Value))
	}
	return e.end()
}

func (c *StreamStatsResponse) Decode(frame []byte) error {
	d, _, err := start(frame, CommandStreamStats.Response(), Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.Code = ResponseCode(d.u16("response code"))
	n := d.count("stat count", 10)
	stats := c.Stats[:0]
	for i := 0; i < n && d.err == nil; i++ {
		name := d.str("stat name")
		v := int64(d.u64("stat value"))
		stats = append(stats, Stat{Name: name, Value: v})
	}
	c.Stats = stats
	return d.finish()
}

// CreateSuperStream creates a super stream: its exchange, partition streams and bindings
// (Partitions[i] bound with BindingKeys[i]). Arguments are the partitions' stream arguments.
type CreateSuperStream struct {
	CorrelationID uint32
	Name          string
	Partitions    []string
	BindingKeys   []string
	Arguments     []Property
}

func (*CreateSuperStream) Key() Key        { return CommandCreateSuperStream }
func (*CreateSuperStream) Version() uint16 { return Version1 }

func (c *CreateSuperStream) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.str(c.Name)
	e.strs(c.Partitions)
	e.strs(c.BindingKeys)
	e.props(c.Arguments)
	return e.end()
}

func (c *CreateSuperStream) Decode(frame []byte) error {
	d, _, err := start(frame, CommandCreateSuperStream, Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.Name = d.str("super stream")
	c.Partitions = d.strs("partitions", c.Partitions[:0])
	c.BindingKeys = d.strs("binding keys", c.BindingKeys[:0])
	c.Arguments = d.props("arguments", c.Arguments[:0])
	return d.finish()
}

// DeleteSuperStream deletes a super stream and its partitions.
type DeleteSuperStream struct {
	CorrelationID uint32
	Name          string
}

func (*DeleteSuperStream) Key() Key        { return CommandDeleteSuperStream }
func (*DeleteSuperStream) Version() uint16 { return Version1 }

func (c *DeleteSuperStream) Append(b []byte) ([]byte, error) {
	e := begin(b, c.Key(), Version1)
	e.u32(c.CorrelationID)
	e.str(c.Name)
	return e.end()
}

func (c *DeleteSuperStream) Decode(frame []byte) error {
	d, _, err := start(frame, CommandDeleteSuperStream, Version1)
	if err != nil {
		return err
	}
	c.CorrelationID = d.u32("correlation id")
	c.Name = d.str("super stream")
	return d.finish()
}
