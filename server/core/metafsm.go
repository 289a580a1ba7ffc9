package core

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/raft"

	"warren/amqp"
	"warren/storage"
)

// The metadata raft group (group 0) replicates the replicated records: each command is one
// record put or delete, and every node applies it to its memory and writes that record, with the
// group's applied index, in one storage batch. The batch is committed without waiting: the raft
// log is already durable, and after a crash the entries above the stored applied index are
// applied again (applying is idempotent). A change therefore costs one raft entry and one small
// write, whatever the number of objects; nothing re-encodes or diffs the whole metadata.

// metaOp is a metadata command.
type metaOp byte

// The metadata commands; each carries one record (for deletes, only its identity).
const (
	opPutExchange metaOp = iota + 1
	opDeleteExchange
	opPutQueue
	opDeleteQueue
	opBind
	opUnbind
	opPutSuperStream    // a super stream: its exchange, partitions and bindings at once
	opDeleteSuperStream // a super stream's exchange and partitions
)

// metaCmdVersion is the first byte of a command. Format-1 commands were AMQP tables, whose first
// byte (the high byte of their length) is 0.
const metaCmdVersion byte = 2

// metaTimeout bounds how long a change waits for the metadata group.
const metaTimeout = 10 * time.Second

// metaGroupID is the raft group of the cluster metadata.
const metaGroupID = 0

func appliedKey() []byte { return []byte{storage.PrefixMeta, kindApplied} }

// startMeta starts the metadata group (bootstrapping it with the initial members on first start).
func (b *Broker) startMeta() error {
	var voters []string
	for _, m := range b.node.Members() {
		voters = append(voters, m.ID)
	}
	if len(voters) == 0 {
		voters = []string{b.node.ID()}
	}
	g, err := b.node.StartGroup(clusterGroupConfig(metaGroupID, "metadata", &metaFSM{b: b}, voters, nil, !b.opts.Join, nil))
	if err != nil {
		return wrap("start metadata group", err)
	}
	b.meta = g
	return nil
}

// propose replicates a metadata change and waits until this node has applied it.
func (b *Broker) propose(ctx context.Context, op metaOp, rec []byte) *amqp.Error {
	if b.meta == nil {
		return amqp.Errorf(amqp.InternalError, "the cluster metadata is not running")
	}
	ctx, cancel := context.WithTimeout(ctx, metaTimeout)
	defer cancel()
	cmd := make([]byte, 0, 2+len(rec))
	cmd = append(append(cmd, metaCmdVersion, byte(op)), rec...)
	res, err := b.meta.Propose(ctx, cmd)
	if err == nil {
		err = b.meta.WaitApplied(ctx, res.Index)
	}
	if err != nil {
		b.log.Warn("metadata change not replicated", "op", op, "err", err)
		return amqp.Errorf(amqp.InternalError, "cannot replicate the change to the cluster metadata (no majority of nodes?): %v", err)
	}
	return nil
}

// metaFSM applies metadata commands on every node.
type metaFSM struct{ b *Broker }

// Apply implements raft.FSM.
func (f *metaFSM) Apply(l *raft.Log) any {
	f.ApplyBatch([]*raft.Log{l})
	return nil
}

// ApplyBatch implements raft.BatchingFSM: a burst of changes (many declarations at once) is
// written as one storage batch with the last applied index, instead of one batch per entry.
func (f *metaFSM) ApplyBatch(logs []*raft.Log) []any {
	b := f.b
	var batch storage.Batch
	var last uint64
	for _, l := range logs {
		if l.Type != raft.LogCommand || l.Index <= b.applied.Load() {
			continue
		}
		b.applyMeta(l.Data, &batch)
		b.applied.Store(l.Index)
		last = l.Index
	}
	if last == 0 {
		return make([]any, len(logs))
	}
	batch.Set(appliedKey(), binary.BigEndian.AppendUint64(nil, last))
	batch.UseReserve() // metadata changes are small and must work while a full disk is drained
	b.db.Commit(&batch, func(err error) {
		if err != nil {
			b.log.Error("cannot store metadata", "index", last, "err", err)
		}
	})
	return make([]any, len(logs))
}

// applyMeta carries out one command on this node, putting the record changes in batch.
func (b *Broker) applyMeta(data []byte, batch *storage.Batch) {
	op, rec, err := decodeMetaCmd(data)
	if err != nil {
		b.log.Error("malformed metadata command; skipped", "err", err)
		return
	}
	b.applyOp(op, rec, batch)
}

func (b *Broker) applyOp(op metaOp, rec []byte, batch *storage.Batch) {
	var vhost string
	var err error
	switch op {
	case opPutExchange, opDeleteExchange:
		var r ExchangeRecord
		if r, err = decodeExchange(rec); err == nil {
			vhost = r.VHost
			if v := b.vhostFor(vhost); v != nil {
				if op == opPutExchange {
					v.applyPutExchange(r, batch)
				} else {
					v.applyDeleteExchange(r, batch)
				}
			}
		}
	case opPutQueue, opDeleteQueue:
		var r QueueRecord
		if r, err = decodeQueue(rec); err == nil {
			vhost = r.VHost
			if v := b.vhostFor(vhost); v != nil {
				if op == opPutQueue {
					v.applyPutQueue(r, batch)
				} else {
					v.applyDeleteQueue(r, batch)
				}
			}
		}
	case opBind, opUnbind:
		var r BindingRecord
		if r, err = decodeBinding(rec); err == nil {
			vhost = r.VHost
			if v := b.vhostFor(vhost); v != nil {
				if aerr := v.applyBinding(r.Binding, op == opBind, batch); aerr != nil {
					b.log.Debug("replicated binding change not applied", "vhost", vhost, "source", r.Source, "destination", r.Dest, "err", aerr.Text)
				}
			}
		}
	case opGroup:
		b.applyGroup(rec, batch)
	case opPutSuperStream, opDeleteSuperStream:
		var t amqp.Table
		if t, err = decodeRecord(rec); err == nil {
			vhost = str(t, "vhost")
			exb, _ := t["exchange"].([]byte)
			var ex ExchangeRecord
			if ex, err = decodeExchange(exb); err == nil {
				if v := b.vhostFor(ex.VHost); v != nil {
					v.applySuperStream(t, op == opPutSuperStream, batch)
				}
			}
		}
	default:
		var known bool
		if known, err = b.applyAccessOp(op, rec, batch); !known {
			err = fmt.Errorf("unknown metadata command %d", op)
		}
	}
	if err != nil {
		b.log.Error("metadata command not applied", "op", op, "err", err)
	}
}

// vhostFor returns the vhost a replicated change is for (nil, logged, if there is none).
func (b *Broker) vhostFor(name string) *VHost {
	if v := b.VHost(name); v != nil {
		return v
	}
	b.log.Warn("metadata change for a vhost this node does not have; skipped", "vhost", name)
	return nil
}

func (v *VHost) applyPutExchange(r ExchangeRecord, batch *storage.Batch) {
	_, created, err := v.ex.Declare(r.Name, r.Type, true, r.AutoDelete, r.Internal, false, r.Args)
	if err != nil {
		// Two nodes declared it differently at once: the first one applied wins.
		v.b.log.Warn("replicated exchange declaration not applied", "vhost", v.name, "exchange", r.Name, "err", err.Text)
		return
	}
	if created {
		v.matchExchange(r.Name)
	}
	batch.Set(r.key(), r.encode())
}

func (v *VHost) applyDeleteExchange(r ExchangeRecord, batch *storage.Batch) {
	rm, err := v.ex.DeleteReport(r.Name, false)
	if err != nil {
		v.b.log.Warn("replicated exchange deletion not applied", "vhost", v.name, "exchange", r.Name, "err", err.Text)
		return
	}
	v.dropRecords(rm, batch)
	batch.Delete(r.key())
}

func (v *VHost) applyPutQueue(r QueueRecord, batch *storage.Batch) {
	if e := v.Queue(r.Name); e != nil {
		if e.id == r.ID {
			return
		}
		if e.store != storeReplicated {
			// A queue local to this node (a stream, an exclusive or transient queue) has the name:
			// it keeps it, and this node does not serve the replicated one.
			v.b.log.Error("a replicated queue has the name of a queue local to this node; this node will not serve it",
				"vhost", v.name, "queue", r.Name)
			return
		}
		v.removeQueue(e, batch)
	}
	q, err := v.openQueue(r, true, nil, storeReplicated, false)
	if err != nil {
		v.b.log.Error("cannot start a replicated queue", "vhost", v.name, "queue", r.Name, "err", err)
		return
	}
	v.mu.Lock()
	if v.queues[r.Name] != nil {
		v.mu.Unlock()
		v.b.log.Error("a replicated queue has the name of a queue local to this node; this node will not serve it",
			"vhost", v.name, "queue", r.Name)
		v.dropReplica(q)
		return
	}
	v.queues[r.Name] = q
	v.mu.Unlock()
	batch.Set(q.recordKey(), r.encode())
	v.b.log.Debug("queue record applied", "vhost", v.name, "queue", r.Name, "type", q.kind, "replicated", true)
}

// dropReplica removes a replica that was opened but is not kept.
func (v *VHost) dropReplica(q *Queue) {
	q.Queue.Delete()
	v.b.forgetStream(q)
	v.b.stats.Release(q.counters)
	if q.group != nil {
		if err := q.group.Remove(); err != nil {
			v.b.log.Warn("cannot remove a replicated queue's group", "vhost", v.name, "queue", q.name, "err", err)
		}
	}
}

func (v *VHost) applyDeleteQueue(r QueueRecord, batch *storage.Batch) {
	if q := v.Queue(r.Name); q != nil && q.id == r.ID && q.store == storeReplicated {
		v.removeQueue(q, batch)
	}
}

// decodeMetaCmd reads a command of either format.
func decodeMetaCmd(data []byte) (metaOp, []byte, error) {
	if len(data) >= 2 && data[0] == metaCmdVersion {
		return metaOp(data[1]), data[2:], nil
	}
	if len(data) > 0 && data[0] == 0 {
		return decodeV1Cmd(data)
	}
	return 0, nil, errors.New("unknown metadata command version")
}

// metaSnapshot is a point-in-time view of the replicated records.
type metaSnapshot struct {
	view    *storage.View
	applied uint64
}

// snapshotMagic starts a format-2 metadata snapshot.
const snapshotMagic = "WMS2"

// Snapshot implements raft.FSM. It waits until the records of everything applied are on disk,
// takes a storage view, and leaves the encoding to Persist, which runs while applies go on.
func (f *metaFSM) Snapshot() (raft.FSMSnapshot, error) {
	if err := f.b.db.CommitSync(&storage.Batch{}); err != nil {
		return nil, wrap("flush metadata records", err)
	}
	view, err := f.b.db.NewView()
	if err != nil {
		return nil, wrap("open metadata view", err)
	}
	return &metaSnapshot{view: view, applied: f.b.applied.Load()}, nil
}

// replicatedKinds are the record kinds the metadata group replicates, in the order a snapshot
// restore puts them (a vhost before what is in it, a user before its permissions; consumer groups,
// last, are restored by restoreGroups).
var replicatedKinds = [...]byte{kindInit, kindVHost, kindUser, kindPermission, kindTopicPerm, kindLimits,
	kindPolicy, kindOperatorPolicy, kindExchange, kindQueue, kindBinding, kindGroup}

// Persist implements raft.FSMSnapshot: magic, applied index, then (key, value) pairs with
// uvarint lengths, ending with an empty key.
func (s *metaSnapshot) Persist(sink raft.SnapshotSink) error {
	w := bufio.NewWriter(sink)
	var hdr []byte
	hdr = append(hdr, snapshotMagic...)
	hdr = binary.BigEndian.AppendUint64(hdr, s.applied)
	w.Write(hdr)
	var lb []byte
	for _, kind := range replicatedKinds {
		err := s.view.Scan([]byte{storage.PrefixMeta, kind}, func(k, v []byte) error {
			lb = binary.AppendUvarint(lb[:0], uint64(len(k)))
			w.Write(lb)
			w.Write(k)
			lb = binary.AppendUvarint(lb[:0], uint64(len(v)))
			w.Write(lb)
			_, err := w.Write(v)
			return err
		})
		if err != nil {
			sink.Cancel()
			return wrap("write metadata snapshot", err)
		}
	}
	w.WriteByte(0)
	if err := w.Flush(); err != nil {
		sink.Cancel()
		return wrap("write metadata snapshot", err)
	}
	return sink.Close()
}

// Release implements raft.FSMSnapshot.
func (s *metaSnapshot) Release() { s.view.Close() }

// Restore implements raft.FSM: it makes the replicated records those of the snapshot, unless the
// records on disk are already newer (a restart restores the last snapshot first).
func (f *metaFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b := f.b
	r := bufio.NewReader(rc)
	applied, want, err := readMetaSnapshot(r)
	if err != nil {
		return wrap("read metadata snapshot", err)
	}
	if applied <= b.applied.Load() {
		return nil
	}
	// Earlier applies queued their records for the group committer; wait until those are written
	// so the scan below sees them (commits complete in submission order), or a record applied just
	// before the snapshot arrived would survive it.
	var flush storage.Batch
	flush.UseReserve()
	flush.Set(appliedKey(), binary.BigEndian.AppendUint64(nil, b.applied.Load()))
	if err := b.db.CommitSync(&flush); err != nil {
		return wrap("write queued metadata before a restore", err)
	}
	have := make(map[string][]byte)
	for _, kind := range replicatedKinds {
		if err := b.db.Scan([]byte{storage.PrefixMeta, kind}, false, func(k, v []byte) error {
			have[string(k)] = append([]byte(nil), v...)
			return nil
		}); err != nil {
			return wrap("read metadata records", err)
		}
	}
	var batch storage.Batch
	// Deletions first, contents before their containers (bindings, queues, exchanges, policies,
	// permissions, users, vhosts), then every record of the snapshot is put in replicatedKinds'
	// order (putting what is already there changes nothing).
	deleteOps := []struct {
		kind byte
		op   metaOp
	}{{kindBinding, opUnbind}, {kindQueue, opDeleteQueue}, {kindExchange, opDeleteExchange},
		{kindPolicy, opDeletePolicy}, {kindOperatorPolicy, opDeletePolicy}, {kindTopicPerm, opDeleteTopicPermission},
		{kindPermission, opDeletePermission}, {kindLimits, opPutLimits}, {kindUser, opDeleteUser}, {kindVHost, opDeleteVHost}}
	for _, d := range deleteOps {
		for k, val := range have {
			if k[1] != d.kind {
				continue
			}
			if nv, ok := want[k]; ok && (string(nv) == string(val) || d.kind == kindBinding) {
				continue
			}
			if _, ok := want[k]; ok && d.kind != kindQueue && d.kind != kindExchange {
				continue // changed, not gone: the put below replaces it
			}
			switch d.kind {
			case kindLimits:
				vhost, _, err := decodeLimits(val)
				if err == nil {
					b.applyPutLimits(vhost, nil, &batch)
				}
			default:
				b.applyOp(d.op, val, &batch)
			}
		}
	}
	putOps := map[byte]metaOp{kindVHost: opPutVHost, kindUser: opPutUser, kindPermission: opPutPermission,
		kindTopicPerm: opPutTopicPermission, kindLimits: opPutLimits, kindPolicy: opPutPolicy, kindOperatorPolicy: opPutPolicy,
		kindExchange: opPutExchange, kindQueue: opPutQueue, kindBinding: opBind}
	for _, kind := range replicatedKinds {
		if kind == kindGroup {
			continue // restoreGroups, below
		}
		for k, val := range want {
			if k[1] != kind {
				continue
			}
			if kind == kindInit {
				b.restoreInit(&batch)
				continue
			}
			if string(have[k]) == string(val) && kind != kindExchange && kind != kindQueue && kind != kindBinding {
				continue
			}
			b.applyOp(putOps[kind], val, &batch)
		}
	}
	b.restoreGroups(have, want, &batch)
	b.applied.Store(applied)
	batch.Set(appliedKey(), binary.BigEndian.AppendUint64(nil, applied))
	if err := b.db.CommitSync(&batch); err != nil {
		return wrap("store restored metadata", err)
	}
	b.log.Info("metadata restored from a snapshot", "applied", applied, "records", len(want))
	return nil
}

// readMetaSnapshot decodes a snapshot of either format into records keyed as on disk.
func readMetaSnapshot(r *bufio.Reader) (uint64, map[string][]byte, error) {
	magic, err := r.Peek(len(snapshotMagic))
	if err != nil {
		return 0, nil, err
	}
	if string(magic) != snapshotMagic {
		all, err := io.ReadAll(r)
		if err != nil {
			return 0, nil, err
		}
		return decodeV1Snapshot(all)
	}
	var hdr [len(snapshotMagic) + 8]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	applied := binary.BigEndian.Uint64(hdr[len(snapshotMagic):])
	want := make(map[string][]byte)
	for {
		kl, err := binary.ReadUvarint(r)
		if err != nil {
			return 0, nil, err
		}
		if kl == 0 {
			return applied, want, nil
		}
		if kl > 1<<20 {
			return 0, nil, errors.New("metadata snapshot key too long")
		}
		k := make([]byte, kl)
		if _, err := io.ReadFull(r, k); err != nil {
			return 0, nil, err
		}
		vl, err := binary.ReadUvarint(r)
		if err != nil {
			return 0, nil, err
		}
		if vl > 64<<20 {
			return 0, nil, errors.New("metadata snapshot value too long")
		}
		v := make([]byte, vl)
		if _, err := io.ReadFull(r, v); err != nil {
			return 0, nil, err
		}
		want[string(k)] = v
	}
}
