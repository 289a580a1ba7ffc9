package replica

import (
	"sync"
	"time"
)

// offsetWriter replicates named consumer offsets through the coordinator, coalesced: at most one
// proposal in flight per stream, carrying the latest offset of every name changed since the
// previous one.
type offsetWriter struct {
	r        *Replica
	mu       sync.Mutex
	dirty    map[string]uint64
	inflight bool
	// local holds the offsets stored on this node whose command has not applied yet: an older
	// command of this node that applies meanwhile does not move them back.
	local map[string]uint64
}

// applied tells whether a replicated offset may be set in the log (and forgets a local value
// it confirms).
func (w *offsetWriter) applied(name string, off uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	v, ok := w.local[name]
	if !ok {
		return true
	}
	if v == off {
		delete(w.local, name)
		return true
	}
	return false
}

// StoreOffset stores offset under a consumer name (x-stream-consumer-name, a consumer group's
// name): on every replica through the coordinator (asynchronously, coalesced), or directly for a
// stream of one replica.
func (r *Replica) StoreOffset(name string, offset uint64) {
	if r.cfg.Coord == nil {
		r.log.StoreOffset(name, offset)
		return
	}
	// Seen here at once (a consumer of this node resuming reads its own store); every replica
	// sets it again when the command applies.
	r.log.StoreOffset(name, offset)
	w := &r.off
	w.mu.Lock()
	if w.dirty == nil {
		w.dirty = make(map[string]uint64)
		w.local = make(map[string]uint64)
	}
	w.local[name] = offset
	w.dirty[name] = offset
	send := !w.inflight
	if send {
		w.inflight = true
	}
	w.mu.Unlock()
	if send {
		w.send()
	}
}

// LoadOffset returns the offset stored under name (as applied on this replica).
func (r *Replica) LoadOffset(name string) (uint64, bool) { return r.log.LoadOffset(name) }

// send proposes the dirty offsets; inflight is set.
func (w *offsetWriter) send() {
	w.mu.Lock()
	batch := w.dirty
	w.dirty = nil
	if len(batch) == 0 {
		w.inflight = false
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	w.r.cfg.Coord.Propose(encodeOffsets(batch), func(_ []byte, err error) {
		if err != nil {
			w.r.logger.Warn("stream offsets not replicated; retrying", "err", err)
			w.mu.Lock()
			if w.dirty == nil {
				w.dirty = make(map[string]uint64)
			}
			for n, o := range batch {
				if _, newer := w.dirty[n]; !newer {
					w.dirty[n] = o
				}
			}
			w.mu.Unlock()
			time.AfterFunc(retryPause, func() {
				select {
				case <-w.r.stop:
					w.mu.Lock()
					w.inflight = false
					w.mu.Unlock()
				default:
					w.send()
				}
			})
			return
		}
		w.send()
	})
}

// Retain replicates a retention decision of the leader's writer (stream.Options.OnRetention):
// every replica removes the segments below first when it applies it.
func (r *Replica) Retain(first uint64) {
	if r.cfg.Coord == nil {
		r.log.DropBefore(first)
		return
	}
	r.cfg.Coord.Propose(encodeRetention(first), func(_ []byte, err error) {
		if err != nil {
			r.logger.Warn("stream retention not replicated", "first", first, "err", err)
		}
	})
}
