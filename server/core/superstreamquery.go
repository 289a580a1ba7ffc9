package core

import "warren/exchange"

// Queries of super streams for the stream protocol's partitions and route commands.

// SuperStreamPartitions returns super stream name's partitions in partition order; ok is false
// when name is not a super stream.
func (v *VHost) SuperStreamPartitions(name string) (parts []string, ok bool) {
	x, found := v.ex.Get(name)
	if !found || x.Kind != exchange.SuperStream {
		return nil, false
	}
	return v.ex.Partitions(name), true
}

// SuperStreamRoute returns the partitions of super stream name bound with routing key key (the
// stream protocol's route: a binding-key lookup, not the hash); ok is false when name is not a
// super stream.
func (v *VHost) SuperStreamRoute(name, key string) (streams []string, ok bool) {
	x, found := v.ex.Get(name)
	if !found || x.Kind != exchange.SuperStream {
		return nil, false
	}
	for _, b := range v.ex.Bindings() {
		if b.Source == name && b.Key == key && b.DestKind == exchange.ToQueue {
			streams = append(streams, b.Dest)
		}
	}
	return streams, true
}
