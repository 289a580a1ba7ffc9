package cluster

import (
	"encoding/binary"
	"fmt"

	"github.com/hashicorp/raft"

	"warren/storage/raftstore"
)

// The raft messages of the mesh transport (mesh.go), in our own compact binary encoding: hashicorp's
// NetworkTransport encodes every RPC with reflective msgpack, which was a large part of an idle
// cluster's CPU.
//
// A request frame is: kind u8 | request id uvarint | group uvarint | body. A response frame is:
// kind|respFlag u8 | request id uvarint | status u8 | (status ok) epoch uvarint, body | (status error)
// message. The epoch identifies the answering group's transport instance (see groupTransport.epoch).
//
// A heartbeat batch (kindHeartbeats) carries the RPC header once and then, per heartbeat, request id,
// group and term: hashicorp/raft's heartbeat is exactly an AppendEntries with the header, the term and
// the leader address (the address is the header's). Its answer (kindHeartbeats|respFlag) carries the
// answering node's header once and then, per heartbeat, request id, status and (status ok) epoch, term,
// last log index and flags.

// Message kinds.
const (
	kindAppend     byte = 1 // AppendEntries (not a heartbeat)
	kindVote       byte = 2 // RequestVote
	kindPreVote    byte = 3 // RequestPreVote
	kindTimeoutNow byte = 4 // TimeoutNow
	kindHeartbeats byte = 5 // a batch of heartbeats (AppendEntries with only term and leader)
	kindSnapshot   byte = 6 // InstallSnapshot, on its own connection, followed by the snapshot data

	respFlag byte = 0x80
)

// Response status.
const (
	statusOK  byte = 0
	statusErr byte = 1 // a message follows
)

// Flags of an AppendEntriesResponse.
const (
	flagSuccess        byte = 1
	flagNoRetryBackoff byte = 2
)

// isHeartbeat reports whether req is hashicorp/raft's heartbeat: term and leader only. The test is
// NetworkTransport's, so the follower handles exactly what hashicorp's fast path would.
func isHeartbeat(req *raft.AppendEntriesRequest) bool {
	leader := req.Addr
	if len(leader) == 0 {
		leader = req.Leader
	}
	return req.Term != 0 && leader != nil && req.PrevLogEntry == 0 && req.PrevLogTerm == 0 &&
		len(req.Entries) == 0 && req.LeaderCommitIndex == 0
}

func appendHeader(b []byte, h raft.RPCHeader) []byte {
	b = binary.AppendUvarint(b, uint64(h.ProtocolVersion))
	b = appendBytes(b, h.ID)
	return appendBytes(b, h.Addr)
}

func (d *decoder) header() raft.RPCHeader {
	return raft.RPCHeader{ProtocolVersion: raft.ProtocolVersion(d.uvarint()), ID: d.bytes(), Addr: d.bytes()}
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errShortFrame
		return 0
	}
	d.b = d.b[n:]
	return v
}

// end fails the decoding if bytes are left over.
func (d *decoder) end() error {
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("cluster: malformed frame: %d bytes left over", len(d.b))
	}
	return d.err
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// appendAppendReq encodes an AppendEntriesRequest.
func appendAppendReq(b []byte, r *raft.AppendEntriesRequest) []byte {
	b = appendHeader(b, r.RPCHeader)
	b = binary.AppendUvarint(b, r.Term)
	b = appendBytes(b, r.Leader)
	b = binary.AppendUvarint(b, r.PrevLogEntry)
	b = binary.AppendUvarint(b, r.PrevLogTerm)
	b = binary.AppendUvarint(b, r.LeaderCommitIndex)
	b = binary.AppendUvarint(b, uint64(len(r.Entries)))
	for _, l := range r.Entries {
		// Length-prefixed stored encoding: reserve the largest prefix, then move the entry down.
		start := len(b)
		b = binary.AppendUvarint(b, uint64(raftstore.MaxEncodedLen(l)))
		prefix := len(b) - start
		b = raftstore.AppendLog(b, l)
		n := len(b) - start - prefix
		var tmp [binary.MaxVarintLen64]byte
		k := binary.PutUvarint(tmp[:], uint64(n))
		copy(b[start:], tmp[:k])
		copy(b[start+k:], b[start+prefix:])
		b = b[:start+k+n]
	}
	return b
}

// maxAppendReqLen bounds the encoded size of r.
func maxAppendReqLen(r *raft.AppendEntriesRequest) int {
	n := 8*binary.MaxVarintLen64 + len(r.ID) + len(r.Addr) + len(r.Leader)
	for _, l := range r.Entries {
		n += binary.MaxVarintLen64 + raftstore.MaxEncodedLen(l)
	}
	return n
}

// maxEntries bounds the entries of a decoded AppendEntries (a corrupt count must not allocate much).
const maxEntries = 1 << 20

func decodeAppendReq(d *decoder) (*raft.AppendEntriesRequest, error) {
	r := &raft.AppendEntriesRequest{RPCHeader: d.header()}
	r.Term = d.uvarint()
	r.Leader = d.bytes()
	r.PrevLogEntry = d.uvarint()
	r.PrevLogTerm = d.uvarint()
	r.LeaderCommitIndex = d.uvarint()
	n := d.uvarint()
	if d.err == nil && (n > maxEntries || n > uint64(len(d.b))) {
		d.err = fmt.Errorf("cluster: malformed frame: %d log entries", n)
	}
	if d.err != nil {
		return nil, d.err
	}
	if n > 0 {
		r.Entries = make([]*raft.Log, n)
		logs := make([]raft.Log, n)
		for i := range r.Entries {
			b := d.bytes()
			if d.err != nil {
				return nil, d.err
			}
			if err := raftstore.DecodeLog(b, &logs[i]); err != nil {
				return nil, fmt.Errorf("cluster: malformed frame: log entry %d: %w", i, err)
			}
			r.Entries[i] = &logs[i]
		}
	}
	return r, d.end()
}

func appendAppendResp(b []byte, r *raft.AppendEntriesResponse) []byte {
	b = appendHeader(b, r.RPCHeader)
	b = binary.AppendUvarint(b, r.Term)
	b = binary.AppendUvarint(b, r.LastLog)
	var f byte
	if r.Success {
		f |= flagSuccess
	}
	if r.NoRetryBackoff {
		f |= flagNoRetryBackoff
	}
	return append(b, f)
}

func decodeAppendResp(d *decoder, r *raft.AppendEntriesResponse) error {
	r.RPCHeader = d.header()
	r.Term = d.uvarint()
	r.LastLog = d.uvarint()
	f := d.byte()
	r.Success, r.NoRetryBackoff = f&flagSuccess != 0, f&flagNoRetryBackoff != 0
	return d.end()
}

func appendVoteReq(b []byte, r *raft.RequestVoteRequest) []byte {
	b = appendHeader(b, r.RPCHeader)
	b = binary.AppendUvarint(b, r.Term)
	b = appendBytes(b, r.Candidate)
	b = binary.AppendUvarint(b, r.LastLogIndex)
	b = binary.AppendUvarint(b, r.LastLogTerm)
	return append(b, boolByte(r.LeadershipTransfer))
}

func decodeVoteReq(d *decoder) (*raft.RequestVoteRequest, error) {
	r := &raft.RequestVoteRequest{RPCHeader: d.header()}
	r.Term = d.uvarint()
	r.Candidate = d.bytes()
	r.LastLogIndex = d.uvarint()
	r.LastLogTerm = d.uvarint()
	r.LeadershipTransfer = d.byte() != 0
	return r, d.end()
}

func appendVoteResp(b []byte, r *raft.RequestVoteResponse) []byte {
	b = appendHeader(b, r.RPCHeader)
	b = binary.AppendUvarint(b, r.Term)
	b = appendBytes(b, r.Peers)
	return append(b, boolByte(r.Granted))
}

func decodeVoteResp(d *decoder, r *raft.RequestVoteResponse) error {
	r.RPCHeader = d.header()
	r.Term = d.uvarint()
	r.Peers = d.bytes()
	r.Granted = d.byte() != 0
	return d.end()
}

func appendPreVoteReq(b []byte, r *raft.RequestPreVoteRequest) []byte {
	b = appendHeader(b, r.RPCHeader)
	b = binary.AppendUvarint(b, r.Term)
	b = binary.AppendUvarint(b, r.LastLogIndex)
	return binary.AppendUvarint(b, r.LastLogTerm)
}

func decodePreVoteReq(d *decoder) (*raft.RequestPreVoteRequest, error) {
	r := &raft.RequestPreVoteRequest{RPCHeader: d.header()}
	r.Term = d.uvarint()
	r.LastLogIndex = d.uvarint()
	r.LastLogTerm = d.uvarint()
	return r, d.end()
}

func appendPreVoteResp(b []byte, r *raft.RequestPreVoteResponse) []byte {
	b = appendHeader(b, r.RPCHeader)
	b = binary.AppendUvarint(b, r.Term)
	return append(b, boolByte(r.Granted))
}

func decodePreVoteResp(d *decoder, r *raft.RequestPreVoteResponse) error {
	r.RPCHeader = d.header()
	r.Term = d.uvarint()
	r.Granted = d.byte() != 0
	return d.end()
}

func appendTimeoutNowReq(b []byte, r *raft.TimeoutNowRequest) []byte {
	return appendHeader(b, r.RPCHeader)
}

func decodeTimeoutNowReq(d *decoder) (*raft.TimeoutNowRequest, error) {
	r := &raft.TimeoutNowRequest{RPCHeader: d.header()}
	return r, d.end()
}

func appendTimeoutNowResp(b []byte, r *raft.TimeoutNowResponse) []byte {
	return appendHeader(b, r.RPCHeader)
}

func decodeTimeoutNowResp(d *decoder, r *raft.TimeoutNowResponse) error {
	r.RPCHeader = d.header()
	return d.end()
}

func appendSnapshotReq(b []byte, r *raft.InstallSnapshotRequest) []byte {
	b = appendHeader(b, r.RPCHeader)
	b = binary.AppendVarint(b, int64(r.SnapshotVersion))
	b = binary.AppendUvarint(b, r.Term)
	b = appendBytes(b, r.Leader)
	b = binary.AppendUvarint(b, r.LastLogIndex)
	b = binary.AppendUvarint(b, r.LastLogTerm)
	b = appendBytes(b, r.Peers)
	b = appendBytes(b, r.Configuration)
	b = binary.AppendUvarint(b, r.ConfigurationIndex)
	return binary.AppendVarint(b, r.Size)
}

func decodeSnapshotReq(d *decoder) (*raft.InstallSnapshotRequest, error) {
	r := &raft.InstallSnapshotRequest{RPCHeader: d.header()}
	r.SnapshotVersion = raft.SnapshotVersion(d.varint())
	r.Term = d.uvarint()
	r.Leader = d.bytes()
	r.LastLogIndex = d.uvarint()
	r.LastLogTerm = d.uvarint()
	r.Peers = d.bytes()
	r.Configuration = d.bytes()
	r.ConfigurationIndex = d.uvarint()
	r.Size = d.varint()
	if d.err == nil && r.Size < 0 {
		d.err = fmt.Errorf("cluster: malformed frame: snapshot size %d", r.Size)
	}
	return r, d.end()
}

func appendSnapshotResp(b []byte, r *raft.InstallSnapshotResponse) []byte {
	b = appendHeader(b, r.RPCHeader)
	b = binary.AppendUvarint(b, r.Term)
	return append(b, boolByte(r.Success))
}

func decodeSnapshotResp(d *decoder, r *raft.InstallSnapshotResponse) error {
	r.RPCHeader = d.header()
	r.Term = d.uvarint()
	r.Success = d.byte() != 0
	return d.end()
}

// hbEntry is one heartbeat of a batch.
type hbEntry struct {
	id    uint64
	group uint64
	term  uint64
}

// maxBatch bounds the heartbeats of one decoded batch.
const maxBatch = 1 << 20

func appendHeartbeats(b []byte, h raft.RPCHeader, entries []hbEntry) []byte {
	b = append(b, kindHeartbeats)
	b = appendHeader(b, h)
	b = binary.AppendUvarint(b, uint64(len(entries)))
	for _, e := range entries {
		b = binary.AppendUvarint(b, e.id)
		b = binary.AppendUvarint(b, e.group)
		b = binary.AppendUvarint(b, e.term)
	}
	return b
}

// decodeHeartbeats decodes a heartbeat batch after its kind byte.
func decodeHeartbeats(d *decoder) (raft.RPCHeader, []hbEntry, error) {
	h := d.header()
	n := d.uvarint()
	if d.err == nil && (n > maxBatch || n > uint64(len(d.b))) {
		d.err = fmt.Errorf("cluster: malformed frame: %d heartbeats", n)
	}
	if d.err != nil {
		return h, nil, d.err
	}
	out := make([]hbEntry, n)
	for i := range out {
		out[i] = hbEntry{id: d.uvarint(), group: d.uvarint(), term: d.uvarint()}
	}
	return h, out, d.end()
}

// hbAnswer is the answer to one heartbeat of a batch.
type hbAnswer struct {
	id    uint64
	err   string // non-empty: the heartbeat failed (group not running, raft shut down)
	epoch uint64
	resp  raft.AppendEntriesResponse // header not used: the batch carries it once
}

func appendHeartbeatAnswers(b []byte, h raft.RPCHeader, answers []hbAnswer) []byte {
	b = append(b, kindHeartbeats|respFlag)
	b = appendHeader(b, h)
	b = binary.AppendUvarint(b, uint64(len(answers)))
	for i := range answers {
		a := &answers[i]
		b = binary.AppendUvarint(b, a.id)
		if a.err != "" {
			b = append(b, statusErr)
			b = appendBytes(b, []byte(a.err))
			continue
		}
		b = append(b, statusOK)
		b = binary.AppendUvarint(b, a.epoch)
		b = binary.AppendUvarint(b, a.resp.Term)
		b = binary.AppendUvarint(b, a.resp.LastLog)
		var f byte
		if a.resp.Success {
			f |= flagSuccess
		}
		if a.resp.NoRetryBackoff {
			f |= flagNoRetryBackoff
		}
		b = append(b, f)
	}
	return b
}

// decodeHeartbeatAnswers decodes a heartbeat batch's answer after its kind byte; every answer's
// response carries the batch's header.
func decodeHeartbeatAnswers(d *decoder) ([]hbAnswer, error) {
	h := d.header()
	n := d.uvarint()
	if d.err == nil && (n > maxBatch || n > uint64(len(d.b))) {
		d.err = fmt.Errorf("cluster: malformed frame: %d heartbeat answers", n)
	}
	if d.err != nil {
		return nil, d.err
	}
	out := make([]hbAnswer, n)
	for i := range out {
		a := &out[i]
		a.id = d.uvarint()
		switch d.byte() {
		case statusOK:
			a.epoch = d.uvarint()
			a.resp.RPCHeader = h
			a.resp.Term = d.uvarint()
			a.resp.LastLog = d.uvarint()
			f := d.byte()
			a.resp.Success, a.resp.NoRetryBackoff = f&flagSuccess != 0, f&flagNoRetryBackoff != 0
		case statusErr:
			a.err = string(d.bytes())
			if a.err == "" {
				a.err = "heartbeat failed"
			}
		default:
			if d.err == nil {
				d.err = fmt.Errorf("cluster: malformed frame: heartbeat answer status")
			}
		}
		if d.err != nil {
			return nil, d.err
		}
	}
	return out, d.end()
}

// requestFrame builds a request frame: kind, id, group, body (encoded by body).
func requestFrame(kind byte, id, group uint64, size int, body func([]byte) []byte) []byte {
	b := make([]byte, 0, 1+2*binary.MaxVarintLen64+size)
	b = append(b, kind)
	b = binary.AppendUvarint(b, id)
	b = binary.AppendUvarint(b, group)
	return body(b)
}

// responseFrame builds an ok response frame.
func responseFrame(kind byte, id, epoch uint64, size int, body func([]byte) []byte) []byte {
	b := make([]byte, 0, 1+3*binary.MaxVarintLen64+size)
	b = append(b, kind|respFlag)
	b = binary.AppendUvarint(b, id)
	b = append(b, statusOK)
	b = binary.AppendUvarint(b, epoch)
	return body(b)
}

// errorFrame builds an error response frame.
func errorFrame(kind byte, id uint64, msg string) []byte {
	b := make([]byte, 0, 2+binary.MaxVarintLen64+len(msg)+binary.MaxVarintLen64)
	b = append(b, kind|respFlag)
	b = binary.AppendUvarint(b, id)
	b = append(b, statusErr)
	return appendBytes(b, []byte(msg))
}
