package stream

import (
	"errors"
	"maps"
	"sync"
	"testing"
)

// pub is a record of publisher id with publishing id seq; its body names both.
func pub(id string, seq uint64) Record {
	return Record{PublisherID: id, PublishingID: seq, Body: []byte(id + "/" + string(rune('0'+seq%10)))}
}

// TestDeduplicationWithInterleavedWriters appends batches whose records alternate between
// writers and repeat sequences, in chunks of a few records so a writer's sequences span chunks:
// only records above their writer's highest stored sequence are kept, before and after a restart.
func TestDeduplicationWithInterleavedWriters(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	opts := Options{ChunkMaxRecords: 3}
	l := openLog(t, db, 5, opts)

	appendSync(t, l,
		pub("a", 1), pub("a", 2), pub("b", 1), pub("a", 3), pub("a", 2), // a2 repeated
		pub("b", 1), pub("b", 2), pub("a", 4), pub("b", 2), pub("c", 7), // b1, b2 repeated
	)
	// A record with both a publisher id and an internal writer id, and the internal writer alone.
	both := pub("a", 5)
	both.WriterID, both.WriterSeq = "node-1", 1
	appendSync(t, l, both, pub("a", 5), Record{WriterID: "node-1", WriterSeq: 1, Body: []byte("w1")},
		Record{WriterID: "node-1", WriterSeq: 2, Body: []byte("w2")}, pub("c", 6), pub("c", 8))

	want := []string{"a/1", "a/2", "b/1", "a/3", "b/2", "a/4", "c/7", "a/5", "w2", "c/8"}
	check := func(l *Log, when string) {
		t.Helper()
		es := readAll(t, l, 0)
		var got []string
		for _, e := range es {
			got = append(got, string(e.Body))
		}
		if len(got) != len(want) {
			t.Fatalf("%s: stored %q, want %q", when, got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%s: stored %q, want %q", when, got, want)
			}
		}
		wantSeqs := map[string]uint64{"a": 5, "b": 2, "c": 8, "node-1": 2}
		if ws := l.Writers(); !maps.Equal(ws, wantSeqs) {
			t.Fatalf("%s: writers %v, want %v", when, ws, wantSeqs)
		}
	}
	check(l, "after the appends")

	db, l = reopen(t, dir, db, l, opts)
	check(l, "after a restart")
	// Repeats after the restart are still dropped, new sequences kept.
	appendSync(t, l, pub("b", 2), pub("a", 5), pub("b", 3), pub("a", 6))
	want = append(want, "b/3", "a/6")
	es := readAll(t, l, 0)
	if len(es) != len(want) || string(es[len(es)-2].Body) != "b/3" || string(es[len(es)-1].Body) != "a/6" {
		t.Fatalf("after a restart, appends stored %d records, want %d ending b/3, a/6", len(es), len(want))
	}
}

// TestAGappedAppendIsAnsweredOnce puts an append refused as a gap (its writer's earlier
// sequences are missing) in the same batch as one whose chunk cannot be built: each append's done
// runs exactly once, the gapped one with ErrGap.
func TestAGappedAppendIsAnsweredOnce(t *testing.T) {
	db := openDB(t, t.TempDir())
	l := openLog(t, db, 1, Options{})
	release := holdCommitter(db)

	var mu sync.Mutex
	calls := map[string][]error{}
	appendAs := func(name string, recs ...Record) {
		l.Append(recs, func(_ uint64, err error) {
			mu.Lock()
			calls[name] = append(calls[name], err)
			mu.Unlock()
		})
	}
	appendAs("first", rec(0)) // batch 1: submitted, waits for the committer
	waitFor(t, "batch 1 to be submitted", func() bool { return l.Written() == 1 })
	appendAs("second", rec(1)) // built while batch 1 is in flight
	waitFor(t, "the writer to take the second append", func() bool { return queuedAppends(l) == 0 })
	appendAs("gapped", Record{WriterID: "w", WriterSeq: 5, Body: []byte("gap")})
	// A sub-batch entry that says it holds 100 bytes and holds none: its chunk cannot be built.
	appendAs("malformed", Record{Raw: []byte{0x80, 0, 1, 0, 0, 0, 1, 0, 0, 0, 100}})
	waitFor(t, "both appends to be queued", func() bool { return queuedAppends(l) == 2 })
	close(release)

	waitFor(t, "every append to be answered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(calls) == 4
	})
	// Let a second answer, if any, arrive.
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for name, errs := range calls {
		if len(errs) != 1 {
			t.Errorf("append %q answered %d times: %v", name, len(errs), errs)
		}
	}
	if errs := calls["gapped"]; len(errs) == 0 || !errors.Is(errs[0], ErrGap) {
		t.Errorf("the gapped append was answered with %v, want ErrGap", errs)
	}
	if errs := calls["malformed"]; len(errs) == 0 || errs[0] == nil {
		t.Errorf("the malformed append was answered with %v, want an error", errs)
	}
}
