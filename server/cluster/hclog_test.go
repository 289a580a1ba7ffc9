package cluster

import (
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// Raft's warning about a heartbeat timeout is expected once when this node forces a group's first
// election, and logged at debug level then; otherwise (and the next time) it stays a warning.
func TestHclogForcedElectionQuiet(t *testing.T) {
	var buf logBuf
	var forced atomic.Bool
	h := newHclog(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})), "raft")
	h.forced = &forced
	forced.Store(true)
	h.Log(hclog.Warn, forcedElectionMsg)
	if s := buf.String(); s != "" {
		t.Fatalf("forced election logged as a warning: %q", s)
	}
	h.Log(hclog.Warn, forcedElectionMsg)
	if s := buf.String(); !strings.Contains(s, forcedElectionMsg) || !strings.Contains(s, "level=WARN") {
		t.Fatalf("an election after the forced one not logged as a warning: %q", s)
	}
}
