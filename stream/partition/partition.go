// Package partition picks the partition of a super stream for a routing key the way
// RabbitMQ's stream clients do with hash routing (Java HashRoutingStrategy, Go
// HashRoutingStrategy, .NET HashRoutingMurmurStrategy): MurmurHash3 x86 32-bit of the routing
// key's UTF-8 bytes with seed 104729, as an unsigned 32-bit number, modulo the number of
// partitions, indexing the partitions in their partition order (x-stream-partition-order).
// The Java client takes Integer.remainderUnsigned of its int hash, the Go and .NET clients
// uint32 %: all unsigned, so a hash with the top bit set never gives a negative index.
//
// Warren routes AMQP 0-9-1 publishes to a super stream with Index, so that 0-9-1 publishers
// and stream-protocol publishers agree on the partition of every key.
package partition

import (
	"encoding/binary"
	"math/bits"
)

// Seed is the seed every RabbitMQ stream client uses for hash routing.
const Seed = 104729

// Murmur3 returns MurmurHash3_x86_32 of data with seed.
func Murmur3(data []byte, seed uint32) uint32 {
	const (
		c1 = 0xcc9e2d51
		c2 = 0x1b873593
	)
	h := seed
	n := len(data)
	i := 0
	for ; i+4 <= n; i += 4 {
		k := binary.LittleEndian.Uint32(data[i:])
		k *= c1
		k = bits.RotateLeft32(k, 15)
		k *= c2
		h ^= k
		h = bits.RotateLeft32(h, 13)
		h = h*5 + 0xe6546b64
	}
	var k uint32
	switch n - i {
	case 3:
		k ^= uint32(data[i+2]) << 16
		fallthrough
	case 2:
		k ^= uint32(data[i+1]) << 8
		fallthrough
	case 1:
		k ^= uint32(data[i])
		k *= c1
		k = bits.RotateLeft32(k, 15)
		k *= c2
		h ^= k
	}
	h ^= uint32(n)
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

// Index returns the partition (0 .. n-1, in partition order) of routingKey in a super stream of
// n partitions, or -1 when n is not positive.
func Index(routingKey string, n int) int {
	if n <= 0 {
		return -1
	}
	return int(Murmur3([]byte(routingKey), Seed) % uint32(n))
}
