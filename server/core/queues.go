package core

import (
	"context"
	"strings"
	"sync/atomic"

	"warren/amqp"
	"warren/exchange"
	"warren/server/cluster"
	"warren/server/policy"
	"warren/server/queue"
	"warren/server/stats"
	"warren/storage"
)

// Queue is a declared queue as the core keeps it: the implementation of its type (embedded: the
// sessions call its queue.Queue methods directly) plus the declaration.
type Queue struct {
	queue.Queue
	vhost      *VHost
	name       string
	id         uint64
	kind       string
	durable    bool
	autoDelete bool
	owner      Owner // the exclusive owner; nil if not exclusive
	args       amqp.Table
	settings   queueSettings
	store      recStore
	voters     []string // initial raft members of a replicated queue
	nonvoters  []string
	group      *cluster.Group // the raft group of a replicated queue
	hooks      *queueHooks
	pol        atomic.Pointer[queuePolicy] // its policies and the settings they give; nil: none

	droppedDeliveryLimit atomic.Uint64 // over the delivery limit, dropped for lack of a DLX

	counters *stats.Object // what happened to the queue (message_stats); released when it is removed
}

// Counters are the queue's traffic counters: sessions count what they route into it, deliver
// from it and settle; the core counts its dead letters.
func (q *Queue) Counters() *stats.Object { return q.counters }

// Name is the queue's name.
func (q *Queue) Name() string { return q.name }

// VHost is the queue's vhost.
func (q *Queue) VHost() *VHost { return q.vhost }

// ID names the queue in storage (and is its raft group id when replicated).
func (q *Queue) ID() uint64 { return q.id }

// Kind is the queue type: classic, quorum or stream.
func (q *Queue) Kind() string { return q.kind }

// Durable reports the queue's durable flag.
func (q *Queue) Durable() bool { return q.durable }

// AutoDelete reports the queue's auto-delete flag.
func (q *Queue) AutoDelete() bool { return q.autoDelete }

// Exclusive reports whether a connection owns the queue.
func (q *Queue) Exclusive() bool { return q.owner != nil }

// Owner is the exclusive owner (nil if none).
func (q *Queue) Owner() Owner { return q.owner }

// Args are the x-arguments the queue was declared with.
func (q *Queue) Args() amqp.Table { return q.args }

// Snapshot has the raft group of a replicated queue take a snapshot now on this node (which
// truncates the log behind it); it does nothing for other queues.
func (q *Queue) Snapshot() error {
	if q.group == nil {
		return nil
	}
	if r, ok := q.Queue.(Replica); ok {
		r.ForceNextSnapshot()
	}
	return q.group.Snapshot()
}

// Replicated reports whether the queue is served by a raft group across the cluster.
func (q *Queue) Replicated() bool { return q.store == storeReplicated }

func (q *Queue) record() QueueRecord {
	return QueueRecord{VHost: q.vhost.name, Name: q.name, ID: q.id, Kind: q.kind, AutoDelete: q.autoDelete,
		Args: q.args, Voters: q.voters, Nonvoters: q.nonvoters}
}

func (q *Queue) recordKey() []byte {
	r := q.record()
	k := r.key()
	if q.store == storeLocal {
		k[1] = kindLocalQueue
	}
	return k
}

// QueueDecl is a queue.declare. The session resolves an empty name first: ServerNamed is set
// when it generated Name.
type QueueDecl struct {
	Name                                    string
	ServerNamed                             bool
	Passive, Durable, Exclusive, AutoDelete bool
	Args                                    amqp.Table
}

// DeclareQueue declares (or checks) a queue, with RabbitMQ's rules and texts. owner is the
// declaring connection; an exclusive queue belongs to it.
func (v *VHost) DeclareQueue(ctx context.Context, d QueueDecl, owner Owner) (*Queue, *amqp.Error) {
	q, err := v.declareQueue(ctx, d, owner)
	if err == nil {
		v.b.stats.Inc(stats.QueuesDeclared)
	}
	return q, err
}

// logDeclared logs a queue or stream this declaration created.
func (v *VHost) logDeclared(ctx context.Context, q *Queue) {
	what := "queue"
	if q.kind == "stream" {
		what = "stream"
	}
	v.logChange(ctx, what+" declared", what, q.name, "type", q.kind, "durable", q.durable)
}

func (v *VHost) declareQueue(ctx context.Context, d QueueDecl, owner Owner) (*Queue, *amqp.Error) {
	name := d.Name
	if !d.Passive && !d.ServerNamed && strings.HasPrefix(name, "amq.") {
		return nil, amqp.Errorf(amqp.AccessRefused, "queue name '%s' contains reserved prefix 'amq.*'", name)
	}
	for {
		if q := v.Queue(name); q != nil {
			return v.redeclare(q, d, owner)
		}
		if d.Passive {
			return nil, v.QueueNotFound(name)
		}
		st, err := parseQueueArgs(name, v.name, d.Args, v.b.hasType)
		if err == nil && st.stream {
			err = checkStreamDeclare(d, name, v.name)
		}
		if err == nil && st.quorum {
			err = checkReplicatedDeclare(d, name, v.name, "rabbit_quorum_queue")
		}
		if err != nil {
			return nil, err
		}
		if err := v.checkQueueLimit(name); err != nil {
			return nil, err
		}
		store := storeNone
		if d.Durable && !d.Exclusive {
			store = storeLocal
			// In a cluster, durable named classic queues are replicated too, with one voter (this
			// node) and a non-voting replica on every other node: every node sees them and serves
			// their clients, and they are unavailable while their home node is down, as in RabbitMQ.
			if st.quorum || st.stream || st.kind() == "classic" && !d.AutoDelete && !d.ServerNamed && v.b.clustered() {
				store = storeReplicated
			}
		}
		if store == storeReplicated {
			return v.declareReplicated(ctx, d, st, owner)
		}
		rec := QueueRecord{VHost: v.name, Name: name, ID: newQueueID(), Kind: st.kind(), AutoDelete: d.AutoDelete, Args: d.Args}
		v.mu.Lock()
		if v.queues[name] != nil {
			v.mu.Unlock()
			continue // declared meanwhile: check against it
		}
		var o Owner
		if d.Exclusive {
			o = owner
		}
		q, oerr := v.openQueue(rec, d.Durable, o, store, false)
		if oerr != nil {
			v.mu.Unlock()
			return nil, amqp.Errorf(amqp.InternalError, "cannot create queue '%s' in vhost '%s': %v", name, v.name, oerr)
		}
		v.queues[name] = q
		v.mu.Unlock()
		if store == storeLocal {
			var b storage.Batch
			b.Set(q.recordKey(), rec.encode())
			if err := v.b.commitLocal(ctx, &b); err != nil {
				v.removeQueue(q, nil)
				return nil, err
			}
		}
		v.logDeclared(ctx, q)
		return q, nil
	}
}

// redeclare answers a declaration of an existing queue.
func (v *VHost) redeclare(q *Queue, d QueueDecl, owner Owner) (*Queue, *amqp.Error) {
	if q.owner != nil && q.owner != owner {
		return nil, v.lockedError(q.name)
	}
	q.Touch()
	if d.Passive {
		return q, nil
	}
	if err := checkQueueEquivalence(q, d, v.name); err != nil {
		if err.Code == amqp.ResourceLocked {
			return nil, v.lockedError(q.name)
		}
		return nil, err
	}
	return q, nil
}

// declareReplicated replicates a new quorum queue's declaration (or a durable classic queue's in
// a cluster, with this node as its only voter) and returns this node's replica.
func (v *VHost) declareReplicated(ctx context.Context, d QueueDecl, st queueSettings, owner Owner) (*Queue, *amqp.Error) {
	size, what := st.groupSize, "quorum queue"
	switch {
	case st.stream:
		what = "stream"
	case !st.quorum:
		size, what = 1, "queue"
	}
	voters, nonvoters, err := v.b.quorumMembers(size)
	if err != nil {
		return nil, amqp.Errorf(amqp.InternalError, "cannot declare %s '%s' in vhost '%s': %v", what, d.Name, v.name, err)
	}
	rec := QueueRecord{VHost: v.name, Name: d.Name, ID: newQueueID(), Kind: st.kind(), Args: d.Args,
		Voters: voters, Nonvoters: nonvoters}
	if aerr := v.b.propose(ctx, opPutQueue, rec.encode()); aerr != nil {
		return nil, aerr
	}
	q := v.Queue(d.Name)
	switch {
	case q == nil:
		return nil, amqp.Errorf(amqp.InternalError, "cannot start %s '%s' in vhost '%s'", what, d.Name, v.name)
	case q.id != rec.ID:
		return v.redeclare(q, d, owner) // someone else's declaration won
	}
	v.logDeclared(ctx, q)
	return q, nil
}

// openQueue creates the in-memory queue for a record (and, for a replicated record, this node's
// replica and its raft group). v.mu may be held.
func (v *VHost) openQueue(rec QueueRecord, durable bool, owner Owner, store recStore, recovered bool) (*Queue, error) {
	b := v.b
	st, aerr := parseQueueArgs(rec.Name, v.name, rec.Args, v.b.hasType)
	if aerr != nil {
		b.log.Warn("stored queue arguments no longer valid; using defaults", "vhost", v.name, "queue", rec.Name, "err", aerr.Text)
		st, _ = parseQueueArgs(rec.Name, v.name, nil, nil)
	}
	q := &Queue{vhost: v, name: rec.Name, id: rec.ID, kind: st.kind(), durable: durable, autoDelete: rec.AutoDelete,
		owner: owner, args: rec.Args, settings: st, store: store, voters: rec.Voters, nonvoters: rec.Nonvoters}
	q.hooks = &queueHooks{q: q}
	// Counting starts before the queue opens: a replica replaying its log may dead-letter at once.
	q.counters = b.stats.NewObject(stats.ScopeQueue, stats.Labels{VHost: v.name, Name: rec.Name, Type: q.kind})
	eff := st
	if m := b.policySet().Match(v.name, rec.Name, policy.QueueType(q.kind)); m != (policy.Match{}) {
		eff = withPolicy(st, q.kind, rec.Args, m)
		q.pol.Store(&queuePolicy{match: m, st: eff})
	}
	cfg := q.openConfig(eff)
	cfg.Recovered = recovered
	if store == storeReplicated {
		open := b.openReplica
		if q.kind == "stream" {
			open = b.openStreamReplica
		}
		if err := open(q, cfg); err != nil {
			b.stats.Release(q.counters)
			return nil, err
		}
		q.created(recovered)
		return q, nil
	}
	t := b.types[q.kind]
	if t == nil {
		b.stats.Release(q.counters)
		return nil, errUnknownType(q.kind)
	}
	impl, err := t.Open(cfg)
	if err != nil {
		b.stats.Release(q.counters)
		return nil, err
	}
	q.Queue = impl
	q.created(recovered)
	return q, nil
}

// created counts a new queue (not one recovered at boot).
func (q *Queue) created(recovered bool) {
	if !recovered {
		q.vhost.b.stats.Inc(stats.QueuesCreated)
	}
}

type errUnknownType string

func (e errUnknownType) Error() string { return "no queue type '" + string(e) + "' is registered" }

// checkQueueLimit is the vhost's max-queues, checked before a new queue is declared, with
// RabbitMQ's 406 (rabbit_amqqueue:check_vhost_queue_limit). The count is this node's view: every
// replicated queue and this node's own.
func (v *VHost) checkQueueLimit(name string) *amqp.Error {
	if v.deleted.Load() {
		return amqp.Errorf(amqp.NotFound, "vhost '%s' is down", v.name)
	}
	limit := v.b.vhostLimit(v.name, LimitMaxQueues)
	if limit < 0 {
		return nil
	}
	v.mu.RLock()
	n := len(v.queues)
	v.mu.RUnlock()
	if int64(n) >= limit {
		return amqp.Errorf(amqp.PreconditionFailed, "cannot declare queue '%s': queue limit in vhost '%s' (%d) is reached", name, v.name, limit)
	}
	return nil
}

// DeleteQueue deletes a queue (queue.delete) and returns how many ready messages went with it.
// owner is the deleting connection (another connection's exclusive queue is 405).
func (v *VHost) DeleteQueue(ctx context.Context, q *Queue, ifUnused, ifEmpty bool, owner Owner) (int, *amqp.Error) {
	n, err := v.deleteQueue(ctx, q, ifUnused, ifEmpty, owner, false)
	if err == nil {
		what := "queue"
		if q.kind == "stream" {
			what = "stream"
		}
		v.logChange(ctx, what+" deleted", what, q.name, "type", q.kind, "messages", n)
	}
	return n, err
}

// AutoDeleteNow deletes an auto-delete queue whose last consumer went away. It must not run on
// one of the queue's own goroutines (use DeleteLater there).
func (q *Queue) AutoDeleteNow() {
	if _, err := q.vhost.deleteQueue(context.Background(), q, false, false, nil, true); err != nil {
		q.vhost.b.log.Warn("cannot auto-delete a queue", "vhost", q.vhost.name, "queue", q.name, "err", err.Text)
	}
}

// DeleteLater deletes the queue from the core's janitor goroutine (callbacks that run on the
// queue's own goroutines cannot wait for it to stop).
func (q *Queue) DeleteLater() { q.vhost.b.deleteLater(q) }

func (v *VHost) deleteQueue(ctx context.Context, q *Queue, ifUnused, ifEmpty bool, owner Owner, internal bool) (int, *amqp.Error) {
	if !internal && q.owner != nil && q.owner != owner {
		return 0, v.lockedError(q.name)
	}
	st := q.Stats()
	if ifUnused && st.Consumers > 0 {
		return 0, amqp.Errorf(amqp.PreconditionFailed, "queue '%s' in vhost '%s' in use", q.name, v.name)
	}
	if ifEmpty && st.Ready > 0 {
		return 0, amqp.Errorf(amqp.PreconditionFailed, "queue '%s' in vhost '%s' not empty", q.name, v.name)
	}
	if q.store == storeReplicated {
		rec := QueueRecord{VHost: v.name, Name: q.name, ID: q.id}
		if err := v.b.propose(ctx, opDeleteQueue, rec.encode()); err != nil {
			return 0, err
		}
		return st.Ready, nil
	}
	var b storage.Batch
	n, rm := v.removeQueue(q, &b)
	var err *amqp.Error
	if b.Len() > 0 {
		err = v.b.commitLocal(ctx, &b)
	}
	if aerr := v.afterLocalRemoval(ctx, exchange.Removed{Exchanges: rm.Exchanges}); aerr != nil && err == nil {
		err = aerr
	}
	return n, err
}

// removeQueue takes a queue out of the vhost with its bindings, deletes its data and puts the
// record deletes in batch (nil: none). It returns the ready messages that went with it and what
// the registry removed.
func (v *VHost) removeQueue(q *Queue, batch *storage.Batch) (int, exchange.Removed) {
	v.mu.Lock()
	if v.queues[q.name] != q {
		v.mu.Unlock()
		return 0, exchange.Removed{}
	}
	delete(v.queues, q.name)
	rm := v.ex.RemoveQueue(q.name)
	v.mu.Unlock()
	if batch != nil {
		v.dropRecords(rm, batch)
		if q.store != storeNone {
			batch.Delete(q.recordKey())
		}
	}
	n := q.Queue.Delete()
	v.b.forgetStream(q)
	if q.kind == "stream" && batch != nil {
		v.b.dropGroupsOf(v.name, q.name, batch)
	}
	if q.kind == "stream" {
		v.b.streamEvent(StreamEvent{VHost: v.name, Stream: q.name, Deleted: true})
	}
	v.b.stats.Release(q.counters)
	v.b.stats.Inc(stats.QueuesDeleted)
	if q.group != nil {
		if err := q.group.Remove(); err != nil {
			v.b.log.Warn("cannot remove a replicated queue's group", "vhost", v.name, "queue", q.name, "err", err)
		}
	}
	return n, rm
}

// shutdown stops the queue's goroutines at broker shutdown, keeping its data.
func (q *Queue) shutdown() {
	if q.Queue != nil {
		q.vhost.b.forgetStream(q)
		q.Queue.Close()
	}
}

// queueHooks connect a queue's lifecycle to the core: dead-lettering through the vhost's exchanges
// and deletion when it expires.
type queueHooks struct{ q *Queue }

func (h *queueHooks) DeadLetter(_ queue.Queue, dead []queue.Dead, done func(error)) {
	h.q.vhost.deadLetter(h.q, dead, done)
}

func (h *queueHooks) Expired(queue.Queue) { h.q.DeleteLater() }
