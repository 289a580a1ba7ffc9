// Package stats is the broker's counters layer: what the management API's message_stats and
// rates, the Prometheus exporter and `warren ctl` read about traffic and churn.
//
// Counting costs one uncontended atomic add where the work happens and nothing else: each
// channel and each queue owns an Object (an array of atomic counters) that only its own
// goroutines write, and totals are summed on read. No lock and no allocation is on the hot
// path. An Object that goes away (a channel closes, a queue is deleted) is Released: its counts
// fold into the Registry's retired totals, so node-wide totals never go backwards.
//
// Rates are RabbitMQ's *_details.rate: a Sampler records every object's counters every 5 s (the
// management plugin's default) and a rate is the difference of the last two samples divided by
// the time between them, in messages per second.
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

// Add adds n to counter k.
func (c *Counters) Add(k Kind, n uint64) { c.v[k].Add(n) }

// Inc adds one to counter k.
func (c *Counters) Inc(k Kind) { c.v[k].Add(1) }

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

// Object is the counters of one channel or queue. Its goroutines count with Counters' methods
// (promoted); readers use Snapshot.
type Object struct {
	Counters
	scope  Scope
	labels Labels

	mu    sync.Mutex // guards the sample fields; never taken on the hot path
	last  Values
	lastT time.Time
	rates Rates
}

// Scope is what the object counts for.
func (o *Object) Scope() Scope { return o.scope }

// Labels identify the object.
func (o *Object) Labels() Labels { return o.labels }

// Snapshot is a reading of an object (or of the node) with the rates of the last sample.
type Snapshot struct {
	Totals Values
	Rates  Rates
}

// Snapshot reads the object's counters now and its rates as of the last sample.
func (o *Object) Snapshot() Snapshot {
	s := Snapshot{Totals: o.Values()}
	o.mu.Lock()
	s.Rates = o.rates
	o.mu.Unlock()
	return s
}

// sample records the object's values at now and updates its rates.
func (o *Object) sample(v Values, now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.lastT.IsZero() {
		if dt := now.Sub(o.lastT).Seconds(); dt > 0 {
			for i := range v {
				o.rates[i] = float64(v[i]-o.last[i]) / dt
			}
		}
	}
	o.last, o.lastT = v, now
}

// Registry holds a node's objects and node-wide totals.
//
// Lock order: Registry.mu -> Object.mu (the sampler); both are leaves otherwise.
type Registry struct {
	node Object // ScopeNode counters, and the node-wide rates

	mu      sync.Mutex
	objs    map[*Object]struct{}
	retired Values // counts of released objects, for their scope's kinds
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{node: Object{scope: ScopeNode}, objs: make(map[*Object]struct{})}
}

// Inc counts one node-level event (a ScopeNode kind: churn).
func (r *Registry) Inc(k Kind) { r.node.Inc(k) }

// NewObject registers the counters of a new channel or queue; Release them when it goes away.
func (r *Registry) NewObject(scope Scope, l Labels) *Object {
	// The baseline is zero at creation, so the first sample already has a rate.
	o := &Object{scope: scope, labels: l, lastT: time.Now()}
	r.mu.Lock()
	r.objs[o] = struct{}{}
	r.mu.Unlock()
	return o
}

// Release removes an object, keeping its counts in the node-wide totals. Releasing twice (or
// nil) does nothing.
func (r *Registry) Release(o *Object) {
	if o == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.objs[o]; !ok {
		return
	}
	delete(r.objs, o)
	v := o.Values()
	for k := range v {
		if Source(Kind(k)) == o.scope {
			r.retired[k] += v[k]
		}
	}
}

// Totals reads the node-wide totals now.
func (r *Registry) Totals() Values {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.totalsLocked()
}

func (r *Registry) totalsLocked() Values {
	out := r.retired
	for o := range r.objs {
		for k := range out {
			if Source(Kind(k)) == o.scope {
				out[k] += o.Load(Kind(k))
			}
		}
	}
	nv := r.node.Values()
	for k := range out {
		if Source(Kind(k)) == ScopeNode {
			out[k] += nv[k]
		}
	}
	return out
}

// Global is the node-wide totals now and the node-wide rates of the last sample.
func (r *Registry) Global() Snapshot {
	s := Snapshot{Totals: r.Totals()}
	r.node.mu.Lock()
	s.Rates = r.node.rates
	r.node.mu.Unlock()
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

// Sample records every object's counters and the node-wide totals at now, updating their
// rates. The Sampler calls it every interval; tests may call it directly.
func (r *Registry) Sample(now time.Time) {
	r.mu.Lock()
	objs := make([]*Object, 0, len(r.objs))
	for o := range r.objs {
		objs = append(objs, o)
	}
	total := r.totalsLocked()
	r.mu.Unlock()
	r.node.sample(total, now)
	for _, o := range objs {
		o.sample(o.Values(), now)
	}
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
