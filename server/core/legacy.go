package core

import (
	"errors"
	"sync"

	"warren/server/queue"
	"warren/storage"
)

// This file adapts the earlier queue implementation (queue.Classic with its ConsumerV1/HooksV1
// callbacks) to the queue-type interface, until the classic and quorum types implement it
// themselves. It will be deleted then.

// LegacyTypes returns the classic and quorum queue types built on queue.Classic.
func LegacyTypes() []queue.Type { return []queue.Type{legacyType{"classic"}, legacyType{"quorum"}} }

type legacyType struct{ kind string }

func (t legacyType) Kind() string { return t.kind }

func legacyOptions(cfg queue.OpenConfig, a *legacyQueue) queue.Options {
	lc := cfg.Lifecycle
	return queue.Options{Name: cfg.Name, Durable: cfg.Durable, Exclusive: cfg.Exclusive, AutoDelete: cfg.AutoDelete,
		ID: cfg.ID, DB: cfg.DB, Logger: cfg.Logger, Config: &lc, Expires: cfg.Expires, ConsumerTimeout: cfg.ConsumerTimeout,
		Hooks: legacyHooks{a: a, h: cfg.Hooks}}
}

func (t legacyType) Open(cfg queue.OpenConfig) (queue.Queue, error) {
	a := &legacyQueue{kind: t.kind}
	a.c = queue.New(legacyOptions(cfg, a))
	if cfg.Recovered && cfg.DB != nil {
		if err := a.restore(cfg.DB, cfg.ID); err != nil {
			a.c.Close()
			return nil, err
		}
	}
	return a, nil
}

func (t legacyType) OpenReplica(cfg queue.OpenConfig, rep queue.Replicator, tag, epoch uint16, classic bool) (Replica, error) {
	a := &legacyQueue{kind: t.kind, replicated: true}
	if classic {
		a.kind = "classic"
	}
	a.c = queue.NewReplicated(legacyOptions(cfg, a), rep, tag, epoch)
	a.tag = tag
	return a, nil
}

// restore adds the stored messages of a recovered queue (keys only: bodies stay on disk).
func (a *legacyQueue) restore(db *storage.DB, id uint64) error {
	metas := make(map[uint64]queue.RestoredMeta)
	if err := db.Scan(queue.MetaPrefix(id), false, func(key, val []byte) error {
		if mid, m, ok := queue.ParseMeta(key, val); ok {
			metas[mid] = m
		}
		return nil
	}); err != nil {
		return err
	}
	return db.Scan(storage.MessagePrefix(id), true, func(key, _ []byte) error {
		if _, mid, ok := storage.ParseMessageKey(key); ok {
			m, has := metas[mid]
			a.c.Restore(mid, m, has)
		}
		return nil
	})
}

type legacyQueue struct {
	c          *queue.Classic
	kind       string
	replicated bool
	tag        uint16
	mu         sync.Mutex
	cons       map[queue.ConsumerID]queue.Consumer
}

func (a *legacyQueue) Name() string { return a.c.Name }
func (a *legacyQueue) Kind() string { return a.kind }

func (a *legacyQueue) Publish(msg *queue.Message, done queue.Done) queue.PublishStatus {
	var cb func(error)
	if done != nil {
		cb = done.Done
	}
	st, async := a.c.Publish(msg, cb)
	if !async && done != nil {
		switch st {
		case queue.Rejected:
			done.Done(queue.ErrRejected)
		case queue.Gone:
			done.Done(queue.ErrGone)
		default:
			done.Done(nil)
		}
	}
	return st
}

type legacyConsumer struct {
	a *legacyQueue
	c queue.Consumer
}

func (lc legacyConsumer) Reserve(q *queue.Classic) bool { return lc.c.Reserve(q) }

func (lc legacyConsumer) Deliver(q *queue.Classic, d queue.Delivery) {
	if !lc.c.Deliver(lc.a, d) && !d.Settled {
		q.Return([]uint64{d.ID})
	}
}

func (a *legacyQueue) Consume(spec queue.ConsumeSpec, c queue.Consumer) error {
	if a.kind == "quorum" && spec.GlobalPrefetch > 0 {
		return errGlobalQos
	}
	cs := queue.ConsumerSpec{ID: spec.ID, Prefetch: spec.Prefetch, Priority: spec.Priority, NoAck: spec.NoAck}
	if a.replicated && spec.GlobalPrefetch > 0 && (cs.Prefetch == 0 || spec.GlobalPrefetch < cs.Prefetch) {
		cs.Prefetch = spec.GlobalPrefetch // a replicated classic queue applies a global prefetch per consumer
	}
	a.mu.Lock()
	if a.cons == nil {
		a.cons = make(map[queue.ConsumerID]queue.Consumer)
	}
	a.cons[spec.ID] = c
	a.mu.Unlock()
	err := a.c.AddConsumer(cs, spec.Exclusive, legacyConsumer{a, c}, spec.OnAdded)
	if err != nil {
		a.mu.Lock()
		delete(a.cons, spec.ID)
		a.mu.Unlock()
	}
	return err
}

// errGlobalQos is the refusal of basic.qos global on a quorum queue; the session adds the text.
var errGlobalQos = errors.New("global qos not supported")

// ErrGlobalQos reports whether err is a queue type's refusal of a channel-wide prefetch.
func ErrGlobalQos(err error) bool { return errors.Is(err, errGlobalQos) }

func (a *legacyQueue) Cancel(id queue.ConsumerID) bool {
	a.mu.Lock()
	delete(a.cons, id)
	a.mu.Unlock()
	return a.c.RemoveConsumer(id)
}

func (a *legacyQueue) Settle(_ queue.ConsumerID, op queue.SettleOp, tags []queue.Tag) error {
	ids := make([]uint64, len(tags))
	for i, t := range tags {
		ids[i] = t.ID
	}
	switch op {
	case queue.SettleAck:
		a.c.Settle(ids)
	case queue.SettleRequeue:
		a.c.Return(ids)
	default:
		a.c.Discard(ids)
	}
	return nil
}

func (a *legacyQueue) Get(noAck bool) (queue.Delivery, int, bool, error) {
	return a.c.GetFrom(noAck, a.tag)
}

func (a *legacyQueue) Purge() (int, error) { return a.c.PurgeErr() }

func (a *legacyQueue) Delete() int {
	consumers, n := a.c.Close()
	a.c.Drop()
	for _, lc := range consumers {
		if c, ok := lc.(legacyConsumer); ok {
			c.c.Cancelled(a, queue.CancelDeleted)
		}
	}
	return n
}

func (a *legacyQueue) Close() { a.c.Close() }

func (a *legacyQueue) Stats() queue.Stats {
	r, u, c := a.c.Stats()
	return queue.Stats{Ready: r, Unacked: u, Consumers: c}
}

func (a *legacyQueue) Kick()  { a.c.Kick() }
func (a *legacyQueue) Touch() { a.c.Touch() }

func (a *legacyQueue) Apply(index uint64, cmd []byte) []byte { return a.c.Apply(index, cmd) }
func (a *legacyQueue) Snapshot() []byte                      { return a.c.Snapshot() }
func (a *legacyQueue) RestoreSnapshot(b []byte) error        { return a.c.RestoreSnapshot(b) }
func (a *legacyQueue) NodeReset(tag, keep uint16, all bool)  { a.c.NodeReset(tag, keep, all) }
func (a *legacyQueue) ConsumerNodes() []uint16               { return a.c.ConsumerNodes() }
func (a *legacyQueue) LeaderChanged(bool)                    {}
func (a *legacyQueue) CancelLocal(why queue.CancelReason) {
	for id, lc := range a.c.LocalConsumers() {
		if c, ok := lc.(legacyConsumer); ok {
			c.c.Cancelled(a, why)
			a.c.RemoveConsumer(id)
		}
	}
}

type legacyHooks struct {
	a *legacyQueue
	h queue.Hooks
}

func (h legacyHooks) DeadLetter(_ *queue.Classic, dead []queue.Dead) { h.h.DeadLetter(h.a, dead, nil) }
func (h legacyHooks) ConsumerTimedOut(_ *queue.Classic, c queue.ConsumerV1) {
	if lc, ok := c.(legacyConsumer); ok {
		lc.c.Cancelled(h.a, queue.CancelTimeout)
	}
}
func (h legacyHooks) Expired(*queue.Classic) { h.h.Expired(h.a) }
