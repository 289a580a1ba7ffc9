package server

import (
	"sync"
	"sync/atomic"

	"warren/amqp"
	"warren/exchange"
	"warren/server/queue"
	"warren/storage"
)

// vhost holds a virtual host's exchanges and queues.
type vhost struct {
	name      string
	exchanges *exchange.Registry

	mu     sync.RWMutex
	queues map[string]*queueEntry

	queueExistsFn func(string) bool

	db        *storage.DB
	metaMu    sync.Mutex        // serialises syncMeta
	persisted map[string][]byte // metadata records on disk, by key
	// metaApplied is the last metadata-group index whose changes are in the records on disk.
	metaApplied atomic.Uint64
}

// queueEntry is a declared queue plus what the server needs to know about it.
type queueEntry struct {
	q        *queue.Classic // classic queue; nil for a stream
	stream   *streamQueue // stream queue; nil for a classic queue
	name     string
	durable  bool
	autoDel  bool
	id       uint64
	args     amqp.Table
	owner    *conn // exclusive owner; nil if not exclusive
	v        *vhost
	settings queueSettings
	hooks    *queueHooks

	// Quorum queues: the Raft group and its initial members; 0 for other queues.
	group     uint64
	voters    []string
	nonvoters []string
	rep       *groupReplicator
}

func newVhost(name string, db *storage.DB) *vhost {
	v := &vhost{
		name:      name,
		exchanges: exchange.NewRegistry(name),
		queues:    make(map[string]*queueEntry),
		db:        db,
		persisted: make(map[string][]byte),
	}
	v.queueExistsFn = v.queueExists
	return v
}

func (v *vhost) queueExists(name string) bool {
	_, ok := v.queues[name] // called by Route while v.mu is read-locked
	return ok
}

// route resolves the target queues of a publish.
func (v *vhost) route(dst []*queueEntry, names []string, ex, key string, extra []string, headers amqp.Table) ([]*queueEntry, []string, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	names, ok := v.exchanges.Route(names[:0], ex, key, extra, headers, v.queueExistsFn)
	for _, n := range names {
		if e := v.queues[n]; e != nil {
			dst = append(dst, e)
		}
	}
	return dst, names, ok
}

func (v *vhost) lookupQueue(name string) *queueEntry {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.queues[name]
}

// deleteQueue removes a queue and its bindings, tells its consumers (basic.cancel) and returns how
// many ready messages went with it.
func (v *vhost) deleteQueue(e *queueEntry) int {
	v.mu.Lock()
	if cur := v.queues[e.name]; cur == e {
		delete(v.queues, e.name)
		v.exchanges.RemoveQueue(e.name)
	}
	v.mu.Unlock()
	if e.stream != nil {
		e.stream.delete()
		return 0
	}
	consumers, n := e.q.Close()
	e.q.Drop()
	for _, cons := range consumers {
		if sc, ok := cons.(*consumer); ok {
			sc.ch.serverCancel(sc)
		}
	}
	return n
}

// publish hands a routed message to the queue, whatever its type.
func (e *queueEntry) publish(msg *queue.Message, filterValue string, done func(error)) (queue.PublishStatus, bool) {
	if e.stream != nil {
		return e.stream.publish(msg, filterValue, done)
	}
	return e.q.Publish(msg, done)
}

// counts returns ready messages and consumers (streams report 0 and 0, as RabbitMQ).
func (e *queueEntry) counts() (int, int) {
	if e.stream != nil {
		return 0, 0
	}
	return e.q.Counts()
}

// close stops every queue's dispatcher (broker shutdown).
func (v *vhost) close() {
	v.mu.Lock()
	qs := make([]*queueEntry, 0, len(v.queues))
	for _, e := range v.queues {
		qs = append(qs, e)
	}
	v.queues = map[string]*queueEntry{}
	v.mu.Unlock()
	for _, e := range qs {
		if e.stream != nil {
			e.stream.close()
			continue
		}
		e.q.Close()
	}
}
