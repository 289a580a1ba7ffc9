package perf

// A lean client of RabbitMQ's stream protocol for `warren perf stream`, on Warren's own codec
// (server/streamproto/wire): one connection per producer or consumer, a reader goroutine for
// confirms, deliveries answered with one credit per chunk. It costs the machine little CPU of
// its own, so on a shared 2-core machine the broker under test gets most of it.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"warren/server/streamproto/wire"
	"warren/stream/osiris"
)

// streamConn is one open stream-protocol connection.
type streamConn struct {
	nc   net.Conn
	r    *wire.Reader
	corr uint32
	wmu  sync.Mutex // serialises writes (the publisher and the reader's credit answers)
}

// parseStreamURI splits rabbitmq-stream://user:pass@host:port/vhost.
func parseStreamURI(uri string) (addr, user, pass, vhost string, err error) {
	u, err := url.Parse(uri)
	if err != nil {
		return "", "", "", "", fmt.Errorf("parse stream URI %q: %w", uri, err)
	}
	if u.Scheme != "rabbitmq-stream" {
		return "", "", "", "", fmt.Errorf("stream URI %q: scheme must be rabbitmq-stream", uri)
	}
	user, pass = "guest", "guest"
	if u.User != nil {
		user = u.User.Username()
		if p, ok := u.User.Password(); ok {
			pass = p
		}
	}
	vhost = strings.TrimPrefix(u.Path, "/")
	if vhost == "" {
		vhost = "/"
	}
	addr = u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "5552")
	}
	return addr, user, pass, vhost, nil
}

// dialStream connects and runs the handshake (peer properties, PLAIN, tune, open).
func dialStream(uri string) (*streamConn, error) {
	addr, user, pass, vhost, err := parseStreamURI(uri)
	if err != nil {
		return nil, err
	}
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	c := &streamConn{nc: nc, r: wire.NewReader(nc, 0)}
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := c.handshake(user, pass, vhost); err != nil {
		nc.Close()
		return nil, fmt.Errorf("stream handshake with %s: %w", addr, err)
	}
	_ = nc.SetDeadline(time.Time{})
	return c, nil
}

func (c *streamConn) send(cmd wire.Command) error {
	b, err := cmd.Append(nil)
	if err != nil {
		return err
	}
	return c.write(b)
}

func (c *streamConn) write(b []byte) error {
	c.wmu.Lock()
	_, err := c.nc.Write(b)
	c.wmu.Unlock()
	return err
}

// next reads the next frame that is not a heartbeat, decoded.
func (c *streamConn) next() (wire.Command, error) {
	for {
		f, err := c.r.ReadFrame()
		if err != nil {
			return nil, err
		}
		cmd, err := wire.Decode(f)
		if err != nil {
			return nil, err
		}
		if _, hb := cmd.(*wire.Heartbeat); !hb {
			return cmd, nil
		}
	}
}

func (c *streamConn) nextCorr() uint32 { c.corr++; return c.corr }

func (c *streamConn) handshake(user, pass, vhost string) error {
	if err := c.send(&wire.PeerProperties{CorrelationID: c.nextCorr(), Properties: []wire.Property{{Key: "product", Value: "warren perf stream"}}}); err != nil {
		return err
	}
	if cmd, err := c.next(); err != nil {
		return err
	} else if r, ok := cmd.(*wire.PeerPropertiesResponse); !ok || r.Code != wire.ResponseCodeOK {
		return fmt.Errorf("peer properties: %+v", cmd)
	}
	if err := c.send(&wire.SASLHandshake{CorrelationID: c.nextCorr()}); err != nil {
		return err
	}
	if cmd, err := c.next(); err != nil {
		return err
	} else if r, ok := cmd.(*wire.SASLHandshakeResponse); !ok || r.Code != wire.ResponseCodeOK {
		return fmt.Errorf("sasl handshake: %+v", cmd)
	}
	if err := c.send(&wire.SASLAuthenticate{CorrelationID: c.nextCorr(), Mechanism: "PLAIN", Data: []byte("\x00" + user + "\x00" + pass)}); err != nil {
		return err
	}
	if cmd, err := c.next(); err != nil {
		return err
	} else if r, ok := cmd.(*wire.SASLAuthenticateResponse); !ok || r.Code != wire.ResponseCodeOK {
		return fmt.Errorf("authenticate: %+v", cmd)
	}
	cmd, err := c.next()
	if err != nil {
		return err
	}
	tune, ok := cmd.(*wire.Tune)
	if !ok {
		return fmt.Errorf("expected tune, got %T", cmd)
	}
	// No heartbeats: runs are short and the reader goroutines answer nothing but credits.
	if err := c.send(&wire.Tune{FrameMax: tune.FrameMax, Heartbeat: 0, Response: true}); err != nil {
		return err
	}
	if err := c.send(&wire.Open{CorrelationID: c.nextCorr(), VirtualHost: vhost}); err != nil {
		return err
	}
	cmd, err = c.next()
	if err != nil {
		return err
	}
	if r, ok := cmd.(*wire.OpenResponse); !ok || r.Code != wire.ResponseCodeOK {
		return fmt.Errorf("open vhost %q: %+v", vhost, cmd)
	}
	return nil
}

// request sends cmd and waits for its generic response.
func (c *streamConn) request(cmd wire.Command) (wire.ResponseCode, error) {
	if err := c.send(cmd); err != nil {
		return 0, err
	}
	_ = c.nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	defer c.nc.SetReadDeadline(time.Time{})
	for {
		got, err := c.next()
		if err != nil {
			return 0, err
		}
		if r, ok := got.(*wire.Response); ok {
			return r.Code, nil
		}
	}
}

func (c *streamConn) close() {
	_ = c.send(&wire.Close{CorrelationID: c.nextCorr(), Code: wire.ResponseCodeOK, Reason: "done"})
	c.nc.Close()
}

// amqp10Body is an AMQP 1.0 message holding only a data section of size bytes, as
// stream-perf-test publishes.
func amqp10Body(size int) []byte {
	b := []byte{0x00, 0x53, 0x75}
	if size < 256 {
		b = append(b, 0xa0, byte(size))
	} else {
		b = append(b, 0xb0)
		b = binary.BigEndian.AppendUint32(b, uint32(size))
	}
	return append(b, make([]byte, size)...)
}

// streamPublisher publishes n messages in frames of batch messages (or sub-entries of subEntry
// messages), with at most window messages unconfirmed, and returns when all are confirmed.
func streamPublisher(c *streamConn, stream string, n, batch, subEntry, window int, body []byte, deadline time.Time) error {
	if code, err := c.request(&wire.DeclarePublisher{CorrelationID: c.nextCorr(), PublisherID: 0, Stream: stream}); err != nil {
		return err
	} else if code != wire.ResponseCodeOK {
		return fmt.Errorf("declare publisher: %s", code)
	}
	if subEntry < 1 {
		subEntry = 1
	}
	var (
		mu        sync.Mutex
		cond      = sync.NewCond(&mu)
		confirmed int
		readErr   error
	)
	go func() {
		var pc wire.PublishConfirm
		for {
			f, err := c.r.ReadFrame()
			if err == nil {
				var h wire.Header
				if h, err = wire.PeekHeader(f); err == nil {
					switch h.Key {
					case wire.CommandPublishConfirm:
						if err = pc.Decode(f); err == nil {
							mu.Lock()
							confirmed += len(pc.PublishingIDs) * subEntry
							cond.Broadcast()
							mu.Unlock()
							continue
						}
					case wire.CommandPublishError:
						err = errors.New("publish error from the broker")
					default:
						continue
					}
				}
			}
			mu.Lock()
			readErr = err
			cond.Broadcast()
			mu.Unlock()
			return
		}
	}()
	// A frame of batch entries; entries are messages, or sub-entries of subEntry messages.
	entries := max(1, batch/subEntry)
	var frame []byte
	var m wire.Publish
	var sub []byte
	if subEntry > 1 {
		for i := 0; i < subEntry; i++ {
			sub = binary.BigEndian.AppendUint32(sub, uint32(len(body)))
			sub = append(sub, body...)
		}
	}
	sent, nextID := 0, uint64(1)
	for sent < n {
		k := min(entries, (n-sent+subEntry-1)/subEntry)
		m.Messages = m.Messages[:0]
		for i := 0; i < k; i++ {
			pm := wire.PublishedMessage{PublishingID: nextID, Data: body}
			if subEntry > 1 {
				pm = wire.PublishedMessage{PublishingID: nextID, Data: sub, SubBatch: true, Records: uint16(subEntry), UncompressedSize: uint32(len(sub))}
			}
			nextID++
			m.Messages = append(m.Messages, pm)
		}
		msgs := k * subEntry
		mu.Lock()
		for sent-confirmed+msgs > window && readErr == nil {
			cond.Wait()
		}
		err := readErr
		mu.Unlock()
		if err != nil {
			return fmt.Errorf("publisher: %w", err)
		}
		var aerr error
		if frame, aerr = m.Append(frame[:0]); aerr != nil {
			return aerr
		}
		if err := c.write(frame); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		sent += msgs
	}
	stop := time.AfterFunc(time.Until(deadline), func() {
		mu.Lock()
		if readErr == nil {
			readErr = errors.New("timed out waiting for confirms")
		}
		cond.Broadcast()
		mu.Unlock()
	})
	defer stop.Stop()
	mu.Lock()
	defer mu.Unlock()
	for confirmed < sent && readErr == nil {
		cond.Wait()
	}
	if confirmed < sent {
		return fmt.Errorf("%d of %d confirmed: %w", confirmed, sent, readErr)
	}
	return nil
}

// streamConsumer subscribes from the first offset with credit chunks of initial credit, gives
// one credit back per chunk received (as the stream clients do), checks each chunk's CRC and
// returns once n messages arrived.
func streamConsumer(c *streamConn, stream string, n int, credit uint16, deadline time.Time) error {
	if code, err := c.request(&wire.Subscribe{CorrelationID: c.nextCorr(), SubscriptionID: 0, Stream: stream,
		Offset: wire.OffsetSpec{Type: wire.OffsetTypeFirst}, Credit: credit}); err != nil {
		return err
	} else if code != wire.ResponseCodeOK {
		return fmt.Errorf("subscribe: %s", code)
	}
	_ = c.nc.SetReadDeadline(deadline)
	creditFrame, _ := (&wire.Credit{SubscriptionID: 0, Credit: 1}).Append(nil)
	got := 0
	var d wire.Deliver
	for got < n {
		f, err := c.r.ReadFrame()
		if err != nil {
			return fmt.Errorf("consumer: %d of %d messages: %w", got, n, err)
		}
		h, err := wire.PeekHeader(f)
		if err != nil {
			return err
		}
		if h.Key != wire.CommandDeliver {
			continue
		}
		if err := d.Decode(f); err != nil {
			return err
		}
		if err := c.write(creditFrame); err != nil {
			return err
		}
		ch, err := osiris.ParseHeader(d.Chunk)
		if err != nil {
			return fmt.Errorf("deliver: %w", err)
		}
		if end := osiris.HeaderSize + int(ch.DataLength); end <= len(d.Chunk) {
			if crc32.ChecksumIEEE(d.Chunk[osiris.HeaderSize:end]) != ch.CRC {
				return fmt.Errorf("chunk %d: CRC mismatch", ch.ChunkID)
			}
		} else {
			return fmt.Errorf("chunk %d: %d data bytes in a frame of %d", ch.ChunkID, ch.DataLength, len(d.Chunk))
		}
		got += int(ch.NumRecords)
	}
	return nil
}
