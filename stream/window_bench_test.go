package stream

import (
	"testing"
	"time"

	"warren/storage"
)

// BenchmarkWindowedAppendSync measures appends of 1 KB records by one writer keeping at most 100
// awaiting their callback, with real fsyncs: the latency-bound shape of a publisher with confirms.
func BenchmarkWindowedAppendSync(b *testing.B) {
	db, err := storage.Open(storage.Options{Dir: b.TempDir(), Logger: quietLogger(), GCInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	l, err := Open(db, 1, Options{Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	sem := make(chan struct{}, 100)
	body := make([]byte, 1024)
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		sem <- struct{}{}
		l.Append([]Record{{Body: body}}, func(uint64, error) { <-sem })
	}
	for range cap(sem) {
		sem <- struct{}{}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msg/s")
	l.mu.RLock()
	b.ReportMetric(float64(b.N)/float64(len(l.chunks)), "rec/chunk")
	l.mu.RUnlock()
	st := db.Stats()
	b.ReportMetric(float64(st.Txns), "txns")
}
