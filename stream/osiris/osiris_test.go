package osiris

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash/crc32"
	"testing"
)

// delivered is the chunk of the deliver frame RabbitMQ 3.10.8 sent to rabbitmq-stream-go-client
// for three messages published by a deduplicating publisher (see
// server/streamproto/wire/testdata): header and data, the 26-byte trailer not sent.
const delivered = "5000000300000003000001a2334bdd9900000000000000010000000000000000a829d3440000008f0000001a00000000" +
	"0000000a005375a00568656c6c6f0000005b005373d0000000320000000ca10469642d31a005677565737440a1047375626aa1027274" +
	"a103632d31a30a746578742f706c61696e4040404043005374d10000000f00000004a1016ba10176a1016e5407005375a005776f726c64" +
	"0000001e005372d10000000e00000002a305782d616e6ea10161005375a003000102"

func TestParseRabbitMQDeliveredChunk(t *testing.T) {
	raw, _ := hex.DecodeString(delivered)
	c, err := ParseDelivered(raw)
	if err != nil {
		t.Fatal(err)
	}
	want := Header{Type: ChunkUser, NumEntries: 3, NumRecords: 3, Timestamp: 0x1a2334bdd99, Epoch: 1, ChunkID: 0,
		CRC: 0xa829d344, DataLength: 143, TrailerLength: 26, BloomSize: 0}
	if c.Header != want {
		t.Fatalf("header %+v\nwant   %+v", c.Header, want)
	}
	var recs [][]byte
	for rest := c.Data; len(rest) > 0; {
		e, next, err := NextEntry(rest)
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, e.Data)
		rest = next
	}
	if len(recs) != 3 || !bytes.Equal(recs[0], []byte("\x00\x53\x75\xa0\x05hello")) {
		t.Fatalf("records %x", recs)
	}

	// The same chunk rebuilt with the Builder (with the publisher's tracking entry in the
	// trailer) is byte for byte what RabbitMQ stored: its delivered form equals the capture.
	var b Builder
	b.Reset(ChunkUser, 0, 0x1a2334bdd99, 1, 0)
	for _, r := range recs {
		if err := b.Add(r, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.AddTracking(TrackingSequence, []byte("capture-producer"), 3); err != nil {
		t.Fatal(err)
	}
	stored, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	sc, rest, err := Parse(stored)
	if err != nil || len(rest) != 0 {
		t.Fatalf("Parse: %v, %d left", err, len(rest))
	}
	h, d := sc.DeliverParts()
	if got := append(append([]byte{}, h...), d...); !bytes.Equal(got, raw) {
		t.Fatalf("rebuilt delivered chunk\n %x\nwant %x", got, raw)
	}
	tr, _, err := NextTracking(sc.Trailer)
	if err != nil || string(tr.ID) != "capture-producer" || tr.Value != 3 || tr.Type != TrackingSequence {
		t.Fatalf("trailer %+v %v", tr, err)
	}
}

func TestBuilderRoundTrip(t *testing.T) {
	var b Builder
	cases := []struct {
		name    string
		build   func(*Builder) error
		entries int
		records int
		bloom   bool
	}{
		{"one record", func(b *Builder) error { return b.Add([]byte("x"), nil) }, 1, 1, false},
		{"empty record", func(b *Builder) error { return b.Add([]byte{}, nil) }, 1, 1, false},
		{"filtered", func(b *Builder) error {
			if err := b.Add([]byte("a"), []byte("eu")); err != nil {
				return err
			}
			return b.Add([]byte("b"), nil)
		}, 2, 2, true},
		{"sub-batch", func(b *Builder) error {
			var body []byte
			for _, r := range []string{"r1", "r22", "r333"} {
				body = binary.BigEndian.AppendUint32(body, uint32(len(r)))
				body = append(body, r...)
			}
			if err := b.AddSubBatch(CompressionNone, 3, uint32(len(body)), body, nil); err != nil {
				return err
			}
			if err := b.AddSubBatch(CompressionGzip, 10, 1000, []byte("gzipped"), nil); err != nil {
				return err
			}
			return b.Add([]byte("simple"), nil)
		}, 3, 14, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b.Reset(ChunkUser, 100, 1700000000000, 3, 0)
			if err := tc.build(&b); err != nil {
				t.Fatal(err)
			}
			stored, err := b.Finish()
			if err != nil {
				t.Fatal(err)
			}
			c, rest, err := Parse(append(append([]byte{}, stored...), "next chunk"...))
			if err != nil {
				t.Fatal(err)
			}
			if string(rest) != "next chunk" {
				t.Fatalf("rest %q", rest)
			}
			if int(c.NumEntries) != tc.entries || int(c.NumRecords) != tc.records || c.ChunkID != 100 ||
				c.Timestamp != 1700000000000 || c.Epoch != 3 || c.NextChunkID() != 100+uint64(tc.records) {
				t.Fatalf("header %+v", c.Header)
			}
			if (c.BloomSize != 0) != tc.bloom || (tc.bloom && c.BloomSize != DefaultBloomSize) {
				t.Fatalf("bloom size %d", c.BloomSize)
			}
			if c.CRC != crc32.ChecksumIEEE(c.Data) {
				t.Fatal("crc")
			}
			h, d := c.DeliverParts()
			dc, err := ParseDelivered(append(append([]byte{}, h...), d...))
			if err != nil || dc.Header != c.Header {
				t.Fatalf("delivered form: %v", err)
			}
		})
	}
	// Records of an uncompressed sub-batch.
	b.Reset(ChunkUser, 0, 0, 0, 0)
	body := binary.BigEndian.AppendUint32(nil, 2)
	body = append(body, "hi"...)
	if err := b.AddSubBatch(CompressionNone, 1, uint32(len(body)), body, nil); err != nil {
		t.Fatal(err)
	}
	stored, _ := b.Finish()
	c, _, _ := Parse(stored)
	e, _, _ := NextEntry(c.Data)
	r, rest, err := NextRecord(e.Data)
	if err != nil || string(r) != "hi" || len(rest) != 0 || !e.SubBatch || e.Records != 1 {
		t.Fatalf("record %q %v %+v", r, err, e)
	}
}

func TestBloomMatch(t *testing.T) {
	var b Builder
	b.Reset(ChunkUser, 0, 0, 0, 32)
	b.Add([]byte("1"), []byte("eu"))
	b.Add([]byte("2"), []byte("us"))
	stored, _ := b.Finish()
	c, _, err := Parse(stored)
	if err != nil || c.BloomSize != 32 {
		t.Fatalf("%v size %d", err, c.BloomSize)
	}
	vals := func(s ...string) [][]byte {
		var out [][]byte
		for _, v := range s {
			out = append(out, []byte(v))
		}
		return out
	}
	if !BloomMatch(c.Bloom, vals("eu"), false) || !BloomMatch(c.Bloom, vals("apac", "us"), false) {
		t.Fatal("filter values present do not match")
	}
	if BloomMatch(c.Bloom, vals("definitely-absent-value-xyz"), true) && bloomBit(c.Bloom, 0) {
		t.Fatal("unfiltered bit set without unfiltered records")
	}
	if !BloomMatch(nil, nil, false) || BloomMatch(nil, vals("eu"), false) || !BloomMatch(nil, vals("eu"), true) {
		t.Fatal("chunk without bloom filter")
	}
	// Only unfiltered records: no bloom filter is written, as osiris does.
	b.Reset(ChunkUser, 0, 0, 0, 0)
	b.Add([]byte("1"), nil)
	stored, _ = b.Finish()
	if c, _, _ := Parse(stored); c.BloomSize != 0 {
		t.Fatalf("bloom size %d for unfiltered records", c.BloomSize)
	}
	// Mixed: bit 0 is set.
	b.Reset(ChunkUser, 0, 0, 0, 0)
	b.Add([]byte("1"), nil)
	b.Add([]byte("2"), []byte("eu"))
	stored, _ = b.Finish()
	c, _, _ = Parse(stored)
	if !bloomBit(c.Bloom, 0) || !BloomMatch(c.Bloom, vals("other"), true) {
		t.Fatal("unfiltered bit")
	}
}

func TestCorruptChunks(t *testing.T) {
	var b Builder
	b.Reset(ChunkUser, 5, 1, 1, 0)
	b.Add([]byte("hello"), []byte("f"))
	b.Add([]byte("world"), nil)
	b.AddTracking(TrackingSequence, []byte("p"), 1)
	stored, _ := b.Finish()
	good := append([]byte{}, stored...)
	for n := 0; n < len(good); n++ {
		if _, _, err := Parse(good[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("prefix %d: %v", n, err)
		}
	}
	mutate := func(i int, v byte) []byte {
		c := append([]byte{}, good...)
		c[i] = v
		return c
	}
	bad := map[string][]byte{
		"magic":      mutate(0, 0x51),
		"type":       mutate(1, 3),
		"crc":        mutate(32, good[32]^1),
		"entries":    mutate(3, 3),
		"records":    mutate(7, 1),
		"bloom size": mutate(44, 8),
		"data byte":  mutate(HeaderSize+DefaultBloomSize+5, 'x'),
	}
	for name, c := range bad {
		if _, _, err := Parse(c); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := ParseDelivered(good); !errors.Is(err, ErrCorrupt) {
		t.Errorf("stored chunk parsed as delivered: %v", err)
	}
}

func TestBuilderErrors(t *testing.T) {
	var b Builder
	b.Reset(ChunkUser, 0, 0, 0, 8)
	if err := b.Add([]byte("x"), nil); err == nil {
		t.Fatal("bloom size 8 accepted")
	}
	b.Reset(ChunkUser, 0, 0, 0, 0)
	if _, err := b.Finish(); err == nil {
		t.Fatal("empty chunk")
	}
	if err := b.AddSubBatch(CompressionNone, 1, 10, []byte("short"), nil); err == nil {
		t.Fatal("sizes of an uncompressed sub-batch")
	}
	if err := b.AddSubBatch(8, 1, 10, []byte("x"), nil); err == nil {
		t.Fatal("compression 8")
	}
	if err := b.AddTracking(TrackingOffset, bytes.Repeat([]byte("x"), 256), 1); err == nil {
		t.Fatal("long tracking id")
	}
}

// TestBuilderDoesNotAllocate: a reused Builder builds a chunk of 100 records without allocating.
func TestBuilderDoesNotAllocate(t *testing.T) {
	var b Builder
	rec := bytes.Repeat([]byte("m"), 100)
	build := func() {
		b.Reset(ChunkUser, 0, 0, 0, 0)
		for i := 0; i < 100; i++ {
			if err := b.Add(rec, []byte("eu")); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := b.Finish(); err != nil {
			t.Fatal(err)
		}
	}
	build()
	if a := testing.AllocsPerRun(50, build); a != 0 {
		t.Fatalf("%v allocations per chunk", a)
	}
}

func FuzzParse(f *testing.F) {
	raw, _ := hex.DecodeString(delivered)
	f.Add(raw)
	var b Builder
	b.Reset(ChunkUser, 1, 2, 3, 0)
	b.Add([]byte("a"), []byte("x"))
	b.AddSubBatch(CompressionNone, 1, 5, []byte{0, 0, 0, 1, 'z'}, nil)
	b.AddTracking(TrackingOffset, []byte("c"), 9)
	stored, _ := b.Finish()
	f.Add(append([]byte{}, stored...))
	f.Fuzz(func(t *testing.T, data []byte) {
		if c, err := ParseDelivered(data); err == nil {
			walk(t, c)
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("error %v does not wrap ErrCorrupt", err)
		}
		for rest := data; len(rest) > 0; {
			c, next, err := Parse(rest)
			if err != nil {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("error %v does not wrap ErrCorrupt", err)
				}
				return
			}
			walk(t, c)
			if len(next) >= len(rest) {
				t.Fatal("no progress")
			}
			rest = next
		}
	})
}

// walk reads every entry and record of a chunk that parsed: it must not fail.
func walk(t *testing.T, c Chunk) {
	for rest := c.Data; len(rest) > 0; {
		e, next, err := NextEntry(rest)
		if err != nil {
			t.Fatalf("entry of a parsed chunk: %v", err)
		}
		if e.SubBatch && e.Compression == CompressionNone {
			for body := e.Data; len(body) > 0; {
				_, r, err := NextRecord(body)
				if err != nil {
					break // the record framing inside a sub-batch is the publisher's
				}
				body = r
			}
		}
		rest = next
	}
}

func BenchmarkBuildAndParse(b *testing.B) {
	var bl Builder
	rec := bytes.Repeat([]byte("m"), 12)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		bl.Reset(ChunkUser, uint64(i)*100, 1, 1, 0)
		for j := 0; j < 100; j++ {
			bl.Add(rec, nil)
		}
		stored, err := bl.Finish()
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := Parse(stored); err != nil {
			b.Fatal(err)
		}
	}
}

// TestPhash2 checks the bloom filter's hashes against erlang:phash2 (values printed by erl:
// erlang:phash2(V, 1 bsl 32) and erlang:phash2([V], 1 bsl 32), and with ranges 127 and 2039).
func TestPhash2(t *testing.T) {
	cases := []struct {
		v           string
		h27, l27    uint32 // phash2/1 (the hash masked to 27 bits)
		r127, l2039 uint32
	}{
		{"eu", 41639428, 77685158, 13, 1643},
		{"us", 58961473, 59420817, 20, 591},
		{"a", 112802447, 53691870, 100, 1027},
		{"hello world, a longer value!", 42579771, 47922541, 112, 97},
		{"0123456789ab", 115360506, 119280432, 6, 1317},
		{"0123456789abc", 67923675, 56666097, 14, 594},
		{"\xff\x00\x80", 70739353, 80491239, 103, 540},
	}
	for _, tc := range cases {
		v := []byte(tc.v)
		h, l := phash2Binary(v), phash2ListOfBinary(v)
		if h&(1<<27-1) != tc.h27 || l&(1<<27-1) != tc.l27 || h%127 != tc.r127 || l%2039 != tc.l2039 {
			t.Errorf("%q: phash2 %d/%d, [V] %d/%d; want %d/%d, %d/%d", tc.v, h&(1<<27-1), h%127, l&(1<<27-1), l%2039, tc.h27, tc.r127, tc.l27, tc.l2039)
		}
	}
	if h, l := phash2Binary([]byte("eu")), phash2ListOfBinary([]byte("eu")); h != 3128647172 || l != 1151426982 {
		t.Errorf("full 32-bit hashes %d %d", h, l)
	}
}

// TestBloomBitsAsOsiris: the filter of a chunk with values "eu" and "us" (and then also an
// unfiltered record) has the bits osiris_bloom sets, computed with erl from phash2.
func TestBloomBitsAsOsiris(t *testing.T) {
	for _, tc := range []struct {
		unfiltered bool
		want       string
	}{
		{false, "08020440000000000000000000000000"},
		{true, "88020440000000000000000000000000"},
	} {
		var b Builder
		b.Reset(ChunkUser, 0, 0, 0, 16)
		b.Add([]byte("1"), []byte("eu"))
		b.Add([]byte("2"), []byte("us"))
		if tc.unfiltered {
			b.Add([]byte("3"), nil)
		}
		stored, _ := b.Finish()
		c, _, err := Parse(stored)
		if err != nil {
			t.Fatal(err)
		}
		if got := hex.EncodeToString(c.Bloom); got != tc.want {
			t.Errorf("unfiltered=%v: bloom %s, want %s", tc.unfiltered, got, tc.want)
		}
	}
}

// TestBuilderDetach: a detached chunk is the caller's (building the next chunk leaves it as it
// was), an entry added after Finish goes into the chunk (Finish again includes it, with the
// trailer once), and an entry added after Detach without a Reset is refused.
func TestBuilderDetach(t *testing.T) {
	var b Builder
	b.Reset(ChunkUser, 10, 0, 1, 0)
	if err := b.Add([]byte("first"), []byte("eu")); err != nil {
		t.Fatal(err)
	}
	if err := b.AddTracking(TrackingSequence, []byte("pub"), 7); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Finish(); err != nil {
		t.Fatal(err)
	}
	if err := b.Add([]byte("second"), nil); err != nil {
		t.Fatal(err)
	}
	one, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	kept := append([]byte{}, one...)
	b.Detach()
	if err := b.Add([]byte("x"), nil); err == nil {
		t.Fatal("Add after Detach without Reset accepted")
	}
	b.Reset(ChunkUser, 12, 0, 1, 0)
	for i := 0; i < 50; i++ {
		if err := b.Add(bytes.Repeat([]byte("y"), 64), nil); err != nil {
			t.Fatal(err)
		}
	}
	two, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(one, kept) {
		t.Fatal("the detached chunk changed while the next one was built")
	}
	c, rest, err := Parse(one)
	if err != nil || len(rest) != 0 {
		t.Fatalf("detached chunk: %v, %d bytes left", err, len(rest))
	}
	if c.NumEntries != 2 || c.BloomSize != DefaultBloomSize || c.TrailerLength != uint32(len(c.Trailer)) {
		t.Fatalf("detached chunk header %+v", c.Header)
	}
	var recs []string
	for d := c.Data; len(d) > 0; {
		e, next, err := NextEntry(d)
		if err != nil {
			t.Fatal(err)
		}
		recs, d = append(recs, string(e.Data)), next
	}
	if len(recs) != 2 || recs[0] != "first" || recs[1] != "second" {
		t.Fatalf("records %q", recs)
	}
	if c2, _, err := Parse(two); err != nil || c2.NumRecords != 50 || c2.BloomSize != 0 {
		t.Fatalf("next chunk: %v %+v", err, c2.Header)
	}
}
