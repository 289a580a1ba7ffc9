// Package exchange implements Warren's routing: exchanges of the four AMQP
// 0-9-1 kinds (direct, fanout, topic, headers), the bindings between
// exchanges and queues or other exchanges, alternate exchanges and
// auto-delete. It resolves (exchange, routing keys, headers) to a set of queue
// names and performs no I/O.
//
// Behaviour and reply texts follow RabbitMQ 3.10 as observed on a live broker.
package exchange

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	"warren/amqp"
)

// Kind is an exchange type.
type Kind uint8

// The exchange types RabbitMQ ships without plugins.
const (
	Direct Kind = iota + 1
	Fanout
	Topic
	Headers
	// SuperStream is Warren's x-super-stream exchange: a publish goes to one of the bound
	// partitions (ordered by the bindings' x-stream-partition-order argument), the one its
	// routing key hashes to (Registry.SetPartitioner), as RabbitMQ's stream clients pick it.
	SuperStream
)

// PartitionOrderArg is the binding argument that orders a super stream's partitions, as
// RabbitMQ's stream manager binds them.
const PartitionOrderArg = "x-stream-partition-order"

// ParseKind maps an exchange type name as sent in exchange.declare
// ("direct", "fanout", "topic", "headers") to its Kind. Names are
// case-sensitive, as in RabbitMQ.
func ParseKind(s string) (Kind, bool) {
	switch s {
	case "direct":
		return Direct, true
	case "fanout":
		return Fanout, true
	case "topic":
		return Topic, true
	case "headers":
		return Headers, true
	case "x-super-stream":
		return SuperStream, true
	}
	return 0, false
}

// String returns the type name used on the wire, e.g. "topic".
func (k Kind) String() string {
	switch k {
	case Direct:
		return "direct"
	case Fanout:
		return "fanout"
	case Topic:
		return "topic"
	case Headers:
		return "headers"
	case SuperStream:
		return "x-super-stream"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// DestKind tells whether a binding points at a queue or an exchange
// (exchange-to-exchange bindings).
type DestKind uint8

// Binding destination kinds.
const (
	ToQueue DestKind = iota + 1
	ToExchange
)

// String returns "queue" or "exchange".
func (d DestKind) String() string {
	switch d {
	case ToQueue:
		return "queue"
	case ToExchange:
		return "exchange"
	}
	return "DestKind(" + strconv.Itoa(int(d)) + ")"
}

// Binding is a route from a source exchange to a queue or an exchange.
// Two bindings are the same when source, destination, destination kind, key
// and arguments are equal; arguments compare with their field types (an
// int32 1 and an int64 1 are different arguments, as in RabbitMQ).
type Binding struct {
	Source   string // exchange name
	Dest     string // queue or exchange name
	DestKind DestKind
	Key      string
	Args     amqp.Table
}

// Exchange is a declared exchange. Its exported fields are read-only after
// declaration; the binding indexes are guarded by the owning Registry.
type Exchange struct {
	Name                          string
	Kind                          Kind
	Durable, AutoDelete, Internal bool
	Args                          amqp.Table

	// alternate is the alternate-exchange argument ("" if none).
	alternate string
	// policyAlternate is the alternate exchange a policy gives it ("" if none); the argument
	// wins when both are set, as in RabbitMQ. Guarded by the Registry's lock.
	policyAlternate string
	// out holds every binding whose source is this exchange, grouped by
	// destination; nOut counts them.
	out  map[destRef][]*binding
	nOut int

	// Routing indexes; which one is used depends on Kind.
	direct  map[string]*destSet
	fanout  destSet
	topic   *topicNode
	headers []*binding
	parts   []*binding // super streams: by partition order
}

// destRef names a binding destination.
type destRef struct {
	kind DestKind
	name string
}

// binding is the stored form of a Binding.
type binding struct {
	dest  destRef
	destX *Exchange // the destination exchange for ToExchange bindings
	key   string
	args  amqp.Table
	match *headersMatch // headers exchanges only
}

func (b *binding) public(source string) Binding {
	return Binding{Source: source, Dest: b.dest.name, DestKind: b.dest.kind, Key: b.key, Args: b.args}
}

// destSet is the set of destinations reached through one index entry (a
// direct routing key, a fanout exchange, a topic trie node). Queue names and
// exchanges are kept sorted and unique; refs counts the bindings behind each
// destination so that removing one of several equal-destination bindings
// keeps the route.
type destSet struct {
	queues    []string
	exchanges []*Exchange
	refs      map[destRef]int
}

func (d *destSet) empty() bool { return len(d.refs) == 0 }

func (d *destSet) add(b *binding) {
	if d.refs == nil {
		d.refs = make(map[destRef]int)
	}
	d.refs[b.dest]++
	if d.refs[b.dest] > 1 {
		return
	}
	if b.dest.kind == ToQueue {
		i, _ := searchStrings(d.queues, b.dest.name)
		d.queues = insertAt(d.queues, i, b.dest.name)
		return
	}
	i, _ := searchExchanges(d.exchanges, b.dest.name)
	d.exchanges = insertAt(d.exchanges, i, b.destX)
}

func (d *destSet) remove(b *binding) {
	n := d.refs[b.dest] - 1
	if n > 0 {
		d.refs[b.dest] = n
		return
	}
	delete(d.refs, b.dest)
	if b.dest.kind == ToQueue {
		if i, ok := searchStrings(d.queues, b.dest.name); ok {
			d.queues = removeAt(d.queues, i)
		}
		return
	}
	if i, ok := searchExchanges(d.exchanges, b.dest.name); ok {
		d.exchanges = removeAt(d.exchanges, i)
	}
}

func searchStrings(s []string, name string) (int, bool) {
	lo, hi := 0, len(s)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if s[m] < name {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < len(s) && s[lo] == name
}

func searchExchanges(s []*Exchange, name string) (int, bool) {
	lo, hi := 0, len(s)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if s[m].Name < name {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < len(s) && s[lo].Name == name
}

func insertAt[T any](s []T, i int, v T) []T {
	var zero T
	s = append(s, zero)
	copy(s[i+1:], s[i:])
	s[i] = v
	return s
}

func removeAt[T any](s []T, i int) []T {
	copy(s[i:], s[i+1:])
	var zero T
	s[len(s)-1] = zero
	return s[:len(s)-1]
}

// addIndex adds b to the routing index of x.
func (x *Exchange) addIndex(b *binding) {
	switch x.Kind {
	case Direct:
		ds := x.direct[b.key]
		if ds == nil {
			ds = &destSet{}
			x.direct[b.key] = ds
		}
		ds.add(b)
	case Fanout:
		x.fanout.add(b)
	case Topic:
		x.topic.insert(b)
	case Headers:
		x.headers = append(x.headers, b)
	case SuperStream:
		i, _ := slices.BinarySearchFunc(x.parts, b, comparePartitions)
		x.parts = slices.Insert(x.parts, i, b)
	}
}

// partitionOrder is a binding's x-stream-partition-order (bindings without one sort last).
func partitionOrder(b *binding) int64 {
	if n, ok := amqp.AsInt64(b.args[PartitionOrderArg]); ok {
		return n
	}
	return 1 << 62
}

func comparePartitions(a, b *binding) int {
	if c := cmp.Compare(partitionOrder(a), partitionOrder(b)); c != 0 {
		return c
	}
	if c := strings.Compare(a.dest.name, b.dest.name); c != 0 {
		return c
	}
	return strings.Compare(a.key, b.key)
}

// removeIndex removes b from the routing index of x.
func (x *Exchange) removeIndex(b *binding) {
	switch x.Kind {
	case Direct:
		if ds := x.direct[b.key]; ds != nil {
			ds.remove(b)
			if ds.empty() {
				delete(x.direct, b.key)
			}
		}
	case Fanout:
		x.fanout.remove(b)
	case Topic:
		x.topic.remove(b)
	case Headers:
		for i, hb := range x.headers {
			if hb == b {
				x.headers = removeAt(x.headers, i)
				break
			}
		}
	case SuperStream:
		if i := slices.Index(x.parts, b); i >= 0 {
			x.parts = removeAt(x.parts, i)
		}
	}
}

// Partitions returns the destinations of a super stream's bindings in partition order.
func (r *Registry) Partitions(name string) []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	x := r.exchanges[name]
	if x == nil || x.Kind != SuperStream {
		return nil
	}
	out := make([]string, len(x.parts))
	for i, b := range x.parts {
		out[i] = b.dest.name
	}
	return out
}
