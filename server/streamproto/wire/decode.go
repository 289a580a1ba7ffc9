package wire

// New returns an empty command value for a key (response bit included), or nil when the key is
// not one this codec decodes. Tune answers both with and without the response bit.
func New(k Key) Command {
	if k.IsResponse() {
		c := k.Command()
		switch {
		case isGenericResponse(c):
			return &Response{Command: c}
		case c == CommandRoute || c == CommandPartitions:
			return &StreamsResponse{Command: c}
		}
		switch c {
		case CommandQueryPublisherSequence:
			return &QueryPublisherSequenceResponse{}
		case CommandCredit:
			return &CreditResponse{}
		case CommandQueryOffset:
			return &QueryOffsetResponse{}
		case CommandMetadata:
			return &MetadataResponse{}
		case CommandPeerProperties:
			return &PeerPropertiesResponse{}
		case CommandSASLHandshake:
			return &SASLHandshakeResponse{}
		case CommandSASLAuthenticate:
			return &SASLAuthenticateResponse{}
		case CommandTune:
			return &Tune{Response: true}
		case CommandOpen:
			return &OpenResponse{}
		case CommandConsumerUpdate:
			return &ConsumerUpdateResponse{}
		case CommandExchangeCommandVersions:
			return &ExchangeCommandVersionsResponse{}
		case CommandStreamStats:
			return &StreamStatsResponse{}
		case CommandResolveOffsetSpec:
			return &ResolveOffsetSpecResponse{}
		}
		return nil
	}
	switch k {
	case CommandDeclarePublisher:
		return &DeclarePublisher{}
	case CommandPublish:
		return &Publish{}
	case CommandPublishConfirm:
		return &PublishConfirm{}
	case CommandPublishError:
		return &PublishError{}
	case CommandQueryPublisherSequence:
		return &QueryPublisherSequence{}
	case CommandDeletePublisher:
		return &DeletePublisher{}
	case CommandSubscribe:
		return &Subscribe{}
	case CommandDeliver:
		return &Deliver{}
	case CommandCredit:
		return &Credit{}
	case CommandStoreOffset:
		return &StoreOffset{}
	case CommandQueryOffset:
		return &QueryOffset{}
	case CommandUnsubscribe:
		return &Unsubscribe{}
	case CommandCreateStream:
		return &CreateStream{}
	case CommandDeleteStream:
		return &DeleteStream{}
	case CommandMetadata:
		return &Metadata{}
	case CommandMetadataUpdate:
		return &MetadataUpdate{}
	case CommandPeerProperties:
		return &PeerProperties{}
	case CommandSASLHandshake:
		return &SASLHandshake{}
	case CommandSASLAuthenticate:
		return &SASLAuthenticate{}
	case CommandTune:
		return &Tune{}
	case CommandOpen:
		return &Open{}
	case CommandClose:
		return &Close{}
	case CommandHeartbeat:
		return &Heartbeat{}
	case CommandRoute:
		return &Route{}
	case CommandPartitions:
		return &Partitions{}
	case CommandConsumerUpdate:
		return &ConsumerUpdate{}
	case CommandExchangeCommandVersions:
		return &ExchangeCommandVersions{}
	case CommandStreamStats:
		return &StreamStats{}
	case CommandCreateSuperStream:
		return &CreateSuperStream{}
	case CommandDeleteSuperStream:
		return &DeleteSuperStream{}
	case CommandResolveOffsetSpec:
		return &ResolveOffsetSpec{}
	}
	return nil
}

// Decode decodes a frame (as ReadFrame returns it) into a new command value. Slices in the
// result (publish messages, deliver chunk, SASL data) alias frame; strings are copies.
// Hot paths should reuse values instead: check PeekHeader and call the type's Decode.
func Decode(frame []byte) (Command, error) {
	h, err := PeekHeader(frame)
	if err != nil {
		return nil, err
	}
	c := New(h.Key)
	if c == nil {
		return nil, &DecodeError{Key: h.Key, Version: h.Version, Reason: "unknown command key", Err: ErrUnknownCommand}
	}
	if err := c.Decode(frame); err != nil {
		return nil, err
	}
	return c, nil
}
