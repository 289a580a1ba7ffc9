package wire

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

// every returns one value of every command type, with every field set (and variants).
func every() []Command {
	props := []Property{{"product", "RabbitMQ Stream"}, {"version", "4.0.0"}}
	return []Command{
		&PeerProperties{CorrelationID: 1, Properties: props},
		&PeerProperties{CorrelationID: 1, Properties: []Property{}},
		&PeerPropertiesResponse{CorrelationID: 1, Code: ResponseCodeOK, Properties: props},
		&SASLHandshake{CorrelationID: 2},
		&SASLHandshakeResponse{CorrelationID: 2, Code: ResponseCodeOK, Mechanisms: []string{"PLAIN", "AMQPLAIN"}},
		&SASLAuthenticate{CorrelationID: 3, Mechanism: "PLAIN", Data: []byte("\x00guest\x00guest")},
		&SASLAuthenticate{CorrelationID: 3, Mechanism: "ANONYMOUS"},
		&SASLAuthenticateResponse{CorrelationID: 3, Code: ResponseCodeOK},
		&SASLAuthenticateResponse{CorrelationID: 3, Code: ResponseSASLChallenge, Challenge: []byte("nonce")},
		&Tune{FrameMax: 1048576, Heartbeat: 60},
		&Tune{FrameMax: 0, Heartbeat: 0, Response: true},
		&Open{CorrelationID: 4, VirtualHost: "/"},
		&OpenResponse{CorrelationID: 4, Code: ResponseCodeOK, Properties: []Property{{"advertised_host", "localhost"}, {"advertised_port", "5552"}}},
		&OpenResponse{CorrelationID: 4, Code: ResponseVhostAccessFailure},
		&Close{CorrelationID: 1, Code: ResponseCodeUnknownFrame, Reason: "unknown frame"},
		&Heartbeat{},
		&DeclarePublisher{CorrelationID: 5, PublisherID: 7, Reference: "ref", Stream: "s"},
		&DeclarePublisher{CorrelationID: 5, PublisherID: 255, Stream: "s"},
		&DeletePublisher{CorrelationID: 6, PublisherID: 7},
		&QueryPublisherSequence{CorrelationID: 7, Reference: "ref", Stream: "s"},
		&QueryPublisherSequenceResponse{CorrelationID: 7, Code: ResponseCodeOK, Sequence: 1 << 40},
		&Publish{PublisherID: 1, Messages: []PublishedMessage{{PublishingID: 1, Data: []byte("a")}, {PublishingID: 2, Data: []byte{}}}},
		&Publish{PublisherID: 1, Messages: []PublishedMessage{
			{PublishingID: 1, Data: []byte("a"), FilterValue: []byte("eu")},
			{PublishingID: 2, Data: []byte("b")},
			{PublishingID: 3, Data: []byte("c"), FilterValue: []byte{}},
		}},
		&Publish{PublisherID: 1, Messages: []PublishedMessage{
			{PublishingID: 9, SubBatch: true, Compression: CompressionGzip, Records: 2, UncompressedSize: 10, Data: []byte("compressed")},
			{PublishingID: 10, Data: []byte("plain")},
		}},
		&Publish{PublisherID: 3, Messages: []PublishedMessage{}},
		&PublishConfirm{PublisherID: 1, PublishingIDs: []uint64{1, 2, 3}},
		&PublishError{PublisherID: 1, Errors: []PublishingError{{1, ResponseCodePublisherDoesNotExist}, {2, ResponseCodeAccessRefused}}},
		&Subscribe{CorrelationID: 8, SubscriptionID: 0, Stream: "s", Offset: OffsetSpec{Type: OffsetTypeFirst}, Credit: 10},
		&Subscribe{CorrelationID: 8, SubscriptionID: 1, Stream: "s", Offset: Offset(42), Credit: 1, Properties: []Property{{"single-active-consumer", "true"}, {"name", "app"}, {"filter.0", "eu"}}},
		&Subscribe{CorrelationID: 8, SubscriptionID: 2, Stream: "s", Offset: Timestamp(-5), Credit: 1},
		&Subscribe{CorrelationID: 8, SubscriptionID: 3, Stream: "s", Offset: OffsetSpec{Type: OffsetTypeNext}, Credit: 65535},
		&Subscribe{CorrelationID: 8, SubscriptionID: 4, Stream: "s", Offset: OffsetSpec{Type: OffsetTypeLast}},
		&Unsubscribe{CorrelationID: 9, SubscriptionID: 1},
		&Credit{SubscriptionID: 1, Credit: 5},
		&CreditResponse{Code: ResponseCodeSubscriptionIDDoesNotExist, SubscriptionID: 9},
		&Deliver{SubscriptionID: 1, Chunk: []byte("chunk bytes"), Vers: Version1},
		&Deliver{SubscriptionID: 1, CommittedChunkID: 77, Chunk: []byte("chunk bytes"), Vers: Version2},
		&StoreOffset{Reference: "app", Stream: "s", Offset: 12},
		&QueryOffset{CorrelationID: 10, Reference: "app", Stream: "s"},
		&QueryOffsetResponse{CorrelationID: 10, Code: ResponseCodeNoOffset},
		&ConsumerUpdate{CorrelationID: 11, SubscriptionID: 1, Active: true},
		&ConsumerUpdate{CorrelationID: 11, SubscriptionID: 1, Active: false},
		&ConsumerUpdateResponse{CorrelationID: 11, Code: ResponseCodeOK, Offset: OffsetSpec{Type: OffsetTypeNone}},
		&ConsumerUpdateResponse{CorrelationID: 11, Code: ResponseCodeOK, Offset: Offset(100)},
		&ConsumerUpdateResponse{CorrelationID: 11, Code: ResponseCodeOK, Offset: Timestamp(1700000000000)},
		&CreateStream{CorrelationID: 12, Stream: "s", Arguments: []Property{{"max-length-bytes", "1000"}}},
		&DeleteStream{CorrelationID: 13, Stream: "s"},
		&Metadata{CorrelationID: 14, Streams: []string{"a", "b"}},
		&MetadataResponse{CorrelationID: 14,
			Brokers: []Broker{{0, "localhost", 5552}, {1, "node2", 5553}},
			Streams: []StreamMetadata{{Stream: "a", Code: ResponseCodeOK, Leader: 0, Replicas: []uint16{1}}, {Stream: "b", Code: ResponseCodeStreamDoesNotExist, Leader: NoLeader}}},
		&MetadataUpdate{Code: ResponseCodeStreamNotAvailable, Stream: "s"},
		&Route{CorrelationID: 15, RoutingKey: "k", SuperStream: "ss"},
		&StreamsResponse{Command: CommandRoute, CorrelationID: 15, Code: ResponseCodeOK, Streams: []string{"ss-1"}},
		&Partitions{CorrelationID: 16, SuperStream: "ss"},
		&StreamsResponse{Command: CommandPartitions, CorrelationID: 16, Code: ResponseCodeOK, Streams: []string{"ss-0", "ss-1", "ss-2"}},
		&ExchangeCommandVersions{CorrelationID: 17, Commands: []CommandVersion{{CommandDeliver, 1, 2}, {CommandPublish, 1, 2}}},
		&ExchangeCommandVersionsResponse{CorrelationID: 17, Code: ResponseCodeOK, Commands: ServerCommandVersions},
		&StreamStats{CorrelationID: 18, Stream: "s"},
		&StreamStatsResponse{CorrelationID: 18, Code: ResponseCodeOK, Stats: []Stat{{"first_chunk_id", 0}, {"committed_chunk_id", -1}}},
		&CreateSuperStream{CorrelationID: 19, Name: "ss", Partitions: []string{"ss-0", "ss-1"}, BindingKeys: []string{"0", "1"}, Arguments: []Property{{"max-age", "1h"}}},
		&DeleteSuperStream{CorrelationID: 20, Name: "ss"},
		&ResolveOffsetSpec{CorrelationID: 21, Stream: "s", Offset: Timestamp(1700000000000)},
		&ResolveOffsetSpec{CorrelationID: 21, Stream: "s", Offset: OffsetSpec{Type: OffsetTypeLast}, Properties: []Property{{"chunk_selector", "all"}}},
		&ResolveOffsetSpecResponse{CorrelationID: 21, Code: ResponseCodeOK, OffsetType: OffsetTypeOffset, Offset: 5},
		&Response{Command: CommandDeclarePublisher, CorrelationID: 5, Code: ResponseCodeOK},
		&Response{Command: CommandDeletePublisher, CorrelationID: 6, Code: ResponseCodePublisherDoesNotExist},
		&Response{Command: CommandSubscribe, CorrelationID: 8, Code: ResponseCodeSubscriptionIDAlreadyExists},
		&Response{Command: CommandUnsubscribe, CorrelationID: 9, Code: ResponseCodeOK},
		&Response{Command: CommandCreateStream, CorrelationID: 12, Code: ResponseCodeStreamAlreadyExists},
		&Response{Command: CommandDeleteStream, CorrelationID: 13, Code: ResponseCodeOK},
		&Response{Command: CommandClose, CorrelationID: 1, Code: ResponseCodeOK},
		&Response{Command: CommandCreateSuperStream, CorrelationID: 19, Code: ResponseCodePreconditionFailed},
		&Response{Command: CommandDeleteSuperStream, CorrelationID: 20, Code: ResponseCodeOK},
	}
}

// normalize makes decoded values comparable with the ones encoded: empty slices become nil
// and the publish/deliver version chosen by Append is filled in.
func normalize(c Command) Command {
	v := reflect.ValueOf(c).Elem()
	normValue(v)
	switch x := c.(type) {
	case *Publish:
		x.Vers = x.Version()
		for i := range x.Messages {
			x.Messages[i].Entry = nil // checked by TestPublishEntryIsTheFramesEncoding
		}
	case *Deliver:
		x.Vers = x.Version()
	}
	return c
}

func normValue(v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			normValue(v.Field(i))
		}
	case reflect.Slice:
		if v.Len() == 0 {
			if v.Type().Elem().Kind() == reflect.Uint8 && !v.IsNil() {
				// keep: an empty non-nil []byte (filter value "", message "") is meaningful
				return
			}
			v.Set(reflect.Zero(v.Type()))
			return
		}
		for i := 0; i < v.Len(); i++ {
			normValue(v.Index(i))
		}
	}
}

func TestRoundTripEveryCommand(t *testing.T) {
	seen := map[Key]bool{}
	for _, c := range every() {
		t.Run(c.Key().String(), func(t *testing.T) {
			frame, err := c.Append(nil)
			if err != nil {
				t.Fatalf("Append: %v", err)
			}
			r := NewReader(bytes.NewReader(frame), 0)
			body, err := r.ReadFrame()
			if err != nil {
				t.Fatalf("ReadFrame: %v", err)
			}
			h, _ := PeekHeader(body)
			if h.Key != c.Key() || h.Version != c.Version() {
				t.Fatalf("header %v v%d, want %v v%d", h.Key, h.Version, c.Key(), c.Version())
			}
			got, err := Decode(body)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if want := normalize(c); !reflect.DeepEqual(normalize(got), want) {
				t.Fatalf("round trip:\n got %#v\nwant %#v", got, want)
			}
			again, err := got.Append(nil)
			if err != nil || !bytes.Equal(again, frame) {
				t.Fatalf("re-encoding differs: %x\nwant %x (%v)", again, frame, err)
			}
			seen[c.Key()] = true
		})
	}
	// Every key of the protocol, in each direction it travels, has a case above.
	for k := CommandDeclarePublisher; k <= CommandResolveOffsetSpec; k++ {
		if !seen[k] && k != CommandCredit.Response() {
			if New(k) != nil && !seen[k] {
				t.Errorf("no round-trip case for %v", k)
			}
		}
		if New(k.Response()) != nil && !seen[k.Response()] {
			t.Errorf("no round-trip case for %v", k.Response())
		}
	}
}

// TestTruncatedAndExtended checks that every prefix of every valid frame and every frame with a
// byte appended either decodes to an error wrapping ErrMalformed or (for commands whose last
// field runs to the end of the frame) decodes cleanly; never a panic.
func TestTruncatedAndExtended(t *testing.T) {
	for _, c := range every() {
		frame, err := c.Append(nil)
		if err != nil {
			t.Fatal(err)
		}
		body := frame[4:]
		for n := 0; n < len(body); n++ {
			_, err := Decode(body[:n])
			if err == nil {
				if _, open := c.(*Deliver); open && n >= DeliverHeaderSize(c.Version())-4 {
					continue // the chunk runs to the end of the frame
				}
				if isOptionalTail(c, body, n) {
					continue
				}
				t.Errorf("%v: prefix of %d/%d bytes decoded without error", c.Key(), n, len(body))
			} else if !errors.Is(err, ErrMalformed) {
				t.Errorf("%v: prefix of %d bytes: error %v does not wrap ErrMalformed", c.Key(), n, err)
			}
		}
		ext := append(append([]byte{}, body...), 0)
		if _, err := Decode(ext); err == nil {
			switch c.(type) {
			case *Deliver:
			default:
				if !isOptionalTail(c, ext, len(ext)) {
					t.Errorf("%v: a trailing byte was accepted", c.Key())
				}
			}
		}
	}
}

// isOptionalTail reports whether a prefix of n bytes is itself a valid encoding (frames whose
// tail is optional: open response properties, subscribe and resolve properties, a SASL
// challenge).
func isOptionalTail(c Command, body []byte, n int) bool {
	d, err := Decode(body[:n])
	if err != nil {
		return false
	}
	switch d.(type) {
	case *OpenResponse, *Subscribe, *ResolveOffsetSpec, *SASLAuthenticateResponse:
		return true
	}
	return false
}

func TestUnknownKeyAndVersion(t *testing.T) {
	cases := []struct {
		name  string
		frame []byte
		want  error
	}{
		{"unknown key", []byte{0x00, 0x63, 0x00, 0x01}, ErrUnknownCommand},
		{"unknown response key", []byte{0x80, 0x63, 0x00, 0x01}, ErrUnknownCommand},
		{"response to a one-way command", []byte{0x80, 0x02, 0x00, 0x01}, ErrUnknownCommand},
		{"publish v3", []byte{0x00, 0x02, 0x00, 0x03, 1, 0, 0, 0, 0}, ErrUnsupportedVersion},
		{"open v2", []byte{0x00, 0x15, 0x00, 0x02, 0, 0, 0, 1, 0, 1, '/'}, ErrUnsupportedVersion},
		{"heartbeat v0", []byte{0x00, 0x17, 0x00, 0x00}, ErrUnsupportedVersion},
		{"short frame", []byte{0x00}, ErrMalformed},
		{"unknown offset type", []byte{0x00, 0x07, 0x00, 0x01, 0, 0, 0, 1, 0, 0, 1, 's', 0, 9, 0, 1}, ErrMalformed},
		{"none offset in subscribe", []byte{0x00, 0x07, 0x00, 0x01, 0, 0, 0, 1, 0, 0, 1, 's', 0, 0, 0, 1}, ErrMalformed},
		{"huge count", []byte{0x00, 0x0f, 0x00, 0x01, 0, 0, 0, 1, 0x7f, 0xff, 0xff, 0xff}, ErrMalformed},
		{"negative sasl length", []byte{0x00, 0x13, 0x00, 0x01, 0, 0, 0, 1, 0, 0, 0x80, 0, 0, 0}, ErrMalformed},
		{"consumer update active 2", []byte{0x00, 0x1a, 0x00, 0x01, 0, 0, 0, 1, 0, 2}, ErrMalformed},
		{"sub-entry batch in publish v2", []byte{0x00, 0x02, 0x00, 0x02, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0x80, 0, 1, 0, 0, 0, 4, 0, 0, 0, 0}, ErrMalformed},
		{"unknown compression", []byte{0x00, 0x02, 0x00, 0x01, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0xd0, 0, 1, 0, 0, 0, 4, 0, 0, 0, 0}, ErrMalformed},
		{"sub-entry with zero records", []byte{0x00, 0x02, 0x00, 0x01, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0x80, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0}, ErrMalformed},
		{"message longer than frame", []byte{0x00, 0x02, 0x00, 0x01, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 0xff, 0xff, 0xff}, ErrMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode(tc.frame)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Decode(%x) = %v, want %v", tc.frame, err, tc.want)
			}
			var de *DecodeError
			if !errors.As(err, &de) || de.Error() == "" {
				t.Fatalf("error %v is not a *DecodeError", err)
			}
		})
	}
}

func TestDecodeErrorNamesField(t *testing.T) {
	// declare_publisher with a stream string cut short
	frame := []byte{0x00, 0x01, 0x00, 0x01, 0, 0, 0, 5, 7, 0, 0, 0, 9, 'a'}
	_, err := Decode(frame)
	if err == nil || !strings.Contains(err.Error(), "declare_publisher v1: field stream:") {
		t.Fatalf("error %v does not name command and field", err)
	}
}

// capturedFrames returns the frames recorded between the Go client and RabbitMQ 3.10.8.
func capturedFrames(t *testing.T) []struct{ dir, hex string } {
	f, err := os.Open(capturedFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []struct{ dir, hex string }
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		fs := strings.Fields(line)
		out = append(out, struct{ dir, hex string }{fs[0], fs[2]})
	}
	return out
}

// TestCapturedFrames decodes every frame that RabbitMQ 3.10.8 and rabbitmq-stream-go-client sent
// each other and checks that encoding the decoded value gives back the same bytes.
func TestCapturedFrames(t *testing.T) {
	frames := capturedFrames(t)
	if len(frames) < 40 {
		t.Fatalf("only %d captured frames", len(frames))
	}
	keys := map[Key]bool{}
	for _, fr := range frames {
		raw, err := hex.DecodeString(fr.hex)
		if err != nil {
			t.Fatal(err)
		}
		r := NewReader(bytes.NewReader(raw), DefaultFrameMax)
		body, err := r.ReadFrame()
		if err != nil {
			t.Fatalf("%s %s: %v", fr.dir, fr.hex, err)
		}
		c, err := Decode(body)
		if err != nil {
			t.Fatalf("%s %s: %v", fr.dir, fr.hex[:16], err)
		}
		keys[c.Key()] = true
		again, err := c.Append(nil)
		if err != nil || !bytes.Equal(again, raw) {
			t.Errorf("%s %v: re-encoded\n %x\nwant %x", fr.dir, c.Key(), again, raw)
		}
	}
	for _, k := range []Key{CommandPeerProperties, CommandSASLHandshake, CommandSASLAuthenticate, CommandTune,
		CommandTune.Response(), CommandOpen, CommandOpen.Response(), CommandDeclarePublisher, CommandPublish,
		CommandPublishConfirm, CommandSubscribe, CommandDeliver, CommandCredit, CommandStoreOffset,
		CommandQueryOffset.Response(), CommandMetadata.Response(), CommandMetadataUpdate, CommandClose} {
		if !keys[k] {
			t.Errorf("no captured %v frame", k)
		}
	}
}

// TestCapturedPublishAndDeliver checks field values of the captured publish and deliver frames.
func TestCapturedPublishAndDeliver(t *testing.T) {
	var pub *Publish
	var del *Deliver
	for _, fr := range capturedFrames(t) {
		raw, _ := hex.DecodeString(fr.hex)
		c, err := Decode(raw[4:])
		if err != nil {
			t.Fatal(err)
		}
		switch x := c.(type) {
		case *Publish:
			pub = x
		case *Deliver:
			del = x
		}
	}
	if pub == nil || len(pub.Messages) != 3 || pub.Vers != Version1 {
		t.Fatalf("publish: %+v", pub)
	}
	for i, m := range pub.Messages {
		if m.PublishingID != uint64(i+1) || m.SubBatch || m.FilterValue != nil {
			t.Errorf("message %d: %+v", i, m)
		}
	}
	// The first message is amqp.NewMessage([]byte("hello")): a data section 0x00 0x53 0x75.
	if !bytes.HasSuffix(pub.Messages[0].Data, []byte("\x00\x53\x75\xa0\x05hello")) {
		t.Errorf("message 1 = %x", pub.Messages[0].Data)
	}
	if del == nil || del.Version() != Version1 || len(del.Chunk) < 48 || del.Chunk[0] != 0x50 {
		t.Fatalf("deliver: %+v", del)
	}
}

func TestCorrelationID(t *testing.T) {
	f, _ := (&Open{CorrelationID: 77, VirtualHost: "/"}).Append(nil)
	if id, ok := CorrelationID(f[4:]); !ok || id != 77 {
		t.Fatalf("CorrelationID(open) = %d %v", id, ok)
	}
	f, _ = (&Credit{SubscriptionID: 1, Credit: 1}).Append(nil)
	if _, ok := CorrelationID(f[4:]); ok {
		t.Fatal("credit has no correlation id")
	}
}

func TestPublishingIDs(t *testing.T) {
	p := &Publish{PublisherID: 1, Messages: []PublishedMessage{{PublishingID: 5, Data: []byte("x")}, {PublishingID: 6, Data: []byte("y")}}}
	f, _ := p.Append(nil)
	var ids []uint64
	PublishingIDs(f[4:], func(id uint64) { ids = append(ids, id) })
	if !reflect.DeepEqual(ids, []uint64{5, 6}) {
		t.Fatalf("ids %v", ids)
	}
	ids = nil
	PublishingIDs(f[4:len(f)-1], func(id uint64) { ids = append(ids, id) })
	if !reflect.DeepEqual(ids, []uint64{5}) {
		t.Fatalf("ids of a truncated frame %v", ids)
	}
}

func TestEncodeErrors(t *testing.T) {
	long := strings.Repeat("x", MaxStringLength+1)
	cases := []Command{
		&Open{VirtualHost: long},
		&Publish{Vers: Version1, Messages: []PublishedMessage{{FilterValue: []byte("f")}}},
		&Publish{Vers: Version2, Messages: []PublishedMessage{{SubBatch: true, Records: 1}}},
		&Publish{Vers: 3},
		&Response{Command: CommandOpen},
		&StreamsResponse{Command: CommandMetadata},
		&Subscribe{Stream: "s"},
		&Deliver{Vers: 3},
	}
	for _, c := range cases {
		b := []byte("keep")
		out, err := c.Append(b)
		if !errors.Is(err, ErrEncode) {
			t.Errorf("%T: err %v, want ErrEncode", c, err)
		}
		if string(out) != "keep" {
			t.Errorf("%T: buffer changed to %q", c, out)
		}
	}
}

func TestKeyAndCodeNames(t *testing.T) {
	if s := CommandSubscribe.Response().String(); s != "subscribe response" {
		t.Error(s)
	}
	if s := Key(0x63).String(); s != "0x0063" {
		t.Error(s)
	}
	if s := ResponseCodeStreamDoesNotExist.String(); s != "stream_does_not_exist" {
		t.Error(s)
	}
	if ResponseSASLCannotChangeUsername != 0x15 || ResponseCodeNoOffset != 0x13 {
		t.Error("codes")
	}
}

const (
	capturedFile = "testdata/rabbitmq-3.10.8-go-client-1.8.3.txt"
	// clientFile holds what the Go client sent to a server answering with this package.
	clientFile = "testdata/go-client-1.8.3-vs-warren.txt"
)

// readCaptured returns the hex of every captured frame (nil when the file is missing).
func readCaptured() []string {
	var out []string
	for _, line := range strings.Split(readFiles(capturedFile), "\n") {
		fs := strings.Fields(line)
		if len(fs) == 3 && !strings.HasPrefix(line, "#") {
			out = append(out, fs[2])
		}
	}
	return out
}

// TestGoClientFrames decodes what rabbitmq-stream-go-client sent to a server that answered with
// this package's encodings (commands RabbitMQ 3.10.8 does not have: publish v2 with a filter
// value, subscribe with filter and single-active-consumer properties, the consumer-update
// response with an offset, stream stats, super streams, route, partitions, exchange of command
// versions) and checks the re-encoding is byte-identical.
func TestGoClientFrames(t *testing.T) {
	data, err := os.ReadFile(clientFile)
	if err != nil {
		t.Fatal(err)
	}
	keys := map[Key]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		fs := strings.Fields(line)
		if len(fs) != 3 || fs[0] != "C>S" {
			continue
		}
		raw, _ := hex.DecodeString(fs[2])
		c, err := Decode(raw[4:])
		if err != nil {
			t.Fatalf("%s: %v", fs[2], err)
		}
		keys[c.Key()] = true
		again, err := c.Append(nil)
		if err != nil || !bytes.Equal(again, raw) {
			t.Errorf("%v: re-encoded\n %x\nwant %x", c.Key(), again, raw)
		}
		switch x := c.(type) {
		case *Publish:
			if x.Vers != Version2 || string(x.Messages[0].FilterValue) != "eu" {
				t.Errorf("publish v2: %+v", x)
			}
		case *ConsumerUpdateResponse:
			if x.Offset != Offset(42) || x.Code != ResponseCodeOK {
				t.Errorf("consumer update response: %+v", x)
			}
		case *CreateSuperStream:
			if len(x.Partitions) != 3 || x.Partitions[2] != "ss-2" || x.BindingKeys[0] != "0" {
				t.Errorf("create super stream: %+v", x)
			}
		}
	}
	for _, k := range []Key{CommandExchangeCommandVersions, CommandCreateSuperStream, CommandDeleteSuperStream,
		CommandPartitions, CommandRoute, CommandStreamStats, CommandConsumerUpdate.Response()} {
		if !keys[k] {
			t.Errorf("no client %v frame", k)
		}
	}
	pub := false
	for k := range keys {
		pub = pub || k == CommandPublish
	}
	if !pub {
		t.Error("no publish frame")
	}
}

func readFiles(names ...string) string {
	var all []byte
	for _, n := range names {
		data, err := os.ReadFile(n)
		if err == nil {
			all = append(all, data...)
		}
	}
	return string(all)
}

// TestPublishEntryIsTheFramesEncoding checks Entry against the encoding Append writes: the body
// alone for a simple entry, the 11-byte sub-entry header and the body for a batch.
func TestPublishEntryIsTheFramesEncoding(t *testing.T) {
	in := &Publish{PublisherID: 1, Messages: []PublishedMessage{
		{PublishingID: 1, Data: []byte("plain")},
		{PublishingID: 2, Data: []byte("batched"), SubBatch: true, Compression: CompressionGzip, Records: 1, UncompressedSize: 40},
		{PublishingID: 3, Data: []byte{}},
	}}
	frame, err := in.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	var out Publish
	if err := out.Decode(frame[4:]); err != nil { // the frame without its size
		t.Fatal(err)
	}
	want := [][]byte{
		[]byte("plain"),
		append([]byte{0x80 | byte(CompressionGzip)<<4, 0, 1, 0, 0, 0, 40, 0, 0, 0, 7}, "batched"...),
		{},
	}
	for i, m := range out.Messages {
		if !bytes.Equal(m.Entry, want[i]) {
			t.Errorf("message %d: Entry %x, want %x", i, m.Entry, want[i])
		}
		if cap(m.Entry) != len(m.Entry) {
			t.Errorf("message %d: Entry's capacity %d reaches past it (%d bytes)", i, cap(m.Entry), len(m.Entry))
		}
	}
}
