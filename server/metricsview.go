package server

import (
	"time"

	"warren/server/cluster"
	"warren/server/core"
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
