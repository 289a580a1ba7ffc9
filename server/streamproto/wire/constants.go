package wire

import "fmt"

// Key is a command key as on the wire. Requests and one-way commands have the top bit clear,
// responses have it set (ResponseFlag); the command is the low 15 bits.
type Key uint16

// ResponseFlag is the bit that marks a response key (0x8006 answers 0x0006).
const ResponseFlag Key = 0x8000

// Command keys, named after RabbitMQ's COMMAND_* macros (rabbit_stream.hrl).
const (
	CommandDeclarePublisher        Key = 0x0001
	CommandPublish                 Key = 0x0002
	CommandPublishConfirm          Key = 0x0003
	CommandPublishError            Key = 0x0004
	CommandQueryPublisherSequence  Key = 0x0005
	CommandDeletePublisher         Key = 0x0006
	CommandSubscribe               Key = 0x0007
	CommandDeliver                 Key = 0x0008
	CommandCredit                  Key = 0x0009
	CommandStoreOffset             Key = 0x000a
	CommandQueryOffset             Key = 0x000b
	CommandUnsubscribe             Key = 0x000c
	CommandCreateStream            Key = 0x000d
	CommandDeleteStream            Key = 0x000e
	CommandMetadata                Key = 0x000f
	CommandMetadataUpdate          Key = 0x0010
	CommandPeerProperties          Key = 0x0011
	CommandSASLHandshake           Key = 0x0012
	CommandSASLAuthenticate        Key = 0x0013
	CommandTune                    Key = 0x0014
	CommandOpen                    Key = 0x0015
	CommandClose                   Key = 0x0016
	CommandHeartbeat               Key = 0x0017
	CommandRoute                   Key = 0x0018
	CommandPartitions              Key = 0x0019
	CommandConsumerUpdate          Key = 0x001a
	CommandExchangeCommandVersions Key = 0x001b
	CommandStreamStats             Key = 0x001c
	CommandCreateSuperStream       Key = 0x001d
	CommandDeleteSuperStream       Key = 0x001e
	CommandResolveOffsetSpec       Key = 0x001f
)

// Command versions. Publish and Deliver have a version 2 (publish with filter values, deliver
// with the committed chunk id); every other command has only version 1.
const (
	Version1 uint16 = 1
	Version2 uint16 = 2
)

var keyNames = [...]string{
	CommandDeclarePublisher:        "declare_publisher",
	CommandPublish:                 "publish",
	CommandPublishConfirm:          "publish_confirm",
	CommandPublishError:            "publish_error",
	CommandQueryPublisherSequence:  "query_publisher_sequence",
	CommandDeletePublisher:         "delete_publisher",
	CommandSubscribe:               "subscribe",
	CommandDeliver:                 "deliver",
	CommandCredit:                  "credit",
	CommandStoreOffset:             "store_offset",
	CommandQueryOffset:             "query_offset",
	CommandUnsubscribe:             "unsubscribe",
	CommandCreateStream:            "create_stream",
	CommandDeleteStream:            "delete_stream",
	CommandMetadata:                "metadata",
	CommandMetadataUpdate:          "metadata_update",
	CommandPeerProperties:          "peer_properties",
	CommandSASLHandshake:           "sasl_handshake",
	CommandSASLAuthenticate:        "sasl_authenticate",
	CommandTune:                    "tune",
	CommandOpen:                    "open",
	CommandClose:                   "close",
	CommandHeartbeat:               "heartbeat",
	CommandRoute:                   "route",
	CommandPartitions:              "partitions",
	CommandConsumerUpdate:          "consumer_update",
	CommandExchangeCommandVersions: "exchange_command_versions",
	CommandStreamStats:             "stream_stats",
	CommandCreateSuperStream:       "create_super_stream",
	CommandDeleteSuperStream:       "delete_super_stream",
	CommandResolveOffsetSpec:       "resolve_offset_spec",
}

// Command returns the key without the response bit.
func (k Key) Command() Key { return k &^ ResponseFlag }

// IsResponse reports whether the response bit is set.
func (k Key) IsResponse() bool { return k&ResponseFlag != 0 }

// Response returns the key with the response bit set.
func (k Key) Response() Key { return k | ResponseFlag }

// Known reports whether the command (response bit ignored) is one of the protocol's.
func (k Key) Known() bool {
	c := k.Command()
	return int(c) < len(keyNames) && keyNames[c] != ""
}

// String names the command as RabbitMQ does (declare_publisher, ...), with "response" appended
// for responses and the hex key for unknown ones.
func (k Key) String() string {
	name := fmt.Sprintf("0x%04x", uint16(k.Command()))
	if k.Known() {
		name = keyNames[k.Command()]
	}
	if k.IsResponse() {
		return name + " response"
	}
	return name
}

// ResponseCode is the uint16 outcome carried by responses (and by publish errors, metadata
// entries, metadata updates and close). Names follow RabbitMQ's RESPONSE_* macros.
type ResponseCode uint16

// Response codes (rabbit_stream.hrl).
const (
	ResponseCodeOK                            ResponseCode = 0x01
	ResponseCodeStreamDoesNotExist            ResponseCode = 0x02
	ResponseCodeSubscriptionIDAlreadyExists   ResponseCode = 0x03
	ResponseCodeSubscriptionIDDoesNotExist    ResponseCode = 0x04
	ResponseCodeStreamAlreadyExists           ResponseCode = 0x05
	ResponseCodeStreamNotAvailable            ResponseCode = 0x06
	ResponseSASLMechanismNotSupported         ResponseCode = 0x07
	ResponseAuthenticationFailure             ResponseCode = 0x08
	ResponseSASLError                         ResponseCode = 0x09
	ResponseSASLChallenge                     ResponseCode = 0x0a
	ResponseSASLAuthenticationFailureLoopback ResponseCode = 0x0b
	ResponseVhostAccessFailure                ResponseCode = 0x0c
	ResponseCodeUnknownFrame                  ResponseCode = 0x0d
	ResponseCodeFrameTooLarge                 ResponseCode = 0x0e
	ResponseCodeInternalError                 ResponseCode = 0x0f
	ResponseCodeAccessRefused                 ResponseCode = 0x10
	ResponseCodePreconditionFailed            ResponseCode = 0x11
	ResponseCodePublisherDoesNotExist         ResponseCode = 0x12
	ResponseCodeNoOffset                      ResponseCode = 0x13
	ResponseSASLCannotChangeMechanism         ResponseCode = 0x14
	ResponseSASLCannotChangeUsername          ResponseCode = 0x15
)

var codeNames = [...]string{
	ResponseCodeOK:                            "ok",
	ResponseCodeStreamDoesNotExist:            "stream_does_not_exist",
	ResponseCodeSubscriptionIDAlreadyExists:   "subscription_id_already_exists",
	ResponseCodeSubscriptionIDDoesNotExist:    "subscription_id_does_not_exist",
	ResponseCodeStreamAlreadyExists:           "stream_already_exists",
	ResponseCodeStreamNotAvailable:            "stream_not_available",
	ResponseSASLMechanismNotSupported:         "sasl_mechanism_not_supported",
	ResponseAuthenticationFailure:             "authentication_failure",
	ResponseSASLError:                         "sasl_error",
	ResponseSASLChallenge:                     "sasl_challenge",
	ResponseSASLAuthenticationFailureLoopback: "sasl_authentication_failure_loopback",
	ResponseVhostAccessFailure:                "vhost_access_failure",
	ResponseCodeUnknownFrame:                  "unknown_frame",
	ResponseCodeFrameTooLarge:                 "frame_too_large",
	ResponseCodeInternalError:                 "internal_error",
	ResponseCodeAccessRefused:                 "access_refused",
	ResponseCodePreconditionFailed:            "precondition_failed",
	ResponseCodePublisherDoesNotExist:         "publisher_does_not_exist",
	ResponseCodeNoOffset:                      "no_offset",
	ResponseSASLCannotChangeMechanism:         "sasl_cannot_change_mechanism",
	ResponseSASLCannotChangeUsername:          "sasl_cannot_change_username",
}

// String names the code as RabbitMQ's macro does, in lower case.
func (c ResponseCode) String() string {
	if int(c) < len(codeNames) && codeNames[c] != "" {
		return codeNames[c]
	}
	return fmt.Sprintf("response_code_0x%04x", uint16(c))
}

// OffsetType says where a subscription (or a resolve-offset-spec or consumer-update answer)
// starts. OffsetTypeNone appears only in consumer-update responses ("keep the subscription's").
type OffsetType uint16

// Offset specification types (OFFSET_TYPE_* in rabbit_stream.hrl).
const (
	OffsetTypeNone      OffsetType = 0
	OffsetTypeFirst     OffsetType = 1
	OffsetTypeLast      OffsetType = 2
	OffsetTypeNext      OffsetType = 3
	OffsetTypeOffset    OffsetType = 4
	OffsetTypeTimestamp OffsetType = 5
)

func (t OffsetType) String() string {
	switch t {
	case OffsetTypeNone:
		return "none"
	case OffsetTypeFirst:
		return "first"
	case OffsetTypeLast:
		return "last"
	case OffsetTypeNext:
		return "next"
	case OffsetTypeOffset:
		return "offset"
	case OffsetTypeTimestamp:
		return "timestamp"
	}
	return fmt.Sprintf("offset_type_%d", uint16(t))
}

// OffsetSpec is an offset specification: a type and, for OffsetTypeOffset and
// OffsetTypeTimestamp, a value (an offset, or Erlang system time in milliseconds since the
// epoch, stored here as its two's-complement bits: use Timestamp()).
type OffsetSpec struct {
	Type  OffsetType
	Value uint64
}

// Offset returns the specification of an absolute offset.
func Offset(o uint64) OffsetSpec { return OffsetSpec{Type: OffsetTypeOffset, Value: o} }

// Timestamp returns the specification of a timestamp in milliseconds since the epoch.
func Timestamp(ms int64) OffsetSpec { return OffsetSpec{Type: OffsetTypeTimestamp, Value: uint64(ms)} }

// HasValue reports whether the type carries a 64-bit value on the wire.
func (s OffsetSpec) HasValue() bool {
	return s.Type == OffsetTypeOffset || s.Type == OffsetTypeTimestamp
}

// Timestamp returns the value as signed milliseconds (meaningful for OffsetTypeTimestamp).
func (s OffsetSpec) Timestamp() int64 { return int64(s.Value) }

func (s OffsetSpec) String() string {
	switch s.Type {
	case OffsetTypeOffset:
		return fmt.Sprintf("offset %d", s.Value)
	case OffsetTypeTimestamp:
		return fmt.Sprintf("timestamp %d", s.Timestamp())
	}
	return s.Type.String()
}

// Compression is the codec of a sub-entry batch (the 3 bits after the sub-batch flag).
type Compression uint8

// Compression types of sub-entry batches, as the stream clients number them.
const (
	CompressionNone   Compression = 0
	CompressionGzip   Compression = 1
	CompressionSnappy Compression = 2
	CompressionLZ4    Compression = 3
	CompressionZstd   Compression = 4
)

// MaxKnownCompression is the highest compression type RabbitMQ accepts in a sub-entry batch.
const MaxKnownCompression = CompressionZstd

// Defaults and limits RabbitMQ uses (rabbit_stream.hrl).
const (
	// DefaultFrameMax is the frame_max RabbitMQ proposes in tune (1 MiB).
	DefaultFrameMax = 1048576
	// DefaultInitialFrameMax bounds frames until open succeeds (8 KiB).
	DefaultInitialFrameMax = 8192
	// DefaultHeartbeat is the heartbeat RabbitMQ proposes in tune, in seconds.
	DefaultHeartbeat = 60
	// MaxStringLength is the longest string this package encodes (an int16 length).
	MaxStringLength = 32767
)
