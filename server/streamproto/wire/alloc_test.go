package wire

import (
	"bytes"
	"fmt"
	"testing"
)

func publishFrame(n, size int, filter bool) []byte {
	p := &Publish{PublisherID: 1}
	body := bytes.Repeat([]byte{'m'}, size)
	for i := 0; i < n; i++ {
		m := PublishedMessage{PublishingID: uint64(i), Data: body}
		if filter {
			m.FilterValue = []byte("region-eu")
		}
		p.Messages = append(p.Messages, m)
	}
	f, err := p.Append(nil)
	if err != nil {
		panic(err)
	}
	return f
}

// TestPublishDecodeDoesNotAllocate: decoding a publish frame into a reused Publish allocates
// nothing per message (nor per frame, once Messages has grown).
func TestPublishDecodeDoesNotAllocate(t *testing.T) {
	for _, filter := range []bool{false, true} {
		frame := publishFrame(100, 12, filter)[4:]
		var p Publish
		if err := p.Decode(frame); err != nil {
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(100, func() {
			if err := p.Decode(frame); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Fatalf("filter=%v: %v allocations per publish decode of 100 messages", filter, allocs)
		}
	}
}

// TestReadAndDecodePublishDoesNotAllocate: the whole read path (Reader + Decode) in steady state.
func TestReadAndDecodePublishDoesNotAllocate(t *testing.T) {
	frame := publishFrame(50, 100, false)
	src := bytes.NewReader(nil)
	stream := bytes.Repeat(frame, 4)
	r := NewReader(src, DefaultFrameMax)
	var p Publish
	allocs := testing.AllocsPerRun(200, func() {
		if src.Len() == 0 {
			src.Reset(stream)
		}
		f, err := r.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Decode(f); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per frame read and decoded", allocs)
	}
}

// TestDeliverEncodeDoesNotAllocate: writing a deliver frame header (and the chunk after it) into
// a buffer with room allocates nothing.
func TestDeliverEncodeDoesNotAllocate(t *testing.T) {
	chunk := make([]byte, 4096)
	buf := make([]byte, 0, 8192)
	for _, v := range []uint16{Version1, Version2} {
		allocs := testing.AllocsPerRun(100, func() {
			b := AppendDeliverHeader(buf[:0], v, 3, 99, uint32(len(chunk)))
			b = append(b, chunk...)
			if len(b) != DeliverHeaderSize(v)+len(chunk) {
				t.Fatal("size")
			}
		})
		if allocs != 0 {
			t.Fatalf("v%d: %v allocations per deliver encode", v, allocs)
		}
		d := &Deliver{SubscriptionID: 3, CommittedChunkID: 99, Chunk: chunk, Vers: v}
		allocs = testing.AllocsPerRun(100, func() {
			if _, err := d.Append(buf[:0]); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Fatalf("v%d: %v allocations per Deliver.Append", v, allocs)
		}
	}
	// The header announces the chunk that follows.
	b := AppendDeliverHeader(nil, Version2, 3, 99, uint32(len(chunk)))
	b = append(b, chunk...)
	var d Deliver
	if err := d.Decode(b[4:]); err != nil || d.CommittedChunkID != 99 || len(d.Chunk) != len(chunk) {
		t.Fatalf("decode: %v %+v", err, d.CommittedChunkID)
	}
}

func TestPublishConfirmEncodeDoesNotAllocate(t *testing.T) {
	ids := make([]uint64, 100)
	buf := make([]byte, 0, 2048)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := AppendPublishConfirm(buf[:0], 1, ids); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per publish confirm", allocs)
	}
}

func BenchmarkPublishDecode(b *testing.B) {
	for _, size := range []int{12, 1024} {
		frame := publishFrame(100, size, false)[4:]
		b.Run(fmt.Sprintf("100x%dB", size), func(b *testing.B) {
			var p Publish
			b.SetBytes(int64(len(frame)))
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if err := p.Decode(frame); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkDeliverHeader(b *testing.B) {
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		buf = AppendDeliverHeader(buf[:0], Version2, 1, uint64(i), 4096)
	}
}
