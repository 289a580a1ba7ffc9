package cluster

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"slices"
	"strings"
	"time"
)

// Connection tags: the first byte of every connection to the cluster port.
const (
	tagMux      byte = 'M' // header, then a lane byte; then raft request frames of every group (mesh.go)
	tagSnapshot byte = 'S' // header, then a uvarint group id; then one InstallSnapshot and its data
	tagForward  byte = 'F' // header, then pipelined forwarded proposals and membership changes
	tagPing     byte = 'P' // header, then a hello exchange and liveness pings
	tagAdmin    byte = 'A' // header, then one JSON admin request and its answer
	// tagService ('V', service.go): header, then a service byte; the rest is the service's
)

// Header flags (second byte).
const flagJoin byte = 1 // the dialling node was started with Join: skip the fingerprint check

// headerLen is tag + flags + 8-byte cluster fingerprint.
const headerLen = 10

// maxFrame bounds one forwarded frame (a proposal can carry a message body).
const maxFrame = 256 << 20

// dialTimeout bounds dialling a peer's cluster port.
const dialTimeout = 2 * time.Second

// headerReadTimeout bounds reading the header of an accepted connection.
const headerReadTimeout = 10 * time.Second

// fingerprint hashes the sorted id=addr list of the initial peers.
func fingerprint(peers map[string]string) (uint64, string) {
	list := make([]string, 0, len(peers))
	for id, addr := range peers {
		list = append(list, id+"="+addr)
	}
	slices.Sort(list)
	h := fnv.New64a()
	for _, s := range list {
		_, _ = h.Write([]byte(s))
		_, _ = h.Write([]byte{0})
	}
	return h.Sum64(), "[" + strings.Join(list, ", ") + "]"
}

// header builds a connection header.
func (n *Node) header(tag byte) []byte {
	b := make([]byte, headerLen, headerLen+binary.MaxVarintLen64)
	b[0] = tag
	if n.cfg.Join {
		b[1] = flagJoin
	}
	binary.BigEndian.PutUint64(b[2:], n.fp)
	return b
}

// dialPeer dials addr and writes the connection header for tag followed by extra.
func (n *Node) dialPeer(addr string, tag byte, extra []byte, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("cluster: dial %s: %w", addr, err)
	}
	hdr := append(n.header(tag), extra...)
	_ = c.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := c.Write(hdr); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("cluster: dial %s: write header: %w", addr, err)
	}
	_ = c.SetWriteDeadline(time.Time{})
	return c, nil
}

// writeFrame appends a uvarint length and body to w.
func appendFrame(dst, body []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(body)))
	return append(dst, body...)
}

// readFrame reads one length-prefixed frame into a fresh buffer.
func readFrame(r *bufio.Reader) ([]byte, error) {
	l, err := binary.ReadUvarint(r)
	if err != nil {
		return nil, err
	}
	if l > maxFrame {
		return nil, fmt.Errorf("cluster: frame of %d bytes exceeds the limit of %d", l, maxFrame)
	}
	b := make([]byte, l)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	return b, nil
}

// decoder reads fields out of a frame body.
type decoder struct {
	b   []byte
	err error
}

var errShortFrame = errors.New("cluster: malformed frame")

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errShortFrame
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte() byte {
	if d.err != nil || len(d.b) < 1 {
		d.err = errShortFrame
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) bytes() []byte {
	l := d.uvarint()
	if d.err != nil {
		return nil
	}
	if uint64(len(d.b)) < l {
		d.err = errShortFrame
		return nil
	}
	if l == 0 {
		return nil // as encoded from nil or empty alike
	}
	v := d.b[:l:l]
	d.b = d.b[l:]
	return v
}

func appendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}
