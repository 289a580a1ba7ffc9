package amqp

import (
	"bytes"
	"context"
	"io"
	"net"
	"reflect"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// fromClient converts values decoded or produced by amqp091-go into this
// package's types (its Table and Decimal are distinct Go types).
func fromClient(v any) any {
	switch v := v.(type) {
	case amqp091.Table:
		t := Table{}
		for k, e := range v {
			t[k] = fromClient(e)
		}
		return t
	case amqp091.Decimal:
		return Decimal{Scale: v.Scale, Value: v.Value}
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = fromClient(e)
		}
		return out
	case time.Time:
		return v.UTC()
	}
	return v
}

// allTypesClientTable holds a value of every type amqp091-go can encode.
func allTypesClientTable() amqp091.Table {
	return amqp091.Table{
		"bool": true, "int8": int8(-8), "uint8": uint8(200), "int16": int16(-16), "uint16": uint16(65000),
		"int32": int32(-32), "uint32": uint32(4000000000), "int64": int64(-1 << 40),
		"float32": float32(2.5), "float64": float64(-0.125),
		"decimal": amqp091.Decimal{Scale: 3, Value: -12345},
		"string":  "héllo", "bytes": []byte{0, 1, 2, 0xff},
		"array": []any{"a", int32(1), []any{true}, amqp091.Table{"in": "array"}},
		"time":  time.Unix(1700000000, 0).UTC(), "table": amqp091.Table{"nested": amqp091.Table{"deep": int64(7)}},
		"void": nil,
	}
}

// allTypesTable is the same set of values as this package's types.
func allTypesTable() Table { return fromClient(allTypesClientTable()).(Table) }

type clientResult struct {
	serverProps amqp091.Table
	queue       amqp091.Queue
	delivery    amqp091.Delivery
	gotOK       bool
	err         error
}

// TestCrossCheckAMQP091Client drives the amqp091-go client against a
// scripted server built from this package over net.Pipe: handshake tables in
// both directions, queue.declare arguments, a publish with every property and
// a body split over several frames, and a basic.get-ok sent back.
func TestCrossCheckAMQP091Client(t *testing.T) {
	clientConn, serverConn := net.Pipe()
	defer serverConn.Close()
	if err := serverConn.SetDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}

	body := bytes.Repeat([]byte("0123456789abcdef"), 700) // 11200 bytes: 3 frames at frame-max 4096
	published := amqp091.Publishing{
		Headers: allTypesClientTable(), ContentType: "application/octet-stream", ContentEncoding: "identity",
		DeliveryMode: 2, Priority: 7, CorrelationId: "corr-1", ReplyTo: "replies", Expiration: "60000",
		MessageId: "msg-1", Timestamp: time.Unix(1700000123, 0), Type: "kind", UserId: "guest", AppId: "tests",
		Body: body,
	}
	clientProps := allTypesClientTable()
	queueArgs := allTypesClientTable()

	results := make(chan clientResult, 1)
	go func() {
		var r clientResult
		defer func() { results <- r }()
		conn, err := amqp091.Open(clientConn, amqp091.Config{
			SASL:       []amqp091.Authentication{&amqp091.PlainAuth{Username: "guest", Password: "guest"}},
			Vhost:      "/",
			Properties: clientProps,
			Locale:     "en_US",
		})
		if err != nil {
			r.err = err
			return
		}
		defer conn.Close()
		r.serverProps = conn.Properties
		ch, err := conn.Channel()
		if err != nil {
			r.err = err
			return
		}
		r.queue, err = ch.QueueDeclare("cross", true, false, false, false, queueArgs)
		if err != nil {
			r.err = err
			return
		}
		if err := ch.PublishWithContext(context.Background(), "amq.direct", "cross.key", true, false, published); err != nil {
			r.err = err
			return
		}
		r.delivery, r.gotOK, r.err = ch.Get("cross", false)
	}()

	fr := NewFrameReader(serverConn, 0)
	var out []byte
	send := func(channel uint16, m Method) {
		t.Helper()
		out = AppendMethodFrame(out[:0], channel, m)
		if _, err := serverConn.Write(out); err != nil {
			t.Fatalf("writing %s: %v", m.Name(), err)
		}
	}
	readFrame := func() Frame {
		t.Helper()
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading frame: %v", err)
		}
		return f
	}
	expect := func(want Method) Method {
		t.Helper()
		f := readFrame()
		if f.Type != FrameMethod {
			t.Fatalf("frame type %d, want method %s", f.Type, want.Name())
		}
		m, err := DecodeMethod(f.Payload)
		if err != nil {
			t.Fatalf("decoding client method: %v", err)
		}
		if reflect.TypeOf(m) != reflect.TypeOf(want) {
			t.Fatalf("client sent %s, want %s", m.Name(), want.Name())
		}
		return m
	}

	var hdr [8]byte
	if _, err := io.ReadFull(serverConn, hdr[:]); err != nil || string(hdr[:]) != ProtocolHeader {
		t.Fatalf("protocol header %q, %v", hdr, err)
	}
	serverProps := allTypesTable()
	send(0, &ConnectionStart{VersionMajor: 0, VersionMinor: 9, ServerProperties: serverProps,
		Mechanisms: "PLAIN AMQPLAIN", Locales: "en_US"})
	startOk := expect(&ConnectionStartOk{}).(*ConnectionStartOk)
	if startOk.Mechanism != "PLAIN" || startOk.Response != "\x00guest\x00guest" || startOk.Locale != "en_US" {
		t.Fatalf("start-ok %+v", startOk)
	}

	send(0, &ConnectionTune{ChannelMax: 2047, FrameMax: 4096, Heartbeat: 0})
	tuneOk := expect(&ConnectionTuneOk{}).(*ConnectionTuneOk)
	if tuneOk.FrameMax != 4096 || tuneOk.ChannelMax != 2047 {
		t.Fatalf("tune-ok %+v", tuneOk)
	}
	fr.SetMaxFrameSize(tuneOk.FrameMax)
	if open := expect(&ConnectionOpen{}).(*ConnectionOpen); open.VirtualHost != "/" {
		t.Fatalf("open %+v", open)
	}
	send(0, &ConnectionOpenOk{})

	// The client added its capabilities to its properties before sending.
	wantClientProps := allTypesTable()
	wantClientProps["capabilities"] = Table{"connection.blocked": true, "consumer_cancel_notify": true,
		"basic.nack": true, "publisher_confirms": true}
	if !reflect.DeepEqual(startOk.ClientProperties, wantClientProps) {
		t.Errorf("client properties decoded as\n%#v\nwant\n%#v", startOk.ClientProperties, wantClientProps)
	}

	expect(&ChannelOpen{})
	send(1, &ChannelOpenOk{})

	qd := expect(&QueueDeclare{}).(*QueueDeclare)
	if qd.Queue != "cross" || !qd.Durable || qd.AutoDelete || qd.Exclusive || qd.NoWait || qd.Passive {
		t.Errorf("queue.declare %+v", qd)
	}
	if !reflect.DeepEqual(qd.Arguments, allTypesTable()) {
		t.Errorf("queue.declare arguments decoded as\n%#v\nwant\n%#v", qd.Arguments, allTypesTable())
	}
	send(1, &QueueDeclareOk{Queue: "cross", MessageCount: 12, ConsumerCount: 3})

	// basic.publish through the hand-written fast paths.
	f := readFrame()
	if f.Type != FrameMethod || f.Channel != 1 {
		t.Fatalf("publish frame %+v", f)
	}
	pa, err := ParseBasicPublish(f.Payload[4:])
	if err != nil || string(pa.Exchange) != "amq.direct" || string(pa.RoutingKey) != "cross.key" || !pa.Mandatory || pa.Immediate {
		t.Fatalf("publish %+v, %v", pa, err)
	}
	f = readFrame()
	class, size, rawProps, err := ParseContentHeader(f.Payload)
	if f.Type != FrameHeader || err != nil || class != ClassBasic || size != uint64(len(body)) {
		t.Fatalf("content header: type %d class %d size %d, %v", f.Type, class, size, err)
	}
	rawProps = bytes.Clone(rawProps)
	props, err := DecodeProperties(rawProps)
	if err != nil {
		t.Fatal(err)
	}
	wantProps := Properties{
		ContentType: "application/octet-stream", ContentEncoding: "identity", Headers: allTypesTable(),
		DeliveryMode: 2, Priority: 7, CorrelationID: "corr-1", ReplyTo: "replies", Expiration: "60000",
		MessageID: "msg-1", Timestamp: time.Unix(1700000123, 0).UTC(), Type: "kind", UserID: "guest", AppID: "tests",
		Flags: 0xfff8,
	}
	if !reflect.DeepEqual(props, wantProps) {
		t.Errorf("properties decoded as\n%#v\nwant\n%#v", props, wantProps)
	}
	if PropsDeliveryMode(rawProps) != 2 || !PropsHasHeaders(rawProps) {
		t.Error("fast property accessors disagree")
	}
	var got []byte
	frames := 0
	for len(got) < len(body) {
		f = readFrame()
		if f.Type != FrameBody || len(f.Payload) > 4096-8 {
			t.Fatalf("body frame type %d of %d bytes", f.Type, len(f.Payload))
		}
		got = append(got, f.Payload...)
		frames++
	}
	if !bytes.Equal(got, body) || frames != 3 {
		t.Fatalf("body of %d bytes in %d frames", len(got), frames)
	}

	// basic.get answered with our own frames, properties re-encoded.
	g := expect(&BasicGet{}).(*BasicGet)
	if g.Queue != "cross" || g.NoAck {
		t.Fatalf("basic.get %+v", g)
	}
	out = AppendBasicGetOk(out[:0], 1, 42, true, "amq.direct", "cross.key", 5)
	out = AppendContentHeaderFrame(out, 1, ClassBasic, uint64(len(body)), props.Append(nil))
	out = AppendBodyFrames(out, 1, body, 4096)
	if _, err := serverConn.Write(out); err != nil {
		t.Fatal(err)
	}

	// The client closes: channel first is not required; connection.close.
	for {
		f = readFrame()
		m, err := DecodeMethod(f.Payload)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := m.(*ConnectionClose); ok {
			send(0, &ConnectionCloseOk{})
			break
		}
	}

	r := <-results
	if r.err != nil {
		t.Fatalf("client: %v", r.err)
	}
	if got := fromClient(r.serverProps); !reflect.DeepEqual(got, serverProps) {
		t.Errorf("client decoded server properties as\n%#v\nwant\n%#v", got, serverProps)
	}
	if r.queue.Name != "cross" || r.queue.Messages != 12 || r.queue.Consumers != 3 {
		t.Errorf("client got queue %+v", r.queue)
	}
	d := r.delivery
	if !r.gotOK || d.DeliveryTag != 42 || !d.Redelivered || d.Exchange != "amq.direct" || d.RoutingKey != "cross.key" ||
		d.MessageCount != 5 || !bytes.Equal(d.Body, body) {
		t.Errorf("client got delivery tag %d redelivered %v %q %q count %d body %d bytes",
			d.DeliveryTag, d.Redelivered, d.Exchange, d.RoutingKey, d.MessageCount, len(d.Body))
	}
	if !reflect.DeepEqual(fromClient(d.Headers), allTypesTable()) || d.ContentType != published.ContentType ||
		d.DeliveryMode != 2 || d.Priority != 7 || d.CorrelationId != "corr-1" || d.ReplyTo != "replies" ||
		d.Expiration != "60000" || d.MessageId != "msg-1" || !d.Timestamp.Equal(published.Timestamp) ||
		d.Type != "kind" || d.UserId != "guest" || d.AppId != "tests" || d.ContentEncoding != "identity" {
		t.Errorf("client decoded properties differ: %+v", d)
	}
}
