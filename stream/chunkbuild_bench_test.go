package stream

import (
	"bytes"
	"testing"
)

// BenchmarkChunkBuild builds the chunks a writer makes of 1 KB stream-protocol records, 100 per
// chunk, as writeSome does: add, finish and split (the chunk is kept, as the cache keeps it).
func BenchmarkChunkBuild(b *testing.B) {
	rec := Record{Raw: bytes.Repeat([]byte("m"), 1024)}
	var cb chunkBuilder
	b.SetBytes(100 * 1024)
	b.ReportAllocs()
	var first uint64
	for b.Loop() {
		cb.reset(first, 0, 1)
		for range 100 {
			if err := cb.add(&rec); err != nil {
				b.Fatal(err)
			}
		}
		blob, err := cb.finish()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := splitChunk(blob); err != nil {
			b.Fatal(err)
		}
		first += 100
	}
}
