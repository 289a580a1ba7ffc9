package queue

import (
	"log/slog"
	"time"
)

// PublishStatus says what became of a published message (see Queue.Publish).
type PublishStatus uint8

// Publish outcomes.
const (
	Accepted PublishStatus = iota // enqueued (or dead-lettered at once by its TTL, or a duplicate dropped)
	Rejected                      // refused by x-overflow reject-publish(-dlx): nack the publisher
	Gone                          // the queue was deleted
)

// ConsumerNode returns the node tag of a consumer id: replicated queues need consumer ids that are
// unique in the cluster, so the core builds them as node tag (16 bits) | boot epoch (16 bits) |
// counter (32 bits).
func ConsumerNode(id ConsumerID) uint16 { return uint16(id >> 48) }

// ConsumerEpoch returns the boot epoch part of a consumer id (see ConsumerNode).
func ConsumerEpoch(id ConsumerID) uint16 { return uint16(id >> 32) }

// finish reports a publish's outcome to its Done, if any.
func finish(done Done, err error) {
	if done != nil {
		done.Done(err)
	}
}

func nowMs() int64 { return time.Now().UnixMilli() }

// checkoutBatch bounds the deliveries one checkout hands out while the queue's lock is held.
const checkoutBatch = 128

// Flow control between publishers and a queue's consumers: while a queue with consumers has more
// than flowHigh ready messages, each publish to it waits (at most flowMaxWait) until the consumers
// have brought it under flowLow. Like RabbitMQ's credit flow, this keeps a fast publisher from
// starving the consumers of CPU and from growing the queue without bound; with no consumers the
// queue simply grows (and pages to disk).
const (
	flowHigh    = 2048
	flowLow     = 1024
	flowMaxWait = 50 * time.Millisecond
)

// flowGate holds back publishers while a queue with consumers is long (see flowHigh). Its methods
// are called with the queue's lock held, except wait.
type flowGate struct {
	ch chan struct{} // closed when the queue drains under flowLow; nil when not throttling
}

// throttle returns the channel a publisher waits on, or nil if the queue is short enough.
func (g *flowGate) throttle(ready, consumers int) chan struct{} {
	if consumers == 0 || ready <= flowHigh {
		return nil
	}
	if g.ch == nil {
		g.ch = make(chan struct{})
	}
	return g.ch
}

// release lets throttled publishers go once the queue is short again, has no consumers, or is
// closed.
func (g *flowGate) release(ready, consumers int, closed bool) {
	if g.ch != nil && (ready < flowLow || consumers == 0 || closed) {
		close(g.ch)
		g.ch = nil
	}
}

// wait blocks a publisher on ch (from throttle, not nil) for at most flowMaxWait.
func (g *flowGate) wait(ch chan struct{}) {
	t := time.NewTimer(flowMaxWait)
	select {
	case <-ch:
	case <-t.C:
	}
	t.Stop()
}

func loggerOr(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.Default()
	}
	return l
}
