package server

import (
	"context"
	"fmt"
	"sort"

	"warren/amqp"
	"warren/server/core"
	"warren/server/queue"
)

// Operators' views of streams (the HTTP API's /api/stream/... paths).

// StreamTracking returns stream name's stored consumer offsets and deduplicating publishers'
// highest publishing ids.
func (s *Server) StreamTracking(vhost, name string) (offsets, writers map[string]uint64, ok bool) {
	v := s.core.VHost(vhost)
	if v == nil {
		return nil, nil, false
	}
	return v.StreamTracking(name)
}

// StreamStatus returns stream name's replication as this node sees it.
func (s *Server) StreamStatus(vhost, name string) (core.StreamStatus, bool) {
	v := s.core.VHost(vhost)
	if v == nil {
		return core.StreamStatus{}, false
	}
	return v.StreamStatus(name)
}

// ConsumerGroups lists the consumer groups of super stream (or stream) name.
func (s *Server) ConsumerGroups(vhost, name string) ([]core.GroupInfo, bool) {
	v := s.core.VHost(vhost)
	if v == nil {
		return nil, false
	}
	gs, ok := v.ConsumerGroups(name)
	sort.Slice(gs, func(i, j int) bool { return gs[i].Name < gs[j].Name })
	return gs, ok
}

// ResetGroupOffsets moves a consumer group's offsets (it must have no members); spec is an
// x-stream-offset value.
func (s *Server) ResetGroupOffsets(ctx context.Context, vhost, name, group string, spec any) *amqp.Error {
	v := s.core.VHost(vhost)
	if v == nil {
		return amqp.Errorf(amqp.NotFound, "no vhost '%s'", vhost)
	}
	return v.ResetGroupOffsets(ctx, name, group, spec)
}

// StreamConsumer is one consumer of a stream on this node.
type StreamConsumer struct {
	VHost, Stream string
	queue.ConsumerInfo
	Lag uint64 // records committed after its next offset
}

// StreamConsumers lists the stream consumers on this node: AMQP 0-9-1 consumers of streams and
// the stream protocol's subscriptions (tagged with their name property, or "subscription N on
// CONNECTION" without one).
func (s *Server) StreamConsumers() []StreamConsumer {
	var out []StreamConsumer
	if s.stream != nil {
		for _, sub := range s.stream.Subscriptions() {
			v := s.core.VHost(sub.VHost)
			if v == nil {
				continue
			}
			tag := sub.Name
			if tag == "" {
				tag = fmt.Sprintf("subscription %d on %s", sub.ID, sub.Connection)
			}
			sc := StreamConsumer{VHost: sub.VHost, Stream: sub.Stream, ConsumerInfo: queue.ConsumerInfo{
				Tag: tag, Name: sub.Name, Offset: sub.Next, Prefetch: sub.Credit, Active: sub.Active}}
			if st, ok := v.StreamStatus(sub.Stream); ok && st.Next > sub.Next {
				sc.Lag = st.Next - sub.Next
			}
			out = append(out, sc)
		}
	}
	for _, v := range s.core.VHosts() {
		for _, q := range v.Queues() {
			cs, ok := v.StreamConsumers(q.Name())
			if !ok {
				continue
			}
			st, _ := v.StreamStatus(q.Name())
			for _, c := range cs {
				sc := StreamConsumer{VHost: v.Name(), Stream: q.Name(), ConsumerInfo: c}
				if st.Next > c.Offset {
					sc.Lag = st.Next - c.Offset
				}
				out = append(out, sc)
			}
		}
	}
	return out
}

// StreamPublisher is a deduplicating publisher of a stream: its reference (x-publisher-id) and
// the highest publishing id stored.
type StreamPublisher struct {
	VHost, Stream, Reference string
	Sequence                 uint64
}

// StreamPublishers lists the deduplicating publishers of every stream.
func (s *Server) StreamPublishers() []StreamPublisher {
	var out []StreamPublisher
	for _, v := range s.core.VHosts() {
		for _, q := range v.Queues() {
			_, writers, ok := v.StreamTracking(q.Name())
			if !ok {
				continue
			}
			refs := make([]string, 0, len(writers))
			for r := range writers {
				refs = append(refs, r)
			}
			sort.Strings(refs)
			for _, r := range refs {
				out = append(out, StreamPublisher{VHost: v.Name(), Stream: q.Name(), Reference: r, Sequence: writers[r]})
			}
		}
	}
	return out
}
