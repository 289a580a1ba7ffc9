package server

import (
	"time"

	"warren/server/cluster"
	"warren/server/core"
	"warren/server/stats"
	"warren/storage"
)

// This file is the node's view for the Prometheus exporter (server/metrics): numbers read from
// atomics and last samples, so that a scrape costs the broker's hot path nothing.

// Resources is the alarm watchdog's last sample of memory and disk; ok is false before Start.
func (s *Server) Resources() (r core.Resources, ok bool) {
	a := s.core.Alarms()
	if a == nil {
		return core.Resources{}, false
	}
	return a.Resources(), true
}

// RaftGroups describes the raft groups running on this node (the metadata group is id 0).
func (s *Server) RaftGroups() []cluster.GroupMetrics { return s.node.GroupMetrics() }

// StorageStats are the storage engine's cumulative commit counters and disk use.
func (s *Server) StorageStats() storage.Stats { return s.db.Stats() }

// StartedAt is when the node was configured (New).
func (s *Server) StartedAt() time.Time { return s.startedAt }

// StreamProtocolStats are the stream protocol's traffic counters (records published, routed,
// confirmed and delivered), its open subscriptions and its declared publishers; zero when the
// protocol is off.
func (s *Server) StreamProtocolStats() (totals stats.Values, consumers, publishers int) {
	if s.stream == nil {
		return stats.Values{}, 0, 0
	}
	consumers, publishers = s.stream.Clients()
	return s.stream.Counters(), consumers, publishers
}

// StreamLag is how far one reader of a stream is behind its last offset, for the exporter.
type StreamLag struct {
	VHost string
	// Stream is the stream read (for a consumer group, the partition).
	Stream string
	// Kind is "consumer" (Name: its tag), "offset" (a stored offset; Name: its reference) or
	// "group" (a consumer group's partition; Name: the group).
	Kind, Name string
	// Offset is the consumer's next offset or the committed offset (HasOffset false: none).
	Offset    uint64
	HasOffset bool
	Lag       uint64
}

// StreamLags lists every stream reader's lag on this node: stream consumers (AMQP 0-9-1),
// stored offsets and consumer groups' partitions. A group's committed offsets are stored
// offsets of its partitions too; they are listed once, as the group's.
func (s *Server) StreamLags() []StreamLag {
	var out []StreamLag
	for _, c := range s.StreamConsumers() {
		out = append(out, StreamLag{VHost: c.VHost, Stream: c.Stream, Kind: "consumer", Name: c.Tag,
			Offset: c.Offset, HasOffset: true, Lag: c.Lag})
	}
	for _, v := range s.core.VHosts() {
		grouped := map[[2]string]bool{} // partition, group
		for _, name := range v.ConsumerGroupStreams() {
			gs, _ := v.ConsumerGroups(name)
			for _, g := range gs {
				for _, p := range g.Partitions {
					grouped[[2]string{p.Partition, g.Name}] = true
					out = append(out, StreamLag{VHost: v.Name(), Stream: p.Partition, Kind: "group", Name: g.Name,
						Offset: p.Committed, HasOffset: p.HasCommitted, Lag: p.Lag})
				}
			}
		}
		for _, q := range v.Queues() {
			if q.Kind() != "stream" {
				continue
			}
			offsets, _, ok := v.StreamTracking(q.Name())
			if !ok || len(offsets) == 0 {
				continue
			}
			st := q.Stats()
			for ref, off := range offsets {
				if grouped[[2]string{q.Name(), ref}] {
					continue
				}
				l := StreamLag{VHost: v.Name(), Stream: q.Name(), Kind: "offset", Name: ref, Offset: off, HasOffset: true}
				if st.Messages > 0 && st.LastOffset > off {
					l.Lag = st.LastOffset - off
				}
				out = append(out, l)
			}
		}
	}
	return out
}
