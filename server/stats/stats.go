// Package stats is the broker's counters layer: what the management API's message_stats and
// rates, the Prometheus exporter and `warren ctl` read about traffic and churn.
//
// Counting costs atomic adds where the work happens and nothing else: each channel and each
// queue owns an Object (an array of atomic counters) that only its own goroutines write, and
// the count is also added to one of the Registry's sharded node-wide counters, so a node-wide
// total is read in constant time whatever the number of objects. No lock, map lookup or
// allocation is on the hot path. An Object that goes away (a channel closes, a queue is
// deleted) is Released; its counts stay in the node-wide totals, which never go backwards.
//
// Rates are RabbitMQ's *_details.rate: a Sampler runs every 5 s (the management plugin's
// default) and a rate is the difference of the last two samples divided by the time between
// them, in messages per second. The sampler visits only the objects that counted since its last
// run (the first count after a sample puts an object on a lock-free stack); an object it does
// not visit has rates of zero. An idle node costs it nothing per object.
//
// Which objects a node-wide total sums is fixed per Kind (see Source): traffic is counted on
// channels (what clients did), dead-lettering on queues (what queues did), and churn (connections,
// channels, queues opened and closed) on the Registry itself. A queue's own counters say what
// happened to that queue (RabbitMQ's queue message_stats).
package stats

import (
	"sync"
	"sync/atomic"
	"time"
)

// Kind names one counter.
type Kind uint8

// The counters. Comments say where each is counted; the names match RabbitMQ's message_stats
// fields (ChannelStats/QueueStats) and rabbitmq_prometheus's global counters.
const (
	// Published: basic.publish completed on a channel (RabbitMQ "publish", Prometheus
	// messages_received_total); on a queue, messages routed into it.
	Published Kind = iota
	// Routed: publishes routed to at least one queue (messages_routed_total).
	Routed
	// UnroutableDropped: publishes routed nowhere and not mandatory (drop_unroutable).
	UnroutableDropped
	// UnroutableReturned: mandatory publishes routed nowhere and returned (return_unroutable).
	UnroutableReturned
	// Confirmed: publisher confirms sent (basic.ack to a publisher; "confirm").
	Confirmed
	// DeliveredAck: deliveries to consumers in manual-ack mode ("deliver").
	DeliveredAck
	// DeliveredNoAck: deliveries to consumers in no-ack mode ("deliver_no_ack").
	DeliveredNoAck
	// GetAck: basic.get answers with a message, manual ack ("get").
	GetAck
	// GetNoAck: basic.get answers with a message, no-ack ("get_no_ack").
	GetNoAck
	// GetEmpty: basic.get-empty answers ("get_empty").
	GetEmpty
	// Redelivered: deliveries and gets with the redelivered flag ("redeliver").
	Redelivered
	// Acknowledged: deliveries acknowledged by basic.ack ("ack").
	Acknowledged
	// PublishedConfirm: publishes on a channel in confirm mode (messages_received_confirm_total).
	PublishedConfirm
	// DeadLetteredExpired .. DeadLetteredDeliveryLimit: messages that died in a queue, by
	// RabbitMQ's x-death reason (expired, rejected, maxlen, delivery_limit).
	DeadLetteredExpired
	DeadLetteredRejected
	DeadLetteredMaxLen
	DeadLetteredDeliveryLimit
	// DeadLetteredConfirmed: dead letters of a queue that dead-letters at least once (quorum
	// queues) whose every target confirmed them (messages_dead_lettered_confirmed_total).
	DeadLetteredConfirmed
	// ConnectionsOpened .. QueuesDeleted: churn, counted on the Registry (RabbitMQ's
	// churn_rates and rabbitmq_*_opened_total / _closed_total).
	ConnectionsOpened
	ConnectionsClosed
	ChannelsOpened
	ChannelsClosed
	QueuesDeclared // queue.declare (or an API declare) that succeeded, new or not
	QueuesCreated
	QueuesDeleted
	// NumKinds is the number of counters.
	NumKinds
)

var kindNames = [NumKinds]string{
	"published", "routed", "unroutable_dropped", "unroutable_returned", "confirmed",
	"delivered_ack", "delivered_noack", "get_ack", "get_noack", "get_empty", "redelivered",
	"acknowledged", "published_confirm", "dead_lettered_expired", "dead_lettered_rejected", "dead_lettered_maxlen",
	"dead_lettered_delivery_limit", "dead_lettered_confirmed", "connections_opened", "connections_closed", "channels_opened",
	"channels_closed", "queues_declared", "queues_created", "queues_deleted",
}

// String is the counter's snake_case name.
func (k Kind) String() string {
	if k < NumKinds {
		return kindNames[k]
	}
	return "unknown"
}

// Scope says what an Object counts for.
type Scope uint8

// Scopes.
const (
	ScopeNode Scope = iota // the Registry's own counters (churn)
	ScopeChannel
	ScopeQueue
)

// Source is the scope whose objects a node-wide total of k sums.
func Source(k Kind) Scope {
	switch {
	case k >= ConnectionsOpened:
		return ScopeNode
	case k >= DeadLetteredExpired:
		return ScopeQueue
	}
	return ScopeChannel
}

// Values is one reading of every counter.
type Values [NumKinds]uint64

// Rates are per-second rates of every counter, from the last two samples.
type Rates [NumKinds]float64

// Counters is a set of atomic counters; the zero value is ready.
type Counters struct {
	v [NumKinds]atomic.Uint64
}

// Load reads counter k.
func (c *Counters) Load(k Kind) uint64 { return c.v[k].Load() }

// Values reads every counter (each atomically, not all at one instant).
func (c *Counters) Values() Values {
	var out Values
	for i := range c.v {
		out[i] = c.v[i].Load()
	}
	return out
}

// Labels identify an Object for readers (the management API, the Prometheus exporter).
type Labels struct {
	VHost string
	// Name is the queue's name, or the channel's connection name.
	Name string
	// Type is the queue type (classic, quorum, stream) or the channel's protocol.
	Type string
	// Channel is a channel's number on its connection.
	Channel uint16
}

// Object is the counters of one channel or queue. Its goroutines count with Inc and Add;
// readers use Snapshot (or Values, promoted from Counters).
type Object struct {
	Counters
	reg    *Registry // nil for an object outside a registry: it counts for itself only
	shard  *shard    // the registry's node-wide counters this object adds to
	scope  Scope
	labels Labels

	// dirty is set by the first count after a sample, which also pushes the object on the
	// registry's dirty stack (next links it); the sampler clears it when it visits. So an
	// object is on the stack at most once and the sampler visits only objects that counted.
	dirty atomic.Bool
	next  *Object

	mu    sync.Mutex // guards the sample fields; never taken on the hot path
	last  Values     // the counters when the sampler last visited
	rates Rates      // over the interval that ended at sample number tick
	tick  uint64
}

// Add adds n to counter k, and to the node-wide total of k when the object's scope is its
// Source. The first count after a sample marks the object for the next one.
func (o *Object) Add(k Kind, n uint64) {
	o.v[k].Add(n)
	if o.reg == nil {
		return
	}
	if Source(k) == o.scope {
		o.shard[k].Add(n)
	}
	if !o.dirty.Load() && o.dirty.CompareAndSwap(false, true) {
		o.reg.push(o)
	}
}

// Inc adds one to counter k (see Add).
func (o *Object) Inc(k Kind) { o.Add(k, 1) }

// Scope is what the object counts for.
func (o *Object) Scope() Scope { return o.scope }

// Labels identify the object.
func (o *Object) Labels() Labels { return o.labels }

// Snapshot is a reading of an object (or of the node) with the rates of the last sample.
type Snapshot struct {
	Totals Values
	Rates  Rates
}

// Snapshot reads the object's counters now and its rates as of the last sample: zero when the
// object counted nothing in the last interval (the sampler did not visit it).
func (o *Object) Snapshot() Snapshot {
	s := Snapshot{Totals: o.Values()}
	if o.reg == nil {
		return s
	}
	done := o.reg.ticks.Load()
	o.mu.Lock()
	// While sample number done+1 is being taken, objects it visited already have tick done+1.
	if o.tick >= done && o.tick > 0 {
		s.Rates = o.rates
	}
	o.mu.Unlock()
	return s
}

// sample records the object's values as of sample number tick, dt seconds after the last one.
func (o *Object) sample(v Values, dt float64, tick uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if dt > 0 {
		for i := range v {
			o.rates[i] = float64(v[i]-o.last[i]) / dt
		}
	}
	o.last, o.tick = v, tick
}

// numShards spreads the node-wide counters so that two busy channels rarely add to the same
// cache line; a total sums the shards.
const numShards = 8

// shard is one set of node-wide counters, each on its own cache line (goroutines counting
// different kinds do not share one).
type shard [NumKinds]paddedCounter

type paddedCounter struct {
	atomic.Uint64
	_ [56]byte
}

// Registry holds a node's objects and the node-wide totals.
//
// Node-wide totals are counted where the objects count (Object.Add adds to one of the shards),
// so reading them costs NumKinds*numShards loads, whatever the number of objects, and counts
// of released objects stay in them. Rates are sampled from the dirty stack: an idle object
// costs the sampler nothing, and its rates read as zero.
//
// Lock order: Registry.sampleMu -> Object.mu, Registry.sampleMu -> Registry.ratesMu;
// Registry.mu is a leaf.
type Registry struct {
	shards [numShards]shard
	nextSh atomic.Uint32 // round-robin shard of the next object

	dirty atomic.Pointer[Object] // objects that counted since the last sample (a stack)
	ticks atomic.Uint64          // samples completed

	mu   sync.Mutex // guards objs
	objs map[*Object]struct{}

	sampleMu   sync.Mutex // one Sample at a time; guards lastT, lastTotals and batch
	lastT      time.Time
	lastTotals Values
	batch      []*Object

	ratesMu sync.Mutex // guards rates
	rates   Rates      // node-wide, over the last interval
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{objs: make(map[*Object]struct{}), lastT: time.Now()}
}

// Inc counts one node-level event (a ScopeNode kind: churn).
func (r *Registry) Inc(k Kind) { r.shards[0][k].Add(1) }

// NewObject registers the counters of a new channel or queue; Release them when it goes away.
// Its baseline is zero, so the sample after its first counts already has a rate.
func (r *Registry) NewObject(scope Scope, l Labels) *Object {
	o := &Object{reg: r, shard: &r.shards[r.nextSh.Add(1)%numShards], scope: scope, labels: l}
	r.mu.Lock()
	r.objs[o] = struct{}{}
	r.mu.Unlock()
	return o
}

// push puts o on the dirty stack (o.dirty was just set, so it is not on it).
func (r *Registry) push(o *Object) {
	for {
		head := r.dirty.Load()
		o.next = head
		if r.dirty.CompareAndSwap(head, o) {
			return
		}
	}
}

// Release removes an object from the registry's listings. Its counts, and anything it still
// counts, stay in the node-wide totals. Releasing twice (or nil) does nothing.
func (r *Registry) Release(o *Object) {
	if o == nil {
		return
	}
	r.mu.Lock()
	delete(r.objs, o)
	r.mu.Unlock()
}

// Totals reads the node-wide totals now.
func (r *Registry) Totals() Values {
	var out Values
	for i := range r.shards {
		for k := range out {
			out[k] += r.shards[i][k].Load()
		}
	}
	return out
}

// Global is the node-wide totals now and the node-wide rates of the last sample.
func (r *Registry) Global() Snapshot {
	s := Snapshot{Totals: r.Totals()}
	r.ratesMu.Lock()
	s.Rates = r.rates
	r.ratesMu.Unlock()
	return s
}

// Objects lists the live objects of scope (in no order).
func (r *Registry) Objects(scope Scope) []*Object {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*Object, 0, len(r.objs))
	for o := range r.objs {
		if o.scope == scope {
			out = append(out, o)
		}
	}
	return out
}

// Sample takes the node-wide rates and visits the objects that counted since the last sample,
// updating their rates, at now. The Sampler calls it every interval; tests may call it
// directly. Its cost is that of the objects that counted: nothing when the node is idle.
func (r *Registry) Sample(now time.Time) {
	r.sampleMu.Lock()
	defer r.sampleMu.Unlock()
	dt := now.Sub(r.lastT).Seconds()
	r.lastT = now
	tick := r.ticks.Load() + 1

	total := r.Totals()
	r.ratesMu.Lock()
	if dt > 0 {
		for k := range total {
			r.rates[k] = float64(total[k]-r.lastTotals[k]) / dt
		}
	}
	r.ratesMu.Unlock()
	r.lastTotals = total

	// Take the whole stack first: once an object's flag is cleared, a count may push it on the
	// new stack, which rewrites its next link.
	batch := r.batch[:0]
	for o := r.dirty.Swap(nil); o != nil; o = o.next {
		batch = append(batch, o)
	}
	for i, o := range batch {
		o.next = nil
		o.dirty.Store(false)
		// Counts after this read push the object again: the next sample sees them.
		o.sample(o.Values(), dt, tick)
		batch[i] = nil
	}
	r.batch = batch[:0]
	r.ticks.Store(tick)
}

// DefaultInterval is RabbitMQ's collect_statistics_interval default.
const DefaultInterval = 5 * time.Second

// Sampler calls Registry.Sample every interval on its own goroutine until Stop.
type Sampler struct {
	stop chan struct{}
	done chan struct{}
}

// StartSampler samples r now and then every interval (DefaultInterval if <= 0).
func StartSampler(r *Registry, interval time.Duration) *Sampler {
	if interval <= 0 {
		interval = DefaultInterval
	}
	s := &Sampler{stop: make(chan struct{}), done: make(chan struct{})}
	r.Sample(time.Now())
	go func() {
		defer close(s.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case now := <-t.C:
				r.Sample(now)
			case <-s.stop:
				return
			}
		}
	}()
	return s
}

// Stop ends the sampler and waits for its goroutine. Stopping twice is harmless.
func (s *Sampler) Stop() {
	if s == nil {
		return
	}
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}
