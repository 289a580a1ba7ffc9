package cluster

import (
	"context"
	"io"
	"log"
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
)

// hclogAdapter sends hashicorp/raft's hclog output to slog. Raft's routine chatter (trace, debug, info)
// goes to slog's debug levels; raft's warnings and errors (elections, unreachable peers) become slog
// warnings: they are expected during failover and must not look like Warren failures.
type hclogAdapter struct {
	log  *slog.Logger
	name string
	args []any
	// forced, if set, is true while this node forces the group's first election: raft's heartbeat
	// timeout warning that follows is then expected and logged at debug level.
	forced *atomic.Bool
}

// forcedElectionMsg is what raft logs when its follower loop starts an election.
const forcedElectionMsg = "heartbeat timeout reached, starting election"

var _ hclog.Logger = (*hclogAdapter)(nil)

func newHclog(l *slog.Logger, name string) *hclogAdapter {
	return &hclogAdapter{log: l, name: name}
}

func (h *hclogAdapter) level(l hclog.Level) slog.Level {
	switch l {
	case hclog.Trace:
		return slog.LevelDebug - 4
	case hclog.Debug, hclog.Info, hclog.NoLevel, hclog.DefaultLevel:
		return slog.LevelDebug
	default: // Warn, Error
		return slog.LevelWarn
	}
}

// Log implements hclog.Logger.
func (h *hclogAdapter) Log(level hclog.Level, msg string, args ...any) {
	lv := h.level(level)
	if h.forced != nil && msg == forcedElectionMsg && h.forced.CompareAndSwap(true, false) {
		lv = slog.LevelDebug
	}
	ctx := context.Background()
	if !h.log.Enabled(ctx, lv) {
		return
	}
	all := make([]any, 0, len(h.args)+len(args)+2)
	if h.name != "" {
		all = append(all, "component", h.name)
	}
	all = append(all, h.args...)
	all = append(all, args...)
	h.log.Log(ctx, lv, msg, all...)
}

// Trace implements hclog.Logger.
func (h *hclogAdapter) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }

// Debug implements hclog.Logger.
func (h *hclogAdapter) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }

// Info implements hclog.Logger.
func (h *hclogAdapter) Info(msg string, args ...any) { h.Log(hclog.Info, msg, args...) }

// Warn implements hclog.Logger.
func (h *hclogAdapter) Warn(msg string, args ...any) { h.Log(hclog.Warn, msg, args...) }

// Error implements hclog.Logger.
func (h *hclogAdapter) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }

func (h *hclogAdapter) enabled(l hclog.Level) bool {
	return h.log.Enabled(context.Background(), h.level(l))
}

// IsTrace implements hclog.Logger.
func (h *hclogAdapter) IsTrace() bool { return h.enabled(hclog.Trace) }

// IsDebug implements hclog.Logger.
func (h *hclogAdapter) IsDebug() bool { return h.enabled(hclog.Debug) }

// IsInfo implements hclog.Logger.
func (h *hclogAdapter) IsInfo() bool { return h.enabled(hclog.Info) }

// IsWarn implements hclog.Logger.
func (h *hclogAdapter) IsWarn() bool { return h.enabled(hclog.Warn) }

// IsError implements hclog.Logger.
func (h *hclogAdapter) IsError() bool { return h.enabled(hclog.Error) }

// ImpliedArgs implements hclog.Logger.
func (h *hclogAdapter) ImpliedArgs() []any { return h.args }

// With implements hclog.Logger.
func (h *hclogAdapter) With(args ...any) hclog.Logger {
	c := *h
	c.args = append(append([]any(nil), h.args...), args...)
	return &c
}

// Name implements hclog.Logger.
func (h *hclogAdapter) Name() string { return h.name }

// Named implements hclog.Logger.
func (h *hclogAdapter) Named(name string) hclog.Logger {
	c := *h
	if c.name != "" {
		c.name += "." + name
	} else {
		c.name = name
	}
	return &c
}

// ResetNamed implements hclog.Logger.
func (h *hclogAdapter) ResetNamed(name string) hclog.Logger {
	c := *h
	c.name = name
	return &c
}

// SetLevel implements hclog.Logger; the level is the slog handler's.
func (h *hclogAdapter) SetLevel(hclog.Level) {}

// GetLevel implements hclog.Logger.
func (h *hclogAdapter) GetLevel() hclog.Level {
	switch {
	case h.IsTrace():
		return hclog.Trace
	case h.IsDebug():
		return hclog.Debug
	default:
		return hclog.Warn
	}
}

// StandardLogger implements hclog.Logger.
func (h *hclogAdapter) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(h.StandardWriter(opts), "", 0)
}

// StandardWriter implements hclog.Logger.
func (h *hclogAdapter) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return stdWriter{h}
}

type stdWriter struct{ h *hclogAdapter }

func (w stdWriter) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	lv := hclog.Debug
	switch {
	case strings.HasPrefix(msg, "[ERR") || strings.HasPrefix(msg, "[WARN"):
		lv = hclog.Warn
	}
	w.h.Log(lv, msg)
	return len(p), nil
}
