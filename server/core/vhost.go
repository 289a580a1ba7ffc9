package core

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"warren/amqp"
	"warren/exchange"
	"warren/server/policy"
	"warren/storage"
	"warren/stream/partition"
)

// VHost is one virtual host: its exchanges, queues and bindings.
//
// What is stored and where:
//   - durable exchanges, replicated queues (quorum queues; in a cluster, durable named classic
//     queues) and bindings between replicated ends are replicated records: a change is proposed
//     to the metadata raft group and every node applies it (metafsm.go);
//   - other durable queues (a single node's classic queues and streams; in a cluster, auto-delete
//     or server-named durable classic queues) and bindings from a durable exchange to them are
//     records of this node only, written before the reply;
//   - everything else (exclusive or non-durable queues, non-durable exchanges, their bindings)
//     lives in memory only.
//
// Lock order: mu -> the exchange registry's lock -> a queue's locks. mu is held while a binding to
// a queue is added, so a binding can never outlive a queue that is being deleted.
type VHost struct {
	b    *Broker
	name string
	ex   *exchange.Registry

	mu            sync.RWMutex
	queues        map[string]*Queue
	queueExistsFn func(string) bool // v.queueExists, allocated once (Route runs per publish)

	deleted atomic.Bool // the vhost was deleted: connections to it are being closed

	xpolMu sync.Mutex
	xpol   map[string]policy.Match // exchanges' policies, by name (none: absent)
}

// Owner identifies the connection that owns an exclusive queue (the session's connection
// value); nil means no owner.
type Owner any

func newVHost(b *Broker, name string) *VHost {
	v := &VHost{b: b, name: name, ex: exchange.NewRegistry(name), queues: make(map[string]*Queue)}
	v.ex.SetPartitioner(partition.Index)
	v.queueExistsFn = v.queueExists
	return v
}

// Name is the vhost's name.
func (v *VHost) Name() string { return v.name }

// Deleted reports whether the vhost was deleted (its connections are being closed).
func (v *VHost) Deleted() bool { return v.deleted.Load() }

func (v *VHost) queueExists(name string) bool {
	_, ok := v.queues[name] // called by Route while v.mu is read-locked
	return ok
}

// Route resolves the target queues of a publish: dst and names are reused buffers. ok is false
// when the exchange does not exist.
func (v *VHost) Route(dst []*Queue, names []string, ex, key string, extra []string, headers amqp.Table) ([]*Queue, []string, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	names, ok := v.ex.Route(names[:0], ex, key, extra, headers, v.queueExistsFn)
	for _, n := range names {
		if q := v.queues[n]; q != nil {
			dst = append(dst, q)
		}
	}
	return dst, names, ok
}

// Exchange returns the named exchange ("" is the default exchange).
func (v *VHost) Exchange(name string) (*exchange.Exchange, bool) { return v.ex.Get(name) }

// Partitions lists super stream name's partition streams in partition order (nil for any other
// exchange).
func (v *VHost) Partitions(name string) []string { return v.ex.Partitions(name) }

// Exchanges lists the vhost's exchanges, sorted by name.
func (v *VHost) Exchanges() []*exchange.Exchange { return v.ex.Exchanges() }

// Bindings lists the vhost's bindings, sorted.
func (v *VHost) Bindings() []exchange.Binding { return v.ex.Bindings() }

// CheckPublishExchange reports RabbitMQ's error for a publish to a missing or internal exchange.
func (v *VHost) CheckPublishExchange(name string) *amqp.Error {
	ex, ok := v.ex.Get(name)
	if !ok {
		return amqp.Errorf(amqp.NotFound, "no exchange '%s' in vhost '%s'", name, v.name)
	}
	if ex.Internal {
		return amqp.Errorf(amqp.AccessRefused, "cannot publish to internal exchange '%s' in vhost '%s'", name, v.name)
	}
	return nil
}

// Queue returns the named queue, or nil.
func (v *VHost) Queue(name string) *Queue {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.queues[name]
}

// Queues lists the vhost's queues, sorted by name.
func (v *VHost) Queues() []*Queue {
	v.mu.RLock()
	qs := make([]*Queue, 0, len(v.queues))
	for _, q := range v.queues {
		qs = append(qs, q)
	}
	v.mu.RUnlock()
	slices.SortFunc(qs, func(a, b *Queue) int { return strings.Compare(a.name, b.name) })
	return qs
}

// QueueNotFound is RabbitMQ's 404 for a queue.
func (v *VHost) QueueNotFound(name string) *amqp.Error {
	return amqp.Errorf(amqp.NotFound, "no queue '%s' in vhost '%s'", name, v.name)
}

// lockedError is RabbitMQ's 405 for another connection's exclusive queue.
func (v *VHost) lockedError(name string) *amqp.Error {
	return amqp.Errorf(amqp.ResourceLocked,
		"cannot obtain exclusive access to locked queue '%s' in vhost '%s'. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration.",
		name, v.name)
}

// UseQueue finds a queue that owner may use: 404 if there is none, 405 if another connection
// owns it.
func (v *VHost) UseQueue(name string, owner Owner) (*Queue, *amqp.Error) {
	q := v.Queue(name)
	if q == nil {
		return nil, v.QueueNotFound(name)
	}
	if q.owner != nil && q.owner != owner {
		return nil, v.lockedError(name)
	}
	return q, nil
}

// ExchangeDecl is an exchange.declare.
type ExchangeDecl struct {
	Name, Type                             string
	Passive, Durable, AutoDelete, Internal bool
	Args                                   amqp.Table
	// Partitions and BindingKeys name a super stream's partition streams and their binding keys
	// (the stream protocol's create_super_stream); nil means RabbitMQ's default layout,
	// Name-0..Name-{N-1} bound with "0".."N-1".
	Partitions, BindingKeys []string
}

// DeclareExchange declares (or checks) an exchange. A new durable exchange is replicated to
// every node before it returns.
func (v *VHost) DeclareExchange(ctx context.Context, d ExchangeDecl) *amqp.Error {
	created, err := v.declareExchange(ctx, d)
	if created && err == nil {
		v.logChange(ctx, "exchange declared", "exchange", d.Name, "type", d.Type, "durable", d.Durable)
	}
	return err
}

// declareExchange is DeclareExchange; created says whether this call made the exchange.
func (v *VHost) declareExchange(ctx context.Context, d ExchangeDecl) (created bool, _ *amqp.Error) {
	if d.Type == SuperStreamType && !d.Passive {
		return true, v.declareSuperStream(ctx, d)
	}
	if !d.Durable || d.Passive {
		_, created, err := v.ex.Declare(d.Name, d.Type, d.Durable, d.AutoDelete, d.Internal, d.Passive, d.Args)
		if created {
			v.matchExchange(d.Name)
		}
		return created, err
	}
	x, err := v.ex.Check(d.Name, d.Type, d.Durable, d.AutoDelete, d.Internal, false, d.Args)
	if err != nil || x != nil {
		return false, err
	}
	rec := ExchangeRecord{VHost: v.name, Name: d.Name, Type: d.Type, AutoDelete: d.AutoDelete, Internal: d.Internal, Args: d.Args}
	if err := v.b.propose(ctx, opPutExchange, rec.encode()); err != nil {
		return false, err
	}
	// Someone else's declaration may have won the race: the answer is against whatever is there.
	_, err = v.ex.Check(d.Name, d.Type, d.Durable, d.AutoDelete, d.Internal, false, d.Args)
	return true, err
}

// DeleteExchange deletes an exchange and its bindings (exchange.delete).
func (v *VHost) DeleteExchange(ctx context.Context, name string, ifUnused bool) *amqp.Error {
	_, found := v.ex.Get(name)
	err := v.deleteExchange(ctx, name, ifUnused)
	if err == nil && found {
		v.logChange(ctx, "exchange deleted", "exchange", name)
	}
	return err
}

func (v *VHost) deleteExchange(ctx context.Context, name string, ifUnused bool) *amqp.Error {
	x, found := v.ex.Get(name)
	if !found || !x.Durable {
		rm, err := v.ex.DeleteReport(name, ifUnused)
		if err == nil {
			err = v.afterLocalRemoval(ctx, rm)
		}
		return err
	}
	if name == "" || strings.HasPrefix(name, "amq.") {
		_, err := v.ex.DeleteReport(name, ifUnused) // RabbitMQ's 403 for the system exchanges
		return err
	}
	if ifUnused && v.ex.InUse(name) && x.Kind != exchange.SuperStream {
		// Checked here, on the node that received the request, as RabbitMQ checks it.
		return amqp.Errorf(amqp.PreconditionFailed, "exchange '%s' in vhost '%s' in use", name, v.name)
	}
	if x.Kind == exchange.SuperStream {
		return v.deleteSuperStream(ctx, name)
	}
	rec := ExchangeRecord{VHost: v.name, Name: name}
	return v.b.propose(ctx, opDeleteExchange, rec.encode())
}

// Bind adds a binding (queue.bind, exchange.bind). For a queue destination the queue must exist
// and owner may use it.
func (v *VHost) Bind(ctx context.Context, b exchange.Binding, owner Owner) *amqp.Error {
	return v.changeBinding(ctx, b, owner, true)
}

// Unbind removes a binding (queue.unbind, exchange.unbind).
func (v *VHost) Unbind(ctx context.Context, b exchange.Binding, owner Owner) *amqp.Error {
	return v.changeBinding(ctx, b, owner, false)
}

func (v *VHost) changeBinding(ctx context.Context, b exchange.Binding, owner Owner, bind bool) *amqp.Error {
	if b.DestKind == exchange.ToQueue {
		q := v.Queue(b.Dest)
		if q == nil {
			if !bind {
				// RabbitMQ answers unbind-ok for a missing queue only when the exchange exists.
				if _, ok := v.ex.Get(b.Source); !ok {
					return amqp.Errorf(amqp.NotFound, "no exchange '%s' in vhost '%s'", b.Source, v.name)
				}
			}
			return v.QueueNotFound(b.Dest)
		}
		if q.owner != nil && q.owner != owner {
			return v.lockedError(b.Dest)
		}
	}
	switch v.bindingStore(b) {
	case storeReplicated:
		if err := v.ex.CheckBinding(b, bind); err != nil {
			return err
		}
		rec := BindingRecord{VHost: v.name, Binding: b}
		op := opBind
		if !bind {
			op = opUnbind
		}
		return v.b.propose(ctx, op, rec.encode())
	case storeLocal:
		var batch storage.Batch
		if err := v.applyBinding(b, bind, &batch); err != nil {
			return err
		}
		return v.b.commitLocal(ctx, &batch)
	}
	var batch storage.Batch
	if err := v.applyBinding(b, bind, &batch); err != nil {
		return err
	}
	if batch.Len() > 0 {
		return v.b.commitLocal(ctx, &batch)
	}
	return nil
}

// recStore says where a metadata record lives.
type recStore uint8

const (
	storeNone       recStore = iota // memory only
	storeLocal                      // a record of this node only
	storeReplicated                 // a replicated record (the metadata raft group)
)

// bindingStore says where a binding's record lives: replicated when both ends are, on this node
// when its source is durable and its destination is a locally stored queue, nowhere otherwise.
func (v *VHost) bindingStore(b exchange.Binding) recStore {
	src, ok := v.ex.Get(b.Source)
	if !ok || !src.Durable || b.Source == "" {
		return storeNone
	}
	if b.DestKind == exchange.ToExchange {
		if x, ok := v.ex.Get(b.Dest); ok && x.Durable {
			return storeReplicated
		}
		return storeNone
	}
	if q := v.Queue(b.Dest); q != nil {
		return q.store
	}
	return storeNone
}

// applyBinding adds or removes a binding in memory and puts the record changes in batch.
func (v *VHost) applyBinding(b exchange.Binding, bind bool, batch *storage.Batch) *amqp.Error {
	store := v.bindingStore(b)
	if !bind {
		rm, err := v.ex.UnbindReport(b)
		if err != nil {
			return err
		}
		v.dropRecords(rm, batch)
		return nil
	}
	v.mu.Lock()
	if b.DestKind == exchange.ToQueue && v.queues[b.Dest] == nil {
		v.mu.Unlock()
		return v.QueueNotFound(b.Dest)
	}
	err := v.ex.Bind(b)
	v.mu.Unlock()
	if err != nil {
		return err
	}
	if store != storeNone {
		rec := BindingRecord{VHost: v.name, Binding: b}
		batch.Set(bindingKey(store, &rec), rec.encode())
	}
	return nil
}

func bindingKey(store recStore, rec *BindingRecord) []byte {
	k := rec.key()
	if store == storeLocal {
		k[1] = kindLocalBinding
	}
	return k
}

// dropRecords deletes the records of what a registry change removed. A binding's store is found
// from its ends as they are now; ends already gone make it a replicated binding when its
// destination is an exchange, and both kinds are deleted when a queue destination is gone
// (deleting a missing key is harmless).
func (v *VHost) dropRecords(rm exchange.Removed, batch *storage.Batch) {
	for _, x := range rm.Exchanges {
		if x.Durable {
			rec := ExchangeRecord{VHost: v.name, Name: x.Name}
			batch.Delete(rec.key())
		}
	}
	for _, b := range rm.Bindings {
		rec := BindingRecord{VHost: v.name, Binding: b}
		k := rec.key()
		batch.Delete(k)
		if b.DestKind == exchange.ToQueue {
			lk := append([]byte(nil), k...)
			lk[1] = kindLocalBinding
			batch.Delete(lk)
		}
	}
}

// afterLocalRemoval stores what a change made outside the metadata group removed, and, when it
// auto-deleted a durable exchange, replicates that deletion so every node agrees.
func (v *VHost) afterLocalRemoval(ctx context.Context, rm exchange.Removed) *amqp.Error {
	var batch storage.Batch
	v.dropRecords(rm, &batch)
	var err *amqp.Error
	if batch.Len() > 0 {
		err = v.b.commitLocal(ctx, &batch)
	}
	for _, x := range rm.Exchanges {
		if x.Durable && v.b.meta != nil {
			rec := ExchangeRecord{VHost: v.name, Name: x.Name}
			if perr := v.b.propose(ctx, opDeleteExchange, rec.encode()); perr != nil && err == nil {
				err = perr
			}
		}
	}
	return err
}

// close stops every queue's goroutines (broker shutdown).
func (v *VHost) close() {
	v.mu.Lock()
	qs := make([]*Queue, 0, len(v.queues))
	for _, q := range v.queues {
		qs = append(qs, q)
	}
	v.queues = map[string]*Queue{}
	v.mu.Unlock()
	for _, q := range qs {
		q.shutdown()
	}
}
