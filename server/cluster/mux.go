package cluster

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"time"
)

// acceptLoop accepts connections on the cluster port and dispatches each by its tag.
func (n *Node) acceptLoop() {
	defer n.wg.Done()
	var delay time.Duration
	for {
		c, err := n.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || n.ctx.Err() != nil {
				return
			}
			if delay == 0 {
				delay = 5 * time.Millisecond
			} else if delay *= 2; delay > time.Second {
				delay = time.Second
			}
			n.log.Warn("cluster: accept failed", "error", err)
			select {
			case <-n.ctx.Done():
				return
			case <-time.After(delay):
			}
			continue
		}
		delay = 0
		if !n.trackConn(c) {
			_ = c.Close()
			return
		}
		if !n.goTracked(func() { n.handleConn(c) }) {
			n.untrackConn(c)
			_ = c.Close()
			return
		}
	}
}

// handleConn reads the header of an accepted connection and serves it.
func (n *Node) handleConn(c net.Conn) {
	defer func() {
		n.untrackConn(c)
		_ = c.Close()
	}()
	_ = c.SetReadDeadline(time.Now().Add(headerReadTimeout))
	br := bufio.NewReaderSize(c, 64<<10)
	var hdr [headerLen]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return
	}
	tag, flags, fp := hdr[0], hdr[1], binary.BigEndian.Uint64(hdr[2:])
	checkFP := tag != tagAdmin && tag != tagPing && !n.cfg.Join && flags&flagJoin == 0
	if checkFP && fp != n.fp {
		n.log.Debug("cluster: refused a connection from a node with another peer list",
			"remote", c.RemoteAddr().String())
		return
	}
	switch tag {
	case tagMux:
		if _, err := br.ReadByte(); err != nil { // the lane: both are served alike
			return
		}
		_ = c.SetReadDeadline(time.Time{})
		if n.mesh != nil {
			n.mesh.serveMux(c, br)
		}
	case tagSnapshot:
		gid, err := binary.ReadUvarint(br)
		if err != nil {
			return
		}
		_ = c.SetReadDeadline(time.Time{})
		if n.mesh != nil {
			n.mesh.serveSnapshot(c, br, gid)
		}
	case tagForward:
		_ = c.SetReadDeadline(time.Time{})
		n.serveForward(c, br)
	case tagPing:
		n.servePing(c, br)
	case tagAdmin:
		n.serveAdmin(c, br)
	case tagService:
		n.serveService(c, br)
	}
}
