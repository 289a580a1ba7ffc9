package queue

// x-expires (RabbitMQ's queue TTL) of a replicated queue: a quorum queue, or a durable classic
// queue in a cluster. The queue is deleted once it has had no consumer and no basic.get for the
// period; for a replicated classic queue a redeclaration (passive too) also counts as a use, as
// for a classic queue, while a quorum queue's lease is not renewed by a redeclaration (RabbitMQ's
// rabbit_fifo keeps its last_active the same way).
//
// The uses are replicated commands (consume, cancel, basic.get, node reset, touch), so every
// replica sees them at the same log positions with the proposer's clock; each replica keeps the
// time of the last one it applied, and the leader, which alone decides, reports the queue through
// Hooks.Expired once no consumer is attached in the replicated state and the period has passed.
// The core then deletes it through the metadata group, on every member. The time is not part of
// the snapshot: a replica that installs one, or that starts, counts from the latest command time
// the state has seen or from its start, whichever is later, so a restart or a leader change can
// lengthen a lease but never cut one short.

// expiryRetry is how long the leader waits before reporting an expired queue again when the
// deletion did not happen (the metadata group had no majority, say).
const expiryRetry = 5000 // ms

// quorumExpiry is a replicated queue's x-expires bookkeeping, guarded by Quorum.mu.
type quorumExpiry struct {
	ttl        int64 // x-expires in ms; <= 0: none
	lastActive int64 // Unix ms of the last use applied (or of this replica's start or restore)
	reportedAt int64 // Unix ms of the last Hooks.Expired call; 0: none since the last use
}

// isUse reports whether an applied command of type t counts as a use of the queue; touch says
// whether redeclarations do (replicated classic queues).
func isUse(t CommandType) bool {
	switch t {
	case CmdConsume, CmdCancel, CmdGet, CmdTake, CmdNodeReset, CmdTouch:
		return true
	}
	return false
}

// used records a use applied at now (the state's clock); it reports whether the deadline moved.
func (e *quorumExpiry) used(now int64) bool {
	if e.ttl <= 0 || now <= e.lastActive {
		return false
	}
	e.lastActive, e.reportedAt = now, 0
	return true
}

// deadline is when the queue expires (ok=false: not while it has consumers or no TTL), or when
// the leader reports it again after a report that did not lead to its deletion.
func (e *quorumExpiry) deadline(consumers int) (at int64, ok bool) {
	if e.ttl <= 0 || consumers > 0 {
		return 0, false
	}
	if e.reportedAt != 0 {
		return e.reportedAt + expiryRetry, true
	}
	return e.lastActive + e.ttl, true
}

// due reports whether the leader should report the queue expired at now, and records the report.
func (e *quorumExpiry) due(now int64, consumers int) bool {
	at, ok := e.deadline(consumers)
	if !ok || now < at {
		return false
	}
	e.reportedAt = now
	return true
}
