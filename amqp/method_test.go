package amqp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
	"time"
)

// contractMethods lists every method struct the contract names.
func contractMethods() []Method {
	return []Method{
		&ConnectionStart{}, &ConnectionStartOk{}, &ConnectionSecure{}, &ConnectionSecureOk{},
		&ConnectionTune{}, &ConnectionTuneOk{}, &ConnectionOpen{}, &ConnectionOpenOk{},
		&ConnectionClose{}, &ConnectionCloseOk{}, &ConnectionBlocked{}, &ConnectionUnblocked{},
		&ConnectionUpdateSecret{}, &ConnectionUpdateSecretOk{},
		&ChannelOpen{}, &ChannelOpenOk{}, &ChannelFlow{}, &ChannelFlowOk{}, &ChannelClose{}, &ChannelCloseOk{},
		&ExchangeDeclare{}, &ExchangeDeclareOk{}, &ExchangeDelete{}, &ExchangeDeleteOk{},
		&ExchangeBind{}, &ExchangeBindOk{}, &ExchangeUnbind{}, &ExchangeUnbindOk{},
		&QueueDeclare{}, &QueueDeclareOk{}, &QueueBind{}, &QueueBindOk{}, &QueueUnbind{}, &QueueUnbindOk{},
		&QueuePurge{}, &QueuePurgeOk{}, &QueueDelete{}, &QueueDeleteOk{},
		&BasicQos{}, &BasicQosOk{}, &BasicConsume{}, &BasicConsumeOk{}, &BasicCancel{}, &BasicCancelOk{},
		&BasicPublish{}, &BasicReturn{}, &BasicDeliver{}, &BasicGet{}, &BasicGetOk{}, &BasicGetEmpty{},
		&BasicAck{}, &BasicReject{}, &BasicRecoverAsync{}, &BasicRecover{}, &BasicRecoverOk{}, &BasicNack{},
		&TxSelect{}, &TxSelectOk{}, &TxCommit{}, &TxCommitOk{}, &TxRollback{}, &TxRollbackOk{},
		&ConfirmSelect{}, &ConfirmSelectOk{},
	}
}

func TestMethodIdentities(t *testing.T) {
	want := map[string][2]uint16{
		"connection.start": {10, 10}, "connection.start-ok": {10, 11}, "connection.close": {10, 50},
		"connection.blocked": {10, 60}, "connection.unblocked": {10, 61},
		"connection.update-secret": {10, 70}, "connection.update-secret-ok": {10, 71},
		"channel.open": {20, 10}, "channel.close-ok": {20, 41},
		"exchange.bind": {40, 30}, "exchange.unbind-ok": {40, 51},
		"queue.declare": {50, 10}, "queue.unbind": {50, 50}, "queue.unbind-ok": {50, 51},
		"basic.publish": {60, 40}, "basic.deliver": {60, 60}, "basic.get-ok": {60, 71},
		"basic.ack": {60, 80}, "basic.nack": {60, 120}, "basic.recover-async": {60, 100},
		"confirm.select": {85, 10}, "tx.rollback-ok": {90, 31},
	}
	seen := map[uint32]string{}
	for _, m := range contractMethods() {
		key := uint32(m.ClassID())<<16 | uint32(m.MethodID())
		if prev, dup := seen[key]; dup {
			t.Errorf("%s and %s share ids %d/%d", prev, m.Name(), m.ClassID(), m.MethodID())
		}
		seen[key] = m.Name()
		if ids, ok := want[m.Name()]; ok && (ids[0] != m.ClassID() || ids[1] != m.MethodID()) {
			t.Errorf("%s: ids %d/%d, want %d/%d", m.Name(), m.ClassID(), m.MethodID(), ids[0], ids[1])
		}
		fresh := NewMethod(m.ClassID(), m.MethodID())
		if reflect.TypeOf(fresh) != reflect.TypeOf(m) {
			t.Errorf("NewMethod(%d, %d) = %T, want %T", m.ClassID(), m.MethodID(), fresh, m)
		}
		if got := MethodName(m.ClassID(), m.MethodID()); got != m.Name() {
			t.Errorf("MethodName = %q, want %q", got, m.Name())
		}
		content := m.Name() == "basic.publish" || m.Name() == "basic.return" ||
			m.Name() == "basic.deliver" || m.Name() == "basic.get-ok"
		if m.HasContent() != content {
			t.Errorf("%s: HasContent = %v", m.Name(), m.HasContent())
		}
	}
	if len(seen) != 64 {
		t.Errorf("%d methods, want 64", len(seen))
	}
	if NewMethod(60, 41) != nil || NewMethod(0, 0) != nil {
		t.Error("NewMethod of an unknown pair is not nil")
	}
	sync := map[string]bool{"queue.declare": true, "basic.publish": false, "basic.ack": false,
		"basic.get": true, "connection.blocked": false, "connection.update-secret": true}
	for _, m := range contractMethods() {
		if w, ok := sync[m.Name()]; ok && m.Synchronous() != w {
			t.Errorf("%s: Synchronous = %v, want %v", m.Name(), m.Synchronous(), w)
		}
	}
}

// fill sets every field of the struct behind m to a distinct non-zero value
// derived from seed; bools follow the bit pattern of seed.
func fill(m Method, seed int) {
	v := reflect.ValueOf(m).Elem()
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		n := seed*31 + i + 1
		switch f.Kind() {
		case reflect.Bool:
			f.SetBool((seed>>uint(i%8))&1 == 1)
		case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			f.SetUint(uint64(n) * 0x0101010101)
		case reflect.String:
			f.SetString(string(rune('a'+i%26)) + "-field-" + string(rune('0'+seed%10)))
		default:
			switch f.Interface().(type) {
			case Table:
				f.Set(reflect.ValueOf(Table{"x-i": int32(n), "x-s": "v", "x-nested": Table{"b": true}}))
			case time.Time:
				f.Set(reflect.ValueOf(time.Unix(int64(n)*1000, 0).UTC()))
			default:
				panic("unhandled field type " + f.Type().String())
			}
		}
	}
}

func TestMethodRoundTrip(t *testing.T) {
	for _, proto := range contractMethods() {
		for seed := 0; seed < 8; seed++ {
			m := NewMethod(proto.ClassID(), proto.MethodID())
			fill(m, seed)
			frame := AppendMethodFrame(nil, 7, m)
			if frame[0] != FrameMethod || binary.BigEndian.Uint16(frame[1:]) != 7 ||
				int(binary.BigEndian.Uint32(frame[3:])) != len(frame)-8 || frame[len(frame)-1] != FrameEnd {
				t.Fatalf("%s: bad frame envelope % x", m.Name(), frame)
			}
			got, err := DecodeMethod(frame[7 : len(frame)-1])
			if err != nil {
				t.Fatalf("%s: DecodeMethod: %v", m.Name(), err)
			}
			if !reflect.DeepEqual(got, m) {
				t.Fatalf("%s round trip:\n got %#v\nwant %#v", m.Name(), got, m)
			}
			// Any truncation of the arguments must fail cleanly.
			payload := frame[7 : len(frame)-1]
			for cut := 4; cut < len(payload); cut++ {
				if _, err := DecodeMethod(payload[:cut]); err == nil {
					t.Fatalf("%s: truncated to %d of %d bytes decoded without error", m.Name(), cut, len(payload))
				} else if !errors.Is(err, ErrMalformed) {
					t.Fatalf("%s: truncation error %v does not wrap ErrMalformed", m.Name(), err)
				}
			}
		}
	}
}

func TestBitPacking(t *testing.T) {
	// queue.declare: reserved-1, queue, then five consecutive bits in one
	// octet (passive=bit0 ... no-wait=bit4), then the arguments table.
	m := &QueueDeclare{Queue: "q", Durable: true, AutoDelete: true, NoWait: true}
	got := m.AppendArgs(nil)
	want := []byte{0, 0, 1, 'q', 0b11010, 0, 0, 0, 0}
	if !bytes.Equal(got, want) {
		t.Fatalf("queue.declare args = % x, want % x", got, want)
	}

	// basic.consume: no-local, no-ack, exclusive, no-wait share one octet.
	c := &BasicConsume{Queue: "q", ConsumerTag: "t", NoAck: true, NoWait: true}
	want = []byte{0, 0, 1, 'q', 1, 't', 0b1010, 0, 0, 0, 0}
	if got := c.AppendArgs(nil); !bytes.Equal(got, want) {
		t.Fatalf("basic.consume args = % x, want % x", got, want)
	}

	// exchange.declare: type shortstr, then passive/durable/auto-delete/
	// internal/no-wait bits.
	e := &ExchangeDeclare{Exchange: "x", Type: "topic", Durable: true, Internal: true}
	want = append([]byte{0, 0, 1, 'x', 5}, "topic"...)
	want = append(want, 0b01010, 0, 0, 0, 0)
	if got := e.AppendArgs(nil); !bytes.Equal(got, want) {
		t.Fatalf("exchange.declare args = % x, want % x", got, want)
	}

	// basic.deliver: the single redelivered bit sits between the tag and
	// the exchange: bits separated by other fields are not packed.
	d := &BasicDeliver{ConsumerTag: "c", DeliveryTag: 5, Redelivered: true, Exchange: "e", RoutingKey: "r"}
	want = []byte{1, 'c', 0, 0, 0, 0, 0, 0, 0, 5, 1, 1, 'e', 1, 'r'}
	if got := d.AppendArgs(nil); !bytes.Equal(got, want) {
		t.Fatalf("basic.deliver args = % x, want % x", got, want)
	}

	// basic.nack: multiple=bit0, requeue=bit1.
	n := &BasicNack{DeliveryTag: 1, Requeue: true}
	want = []byte{0, 0, 0, 0, 0, 0, 0, 1, 0b10}
	if got := n.AppendArgs(nil); !bytes.Equal(got, want) {
		t.Fatalf("basic.nack args = % x, want % x", got, want)
	}

	// Decoding the same octet sets the same fields.
	var q QueueDeclare
	if err := q.Decode([]byte{0, 0, 1, 'q', 0b10101, 0, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	if !q.Passive || q.Durable || !q.Exclusive || q.AutoDelete || !q.NoWait {
		t.Fatalf("decoded bits %+v", q)
	}
}

func TestDecodeMethodVectors(t *testing.T) {
	// connection.tune-ok from a client: channel-max 2047, frame-max 131072,
	// heartbeat 60.
	payload := []byte{0, 10, 0, 31, 0x07, 0xff, 0, 2, 0, 0, 0, 60}
	m, err := DecodeMethod(payload)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := m, (&ConnectionTuneOk{ChannelMax: 2047, FrameMax: 131072, Heartbeat: 60}); !reflect.DeepEqual(got, Method(want)) {
		t.Fatalf("got %#v", got)
	}

	// channel.close with 404 and the failing class/method.
	text := "NOT_FOUND - no queue 'q' in vhost '/'"
	payload = append([]byte{0, 20, 0, 40, 0x01, 0x94, byte(len(text))}, text...)
	payload = append(payload, 0, 50, 0, 10)
	m, err = DecodeMethod(payload)
	if err != nil {
		t.Fatal(err)
	}
	cc := m.(*ChannelClose)
	if cc.ReplyCode != NotFound || cc.ReplyText != text || cc.FailingClassID != 50 || cc.FailingMethodID != 10 {
		t.Fatalf("got %+v", cc)
	}

	// confirm.select with nowait set.
	m, err = DecodeMethod([]byte{0, 85, 0, 10, 1})
	if err != nil || !m.(*ConfirmSelect).NoWait {
		t.Fatalf("confirm.select: %#v, %v", m, err)
	}

	// connection.update-secret: longstr then shortstr.
	payload = []byte{0, 10, 0, 70, 0, 0, 0, 3, 't', 'o', 'k', 2, 'r', 'x'}
	m, err = DecodeMethod(payload)
	if err != nil {
		t.Fatal(err)
	}
	if us := m.(*ConnectionUpdateSecret); us.NewSecret != "tok" || us.Reason != "rx" {
		t.Fatalf("got %+v", us)
	}
}

func TestDecodeMethodErrors(t *testing.T) {
	_, err := DecodeMethod([]byte{0, 60, 0, 41})
	var ume *UnknownMethodError
	if !errors.As(err, &ume) || ume.ClassID != 60 || ume.MethodID != 41 {
		t.Fatalf("unknown method: %v", err)
	}
	for _, p := range [][]byte{nil, {0}, {0, 60, 0}} {
		if _, err := DecodeMethod(p); !errors.Is(err, ErrMalformed) {
			t.Errorf("DecodeMethod(% x) = %v, want ErrMalformed", p, err)
		}
	}
	// A table whose length runs past the payload.
	if _, err := DecodeMethod([]byte{0, 50, 0, 10, 0, 0, 0, 0, 0, 0, 0, 9}); !errors.Is(err, ErrMalformed) {
		t.Errorf("bad table: %v", err)
	}
}

func TestAppendArgsTruncatesLongShortstr(t *testing.T) {
	long := string(bytes.Repeat([]byte("k"), 300))
	m := &BasicConsumeOk{ConsumerTag: long}
	b := m.AppendArgs(nil)
	if b[0] != 255 || len(b) != 256 {
		t.Fatalf("shortstr of 300 bytes encoded as %d bytes with length %d", len(b), b[0])
	}
}
