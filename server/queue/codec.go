package queue

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
)

// Command encoding (version 2), as replicated by a quorum queue's Raft log:
//
//	version byte (commandVersion), type byte (CommandType), ±now (the proposer's clock, Unix ms),
//	then by type:
//	  Enqueue        producer u64, seq, message
//	  Settle/Return/Discard   list of tags (id, count)
//	  Consume        consumer u64, prefetch, ±priority, bits (noAck, exclusive, credited), credit
//	  Cancel         consumer u64, giveBack byte
//	  Credit         consumer u64, total
//	  Get            noAck byte, owner u32, producer u64, seq
//	  Take           noAck byte, owner u32, producer u64, seq, id
//	  Purge          producer u64, seq
//	  Tick           -
//	  NodeReset      node u16, except byte, list of epochs (u16)
//	  DeadLettered   list of seqs
//
// Integers are uvarints unless marked (± = zig-zag varint, u16/u32/u64 = big-endian). A message
// is: priority byte, ±ExpiresAt, Dedupe (source u64, seq), list of BCC strings, then the stored
// record (record.go) to the end. Bytes after the fields of a known type are ignored, so a later
// version may append fields. Version 1 (the previous release's quorum queues) is decoded too, so
// logs written before an upgrade replay; its settlements name messages without delivery counts.
const commandVersion byte = 2

// Errors of DecodeCommand; the quorum queue logs them and skips the command.
var (
	errCommandVersion = errors.New("queue: unknown command version")
	errCommandType    = errors.New("queue: unknown command type")
	errCommand        = errors.New("queue: malformed command")
)

// AppendCommand appends the encoding of cmd, applied at now, to dst. Checkout and Recover are
// local commands and encode to nothing.
func AppendCommand(dst []byte, cmd *Command, now int64) []byte {
	if cmd.Type == CmdCheckout || cmd.Type == CmdRecover || cmd.Type == 0 || cmd.Type >= cmdTypes {
		return dst
	}
	dst = append(dst, commandVersion, byte(cmd.Type))
	dst = binary.AppendVarint(dst, now)
	switch cmd.Type {
	case CmdEnqueue:
		dst = binary.BigEndian.AppendUint64(dst, cmd.Producer)
		dst = binary.AppendUvarint(dst, cmd.Seq)
		dst = appendCommandMsg(dst, cmd.Msg)
	case CmdSettle, CmdReturn, CmdDiscard:
		dst = binary.AppendUvarint(dst, uint64(len(cmd.Tags)))
		for _, t := range cmd.Tags {
			dst = binary.AppendUvarint(dst, t.ID)
			dst = binary.AppendUvarint(dst, uint64(t.Count))
		}
	case CmdConsume:
		dst = binary.BigEndian.AppendUint64(dst, uint64(cmd.Consumer))
		dst = binary.AppendUvarint(dst, uint64(cmd.Prefetch))
		dst = binary.AppendVarint(dst, int64(cmd.Priority))
		var bits byte
		if cmd.NoAck {
			bits |= 1
		}
		if cmd.Exclusive {
			bits |= 2
		}
		if cmd.Credited {
			bits |= 4
		}
		dst = append(dst, bits)
		dst = binary.AppendUvarint(dst, cmd.Credit)
	case CmdCancel:
		dst = binary.BigEndian.AppendUint64(dst, uint64(cmd.Consumer))
		dst = append(dst, snapBool(cmd.GiveBack))
	case CmdCredit:
		dst = binary.BigEndian.AppendUint64(dst, uint64(cmd.Consumer))
		dst = binary.AppendUvarint(dst, cmd.Credit)
	case CmdGet, CmdTake:
		dst = append(dst, snapBool(cmd.NoAck))
		dst = binary.BigEndian.AppendUint32(dst, cmd.Owner)
		dst = binary.BigEndian.AppendUint64(dst, cmd.Producer)
		dst = binary.AppendUvarint(dst, cmd.Seq)
		if cmd.Type == CmdTake {
			dst = binary.AppendUvarint(dst, cmd.ID)
		}
	case CmdPurge:
		dst = binary.BigEndian.AppendUint64(dst, cmd.Producer)
		dst = binary.AppendUvarint(dst, cmd.Seq)
	case CmdNodeReset:
		dst = binary.BigEndian.AppendUint16(dst, cmd.Node)
		dst = append(dst, snapBool(cmd.Except))
		dst = binary.AppendUvarint(dst, uint64(len(cmd.Epochs)))
		for _, e := range cmd.Epochs {
			dst = binary.BigEndian.AppendUint16(dst, e)
		}
	case CmdDeadLettered:
		dst = binary.AppendUvarint(dst, uint64(len(cmd.Seqs)))
		for _, s := range cmd.Seqs {
			dst = binary.AppendUvarint(dst, s)
		}
	case CmdConfigure:
		l := cmd.Limits
		dst = binary.AppendVarint(dst, l.MessageTTL)
		dst = binary.AppendVarint(dst, l.MaxLength)
		dst = binary.AppendVarint(dst, l.MaxLengthBytes)
		dst = append(dst, byte(l.Overflow))
		dst = binary.AppendVarint(dst, l.DeliveryLimit)
	}
	return dst
}

// appendCommandMsg writes a message for a command: the fields the stored record lacks, then the
// record.
func appendCommandMsg(dst []byte, m *Message) []byte {
	dst = append(dst, m.Priority)
	dst = binary.AppendVarint(dst, m.ExpiresAt)
	dst = binary.BigEndian.AppendUint64(dst, m.Dedupe.Source)
	dst = binary.AppendUvarint(dst, m.Dedupe.Seq)
	dst = binary.AppendUvarint(dst, uint64(len(m.BCC)))
	for _, k := range m.BCC {
		dst = appendSnapString(dst, k)
	}
	return encodeRecord(dst, m, 0)
}

// DecodeCommand decodes a command encoded by AppendCommand (or by the previous release) into
// cmd, reusing its slices, and returns the time it carries. Malformed input, an unknown version or
// an unknown type returns an error, never a panic. The decoded message aliases b.
func DecodeCommand(b []byte, cmd *Command) (now int64, err error) {
	*cmd = Command{Tags: cmd.Tags[:0], Epochs: cmd.Epochs[:0], Seqs: cmd.Seqs[:0]}
	if len(b) < 2 {
		return 0, errCommand
	}
	switch b[0] {
	case commandVersion:
	case 1:
		return decodeCommandV1(b, cmd)
	default:
		return 0, fmt.Errorf("%w %d", errCommandVersion, b[0])
	}
	t := CommandType(b[1])
	r := &snapReader{b: b[2:]}
	now = r.varint("now")
	cmd.Type = t
	switch t {
	case CmdEnqueue:
		cmd.Producer = r.u64("producer")
		cmd.Seq = r.uvarint("seq")
		cmd.Msg = r.commandMsg()
	case CmdSettle, CmdReturn, CmdDiscard:
		n := r.count("tags", 2)
		for range n {
			id := r.uvarint("tag id")
			cmd.Tags = append(cmd.Tags, Tag{ID: id, Count: r.u32("tag count")})
		}
	case CmdConsume:
		cmd.Consumer = ConsumerID(r.u64("consumer"))
		cmd.Prefetch = r.u32("prefetch")
		prio := r.varint("priority")
		if prio < math.MinInt32 || prio > math.MaxInt32 {
			r.fail("priority %d", prio)
		}
		cmd.Priority = int32(prio)
		bits := r.u8("consume bits")
		cmd.NoAck, cmd.Exclusive, cmd.Credited = bits&1 != 0, bits&2 != 0, bits&4 != 0
		cmd.Credit = r.uvarint("credit")
	case CmdCancel:
		cmd.Consumer = ConsumerID(r.u64("consumer"))
		cmd.GiveBack = r.u8("give back") == 1
	case CmdCredit:
		cmd.Consumer = ConsumerID(r.u64("consumer"))
		cmd.Credit = r.uvarint("credit")
	case CmdGet, CmdTake:
		cmd.NoAck = r.u8("no ack") == 1
		cmd.Owner = r.u32be("owner")
		cmd.Producer = r.u64("producer")
		cmd.Seq = r.uvarint("seq")
		if cmd.Type == CmdTake {
			cmd.ID = r.uvarint("id")
		}
	case CmdPurge:
		cmd.Producer = r.u64("producer")
		cmd.Seq = r.uvarint("seq")
	case CmdTick, CmdTouch:
	case CmdNodeReset:
		cmd.Node = r.u16("node")
		cmd.Except = r.u8("except") == 1
		n := r.count("epochs", 2)
		for range n {
			cmd.Epochs = append(cmd.Epochs, r.u16("epoch"))
		}
	case CmdDeadLettered:
		n := r.count("seqs", 1)
		for range n {
			cmd.Seqs = append(cmd.Seqs, r.uvarint("seq"))
		}
	case CmdConfigure:
		l := &cmd.Limits
		l.MessageTTL = r.varint("message ttl")
		l.MaxLength = r.varint("max length")
		l.MaxLengthBytes = r.varint("max length bytes")
		if o := Overflow(r.u8("overflow")); o <= RejectPublishDLX {
			l.Overflow = o
		} else {
			r.fail("overflow %d", o)
		}
		l.DeliveryLimit = r.varint("delivery limit")
	default:
		cmd.Type = 0
		return 0, fmt.Errorf("%w %d", errCommandType, b[1])
	}
	if r.err != nil {
		cmd.Type = 0
		return 0, fmt.Errorf("%w: %v", errCommand, r.err)
	}
	return now, nil
}

// Version 1 command types (the previous release's numbering).
const (
	v1Enqueue byte = iota + 2
	v1Settle
	v1Return
	v1Discard
	v1AddConsumer
	v1RemoveConsumer
	v1NodeReset
	v1Tick
	v1Get
	v1Purge
)

// decodeCommandV1 decodes the previous release's commands.
func decodeCommandV1(b []byte, cmd *Command) (now int64, err error) {
	r := &snapReader{b: b[2:]}
	switch b[1] {
	case v1Enqueue:
		cmd.Type = CmdEnqueue
		cmd.Producer, cmd.Seq = r.u64("producer"), r.u64("seq")
		now = r.varint("now")
		prio := r.u8("priority")
		exp := r.varint("expires at")
		var bcc []string
		n := r.count("bcc", 1)
		for range n {
			bcc = append(bcc, string(r.raw("bcc key")))
		}
		if r.err == nil {
			m, _, derr := decodeRecord(r.b)
			if derr != nil {
				r.fail("record: %v", derr)
			} else {
				m.Priority, m.ExpiresAt, m.BCC = prio, exp, bcc
				cmd.Msg = m
			}
		}
	case v1Settle, v1Return, v1Discard:
		cmd.Type = CmdSettle + CommandType(b[1]-v1Settle) // settle, return, discard: same order
		now = r.varint("now")
		n := r.count("ids", 1)
		for range n {
			cmd.Tags = append(cmd.Tags, Tag{ID: r.uvarint("id"), Count: anyCount})
		}
	case v1AddConsumer:
		cmd.Type = CmdConsume
		cmd.Consumer = ConsumerID(r.u64("consumer"))
		cmd.Prefetch = r.u32("prefetch")
		prio := r.varint("priority")
		if prio < math.MinInt32 || prio > math.MaxInt32 {
			r.fail("priority %d", prio)
		}
		cmd.Priority = int32(prio)
		cmd.NoAck = r.u8("no ack") == 1
		cmd.Exclusive = r.u8("exclusive") == 1
		now = r.varint("now")
	case v1RemoveConsumer:
		cmd.Type = CmdCancel
		cmd.Consumer = ConsumerID(r.u64("consumer"))
		cmd.GiveBack = r.u8("give back") == 1
		now = r.varint("now")
	case v1NodeReset:
		cmd.Type = CmdNodeReset
		cmd.Node = r.u16("node")
		keep := r.u16("keep epoch")
		all := r.u8("all") == 1
		now = r.varint("now")
		cmd.Except = true // every epoch but keep, or with all every epoch
		if !all {
			cmd.Epochs = append(cmd.Epochs, keep)
		}
	case v1Tick:
		cmd.Type = CmdTick
		now = r.varint("now")
	case v1Get:
		cmd.Type = CmdGet
		cmd.NoAck = r.u8("no ack") == 1
		cmd.Owner = uint32(r.u16("node")) << 16
		now = r.varint("now")
	case v1Purge:
		cmd.Type = CmdPurge
		now = r.varint("now")
	default:
		return 0, fmt.Errorf("%w %d (version 1)", errCommandType, b[1])
	}
	if r.err != nil {
		cmd.Type = 0
		return 0, fmt.Errorf("%w (version 1): %v", errCommand, r.err)
	}
	return now, nil
}

func (r *snapReader) u64(what string) uint64 {
	if len(r.b) < 8 {
		r.fail("%s: truncated", what)
		return 0
	}
	v := binary.BigEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

func (r *snapReader) u32be(what string) uint32 {
	if len(r.b) < 4 {
		r.fail("%s: truncated", what)
		return 0
	}
	v := binary.BigEndian.Uint32(r.b)
	r.b = r.b[4:]
	return v
}

func (r *snapReader) u16(what string) uint16 {
	if len(r.b) < 2 {
		r.fail("%s: truncated", what)
		return 0
	}
	v := binary.BigEndian.Uint16(r.b)
	r.b = r.b[2:]
	return v
}

// commandMsg reads a command's message (to the end of the input).
func (r *snapReader) commandMsg() *Message {
	prio := r.u8("priority")
	exp := r.varint("expires at")
	key := DedupeKey{Source: r.u64("dedupe source"), Seq: r.uvarint("dedupe seq")}
	n := r.count("bcc", 1)
	var bcc []string
	for range n {
		bcc = append(bcc, string(r.raw("bcc key")))
	}
	if r.err != nil {
		return nil
	}
	m, _, err := decodeRecord(r.b)
	if err != nil {
		r.fail("record: %v", err)
		return nil
	}
	r.b = nil
	m.Priority, m.ExpiresAt, m.Dedupe, m.BCC = prio, exp, key, bcc
	return m
}

// Reply encoding, the answer a quorum queue's proposer receives (and the form of the reply cache
// in snapshots): bits (OK, Duplicate, Stale, Refused, has delivery), status byte, ID, Remaining,
// Count, then if it has a delivery: consumer, id, count, bits (redelivered, settled, has message),
// flags byte, message (snapshot form).
const (
	replyOK = 1 << iota
	replyDuplicate
	replyStale
	replyRefused
	replyDelivery
	replyBits
)

func appendReply(dst []byte, r *Reply) []byte {
	var bits byte
	if r.OK {
		bits |= replyOK
	}
	if r.Duplicate {
		bits |= replyDuplicate
	}
	if r.Stale {
		bits |= replyStale
	}
	if r.Refused {
		bits |= replyRefused
	}
	d := &r.Delivery
	if r.OK {
		bits |= replyDelivery
	}
	dst = append(dst, bits, byte(r.Status))
	dst = binary.AppendUvarint(dst, r.ID)
	dst = binary.AppendUvarint(dst, uint64(r.Remaining))
	dst = binary.AppendUvarint(dst, uint64(r.Count))
	if bits&replyDelivery != 0 {
		dst = binary.AppendUvarint(dst, uint64(d.Consumer))
		dst = binary.AppendUvarint(dst, d.ID)
		dst = binary.AppendUvarint(dst, uint64(d.DeliveryCount))
		var db byte
		if d.Redelivered {
			db |= 1
		}
		if d.Settled {
			db |= 2
		}
		if d.Msg != nil {
			db |= 4
		}
		dst = append(dst, db, d.flags)
		if d.Msg != nil {
			dst = appendMessage(dst, d.Msg)
		}
	}
	return dst
}

func (r *snapReader) reply() Reply {
	var out Reply
	bits := r.u8("reply bits")
	if bits >= replyBits {
		r.fail("reply bits %#x", bits)
		return out
	}
	out.OK, out.Duplicate, out.Stale, out.Refused = bits&replyOK != 0, bits&replyDuplicate != 0, bits&replyStale != 0, bits&replyRefused != 0
	status := r.u8("reply status")
	if status > byte(Gone) {
		r.fail("reply status %d", status)
	}
	out.Status = PublishStatus(status)
	out.ID = r.uvarint("reply id")
	out.Remaining = int(min(r.uvarint("reply remaining"), math.MaxInt32))
	out.Count = int(min(r.uvarint("reply count"), math.MaxInt32))
	if bits&replyDelivery != 0 {
		d := &out.Delivery
		d.Consumer = ConsumerID(r.uvarint("delivery consumer"))
		d.ID = r.uvarint("delivery id")
		d.DeliveryCount = r.u32("delivery count")
		db := r.u8("delivery bits")
		if db >= 8 {
			r.fail("delivery bits %#x", db)
		}
		d.Redelivered, d.Settled = db&1 != 0, db&2 != 0
		d.flags = r.u8("delivery flags")
		if db&4 != 0 {
			d.Msg = r.message()
		}
	}
	return out
}

// decodeReply decodes a quorum queue's answer.
func decodeReply(b []byte) (Reply, error) {
	r := &snapReader{b: b}
	out := r.reply()
	if r.err != nil {
		return Reply{}, fmt.Errorf("queue: decode reply: %w", r.err)
	}
	return out, nil
}

// stateSnapshotVersion is written first in every State snapshot.
const stateSnapshotVersion byte = 2

// State snapshot layout (version 2):
//
//	version byte, replicated byte, source, ±now, ops, exclusive, dlxSeq
//	producers   list by id: id u64, window, list of cached replies (seq, reply)
//	sources     list by id: id u64, window
//	get owners  list by message id: id, owner u32
//	dead        list of the recorded dead letters in sequence order: seq, dead letter
//	machine     the machine snapshot (snapshot.go)
//
// A window is: max, last, an allocated byte, then the runs of recorded sequence numbers counted
// down from max (a list of gap since the previous run, run length).
// A dead letter is: id, reason byte, delivery count, flags byte, size, has-message byte, message.

// AppendSnapshot appends an exact encoding of s to dst: equal states give equal bytes, and
// DecodeState gives back a state whose every later result is the same. Like Apply it must be
// serialised with the commands (for a Raft FSM: in FSM.Snapshot).
func (s *State) AppendSnapshot(dst []byte) []byte {
	dst = append(dst, stateSnapshotVersion, snapBool(s.replicated))
	dst = binary.AppendUvarint(dst, s.source)
	dst = binary.AppendVarint(dst, s.now)
	dst = binary.AppendUvarint(dst, s.ops)
	dst = binary.AppendUvarint(dst, uint64(s.exclusive))
	dst = binary.AppendUvarint(dst, s.dlxSeq)
	ids := sortedKeys(s.producers)
	dst = binary.AppendUvarint(dst, uint64(len(ids)))
	for _, id := range ids {
		p := s.producers[id]
		dst = binary.BigEndian.AppendUint64(dst, id)
		dst = appendWindow(dst, &p.w)
		dst = binary.AppendUvarint(dst, uint64(len(p.replies)))
		for i := range p.replies {
			dst = binary.AppendUvarint(dst, p.replies[i].seq)
			dst = appendReply(dst, &p.replies[i].reply)
		}
	}
	ids = sortedKeys(s.sources)
	dst = binary.AppendUvarint(dst, uint64(len(ids)))
	for _, id := range ids {
		dst = binary.BigEndian.AppendUint64(dst, id)
		dst = appendWindow(dst, s.sources[id])
	}
	ids = sortedKeys(s.getOwner)
	dst = binary.AppendUvarint(dst, uint64(len(ids)))
	for _, id := range ids {
		dst = binary.AppendUvarint(dst, id)
		dst = binary.BigEndian.AppendUint32(dst, s.getOwner[id])
	}
	dst = binary.AppendUvarint(dst, uint64(s.dlxLive))
	for i := range s.dlx.Len() {
		if r := s.dlx.At(i); !r.gone {
			dst = binary.AppendUvarint(dst, r.seq)
			dst = appendDead(dst, &r.dead)
		}
	}
	return s.m.appendSnapshot(dst)
}

func sortedKeys[V any](m map[uint64]V) []uint64 {
	ids := make([]uint64, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// appendWindow writes a dedupe window as runs of recorded sequence numbers, newest first: a
// producer's window is usually one run, a few bytes instead of a dedupeWindow-bit map.
func appendWindow(dst []byte, w *seqWindow) []byte {
	dst = binary.AppendUvarint(dst, w.max)
	dst = binary.AppendUvarint(dst, w.last)
	var runs [][2]uint64 // (gap since the previous run's end, length), by distance below max
	if w.bits != nil {
		span := min(uint64(dedupeWindow), w.max+1)
		var end uint64
		for k := uint64(0); k < span; {
			if !w.has(w.max - k) {
				k++
				continue
			}
			start := k
			for k < span && w.has(w.max-k) {
				k++
			}
			runs = append(runs, [2]uint64{start - end, k - start})
			end = k
		}
	}
	dst = append(dst, snapBool(w.bits != nil))
	dst = binary.AppendUvarint(dst, uint64(len(runs)))
	for _, r := range runs {
		dst = binary.AppendUvarint(dst, r[0])
		dst = binary.AppendUvarint(dst, r[1])
	}
	return dst
}

// has reports whether the window holds seq (within the window's range).
func (w *seqWindow) has(seq uint64) bool {
	i := seq % dedupeWindow
	return w.bits[i/64]&(1<<(i%64)) != 0
}

func (r *snapReader) window() *seqWindow {
	w := &seqWindow{max: r.uvarint("window max"), last: r.uvarint("window last")}
	switch r.u8("window allocated") {
	case 0:
	case 1:
		w.bits = make([]uint64, dedupeWindow/64)
	default:
		r.fail("window allocated")
	}
	n := r.count("window runs", 2)
	span := min(uint64(dedupeWindow), w.max+1)
	var end uint64
	for i := 0; i < n && r.err == nil; i++ {
		gap, length := r.uvarint("window gap"), r.uvarint("window run")
		if w.bits == nil || length == 0 || (i > 0 && gap == 0) || gap > span || length > span || end+gap+length > span {
			r.fail("window run %d+%d at %d of %d", gap, length, end, span)
			break
		}
		for k := end + gap; k < end+gap+length; k++ {
			i := (w.max - k) % dedupeWindow
			w.bits[i/64] |= 1 << (i % 64)
		}
		end += gap + length
	}
	return w
}

// Dead-letter reasons in snapshots.
var reasonCodes = []Reason{ReasonRejected, ReasonExpired, ReasonMaxLen, ReasonDeliveryLimit}

func appendDead(dst []byte, d *Dead) []byte {
	dst = binary.AppendUvarint(dst, d.ID)
	dst = append(dst, byte(slices.Index(reasonCodes, d.Reason)+1))
	dst = binary.AppendUvarint(dst, uint64(d.DeliveryCount))
	dst = append(dst, d.flags)
	dst = binary.AppendUvarint(dst, uint64(d.size))
	dst = append(dst, snapBool(d.Msg != nil))
	if d.Msg != nil {
		dst = appendMessage(dst, d.Msg)
	}
	return dst
}

func (r *snapReader) dead() Dead {
	var d Dead
	d.ID = r.uvarint("dead id")
	code := r.u8("dead reason")
	if code == 0 || int(code) > len(reasonCodes) {
		r.fail("dead reason %d", code)
		return d
	}
	d.Reason = reasonCodes[code-1]
	d.DeliveryCount = r.u32("dead delivery count")
	d.flags = r.u8("dead flags")
	d.size = r.u32("dead size")
	switch r.u8("dead has message") {
	case 0:
	case 1:
		d.Msg = r.message()
	default:
		r.fail("dead has message")
	}
	return d
}

// DecodeState rebuilds a State from AppendSnapshot's output. Corrupt input returns an error, never
// a panic; the state does not alias b.
func DecodeState(b []byte) (*State, error) {
	s, err := decodeState(b)
	if err != nil {
		return nil, fmt.Errorf("queue: decode state snapshot: %w", err)
	}
	return s, nil
}

func decodeState(b []byte) (*State, error) {
	r := &snapReader{b: b}
	if v := r.u8("version"); r.err == nil && v != stateSnapshotVersion {
		return nil, fmt.Errorf("version %d, want %d: %w", v, stateSnapshotVersion, errSnapshot)
	}
	s := &State{}
	switch r.u8("replicated") {
	case 0:
	case 1:
		s.replicated = true
	default:
		r.fail("replicated")
	}
	s.source = r.uvarint("source")
	s.now = r.varint("now")
	s.ops = r.uvarint("ops")
	s.exclusive = ConsumerID(r.uvarint("exclusive"))
	s.dlxSeq = r.uvarint("dead-letter seq")
	n := r.count("producers", 11)
	for i := 0; i < n && r.err == nil; i++ {
		id := r.u64("producer")
		p := &producer{w: *r.window()}
		k := r.count("replies", 6)
		if k > replyCache {
			r.fail("%d cached replies", k)
		}
		for j := 0; j < k && r.err == nil; j++ {
			seq := r.uvarint("reply seq")
			p.replies = append(p.replies, cachedReply{seq: seq, reply: r.reply()})
		}
		if s.producers == nil {
			s.producers = make(map[uint64]*producer)
		}
		if _, dup := s.producers[id]; dup {
			r.fail("producer %d twice", id)
		}
		s.producers[id] = p
	}
	n = r.count("sources", 11)
	for i := 0; i < n && r.err == nil; i++ {
		id := r.u64("source")
		w := r.window()
		if s.sources == nil {
			s.sources = make(map[uint64]*seqWindow)
		}
		if _, dup := s.sources[id]; dup {
			r.fail("source %d twice", id)
		}
		s.sources[id] = w
	}
	n = r.count("get owners", 5)
	for i := 0; i < n && r.err == nil; i++ {
		id := r.uvarint("get id")
		o := r.u32be("get owner")
		if s.getOwner == nil {
			s.getOwner = make(map[uint64]uint32)
		}
		s.getOwner[id] = o
	}
	n = r.count("dead letters", 7)
	var last uint64
	for i := 0; i < n && r.err == nil; i++ {
		seq := r.uvarint("dead seq")
		if seq <= last || seq > s.dlxSeq {
			r.fail("dead letter seq %d", seq)
		}
		last = seq
		d := r.dead()
		d.Key = DedupeKey{Source: s.source, Seq: seq}
		s.dlx.PushBack(deadRecord{seq: seq, dead: d})
		s.dlxLive++
	}
	if r.err != nil {
		return nil, r.err
	}
	m, err := decodeMachineRaw(r.b)
	if err != nil {
		return nil, err
	}
	s.m = m
	return s, nil
}

// decodeStateV1 rebuilds a replicated state from the snapshot of the previous release's quorum
// queue (after its version byte and applied index): exclusive consumer, producer windows, basic.get
// owners (node only), then the machine.
func decodeStateV1(b []byte, source uint64) (*State, error) {
	r := &snapReader{b: b}
	s := &State{replicated: true, source: source}
	s.exclusive = ConsumerID(r.u64("exclusive"))
	n := r.count("producers", 10)
	for i := 0; i < n && r.err == nil; i++ {
		id := r.u64("producer")
		p := &producer{}
		p.w.max = r.uvarint("window max")
		k := r.uvarint("window words")
		if k != 0 {
			if k != dedupeWindow/64 || uint64(len(r.b)) < k*8 {
				r.fail("window words %d", k)
				break
			}
			p.w.bits = make([]uint64, k)
			for j := range p.w.bits {
				p.w.bits[j] = binary.LittleEndian.Uint64(r.b[j*8:])
			}
			r.b = r.b[k*8:]
		}
		if s.producers == nil {
			s.producers = make(map[uint64]*producer)
		}
		s.producers[id] = p
	}
	n = r.count("get owners", 3)
	for i := 0; i < n && r.err == nil; i++ {
		id := r.uvarint("get id")
		node := r.u16("get node")
		if s.getOwner == nil {
			s.getOwner = make(map[uint64]uint32)
		}
		s.getOwner[id] = uint32(node) << 16
	}
	if r.err != nil {
		return nil, fmt.Errorf("queue: decode version 1 snapshot: %w", r.err)
	}
	m, err := decodeMachine(r.b)
	if err != nil {
		return nil, err
	}
	s.m = m
	return s, nil
}
