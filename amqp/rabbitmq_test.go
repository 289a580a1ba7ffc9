package amqp

import (
	"bytes"
	"net"
	"os"
	"reflect"
	"testing"
	"time"
)

// TestAgainstRabbitMQ speaks to a real RabbitMQ with this package alone:
// decodes its connection.start, sends tables of every type, publishes a
// message with every property over several body frames, gets it back and
// decodes a channel.close. It is skipped when no broker listens on
// $WARREN_REFERENCE_BROKER (default 127.0.0.1:5682, the address of
// /work/shared/tools/rabbitmq.sh).
func TestAgainstRabbitMQ(t *testing.T) {
	addr := os.Getenv("WARREN_REFERENCE_BROKER")
	if addr == "" {
		addr = "127.0.0.1:5682"
	}
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Skipf("no reference broker at %s: %v", addr, err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	fr := NewFrameReader(conn, 0)
	var out []byte
	write := func(b []byte) {
		t.Helper()
		if _, err := conn.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	send := func(channel uint16, m Method) { t.Helper(); out = AppendMethodFrame(out[:0], channel, m); write(out) }
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
		m, err := DecodeMethod(f.Payload)
		if err != nil {
			t.Fatalf("decoding broker method: %v", err)
		}
		if reflect.TypeOf(m) != reflect.TypeOf(want) {
			t.Fatalf("broker sent %s %+v, want %s", m.Name(), m, want.Name())
		}
		return m
	}

	write([]byte(ProtocolHeader))
	start := expect(&ConnectionStart{}).(*ConnectionStart)
	caps, _ := start.ServerProperties["capabilities"].(Table)
	if start.VersionMajor != 0 || start.VersionMinor != 9 || start.ServerProperties["product"] != "RabbitMQ" ||
		caps["publisher_confirms"] != true || caps["connection.blocked"] != true {
		t.Fatalf("connection.start %+v", start)
	}
	clientProps := allTypesTable()
	clientProps["capabilities"] = Table{"authentication_failure_close": true}
	send(0, &ConnectionStartOk{ClientProperties: clientProps, Mechanism: "PLAIN",
		Response: "\x00guest\x00guest", Locale: "en_US"})
	tune := expect(&ConnectionTune{}).(*ConnectionTune)
	send(0, &ConnectionTuneOk{ChannelMax: tune.ChannelMax, FrameMax: 4096, Heartbeat: 0})
	fr.SetMaxFrameSize(4096)
	send(0, &ConnectionOpen{VirtualHost: "/"})
	expect(&ConnectionOpenOk{})

	send(1, &ChannelOpen{})
	expect(&ChannelOpenOk{})
	args := Table{"custom": allTypesTable(), "x-max-length": int32(100)}
	send(1, &QueueDeclare{Queue: "warren-amqp-codec-test", Exclusive: true, Arguments: args})
	dok := expect(&QueueDeclareOk{}).(*QueueDeclareOk)
	if dok.Queue != "warren-amqp-codec-test" || dok.MessageCount != 0 {
		t.Fatalf("declare-ok %+v", dok)
	}

	props := Properties{
		ContentType: "text/plain", ContentEncoding: "utf-8", Headers: allTypesTable(), DeliveryMode: 2, Priority: 1,
		CorrelationID: "c", ReplyTo: "r", Expiration: "600000", MessageID: "m", Timestamp: time.Unix(1700000000, 0).UTC(),
		Type: "t", UserID: "guest", AppID: "a",
	}
	rawProps := props.Append(nil)
	body := bytes.Repeat([]byte("warren "), 2000)
	pub := &BasicPublish{RoutingKey: "warren-amqp-codec-test", Mandatory: true}
	out = AppendMethodFrame(out[:0], 1, pub)
	out = AppendContentHeaderFrame(out, 1, ClassBasic, uint64(len(body)), rawProps)
	out = AppendBodyFrames(out, 1, body, 4096)
	write(out)

	send(1, &BasicGet{Queue: "warren-amqp-codec-test", NoAck: true})
	getOk := expect(&BasicGetOk{}).(*BasicGetOk)
	if getOk.DeliveryTag != 1 || getOk.Redelivered || getOk.Exchange != "" || getOk.RoutingKey != "warren-amqp-codec-test" {
		t.Fatalf("get-ok %+v", getOk)
	}
	f := readFrame()
	class, size, raw, err := ParseContentHeader(f.Payload)
	if err != nil || class != ClassBasic || size != uint64(len(body)) {
		t.Fatalf("content header %d %d %v", class, size, err)
	}
	back, err := DecodeProperties(raw)
	if err != nil {
		t.Fatal(err)
	}
	props.Flags = back.Flags
	if !reflect.DeepEqual(back, props) {
		t.Errorf("properties came back as\n%#v\nsent\n%#v", back, props)
	}
	var got []byte
	for len(got) < len(body) {
		f = readFrame()
		if f.Type != FrameBody {
			t.Fatalf("frame type %d", f.Type)
		}
		got = append(got, f.Payload...)
	}
	if !bytes.Equal(got, body) {
		t.Fatal("body differs")
	}

	// A channel error, decoded.
	send(1, &QueueDeclare{Queue: "warren-amqp-no-such-queue", Passive: true})
	cl := expect(&ChannelClose{}).(*ChannelClose)
	if cl.ReplyCode != NotFound || cl.ReplyText != "NOT_FOUND - no queue 'warren-amqp-no-such-queue' in vhost '/'" ||
		cl.FailingClassID != ClassQueue || cl.FailingMethodID != 10 {
		t.Errorf("channel.close %+v", cl)
	}
	send(1, &ChannelCloseOk{})

	send(0, &ConnectionClose{ReplyCode: ReplySuccess, ReplyText: "bye"})
	expect(&ConnectionCloseOk{})
}
