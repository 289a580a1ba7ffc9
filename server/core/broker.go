// Package core is Warren's broker core: vhosts with their exchanges, queues and bindings, the
// metadata records and their replication through the metadata raft group, dead-lettering, the
// expiry janitor, resource alarms and the registry of client connections. Protocol sessions (AMQP
// 0-9-1 in server/session, RabbitMQ's stream protocol next) and the HTTP API call it; it never
// calls them except through the interfaces it defines (queue.Consumer, ClientConn).
//
// Lock order (outermost first): VHost.mu -> exchange.Registry's lock; VHost.mu -> a queue's own
// locks (queue types never call back into the core while holding theirs: Hooks run unlocked).
// Broker.mu (the vhost map) is never held while a VHost lock is taken. accessState.mu,
// Broker.policyMu and VHost.xpolMu are leaves (VHost.xpolMu is released before the exchange
// registry is called).
package core

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"warren/server/cluster"
	"warren/server/policy"
	"warren/server/queue"
	"warren/server/stats"
	"warren/storage"
)

// Options configure a Broker.
type Options struct {
	DB   *storage.DB
	Node *cluster.Node // the cluster layer (a one-node cluster unless configured)
	// Join starts the metadata group without bootstrapping it: the node waits to be added to a
	// running cluster.
	Join   bool
	Logger *slog.Logger
	// ConsumerTimeout is the default for queues without x-consumer-timeout (0 disables).
	ConsumerTimeout time.Duration
	// Types are the queue types by x-queue-type value ("classic", "quorum", "stream").
	Types []queue.Type
	// DefaultUser and DefaultPass are the user created, tagged administrator with full
	// permissions on "/", when the node or cluster is first bootstrapped ("" creates none).
	DefaultUser, DefaultPass string
	// LoopbackUsers may log in only from a loopback address (RabbitMQ's loopback_users).
	LoopbackUsers []string
	// StartAbort, when closed, ends New's wait for the first bootstrap's records (the default
	// vhost and user), so a node told to stop while its cluster has no majority stops at once
	// instead of after initTimeout.
	StartAbort <-chan struct{}
	// StatsInterval is how often message rates are sampled (0: stats.DefaultInterval, 5 s).
	StatsInterval time.Duration
}

// Broker is the broker core of one node.
type Broker struct {
	opts Options
	log  *slog.Logger
	db   *storage.DB
	node *cluster.Node
	meta *cluster.Group

	// applied is the last metadata-group index whose changes are in memory (and queued for the
	// records on disk, in order).
	applied atomic.Uint64

	types map[string]queue.Type

	mu     sync.RWMutex
	vhosts map[string]*VHost

	conns  connRegistry
	alarms atomic.Pointer[Alarms]

	recovering bool // set while recover runs (New's goroutine, before anything else runs)
	access     accessState
	policies   atomic.Pointer[policy.Set]
	policyMu   sync.Mutex // serialises changes of policies (the metadata group applies one at a time anyway)

	tag, epoch     uint16   // this node's tag and this boot's epoch in consumer ids
	writerID       string   // this boot's writer id in stream deduplication tables
	streams        sync.Map // stream queue id -> StreamQueue, for the stream service
	groups         groups   // consumer groups (groups.go)
	endpoints      endpointRegistry
	streamWatch    streamWatchers
	nextConsumerID atomic.Uint64

	stats   *stats.Registry // counters of channels, queues and churn
	sampler *stats.Sampler  // samples stats for rates; stopped by Close

	janitor chan *Queue
	quit    chan struct{}
	wg      sync.WaitGroup
}

// New recovers the node's metadata from its records (migrating an older layout once), starts
// the metadata raft group and returns the running core.
func New(opts Options) (*Broker, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	b := &Broker{
		opts:    opts,
		log:     opts.Logger,
		db:      opts.DB,
		node:    opts.Node,
		types:   make(map[string]queue.Type),
		vhosts:  make(map[string]*VHost),
		janitor: make(chan *Queue, 64),
		quit:    make(chan struct{}),
		stats:   stats.NewRegistry(),
	}
	b.groups.byKey = make(map[groupKey]*groupState)
	b.groups.local = make(map[uint64]groupLocal)
	for _, t := range opts.Types {
		b.types[t.Kind()] = t
	}
	b.tag = nodeTag(opts.Node.ID())
	var e [2]byte
	rand.Read(e[:])
	b.epoch = binary.BigEndian.Uint16(e[:])
	b.nextConsumerID.Store(uint64(b.tag)<<48 | uint64(b.epoch)<<32)
	b.access.init()
	b.policies.Store(policy.NewSet())

	b.startStreams()
	b.wg.Add(1)
	go b.runJanitor()
	if err := b.recover(); err != nil {
		b.Close()
		return nil, err
	}
	if err := b.startMeta(); err != nil {
		b.Close()
		return nil, err
	}
	b.bootstrapAccess()
	b.forgetOwnBoots()
	b.sampler = stats.StartSampler(b.stats, opts.StatsInterval)
	return b, nil
}

// Close stops every queue's goroutines (keeping their data) and the janitor. The caller closes
// the cluster node and the database afterwards.
func (b *Broker) Close() {
	select {
	case <-b.quit:
		return
	default:
	}
	close(b.quit)
	b.closeGroups()
	b.closeEndpoints()
	b.wg.Wait()
	b.sampler.Stop()
	if a := b.alarms.Load(); a != nil {
		a.Stop()
	}
	b.mu.RLock()
	vs := make([]*VHost, 0, len(b.vhosts))
	for _, v := range b.vhosts {
		vs = append(vs, v)
	}
	b.mu.RUnlock()
	for _, v := range vs {
		v.close()
	}
}

// StartAlarms starts the memory and disk watchdog (the server does so once it listens).
func (b *Broker) StartAlarms(dataDir string, memLimit, diskFree int64) {
	b.alarms.Store(NewAlarms(dataDir, memLimit, diskFree, b.db, b.log))
}

// Alarms returns the resource alarms, or nil before StartAlarms.
func (b *Broker) Alarms() *Alarms { return b.alarms.Load() }

// VHost returns the named vhost, or nil.
func (b *Broker) VHost(name string) *VHost {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.vhosts[name]
}

// VHosts returns every vhost, sorted by name.
func (b *Broker) VHosts() []*VHost {
	b.mu.RLock()
	vs := make([]*VHost, 0, len(b.vhosts))
	for _, v := range b.vhosts {
		vs = append(vs, v)
	}
	b.mu.RUnlock()
	slices.SortFunc(vs, func(a, c *VHost) int { return strings.Compare(a.name, c.name) })
	return vs
}

// Stats is the node's counters layer: sessions count traffic on their channels' objects, queues
// on theirs, and the HTTP API and the metrics exporter read it.
func (b *Broker) Stats() *stats.Registry { return b.stats }

// Logger is the core's logger.
func (b *Broker) Logger() *slog.Logger { return b.log }

// DB is the node's storage.
func (b *Broker) DB() *storage.DB { return b.db }

// Node is the node's cluster layer.
func (b *Broker) Node() *cluster.Node { return b.node }

// NextConsumerID returns a consumer id unique in the cluster: node tag | boot epoch | counter.
func (b *Broker) NextConsumerID() queue.ConsumerID {
	return queue.ConsumerID(b.nextConsumerID.Add(1))
}

// NodeTag is this node's tag in consumer ids (see queue.ConsumerNode).
func (b *Broker) NodeTag() uint16 { return b.tag }

// hasType reports whether a queue type is registered.
func (b *Broker) hasType(kind string) bool { _, ok := b.types[kind]; return ok }

// nodeTag is the 16-bit tag of a node in consumer ids.
func nodeTag(id string) uint16 {
	h := fnv.New32a()
	h.Write([]byte(id))
	v := h.Sum32()
	return uint16(v>>16) ^ uint16(v)
}

// newQueueID returns a random 62-bit queue id (never 0): unique in the cluster without
// coordination, so a declaration carries its id in the replicated record.
func newQueueID() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:])>>2 | 1
}

// deleteLater hands a queue to the janitor for deletion: queue goroutines (x-expires) and
// consumers' callbacks cannot wait for the queue to stop.
func (b *Broker) deleteLater(q *Queue) {
	select {
	case b.janitor <- q:
	case <-b.quit:
	}
}

// runJanitor deletes the queues handed to deleteLater.
func (b *Broker) runJanitor() {
	defer b.wg.Done()
	for {
		select {
		case q := <-b.janitor:
			if _, err := q.vhost.deleteQueue(context.Background(), q, false, false, nil, true); err != nil {
				b.log.Warn("cannot delete an expired queue", "vhost", q.vhost.name, "queue", q.name, "err", err.Text)
				continue
			}
			b.log.Info("queue deleted", "vhost", q.vhost.name, "queue", q.name, "reason", "expired or auto-delete")
		case <-b.quit:
			return
		}
	}
}

func wrap(what string, err error) error { return fmt.Errorf("%s: %w", what, err) }
