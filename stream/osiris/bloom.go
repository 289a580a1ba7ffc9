package osiris

// The bloom filter is osiris_bloom's: a filter of size bytes is size*8 bits, numbered from the
// most significant bit of the first byte; bit 0 says the chunk has records without a filter
// value, and each filter value V sets bits erlang:phash2(V, size*8-1)+1 and
// erlang:phash2([V], size*8-1)+1. phash2 of a binary and of a one-binary list are reproduced
// here (ERTS make_hash2: Bob Jenkins' block hash with its constants; checked against erl), so
// Warren's chunks carry the same filter bits RabbitMQ's do.

const (
	hconst   = 0x9e3779b9 // the golden ratio, ERTS's HCONST
	hconst2  = 0x3c6ef372 // HCONST * 2
	hconst13 = 0x08d12e65 // HCONST * 13
)

func mix(a, b, c uint32) (uint32, uint32, uint32) {
	a -= b
	a -= c
	a ^= c >> 13
	b -= c
	b -= a
	b ^= a << 8
	c -= a
	c -= b
	c ^= b >> 13
	a -= b
	a -= c
	a ^= c >> 12
	b -= c
	b -= a
	b ^= a << 16
	c -= a
	c -= b
	c ^= b >> 5
	a -= b
	a -= c
	a ^= c >> 3
	b -= c
	b -= a
	b ^= a << 10
	c -= a
	c -= b
	c ^= b >> 15
	return a, b, c
}

func le32(k []byte) uint32 {
	return uint32(k[0]) | uint32(k[1])<<8 | uint32(k[2])<<16 | uint32(k[3])<<24
}

// blockHash is ERTS's block_hash.
func blockHash(k []byte, initval uint32) uint32 {
	a, b, c := uint32(hconst), uint32(hconst), initval
	length := len(k)
	for len(k) >= 12 {
		a += le32(k)
		b += le32(k[4:])
		c += le32(k[8:])
		a, b, c = mix(a, b, c)
		k = k[12:]
	}
	c += uint32(length)
	// The remaining bytes, as the C switch with fall-through adds them.
	n := len(k)
	if n >= 11 {
		c += uint32(k[10]) << 24
	}
	if n >= 10 {
		c += uint32(k[9]) << 16
	}
	if n >= 9 {
		c += uint32(k[8]) << 8
	}
	if n >= 8 {
		b += uint32(k[7]) << 24
	}
	if n >= 7 {
		b += uint32(k[6]) << 16
	}
	if n >= 6 {
		b += uint32(k[5]) << 8
	}
	if n >= 5 {
		b += uint32(k[4])
	}
	if n >= 4 {
		a += uint32(k[3]) << 24
	}
	if n >= 3 {
		a += uint32(k[2]) << 16
	}
	if n >= 2 {
		a += uint32(k[1]) << 8
	}
	if n >= 1 {
		a += uint32(k[0])
	}
	_, _, c = mix(a, b, c)
	return c
}

// phash2Binary is the 32-bit make_hash2 of a non-empty binary (erlang:phash2(B, 1 bsl 32)).
func phash2Binary(v []byte) uint32 {
	return blockHash(v, hconst13)
}

// phash2ListOfBinary is make_hash2 of [B]: the binary, then the list's nil tail.
func phash2ListOfBinary(v []byte) uint32 {
	h := blockHash(v, hconst13)
	a, b := uint32(hconst2+2), uint32(hconst2)
	_, _, h = mix(a, b, h)
	return h
}

// bloomHashes returns the two bit positions of a non-empty filter value in a filter of bits
// bits (osiris_bloom:make_hash/2).
func bloomHashes(v []byte, bits int) (int, int) {
	m := uint32(bits - 1)
	return int(phash2Binary(v)%m) + 1, int(phash2ListOfBinary(v)%m) + 1
}

func setBloomBit(f []byte, bit int) {
	f[bit/8] |= 0x80 >> (bit % 8)
}

func bloomBit(f []byte, bit int) bool {
	return f[bit/8]&(0x80>>(bit%8)) != 0
}

// BloomMatch reports whether a chunk with bloom filter bloom may hold a record a consumer
// filtering on values wants (matchUnfiltered: also records without a filter value), as
// osiris_bloom:is_match/2 decides. A chunk without a bloom filter has no filtered records: it
// matches only with matchUnfiltered. A true answer can be a false positive: consumers check each
// record's filter value again. No values means no filtering: everything matches. An empty value
// stands for "no filter value", as in osiris.
func BloomMatch(bloom []byte, values [][]byte, matchUnfiltered bool) bool {
	if len(values) == 0 {
		return true
	}
	if len(bloom) == 0 {
		return matchUnfiltered
	}
	if matchUnfiltered && bloomBit(bloom, 0) {
		return true
	}
	for _, v := range values {
		if len(v) == 0 {
			if bloomBit(bloom, 0) {
				return true
			}
			continue
		}
		h1, h2 := bloomHashes(v, len(bloom)*8)
		if bloomBit(bloom, h1) && bloomBit(bloom, h2) {
			return true
		}
	}
	return false
}
