package partition

import "testing"

func TestMurmur3KnownVectors(t *testing.T) {
	cases := []struct {
		data string
		seed uint32
		want uint32
	}{
		{"", 0, 0},
		{"", 1, 0x514e28b7},
		{"", 0xffffffff, 0x81f16f39},
		{"hello", 0, 0x248bfa47},
		{"\x00\x00\x00\x00", 0, 0x2362f9de},
		{"\xff\xff\xff\xff", 0, 0x76293b50},
		{"\x21\x43\x65\x87", 0, 0xf55b516b},
		{"\x21\x43\x65", 0, 0x7e4a8634}, // tail of 3
		{"\x21\x43", 0, 0xa0f7b07a},     // tail of 2
		{"\x21", 0, 0x72661cf4},         // tail of 1
		{"\xff", 0, 0xfd6cf10d},         // a tail byte with the top bit set (unsigned)
	}
	for _, tc := range cases {
		if got := Murmur3([]byte(tc.data), tc.seed); got != tc.want {
			t.Errorf("Murmur3(%q, %#x) = %#08x, want %#08x", tc.data, tc.seed, got, tc.want)
		}
	}
}

// TestClientHashes: hashes and partitions as rabbitmq-stream-go-client's HashRoutingStrategy
// computes them (spaolacci/murmur3 with seed 104729, uint32 modulo), recorded from it.
func TestClientHashes(t *testing.T) {
	cases := []struct {
		key      string
		hash     uint32
		of3, of7 int
	}{
		{"", 0xc6757d56, 1, 3},
		{"a", 0x40c5855a, 1, 2},
		{"ab", 0x17c238a8, 0, 5},
		{"abc", 0xcb3be711, 0, 2},
		{"abcd", 0xcbf34fec, 2, 2},
		{"hello", 0x4ec83379, 0, 5},
		{"order-12345", 0x56cc4fc2, 2, 3},
		{"customer-42", 0x04cdc68d, 2, 3},
		{"héllo wörld", 0xc83add5b, 0, 3},
		{"0", 0xae9784fd, 2, 4},
		{"1", 0x91cf8aee, 2, 5},
		{"2", 0x644a3f3d, 1, 1},
	}
	for _, tc := range cases {
		if h := Murmur3([]byte(tc.key), Seed); h != tc.hash {
			t.Errorf("hash(%q) = %#08x, want %#08x", tc.key, h, tc.hash)
		}
		if i := Index(tc.key, 3); i != tc.of3 {
			t.Errorf("Index(%q, 3) = %d, want %d", tc.key, i, tc.of3)
		}
		if i := Index(tc.key, 7); i != tc.of7 {
			t.Errorf("Index(%q, 7) = %d, want %d", tc.key, i, tc.of7)
		}
	}
	// The top bit set: a signed modulo would give a negative index.
	if h := Murmur3([]byte("abc"), Seed); h < 1<<31 {
		t.Fatal("test key should hash above 2^31")
	} else if i := Index("abc", 5); i != int(h%5) || i < 0 {
		t.Fatalf("Index = %d", i)
	}
	if Index("k", 0) != -1 || Index("k", 1) != 0 {
		t.Fatal("edge partition counts")
	}
}

func TestMurmur3DoesNotAllocate(t *testing.T) {
	key := []byte("order-12345")
	if a := testing.AllocsPerRun(100, func() { Murmur3(key, Seed) }); a != 0 {
		t.Fatalf("%v allocations", a)
	}
}

func BenchmarkIndex(b *testing.B) {
	for i := 0; i < b.N; i++ {
		Index("order-12345", 8)
	}
}
