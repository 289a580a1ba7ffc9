package queue

import (
	"io"
	"os"
	"strconv"
	"testing"
	"time"

	"warren/storage"
)

// nopRep is a Replicator whose proposals are dropped: the benchmark applies commands itself.
type nopRep struct{}

func (nopRep) Propose(_ []byte, done func(uint64, []byte, error)) { go done(0, nil, nil) }
func (nopRep) IsLeader() bool                                     { return false }

// BenchmarkQuorumSnapshotBacklog measures a replica snapshot with a backlog of 1 KB persistent
// messages (WARREN_SNAPSHOT_BACKLOG, default 100,000) applied through Apply: blocked-ms is how
// long CaptureSnapshot holds raft's FSM goroutine, write-ms how long streaming the snapshot takes
// afterwards (off that goroutine), and snapshot-MB its size.
func BenchmarkQuorumSnapshotBacklog(b *testing.B) {
	n := 100_000
	if v, err := strconv.Atoi(os.Getenv("WARREN_SNAPSHOT_BACKLOG")); err == nil && v > 0 {
		n = v
	}
	db := openDB(b, b.TempDir())
	defer db.Close()
	q, err := OpenQuorum(OpenConfig{Name: "snap", ID: 7, DB: db, Lifecycle: DefaultConfig(), Logger: quiet},
		QuorumConfig{Replicator: nopRep{}, Node: 1, Epoch: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	body := make([]byte, 1024)
	for i := 1; i <= n; i++ {
		cmd := Command{Type: CmdEnqueue, Msg: &Message{RoutingKey: "snap", Body: body, Persistent: true},
			Producer: 1, Seq: uint64(i)}
		q.Apply(uint64(i), encode(&cmd, 1100))
	}
	// The records the applies submitted are committed first: what a snapshot waits for in a
	// running broker is the committer's queue at that moment, not a million queued writes.
	if err := db.CommitSync(&storage.Batch{}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	var blocked, write time.Duration
	var size int64
	for i := 0; i < b.N; i++ {
		start := time.Now()
		snap, err := q.CaptureSnapshot(true)
		if err != nil {
			b.Fatal(err)
		}
		blocked += time.Since(start)
		start = time.Now()
		size, err = snap.WriteTo(io.Discard)
		if err != nil {
			b.Fatal(err)
		}
		write += time.Since(start)
		snap.Release()
	}
	b.ReportMetric(float64(blocked.Milliseconds())/float64(b.N), "blocked-ms")
	b.ReportMetric(float64(write.Milliseconds())/float64(b.N), "write-ms")
	b.ReportMetric(float64(size)/(1<<20), "snapshot-MB")
}
