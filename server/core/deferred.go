package core

import (
	"context"
	"sync"

	"warren/amqp"
	"warren/storage"
)

// Deferred lets a caller take the answer of a change before its record of this node is durable:
// the core applies the change in memory, submits the record write and reports its outcome to the
// Deferred instead of waiting for it. The AMQP session uses it so that one connection's channels
// declaring at once share an fsync (the reader goes on with the other channels' methods, and each
// channel's reply waits for its own write). Without a Deferred in the context, changes wait.
type Deferred struct {
	mu   sync.Mutex
	used bool
	done bool
	err  *amqp.Error
	then func(*amqp.Error)
}

type deferredKey struct{}

// WithDeferred returns a context whose local record writes report to d instead of being waited for.
func WithDeferred(ctx context.Context, d *Deferred) context.Context {
	return context.WithValue(ctx, deferredKey{}, d)
}

// Used reports whether the change handed a write to d (otherwise it was complete when it returned).
func (d *Deferred) Used() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.used
}

// Then runs fn with the write's outcome once it is known (at once if it already is).
func (d *Deferred) Then(fn func(*amqp.Error)) {
	d.mu.Lock()
	if !d.done {
		d.then = fn
		d.mu.Unlock()
		return
	}
	err := d.err
	d.mu.Unlock()
	fn(err)
}

func (d *Deferred) complete(err *amqp.Error) {
	d.mu.Lock()
	d.done, d.err = true, err
	fn := d.then
	d.mu.Unlock()
	if fn != nil {
		fn(err)
	}
}

// commitLocal writes records of this node: it waits until they are durable, or, when ctx carries
// a Deferred that has not been used yet, submits them and reports to it.
func (b *Broker) commitLocal(ctx context.Context, batch *storage.Batch) *amqp.Error {
	batch.UseReserve() // declares and deletes are small and must work while a full disk is drained
	if d, _ := ctx.Value(deferredKey{}).(*Deferred); d != nil {
		d.mu.Lock()
		if !d.used {
			d.used = true
			d.mu.Unlock()
			b.db.Commit(batch, func(err error) {
				if err != nil {
					b.log.Error("cannot store metadata", "err", err)
					d.complete(amqp.Errorf(amqp.InternalError, "cannot store metadata: %v", err))
					return
				}
				d.complete(nil)
			})
			return nil
		}
		d.mu.Unlock()
	}
	if err := b.db.CommitSync(batch); err != nil {
		b.log.Error("cannot store metadata", "err", err)
		return amqp.Errorf(amqp.InternalError, "cannot store metadata: %v", err)
	}
	return nil
}
