package exchange

import (
	"slices"

	"warren/amqp"
)

// acc accumulates the state of one Route call besides the result names.
// It is passed and returned by value, apart from the names (escape analysis
// does not tell struct fields apart), so that its slice, which starts in an
// array on Route's stack, stays there.
type acc struct {
	// xs collects the exchange destinations matched by the exchange being
	// routed.
	xs []*Exchange
	// sets counts the groups of queue names appended; one group is sorted
	// and unique already, more may overlap.
	sets int
	// matched counts the destinations (queues and exchanges) matched by the
	// exchange being routed, to decide whether its alternate exchange
	// applies.
	matched int
}

func (a acc) addSet(dst []string, ds *destSet) ([]string, acc) {
	if len(ds.queues) > 0 {
		dst = append(dst, ds.queues...)
		a.sets++
		a.matched += len(ds.queues)
	}
	if len(ds.exchanges) > 0 {
		a.xs = append(a.xs, ds.exchanges...)
		a.matched += len(ds.exchanges)
	}
	return dst, a
}

// visitedScanMax is how many visited exchanges are scanned linearly before
// a set is built.
const visitedScanMax = 16

// visit records x as visited and reports whether it was new.
func visit(visited []*Exchange, seen map[*Exchange]struct{}, x *Exchange) ([]*Exchange, map[*Exchange]struct{}, bool) {
	if seen != nil {
		if _, ok := seen[x]; ok {
			return visited, seen, false
		}
		seen[x] = struct{}{}
		return append(visited, x), seen, true
	}
	if slices.Contains(visited, x) {
		return visited, seen, false
	}
	if len(visited) >= visitedScanMax {
		seen = make(map[*Exchange]struct{}, 2*visitedScanMax)
		for _, v := range visited {
			seen[v] = struct{}{}
		}
		seen[x] = struct{}{}
	}
	return append(visited, x), seen, true
}

// Route resolves the queues a message published to exchangeName with
// routingKey, the extra routing keys extraKeys (CC and BCC) and headers
// (may be nil) goes to, and appends their names to dst, each at most once,
// in sorted order. ok is false if the exchange does not exist.
//
// The default exchange "" routes to the queue named by each key for which
// queueExists is true (a nil queueExists accepts every name). Other
// exchanges route by kind, follow exchange-to-exchange bindings (each
// exchange is visited once, so cycles end) and, when an exchange matches no
// destination at all (neither queue nor exchange), route through its
// alternate exchange if that exists.
func (r *Registry) Route(dst []string, exchangeName, routingKey string, extraKeys []string, headers amqp.Table, queueExists func(string) bool) (queues []string, ok bool) {
	start := len(dst)
	r.mu.RLock()
	defer r.mu.RUnlock()
	if exchangeName == "" {
		n := 0
		if queueExists == nil || queueExists(routingKey) {
			dst = append(dst, routingKey)
			n++
		}
		for _, k := range extraKeys {
			if queueExists == nil || queueExists(k) {
				dst = append(dst, k)
				n++
			}
		}
		return finish(dst, start, n > 1), true
	}
	x := r.exchanges[exchangeName]
	if x == nil {
		return dst, false
	}
	var workBuf, visitedBuf, xsBuf [8]*Exchange
	work := append(workBuf[:0], x)
	visited := append(visitedBuf[:0], x)
	var seen map[*Exchange]struct{}
	a := acc{xs: xsBuf[:0]}
	for len(work) > 0 {
		x := work[len(work)-1]
		work = work[:len(work)-1]
		a.matched, a.xs = 0, a.xs[:0]
		if x.Kind == SuperStream {
			dst, a = r.routePartition(dst, a, x, routingKey)
		} else {
			dst, a = routeOne(dst, a, x, routingKey, extraKeys, headers)
		}
		if alt := x.alternateExchange(); a.matched == 0 && alt != "" {
			if ae := r.exchanges[alt]; ae != nil && ae.Name != "" {
				a.xs = append(a.xs, ae)
			}
		}
		for _, y := range a.xs {
			var added bool
			if visited, seen, added = visit(visited, seen, y); added {
				work = append(work, y)
			}
		}
	}
	return finish(dst, start, a.sets > 1), true
}

// routeOne matches the bindings of one exchange.
func routeOne(dst []string, a acc, x *Exchange, key string, extraKeys []string, headers amqp.Table) ([]string, acc) {
	switch x.Kind {
	case Direct:
		if ds := x.direct[key]; ds != nil {
			dst, a = a.addSet(dst, ds)
		}
		for _, k := range extraKeys {
			if ds := x.direct[k]; ds != nil {
				dst, a = a.addSet(dst, ds)
			}
		}
	case Fanout:
		dst, a = a.addSet(dst, &x.fanout)
	case Topic:
		dst, a = x.topic.routeKey(dst, a, key)
		for _, k := range extraKeys {
			dst, a = x.topic.routeKey(dst, a, k)
		}
	case Headers:
		for _, b := range x.headers {
			if !b.match.matches(headers) {
				continue
			}
			a.matched++
			if b.dest.kind == ToQueue {
				dst = append(dst, b.dest.name)
				a.sets++
			} else {
				a.xs = append(a.xs, b.destX)
			}
		}
	}
	return dst, a
}

// routePartition routes to the partition of a super stream that key hashes to (CC and BCC keys
// are not used: one message, one partition).
func (r *Registry) routePartition(dst []string, a acc, x *Exchange, key string) ([]string, acc) {
	if len(x.parts) == 0 || r.partition == nil {
		return dst, a
	}
	i := r.partition(key, len(x.parts))
	if i < 0 || i >= len(x.parts) {
		return dst, a
	}
	b := x.parts[i]
	a.matched++
	if b.dest.kind == ToQueue {
		dst = append(dst, b.dest.name)
		a.sets++
	} else {
		a.xs = append(a.xs, b.destX)
	}
	return dst, a
}

// finish makes dst[start:] sorted and unique when it may not be (dedup) and
// drops names already present in dst[:start].
func finish(dst []string, start int, dedup bool) []string {
	if dedup {
		tail := dst[start:]
		slices.Sort(tail)
		dst = dst[:start+len(slices.Compact(tail))]
	}
	if start > 0 {
		prev := dst[:start]
		out := dst[:start]
		for _, q := range dst[start:] {
			if !slices.Contains(prev, q) {
				out = append(out, q)
			}
		}
		clear(dst[len(out):])
		dst = out
	}
	return dst
}

// AppendKeys adds the routing keys of a CC or BCC header value (a string or an array of
// strings, as RabbitMQ's sender-selected distribution takes them) to dst.
func AppendKeys(dst []string, v any) []string {
	switch v := v.(type) {
	case []any:
		for _, x := range v {
			switch s := x.(type) {
			case string:
				dst = append(dst, s)
			case []byte:
				dst = append(dst, string(s))
			}
		}
	case string:
		dst = append(dst, v)
	case []byte:
		dst = append(dst, string(v))
	}
	return dst
}
