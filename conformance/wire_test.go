package conformance

// A deliberately small, independent AMQP 0-9-1 frame writer and reader for raw-socket tests.
// It does not use warren/amqp: the codec under test should not also be the test's ruler.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Wire constants from the AMQP 0-9-1 specification.
const (
	protocolHeader = "AMQP\x00\x00\x09\x01"

	frameMethod    = 1
	frameHeader    = 2
	frameBody      = 3
	frameHeartbeat = 8
	frameEnd       = 0xCE

	classConnection = 10
	classChannel    = 20
	classExchange   = 40
	classQueue      = 50
	classBasic      = 60
)

// Reply codes the tests check.
const (
	codeConnectionForced = 320
	codeAccessRefused    = 403
	codeFrameError       = 501
	codeChannelError     = 504
	codeUnexpectedFrame  = 505
	codeNotAllowed       = 530
	codeNotImplemented   = 540
)

// field is one entry of a field table, kept in order so encodings are deterministic.
type field struct {
	key   string
	value any // string, bool, int32, int64, or []field for a nested table
}

// enc appends AMQP wire types to a byte slice.
type enc struct{ b []byte }

func (e *enc) octet(v uint8)  { e.b = append(e.b, v) }
func (e *enc) short(v uint16) { e.b = binary.BigEndian.AppendUint16(e.b, v) }
func (e *enc) long(v uint32)  { e.b = binary.BigEndian.AppendUint32(e.b, v) }
func (e *enc) longlong(v uint64) {
	e.b = binary.BigEndian.AppendUint64(e.b, v)
}

func (e *enc) shortstr(s string) {
	if len(s) > math.MaxUint8 {
		panic("shortstr too long: " + s)
	}
	e.b = append(e.b, uint8(len(s)))
	e.b = append(e.b, s...)
}

func (e *enc) longstr(s string) {
	e.long(uint32(len(s)))
	e.b = append(e.b, s...)
}

// bits packs consecutive bit fields into octets as the spec requires.
func (e *enc) bits(bs ...bool) {
	for len(bs) > 0 {
		var o uint8
		for i := 0; i < 8 && i < len(bs); i++ {
			if bs[i] {
				o |= 1 << i
			}
		}
		e.octet(o)
		if len(bs) <= 8 {
			break
		}
		bs = bs[8:]
	}
}

// table appends a field table with its 4-byte length.
func (e *enc) table(fs []field) {
	var inner enc
	inner.tableEntries(fs)
	e.longstr(string(inner.b))
}

// tableEntries appends the entries of a table without the length (the AMQPLAIN response form).
func (e *enc) tableEntries(fs []field) {
	for _, f := range fs {
		e.shortstr(f.key)
		switch v := f.value.(type) {
		case string:
			e.octet('S')
			e.longstr(v)
		case bool:
			e.octet('t')
			if v {
				e.octet(1)
			} else {
				e.octet(0)
			}
		case int32:
			e.octet('I')
			e.long(uint32(v))
		case int64:
			e.octet('l')
			e.longlong(uint64(v))
		case []field:
			e.octet('F')
			e.table(v)
		default:
			panic(fmt.Sprintf("unsupported table value %T", v))
		}
	}
}

// frameBytes builds one complete frame.
func frameBytes(typ uint8, channel uint16, payload []byte) []byte {
	b := make([]byte, 0, 8+len(payload))
	b = append(b, typ)
	b = binary.BigEndian.AppendUint16(b, channel)
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	b = append(b, payload...)
	return append(b, frameEnd)
}

// methodFrame builds a method frame; args are the encoded arguments.
func methodFrame(channel, class, method uint16, args []byte) []byte {
	var e enc
	e.short(class)
	e.short(method)
	e.b = append(e.b, args...)
	return frameBytes(frameMethod, channel, e.b)
}

// contentHeaderFrame builds a basic content header frame with no properties.
func contentHeaderFrame(channel uint16, bodySize uint64) []byte {
	return contentHeaderFrameProps(channel, bodySize, 0, nil)
}

// Basic property flags the tests set.
const (
	propReplyTo    = 1 << 9
	propExpiration = 1 << 8
)

// contentHeaderFrameProps builds a basic content header frame with the given property flags and
// the encoded property fields, in flag order.
func contentHeaderFrameProps(channel uint16, bodySize uint64, flags uint16, props []byte) []byte {
	var e enc
	e.short(classBasic)
	e.short(0) // weight
	e.longlong(bodySize)
	e.short(flags)
	e.b = append(e.b, props...)
	return frameBytes(frameHeader, channel, e.b)
}

// Argument encoders for the methods the tests send.

func channelOpenArgs() []byte {
	var e enc
	e.shortstr("") // reserved
	return e.b
}

func closeArgs(code uint16, text string, class, method uint16) []byte {
	var e enc
	e.short(code)
	e.shortstr(text)
	e.short(class)
	e.short(method)
	return e.b
}

func queueDeclareArgs(name string, passive, durable, exclusive, autoDelete bool) []byte {
	var e enc
	e.short(0) // reserved
	e.shortstr(name)
	e.bits(passive, durable, exclusive, autoDelete, false)
	e.table(nil)
	return e.b
}

func basicPublishArgs(exchange, routingKey string) []byte {
	var e enc
	e.short(0) // reserved
	e.shortstr(exchange)
	e.shortstr(routingKey)
	e.bits(false, false)
	return e.b
}

// frame is one frame read from the server.
type frame struct {
	typ     uint8
	channel uint16
	payload []byte
}

// method returns the class and method id of a method frame (0, 0 for other frames).
func (f frame) method() (class, method uint16) {
	if f.typ != frameMethod || len(f.payload) < 4 {
		return 0, 0
	}
	return binary.BigEndian.Uint16(f.payload), binary.BigEndian.Uint16(f.payload[2:])
}

// is reports whether f is the given method.
func (f frame) is(class, method uint16) bool {
	c, m := f.method()
	return f.typ == frameMethod && c == class && m == method
}

// args returns the bytes after the class and method ids.
func (f frame) args() []byte {
	if len(f.payload) < 4 {
		return nil
	}
	return f.payload[4:]
}

func (f frame) String() string {
	switch f.typ {
	case frameMethod:
		c, m := f.method()
		if f.is(classConnection, 50) || f.is(classChannel, 40) {
			ci := parseClose(f)
			return fmt.Sprintf("method %d.%d on channel %d (%d %q)", c, m, f.channel, ci.code, ci.text)
		}
		return fmt.Sprintf("method %d.%d on channel %d", c, m, f.channel)
	case frameHeartbeat:
		return fmt.Sprintf("heartbeat on channel %d", f.channel)
	}
	return fmt.Sprintf("frame type %d on channel %d, %d bytes", f.typ, f.channel, len(f.payload))
}

// dec reads AMQP wire types; the first error sticks and later reads return zero values.
type dec struct {
	b   []byte
	err error
}

func (d *dec) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || len(d.b) < n {
		d.err = io.ErrUnexpectedEOF
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *dec) octet() uint8 {
	if v := d.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (d *dec) short() uint16 {
	if v := d.take(2); v != nil {
		return binary.BigEndian.Uint16(v)
	}
	return 0
}

func (d *dec) long() uint32 {
	if v := d.take(4); v != nil {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

func (d *dec) longlong() uint64 {
	if v := d.take(8); v != nil {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func (d *dec) shortstr() string { return string(d.take(int(d.octet()))) }
func (d *dec) longstr() string  { return string(d.take(int(d.long()))) }

// table decodes a field table (with its length) into a map. Values keep their wire width.
func (d *dec) table() map[string]any {
	raw := d.take(int(d.long()))
	if d.err != nil {
		return nil
	}
	inner := dec{b: raw}
	t := map[string]any{}
	for len(inner.b) > 0 && inner.err == nil {
		k := inner.shortstr()
		t[k] = inner.value()
	}
	if inner.err != nil {
		d.err = fmt.Errorf("table: %w", inner.err)
	}
	return t
}

// value decodes one tagged field value (RabbitMQ's type letters).
func (d *dec) value() any {
	switch tag := d.octet(); tag {
	case 't':
		return d.octet() != 0
	case 'b':
		return int8(d.octet())
	case 'B':
		return d.octet()
	case 's':
		return int16(d.short())
	case 'u':
		return d.short()
	case 'I':
		return int32(d.long())
	case 'i':
		return d.long()
	case 'l':
		return int64(d.longlong())
	case 'f':
		return math.Float32frombits(d.long())
	case 'd':
		return math.Float64frombits(d.longlong())
	case 'D':
		scale := d.octet()
		return [2]int64{int64(scale), int64(int32(d.long()))}
	case 'S':
		return d.longstr()
	case 'x':
		return []byte(d.longstr())
	case 'T':
		return time.Unix(int64(d.longlong()), 0).UTC()
	case 'F':
		return d.table()
	case 'A':
		inner := dec{b: d.take(int(d.long()))}
		var vs []any
		for len(inner.b) > 0 && inner.err == nil {
			vs = append(vs, inner.value())
		}
		if inner.err != nil && d.err == nil {
			d.err = inner.err
		}
		return vs
	case 'V':
		return nil
	default:
		if d.err == nil {
			d.err = fmt.Errorf("unknown field type %q", tag)
		}
		return nil
	}
}

// closeInfo is the content of a connection.close or channel.close.
type closeInfo struct {
	code          uint16
	text          string
	class, method uint16
}

func parseClose(f frame) closeInfo {
	d := dec{b: f.args()}
	return closeInfo{code: d.short(), text: d.shortstr(), class: d.short(), method: d.short()}
}

// startInfo is the content of connection.start.
type startInfo struct {
	major, minor uint8
	props        map[string]any
	mechanisms   []string
	locales      string
}

// tuneInfo is the content of connection.tune.
type tuneInfo struct {
	channelMax uint16
	frameMax   uint32
	heartbeat  uint16
}

// rawConn is a TCP connection driven frame by frame.
type rawConn struct {
	t     testing.TB
	nc    net.Conn
	br    *bufio.Reader
	start startInfo
	tune  tuneInfo
}

// dialRaw opens a TCP connection to addr; it is closed when the test ends.
func dialRaw(t testing.TB, addr string) *rawConn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { nc.Close() })
	return &rawConn{t: t, nc: nc, br: bufio.NewReaderSize(nc, 64*1024)}
}

// write sends bytes, failing the test on error.
func (c *rawConn) write(bs ...[]byte) {
	c.t.Helper()
	var all []byte
	for _, b := range bs {
		all = append(all, b...)
	}
	c.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.nc.Write(all); err != nil {
		c.t.Fatalf("write %d bytes: %v", len(all), err)
	}
}

// send writes one method frame.
func (c *rawConn) send(channel, class, method uint16, args []byte) {
	c.t.Helper()
	c.write(methodFrame(channel, class, method, args))
}

// readFrame reads the next frame, waiting at most d.
func (c *rawConn) readFrame(d time.Duration) (frame, error) {
	c.nc.SetReadDeadline(time.Now().Add(d))
	var hdr [7]byte
	if _, err := io.ReadFull(c.br, hdr[:]); err != nil {
		return frame{}, err
	}
	f := frame{typ: hdr[0], channel: binary.BigEndian.Uint16(hdr[1:]), payload: nil}
	size := binary.BigEndian.Uint32(hdr[3:])
	if size > 16<<20 {
		return frame{}, fmt.Errorf("server sent a frame of %d bytes", size)
	}
	buf := make([]byte, size+1)
	if _, err := io.ReadFull(c.br, buf); err != nil {
		return frame{}, err
	}
	if buf[size] != frameEnd {
		return frame{}, fmt.Errorf("server sent frame end octet %#x", buf[size])
	}
	f.payload = buf[:size]
	return f, nil
}

// next returns the next frame that is not a heartbeat, failing the test on error.
func (c *rawConn) next() frame {
	c.t.Helper()
	for {
		f, err := c.readFrame(10 * time.Second)
		if err != nil {
			c.t.Fatalf("reading a frame: %v", err)
		}
		if f.typ != frameHeartbeat {
			return f
		}
	}
}

// expect reads the next non-heartbeat frame and fails unless it is the given method on channel.
func (c *rawConn) expect(channel, class, method uint16) frame {
	c.t.Helper()
	f := c.next()
	if !f.is(class, method) || f.channel != channel {
		c.t.Fatalf("got %v; want method %d.%d on channel %d", f, class, method, channel)
	}
	return f
}

// sendHeader writes the AMQP 0-9-1 protocol header.
func (c *rawConn) sendHeader() {
	c.t.Helper()
	c.write([]byte(protocolHeader))
}

// readStart reads connection.start and records it.
func (c *rawConn) readStart() startInfo {
	c.t.Helper()
	f := c.expect(0, classConnection, 10)
	d := dec{b: f.args()}
	c.start = startInfo{major: d.octet(), minor: d.octet(), props: d.table()}
	c.start.mechanisms = strings.Fields(d.longstr())
	c.start.locales = d.longstr()
	if d.err != nil {
		c.t.Fatalf("decoding connection.start: %v", d.err)
	}
	return c.start
}

// isRabbitMQ reports whether the peer announced itself as RabbitMQ (the reference broker).
// Tests use it where Warren deliberately answers more clearly than RabbitMQ 3.10 does.
func (c *rawConn) isRabbitMQ() bool {
	p, _ := c.start.props["product"].(string)
	return p == "RabbitMQ"
}

// startOk describes the client's connection.start-ok.
type startOk struct {
	mechanism string
	response  string
	// authFailureClose advertises the authentication_failure_close capability.
	authFailureClose bool
}

func plainResponse(user, pass string) string { return "\x00" + user + "\x00" + pass }

func amqplainResponse(user, pass string) string {
	var e enc
	e.tableEntries([]field{{"LOGIN", user}, {"PASSWORD", pass}})
	return string(e.b)
}

// sendStartOk writes connection.start-ok.
func (c *rawConn) sendStartOk(so startOk) {
	c.t.Helper()
	caps := []field{{"authentication_failure_close", so.authFailureClose}}
	var e enc
	e.table([]field{
		{"product", "warren-conformance"},
		{"platform", "Go"},
		{"capabilities", caps},
	})
	e.shortstr(so.mechanism)
	e.longstr(so.response)
	e.shortstr("en_US")
	c.send(0, classConnection, 11, e.b)
}

// readTune reads connection.tune and records it.
func (c *rawConn) readTune() tuneInfo {
	c.t.Helper()
	f := c.expect(0, classConnection, 30)
	d := dec{b: f.args()}
	c.tune = tuneInfo{channelMax: d.short(), frameMax: d.long(), heartbeat: d.short()}
	if d.err != nil {
		c.t.Fatalf("decoding connection.tune: %v", d.err)
	}
	return c.tune
}

// sendTuneOk writes connection.tune-ok.
func (c *rawConn) sendTuneOk(t tuneInfo) {
	c.t.Helper()
	var e enc
	e.short(t.channelMax)
	e.long(t.frameMax)
	e.short(t.heartbeat)
	c.send(0, classConnection, 31, e.b)
}

// sendOpen writes connection.open for vhost.
func (c *rawConn) sendOpen(vhost string) {
	c.t.Helper()
	var e enc
	e.shortstr(vhost)
	e.shortstr("") // reserved-1 (capabilities)
	e.bits(false)  // reserved-2 (insist)
	c.send(0, classConnection, 40, e.b)
}

// handshake runs the whole opening handshake as guest/guest with PLAIN, accepting the server's
// tune values unless tune overrides them (zero fields keep the server's proposal).
func (c *rawConn) handshake(tune tuneInfo) {
	c.t.Helper()
	c.sendHeader()
	c.readStart()
	c.sendStartOk(startOk{mechanism: "PLAIN", response: plainResponse("guest", "guest"), authFailureClose: true})
	proposed := c.readTune()
	if tune.channelMax == 0 {
		tune.channelMax = proposed.channelMax
	}
	if tune.frameMax == 0 {
		tune.frameMax = proposed.frameMax
	}
	c.tune = tune
	c.sendTuneOk(tune)
	c.sendOpen("/")
	c.expect(0, classConnection, 41)
}

// openRaw dials addr and completes the handshake with the server's tune values and no heartbeats.
func openRaw(t testing.TB, addr string) *rawConn {
	t.Helper()
	c := dialRaw(t, addr)
	c.handshake(tuneInfo{})
	return c
}

// openChannel opens channel ch and waits for open-ok.
func (c *rawConn) openChannel(ch uint16) {
	c.t.Helper()
	c.send(ch, classChannel, 10, channelOpenArgs())
	c.expect(ch, classChannel, 11)
}

// expectConnectionClose reads until the server's connection.close (skipping anything else,
// which is logged), checks its code, answers close-ok and waits for the server to close the
// socket. It returns the close's content.
func (c *rawConn) expectConnectionClose(wantCode uint16) closeInfo {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		f, err := c.readFrame(time.Until(deadline))
		if err != nil {
			c.t.Fatalf("want connection.close %d; reading: %v", wantCode, err)
		}
		if f.typ == frameHeartbeat {
			continue
		}
		if !f.is(classConnection, 50) {
			c.t.Logf("skipping %v while waiting for connection.close", f)
			continue
		}
		if f.channel != 0 {
			c.t.Errorf("connection.close came on channel %d; want 0", f.channel)
		}
		ci := parseClose(f)
		if ci.code != wantCode {
			c.t.Fatalf("connection.close %d %q; want code %d", ci.code, ci.text, wantCode)
		}
		c.t.Logf("connection.close %d %q (class %d, method %d)", ci.code, ci.text, ci.class, ci.method)
		c.send(0, classConnection, 51, nil)
		c.expectSocketClosed(10 * time.Second)
		return ci
	}
}

// expectSocketClosed waits up to d for the server to close the connection. Heartbeats are
// ignored; any other frame fails the test.
func (c *rawConn) expectSocketClosed(d time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(d)
	for {
		f, err := c.readFrame(time.Until(deadline))
		if isClosedErr(err) {
			return
		}
		if err != nil {
			c.t.Fatalf("want the server to close the socket within %v; got %v", d, err)
		}
		if f.typ != frameHeartbeat {
			c.t.Fatalf("want the server to close the socket; got %v", f)
		}
	}
}

// isClosedErr reports whether err means the peer closed or reset the connection.
func isClosedErr(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// isTimeout reports whether err is a deadline expiry.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
