package server_test

// A minimal hand-rolled AMQP 0-9-1 client for the few things amqp091-go cannot
// show: it never lets the server pick a consumer tag, and it never advertises
// the authentication_failure_close capability.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/url"
	"testing"
	"time"
)

type rawConn struct {
	t          *testing.T
	c          net.Conn
	rd         *bufio.Reader
	heartbeats int // heartbeat frames received so far
}

// rawFrame is one decoded frame; for method frames class and method are set
// and args holds the remaining payload.
type rawFrame struct {
	typ           byte
	channel       uint16
	class, method uint16
	args          []byte
}

func rawDial(t *testing.T, amqpURL string) *rawConn {
	t.Helper()
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatalf("parse %s: %v", amqpURL, err)
	}
	c, err := net.DialTimeout("tcp", u.Host, waitFor)
	if err != nil {
		t.Fatalf("dial %s: %v", u.Host, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if err := c.SetDeadline(time.Now().Add(2 * waitFor)); err != nil {
		t.Fatalf("set deadline: %v", err)
	}
	return &rawConn{t: t, c: c, rd: bufio.NewReader(c)}
}

// rawBuf builds method arguments.
type rawBuf struct{ bytes.Buffer }

func (b *rawBuf) u8(v byte) *rawBuf { b.WriteByte(v); return b }
func (b *rawBuf) u16(v uint16) *rawBuf {
	_ = binary.Write(&b.Buffer, binary.BigEndian, v)
	return b
}
func (b *rawBuf) u32(v uint32) *rawBuf {
	_ = binary.Write(&b.Buffer, binary.BigEndian, v)
	return b
}
func (b *rawBuf) short(s string) *rawBuf { b.u8(byte(len(s))); b.WriteString(s); return b }
func (b *rawBuf) long(s string) *rawBuf  { b.u32(uint32(len(s))); b.WriteString(s); return b }

// table encodes a field table of booleans, which is all this client needs.
func (b *rawBuf) table(bools map[string]bool) *rawBuf {
	var inner rawBuf
	for k, v := range bools {
		inner.short(k).u8('t')
		if v {
			inner.u8(1)
		} else {
			inner.u8(0)
		}
	}
	b.u32(uint32(inner.Len()))
	b.Write(inner.Bytes())
	return b
}

func (r *rawConn) send(channel, class, method uint16, args *rawBuf) {
	r.t.Helper()
	var p rawBuf
	p.u16(class).u16(method)
	if args != nil {
		p.Write(args.Bytes())
	}
	var f rawBuf
	f.u8(1).u16(channel).u32(uint32(p.Len()))
	f.Write(p.Bytes())
	f.u8(0xCE)
	if _, err := r.c.Write(f.Bytes()); err != nil {
		r.t.Fatalf("raw write: %v", err)
	}
}

// read returns the next non-heartbeat frame; io.EOF-like errors are returned.
func (r *rawConn) read() (rawFrame, error) {
	for {
		var hdr [7]byte
		if _, err := io.ReadFull(r.rd, hdr[:]); err != nil {
			return rawFrame{}, err
		}
		size := binary.BigEndian.Uint32(hdr[3:])
		payload := make([]byte, size+1)
		if _, err := io.ReadFull(r.rd, payload); err != nil {
			return rawFrame{}, err
		}
		if payload[size] != 0xCE {
			return rawFrame{}, fmt.Errorf("bad frame end %#x", payload[size])
		}
		f := rawFrame{typ: hdr[0], channel: binary.BigEndian.Uint16(hdr[1:])}
		switch f.typ {
		case 8:
			r.heartbeats++
			continue
		case 1:
			if size < 4 {
				return rawFrame{}, fmt.Errorf("short method frame")
			}
			f.class = binary.BigEndian.Uint16(payload)
			f.method = binary.BigEndian.Uint16(payload[2:])
			f.args = payload[4:size]
		default:
			f.args = payload[:size]
		}
		return f, nil
	}
}

// expect reads the next frame and requires it to be class.method.
func (r *rawConn) expect(class, method uint16) rawFrame {
	r.t.Helper()
	f, err := r.read()
	if err != nil {
		r.t.Fatalf("raw read, want method %d.%d: %v", class, method, err)
	}
	if f.typ != 1 || f.class != class || f.method != method {
		if f.typ == 1 && (f.class == 10 || f.class == 20) && f.method == 40 {
			code, text := closeArgs(f.args)
			r.t.Fatalf("got close %d %q, want method %d.%d", code, text, class, method)
		}
		r.t.Fatalf("got frame type %d method %d.%d, want method %d.%d", f.typ, f.class, f.method, class, method)
	}
	return f
}

// closeArgs decodes the reply code and text of connection.close/channel.close.
func closeArgs(a []byte) (uint16, string) {
	if len(a) < 3 {
		return 0, ""
	}
	code := binary.BigEndian.Uint16(a)
	n := int(a[2])
	if len(a) < 3+n {
		return code, ""
	}
	return code, string(a[3 : 3+n])
}

// handshake performs the protocol header and connection.start/start-ok; it
// returns the frame that answered start-ok (tune on success).
func (r *rawConn) handshake(user, pass string, caps map[string]bool) rawFrame {
	r.t.Helper()
	if _, err := r.c.Write([]byte("AMQP\x00\x00\x09\x01")); err != nil {
		r.t.Fatalf("write protocol header: %v", err)
	}
	r.expect(10, 10) // connection.start
	var inner rawBuf
	inner.short("product").u8('S').long("warren raw test client")
	if caps != nil {
		var ct rawBuf
		ct.table(caps)
		inner.short("capabilities").u8('F')
		inner.Write(ct.Bytes())
	}
	var args rawBuf
	args.u32(uint32(inner.Len()))
	args.Write(inner.Bytes())
	args.short("PLAIN").long("\x00" + user + "\x00" + pass).short("en_US")
	r.send(0, 10, 11, &args)
	f, err := r.read()
	if err != nil {
		r.t.Fatalf("raw read after start-ok: %v", err)
	}
	return f
}

// open completes a successful handshake (tune-ok without heartbeats, open
// vhost "/") and opens channel 1.
func (r *rawConn) open(user, pass string) {
	r.t.Helper()
	r.openHeartbeat(user, pass, 0)
}

// openHeartbeat is open with the given heartbeat (seconds) in tune-ok.
func (r *rawConn) openHeartbeat(user, pass string, heartbeat uint16) {
	r.t.Helper()
	r.openCaps(user, pass, heartbeat, nil)
}

// openCaps is openHeartbeat with the given client capabilities.
func (r *rawConn) openCaps(user, pass string, heartbeat uint16, caps map[string]bool) {
	r.t.Helper()
	f := r.handshake(user, pass, caps)
	if f.typ != 1 || f.class != 10 || f.method != 30 {
		r.t.Fatalf("want connection.tune, got %d.%d", f.class, f.method)
	}
	var tuneOK rawBuf
	tuneOK.u16(2047).u32(131072).u16(heartbeat)
	r.send(0, 10, 31, &tuneOK)
	var open rawBuf
	open.short("/").short("").u8(0)
	r.send(0, 10, 40, &open)
	r.expect(10, 41)
	var chOpen rawBuf
	chOpen.short("")
	r.send(1, 20, 10, &chOpen)
	r.expect(20, 11)
}

// close closes the connection politely.
func (r *rawConn) close() {
	r.t.Helper()
	var cl rawBuf
	cl.u16(200).short("bye").u16(0).u16(0)
	r.send(0, 10, 50, &cl)
	r.expect(10, 51)
	_ = r.c.Close()
}

// queue.delete-ok comes before the basic.cancel of a consumer on the deleting channel, as in
// RabbitMQ, for every queue type: amqplib resolves the delete's promise on the reply, and a client
// that closes as soon as it sees the cancel must not find the delete still waiting for it.
func TestRawQueueDeleteOkBeforeCancel(t *testing.T) {
	url := startBroker(t)
	for _, qtype := range []string{"classic", "quorum", "stream"} {
		t.Run(qtype, func(t *testing.T) {
			r := rawDial(t, url)
			r.openCaps("guest", "guest", 0, map[string]bool{"consumer_cancel_notify": true})
			name := "delete-order-" + qtype

			var qos rawBuf
			qos.u32(0).u16(10).u8(0) // streams need a prefetch
			r.send(1, 60, 10, &qos)
			r.expect(60, 11)
			var args rawBuf // {"x-queue-type": qtype}
			args.short("x-queue-type").u8('S').long(qtype)
			var declare rawBuf
			declare.u16(0).short(name).u8(2) // durable
			declare.u32(uint32(args.Len()))
			declare.Write(args.Bytes())
			r.send(1, 50, 10, &declare)
			r.expect(50, 11)
			var consume rawBuf
			consume.u16(0).short(name).short("c1").u8(0).table(nil)
			r.send(1, 60, 20, &consume)
			r.expect(60, 21)
			var del rawBuf
			del.u16(0).short(name).u8(0)
			r.send(1, 50, 40, &del)
			r.expect(50, 41) // queue.delete-ok first
			f := r.expect(60, 30)
			if n := int(f.args[0]); string(f.args[1:1+n]) != "c1" {
				t.Errorf("basic.cancel for %q, want c1", f.args[1:1+n])
			}
			r.close()
		})
	}
}
