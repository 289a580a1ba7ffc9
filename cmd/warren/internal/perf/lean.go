package perf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	wire "warren/amqp"
)

// leanConn is the load tool's own minimal AMQP 0-9-1 client, used with --client lean (and
// --consumer-client lean). It speaks just enough of the protocol for one channel that
// publishes without confirms or consumes with acks (from a queue, a stream or a super
// stream's consumer group: consume arguments are passed through), and it does so on the
// caller's goroutine: a publish is one write system call, a delivery is read by the
// goroutine that handles it, an ack is written by that goroutine too. amqp091-go hands each delivery through two goroutines (its reader and
// its consumer buffer) before the application sees it; on a small machine every hand-off is
// a thread wake-up, which at low rates is most of what a latency measurement would measure.
type leanConn struct {
	conn     net.Conn
	fr       *wire.FrameReader
	frameMax uint32

	wmu sync.Mutex // guards out and writes: a producer's reader goroutine answers the broker
	out []byte

	body        []byte // the delivery being read (consumer only)
	consumerTag string

	// With startReader a goroutine owns the reads (a producer reads nothing else); it ends
	// when the connection does, first sending why to closed.
	readerDone chan struct{}
	closed     chan *amqp.Error
}

// leanChannel is the one channel a leanConn opens.
const leanChannel = 1

// dialLean connects to uri (as amqp091-go parses it), logs in with PLAIN, opens a
// connection with heartbeats off and opens channel 1.
func dialLean(uri, name string) (*leanConn, error) {
	u, err := amqp.ParseURI(uri)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", redact(uri), err)
	}
	if u.Scheme != "amqp" {
		return nil, fmt.Errorf("--client lean speaks plain amqp only, not %s", u.Scheme)
	}
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(u.Host, strconv.Itoa(u.Port)), 10*time.Second)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", redact(uri), err)
	}
	l := &leanConn{conn: conn, fr: wire.NewFrameReader(conn, 0), closed: make(chan *amqp.Error, 1)}
	if err := l.open(u, name); err != nil {
		conn.Close()
		return nil, fmt.Errorf("connect to %s: %w", redact(uri), err)
	}
	return l, nil
}

func (l *leanConn) open(u amqp.URI, name string) error {
	_ = l.conn.SetDeadline(time.Now().Add(10 * time.Second))
	defer func() { _ = l.conn.SetDeadline(time.Time{}) }()
	if _, err := l.conn.Write([]byte{'A', 'M', 'Q', 'P', 0, 0, 9, 1}); err != nil {
		return err
	}
	if err := l.expect(0, &wire.ConnectionStart{}); err != nil {
		return err
	}
	host, _ := os.Hostname()
	props := wire.Table{"product": "warren-perf", "connection_name": name, "platform": "Go", "information": host}
	if err := l.send(0, &wire.ConnectionStartOk{
		ClientProperties: props, Mechanism: "PLAIN", Locale: "en_US",
		Response: "\x00" + u.Username + "\x00" + u.Password,
	}); err != nil {
		return err
	}
	tune := &wire.ConnectionTune{}
	if err := l.expect(0, tune); err != nil {
		return err
	}
	l.frameMax = wire.DefaultFrameMax
	if tune.FrameMax != 0 && tune.FrameMax < l.frameMax {
		l.frameMax = tune.FrameMax
	}
	l.fr.SetMaxFrameSize(l.frameMax)
	if err := l.send(0, &wire.ConnectionTuneOk{ChannelMax: leanChannel, FrameMax: l.frameMax}); err != nil {
		return err
	}
	if err := l.send(0, &wire.ConnectionOpen{VirtualHost: u.Vhost}); err != nil {
		return err
	}
	if err := l.expect(0, &wire.ConnectionOpenOk{}); err != nil {
		return err
	}
	if err := l.send(leanChannel, &wire.ChannelOpen{}); err != nil {
		return err
	}
	return l.expect(leanChannel, &wire.ChannelOpenOk{})
}

// send writes one method frame.
func (l *leanConn) send(channel uint16, m wire.Method) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.out = wire.AppendMethodFrame(l.out[:0], channel, m)
	_, err := l.conn.Write(l.out)
	return err
}

// expect reads frames until the method want (on channel) arrives and decodes it into want.
// A close from the broker is returned as an *amqp.Error; anything else is skipped.
func (l *leanConn) expect(channel uint16, want wire.Method) error {
	for {
		f, err := l.fr.ReadFrame()
		if err != nil {
			return err
		}
		if f.Type != wire.FrameMethod {
			continue
		}
		if err := l.closeError(f); err != nil {
			return err
		}
		m, err := wire.DecodeMethod(f.Payload)
		if err != nil {
			return err
		}
		if f.Channel == channel && m.ClassID() == want.ClassID() && m.MethodID() == want.MethodID() {
			return want.Decode(f.Payload[4:])
		}
	}
}

// closeError returns the broker's reason if f closes the connection or channel (having
// answered it, so the broker need not wait), and nil for any other frame.
func (l *leanConn) closeError(f wire.Frame) error {
	// Only three methods matter: look at the ids before decoding, so a delivery is not decoded
	// here as well as in next.
	switch class, method := frameMethod(f); {
	case class == 10 && method == 50, class == 20 && method == 40, class == 60 && method == 30:
	default:
		return nil
	}
	m, err := wire.DecodeMethod(f.Payload)
	if err != nil {
		return nil
	}
	switch m := m.(type) {
	case *wire.ConnectionClose:
		_ = l.send(0, &wire.ConnectionCloseOk{})
		return &amqp.Error{Code: int(m.ReplyCode), Reason: m.ReplyText, Server: true, Recover: false}
	case *wire.ChannelClose:
		_ = l.send(f.Channel, &wire.ChannelCloseOk{})
		return &amqp.Error{Code: int(m.ReplyCode), Reason: m.ReplyText, Server: true, Recover: true}
	case *wire.BasicCancel:
		return &amqp.Error{Code: 0, Reason: "consumer " + m.ConsumerTag + " cancelled by the broker", Server: true}
	}
	return nil
}

// frameMethod returns the class and method ids of a method frame (zeros for other frames).
func frameMethod(f wire.Frame) (class, method uint16) {
	if f.Type != wire.FrameMethod || len(f.Payload) < 4 {
		return 0, 0
	}
	return binary.BigEndian.Uint16(f.Payload), binary.BigEndian.Uint16(f.Payload[2:])
}

// publish sends one message as a single write: method, content header and body frames.
func (l *leanConn) publish(exchange, key string, deliveryMode uint8, body []byte) error {
	props := wire.Properties{DeliveryMode: deliveryMode}
	l.wmu.Lock()
	defer l.wmu.Unlock()
	b := wire.AppendMethodFrame(l.out[:0], leanChannel, &wire.BasicPublish{Exchange: exchange, RoutingKey: key})
	var p [16]byte
	b = wire.AppendContentHeaderFrame(b, leanChannel, 60, uint64(len(body)), props.Append(p[:0]))
	b = wire.AppendBodyFrames(b, leanChannel, body, l.frameMax)
	l.out = b
	_, err := l.conn.Write(b)
	return err
}

// consume sets the prefetch (if qos > 0) and starts a consumer on queue with args (such as
// x-stream-offset; nil for none).
func (l *leanConn) consume(queue string, qos int, autoAck bool, args wire.Table) error {
	if qos > 0 {
		if err := l.send(leanChannel, &wire.BasicQos{PrefetchCount: uint16(qos)}); err != nil {
			return err
		}
		if err := l.expect(leanChannel, &wire.BasicQosOk{}); err != nil {
			return err
		}
	}
	if err := l.send(leanChannel, &wire.BasicConsume{Queue: queue, NoAck: autoAck, Arguments: args}); err != nil {
		return err
	}
	ok := &wire.BasicConsumeOk{}
	if err := l.expect(leanChannel, ok); err != nil {
		return err
	}
	l.consumerTag = ok.ConsumerTag
	return nil
}

// errCancelled is what next returns once the broker has confirmed a cancel.
var errCancelled = errors.New("consumer cancelled")

// cancel asks the broker to stop the consumer; next returns errCancelled once it has, after
// the deliveries sent before.
func (l *leanConn) cancel() error {
	return l.send(leanChannel, &wire.BasicCancel{ConsumerTag: l.consumerTag})
}

// next reads the next delivery: its tag and body, which is valid until the next call.
func (l *leanConn) next() (tag uint64, body []byte, err error) {
	var deliver wire.BasicDeliver
	for {
		f, err := l.fr.ReadFrame()
		if err != nil {
			return 0, nil, err
		}
		if err := l.closeError(f); err != nil {
			return 0, nil, err
		}
		switch class, method := frameMethod(f); {
		case class == 60 && method == 31: // basic.cancel-ok
			return 0, nil, errCancelled
		case class != 60 || method != 60:
			continue // heartbeats and anything but basic.deliver
		}
		if err := deliver.Decode(f.Payload[4:]); err != nil {
			return 0, nil, err
		}
		break
	}
	f, err := l.fr.ReadFrame()
	if err != nil {
		return 0, nil, err
	}
	if f.Type != wire.FrameHeader {
		return 0, nil, fmt.Errorf("frame type %d after basic.deliver, want a content header", f.Type)
	}
	_, size, _, err := wire.ParseContentHeader(f.Payload)
	if err != nil {
		return 0, nil, err
	}
	l.body = l.body[:0]
	for uint64(len(l.body)) < size {
		f, err := l.fr.ReadFrame()
		if err != nil {
			return 0, nil, err
		}
		if f.Type != wire.FrameBody {
			return 0, nil, fmt.Errorf("frame type %d inside a message body", f.Type)
		}
		l.body = append(l.body, f.Payload...)
	}
	return deliver.DeliveryTag, l.body, nil
}

// ack acknowledges tag (and every earlier one if multiple).
func (l *leanConn) ack(tag uint64, multiple bool) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.out = wire.AppendBasicAck(l.out[:0], leanChannel, tag, multiple)
	_, err := l.conn.Write(l.out)
	return err
}

// startReader hands the reads to a goroutine that discards what arrives until the
// connection ends; a producer uses it so that a close from the broker is answered and
// reported on closed.
func (l *leanConn) startReader() {
	l.readerDone = make(chan struct{})
	go func() {
		defer close(l.readerDone)
		for {
			f, err := l.fr.ReadFrame()
			if err == nil {
				err = l.closeError(f)
				if class, method := frameMethod(f); class == 10 && method == 51 {
					err = errors.New("connection closed") // connection.close-ok
				}
			}
			if err != nil {
				l.reportClose(err)
				return
			}
		}
	}()
}

func (l *leanConn) reportClose(err error) {
	e, ok := err.(*amqp.Error)
	if !ok {
		e = &amqp.Error{Reason: err.Error()}
	}
	select {
	case l.closed <- e:
	default:
	}
}

// abort closes the socket under whatever is blocked on it.
func (l *leanConn) abort() { _ = l.conn.Close() }

// Close closes the connection politely: connection.close, then up to timeout for the
// broker's close-ok, then the socket.
func (l *leanConn) Close(timeout time.Duration) error {
	err := l.send(0, &wire.ConnectionClose{ReplyCode: 200, ReplyText: "Goodbye"})
	deadline := time.Now().Add(timeout)
	if l.readerDone != nil {
		t := time.NewTimer(timeout)
		defer t.Stop()
		select {
		case <-l.readerDone:
		case <-t.C:
		}
	} else if err == nil {
		_ = l.conn.SetReadDeadline(deadline)
		err = l.expect(0, &wire.ConnectionCloseOk{})
	}
	if cerr := l.conn.Close(); err == nil {
		err = cerr
	}
	if l.readerDone != nil {
		<-l.readerDone
	}
	return err
}
