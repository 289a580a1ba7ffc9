// Package metrics is Warren's Prometheus exporter: GET /metrics (node totals) and GET
// /metrics/per-object (per queue, connection and raft group), with the metric names, types,
// help texts and labels of RabbitMQ's rabbitmq_prometheus plugin, so that RabbitMQ's Grafana
// dashboards (which join every panel on rabbitmq_identity_info) work unchanged, plus warren_*
// families for what RabbitMQ lacks (stream logs, storage commits). docs/metrics.md is the
// catalogue.
//
// A scrape reads the broker as the HTTP API does, from atomics and each object's own short
// critical section, and holds no lock across objects; at most maxInFlight scrapes run at once
// (more get 503), so a scrape storm cannot pile up work on a node with many queues.
//
// client_golang does the exposition (text and OpenMetrics negotiation, gzip, escaping,
// validation of names and label sets) and adds its process_* and go_* collectors.
package metrics

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"warren/server"
	"warren/server/netserve"
)

// DefaultListen is rabbitmq_prometheus's port, on loopback as the other listeners' defaults.
const DefaultListen = "127.0.0.1:15692"

// maxInFlight bounds concurrent scrapes per endpoint.
const maxInFlight = 4

// Options configure the exporter.
type Options struct {
	// Version is the broker's version (rabbitmq_build_info's rabbitmq_version).
	Version string
	// Logger receives the exporter's logs; nil means slog.Default().
	Logger *slog.Logger
}

// Handler serves /metrics and /metrics/per-object for broker s.
func Handler(s *server.Server, opt Options) http.Handler {
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	cat := newCatalogue()
	errLog := slog.NewLogLogger(opt.Logger.Handler(), slog.LevelWarn)
	mux := http.NewServeMux()
	for path, perObject := range map[string]bool{"/metrics": false, "/metrics/per-object": true} {
		reg := prometheus.NewRegistry()
		reg.MustRegister(&collector{s: s, c: cat, version: opt.Version, perObject: perObject})
		reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		reg.MustRegister(collectors.NewGoCollector())
		mux.Handle("GET "+path, promhttp.HandlerFor(reg, promhttp.HandlerOpts{
			ErrorLog:            errLog,
			ErrorHandling:       promhttp.ContinueOnError,
			MaxRequestsInFlight: maxInFlight,
		}))
	}
	return mux
}

// Listener is the exporter served on a TCP address.
type Listener = netserve.HTTPListener

// Listen serves the exporter for broker s on addr until Shutdown. An address in use is an
// error naming it.
func Listen(addr string, s *server.Server, opt Options) (*Listener, error) {
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("Prometheus exporter: listen on %s: %w", addr, err)
	}
	return netserve.ServeHTTP("Prometheus exporter", ln, Handler(s, opt), opt.Logger, nil), nil
}
