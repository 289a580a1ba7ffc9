package osiris

// The bloom filter follows osiris_bloom's layout: a filter of size bytes is size*8 bits, bit 0
// (the most significant bit of the first byte) says the chunk has records without a filter
// value, and each filter value sets two bits in 1..size*8-1. osiris picks those two bits with
// erlang:phash2, which this package does not reproduce: it uses two FNV-1a hashes instead. The
// filter is read only by the server that wrote it (deliveries leave it out), so a Warren chunk
// and a RabbitMQ chunk need not agree on bit positions; everything else about the chunk does.

// bloomHashes returns the two bit positions of a filter value in a filter of bits bits.
func bloomHashes(v []byte, bits int) (int, int) {
	const offset, prime = 2166136261, 16777619
	a, b := uint32(offset), uint32(offset)
	b = (b ^ 0xff) * prime // the second hash is FNV-1a of 0xff followed by the value
	for _, c := range v {
		a = (a ^ uint32(c)) * prime
		b = (b ^ uint32(c)) * prime
	}
	m := uint32(bits - 1)
	return int(a%m) + 1, int(b%m) + 1
}

func setBloomBit(f []byte, bit int) {
	f[bit/8] |= 0x80 >> (bit % 8)
}

func bloomBit(f []byte, bit int) bool {
	return f[bit/8]&(0x80>>(bit%8)) != 0
}

// BloomMatch reports whether a chunk with bloom filter bloom may hold a record a consumer
// filtering on values wants (matchUnfiltered: also records without a filter value). A chunk
// without a bloom filter has no filtered records: it matches only with matchUnfiltered (osiris
// reads a missing filter the same way). A true answer can be a false positive: consumers check
// each record's filter value again. No values means no filtering: everything matches.
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
		h1, h2 := bloomHashes(v, len(bloom)*8)
		if bloomBit(bloom, h1) && bloomBit(bloom, h2) {
			return true
		}
	}
	return false
}
