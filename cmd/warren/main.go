// Command warren runs the Warren message broker.
//
//	warren serve [--amqp-listen ADDR] [--http-listen ADDR] [--data-dir DIR] [--log-level LEVEL]
//	warren version
//	warren cluster [status|add|remove] --server HOST:PORT
//	warren perf [run|bench] [flags]
//	warren dlq redrive --uri URI --queue DLQ [--to QUEUE] [--limit N] [--dry-run]
//	warren ctl COMMAND [--url URL] [--username U --password P] [--formatter json] (rabbitmqctl's commands)
//
// Every serve flag can also be set through an environment variable (WARREN_AMQP_LISTEN,
// WARREN_HTTP_LISTEN, WARREN_DATA_DIR, WARREN_LOG_LEVEL); a flag given on the command line wins.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"warren/cmd/warren/internal/clustercmd"
	"warren/cmd/warren/internal/ctl"
	"warren/cmd/warren/internal/dlq"
	"warren/cmd/warren/internal/perf"
	"warren/server"
	"warren/server/auth"
	"warren/server/httpapi"
	"warren/server/idlemem"
	"warren/server/metrics"
	"warren/server/tlsconf"
)

// version is set at build time: go build -ldflags "-X main.version=v1.2.3".
var version = "dev"

// defaultHTTPListen is where RabbitMQ's management API listens, on loopback only as the AMQP
// listener's default.
const defaultHTTPListen = "127.0.0.1:15672"

// shutdownTimeout bounds how long a signalled broker waits for its connections to close.
const shutdownTimeout = 10 * time.Second

func main() {
	if err := newApp(os.Stdout, os.Stderr).Run(os.Args); err != nil {
		fmt.Fprintf(os.Stderr, "warren: %v\n", err)
		os.Exit(exitCode(err))
	}
}

// newApp builds the command-line application; stdout and stderr are where it writes.
// defaultStreamListen is --stream-listen's default, RabbitMQ's stream port on loopback. It is
// not in server.DefaultConfig, so brokers built in tests open no fixed port unless asked to.
const defaultStreamListen = "127.0.0.1:5552"

func newApp(stdout, stderr io.Writer) *cli.App {
	return &cli.App{
		Name:        "warren",
		Usage:       "a RabbitMQ-compatible AMQP 0-9-1 message broker",
		Writer:      stdout,
		ErrWriter:   stderr,
		HideVersion: true, // `warren version` is the one way to ask
		// main prints errors and exits with their code (exitCode): the app itself never exits,
		// so tests can run commands in-process.
		ExitErrHandler: func(*cli.Context, error) {},
		Commands: []*cli.Command{
			{
				Name:  "serve",
				Usage: "run the broker until SIGTERM or SIGINT",
				Flags: []cli.Flag{
					&cli.StringFlag{
						Name:    "amqp-listen",
						Usage:   "TCP `ADDRESS` for AMQP 0-9-1 clients",
						Value:   server.DefaultConfig().AMQPListen,
						EnvVars: []string{"WARREN_AMQP_LISTEN"},
					},
					&cli.StringFlag{
						Name:    "stream-listen",
						Usage:   "TCP `ADDRESS` for RabbitMQ stream-protocol clients (5552); empty disables it",
						Value:   defaultStreamListen,
						EnvVars: []string{"WARREN_STREAM_LISTEN"},
					},
					&cli.StringFlag{
						Name:    "stream-tls-listen",
						Usage:   "TCP `ADDRESS` for the stream protocol over TLS (RabbitMQ uses 5551); off by default",
						EnvVars: []string{"WARREN_STREAM_TLS_LISTEN"},
					},
					&cli.StringFlag{
						Name:    "stream-advertised-host",
						Usage:   "`HOST` stream clients are told to connect to (metadata); default the listener's",
						EnvVars: []string{"WARREN_STREAM_ADVERTISED_HOST"},
					},
					&cli.IntFlag{
						Name:    "stream-advertised-port",
						Usage:   "`PORT` stream clients are told to connect to (metadata); default the listener's",
						EnvVars: []string{"WARREN_STREAM_ADVERTISED_PORT"},
					},
					&cli.StringFlag{
						Name:    "http-listen",
						Usage:   "TCP `ADDRESS` of the HTTP API (RabbitMQ's management API paths under /api); empty disables it",
						Value:   defaultHTTPListen,
						EnvVars: []string{"WARREN_HTTP_LISTEN"},
					},
					&cli.StringFlag{
						Name:    "prometheus-listen",
						Usage:   "TCP `ADDRESS` of the Prometheus exporter (/metrics and /metrics/per-object, RabbitMQ's metric names); empty disables it",
						Value:   metrics.DefaultListen,
						EnvVars: []string{"WARREN_PROMETHEUS_LISTEN"},
					},
					&cli.StringFlag{
						Name:    "data-dir",
						Usage:   "`DIR`ectory for the broker's data (created if missing)",
						Value:   server.DefaultConfig().DataDir,
						EnvVars: []string{"WARREN_DATA_DIR"},
					},
					&cli.Float64Flag{
						Name:    "memory-high-watermark",
						Usage:   "`FRACTION` of RAM above which publishers are blocked (0 disables)",
						Value:   server.DefaultConfig().MemoryHighWatermark,
						EnvVars: []string{"WARREN_MEMORY_HIGH_WATERMARK"},
					},
					&cli.StringFlag{
						Name:    "disk-free-limit",
						Usage:   "free `SPACE` on the data directory's disk below which publishers are blocked (e.g. 50MB, 2GB; 0 disables)",
						Value:   "50MB",
						EnvVars: []string{"WARREN_DISK_FREE_LIMIT"},
					},
					&cli.DurationFlag{
						Name:    "consumer-timeout",
						Usage:   "`DURATION` a consumer may hold an unacknowledged delivery before it is cancelled and its messages requeued (0 disables; queues override it with x-consumer-timeout)",
						Value:   server.DefaultConfig().ConsumerTimeout,
						EnvVars: []string{"WARREN_CONSUMER_TIMEOUT"},
					},
					&cli.StringFlag{
						Name:    "node-id",
						Usage:   "`ID` of this node in its cluster",
						Value:   "warren",
						EnvVars: []string{"WARREN_NODE_ID"},
					},
					&cli.StringFlag{
						Name:    "cluster-listen",
						Usage:   "TCP `ADDRESS` of the cluster port (Raft and node-to-node traffic); empty = a one-node cluster without a port",
						EnvVars: []string{"WARREN_CLUSTER_LISTEN"},
					},
					&cli.StringFlag{
						Name:    "cluster-peers",
						Usage:   "initial cluster members as `id1=host:port,id2=host:port,...`, this node included",
						EnvVars: []string{"WARREN_CLUSTER_PEERS"},
					},
					&cli.BoolFlag{
						Name:    "cluster-join",
						Usage:   "start without bootstrapping and wait to be added with `warren cluster add`",
						EnvVars: []string{"WARREN_CLUSTER_JOIN"},
					},
					&cli.StringFlag{
						Name:    "default-user",
						Usage:   "`NAME` of the user created at the first start (tag administrator, full permissions on /); empty creates none",
						Value:   server.DefaultConfig().DefaultUser,
						EnvVars: []string{"WARREN_DEFAULT_USER"},
					},
					&cli.StringFlag{
						Name:    "default-pass",
						Usage:   "`PASSWORD` of the default user",
						Value:   server.DefaultConfig().DefaultPass,
						EnvVars: []string{"WARREN_DEFAULT_PASS"},
					},
					&cli.StringFlag{
						Name:    "loopback-users",
						Usage:   "comma-separated `USERS` allowed to log in only from a loopback address (empty: none)",
						Value:   strings.Join(server.DefaultConfig().LoopbackUsers, ","),
						EnvVars: []string{"WARREN_LOOPBACK_USERS"},
					},
					&cli.StringFlag{
						Name:    "amqps-listen",
						Usage:   "TCP `ADDRESS` for AMQP 0-9-1 over TLS (e.g. 0.0.0.0:5671); needs --tls-cert and --tls-key",
						EnvVars: []string{"WARREN_AMQPS_LISTEN"},
					},
					&cli.StringFlag{
						Name:    "https-listen",
						Usage:   "TCP `ADDRESS` of the HTTP API over TLS, with the --tls-* certificates",
						EnvVars: []string{"WARREN_HTTPS_LISTEN"},
					},
					&cli.StringFlag{
						Name:    "tls-cert",
						Usage:   "PEM certificate `FILE` of the TLS listeners (reloaded on SIGHUP)",
						EnvVars: []string{"WARREN_TLS_CERT"},
					},
					&cli.StringFlag{
						Name:    "tls-key",
						Usage:   "PEM private key `FILE` of --tls-cert",
						EnvVars: []string{"WARREN_TLS_KEY"},
					},
					&cli.StringFlag{
						Name:    "tls-ca",
						Usage:   "PEM `FILE` of the authorities whose client certificates are accepted",
						EnvVars: []string{"WARREN_TLS_CA"},
					},
					&cli.BoolFlag{
						Name:    "tls-verify-peer",
						Usage:   "require a client certificate signed by --tls-ca (mutual TLS; enables the EXTERNAL mechanism)",
						EnvVars: []string{"WARREN_TLS_VERIFY_PEER"},
					},
					&cli.StringFlag{
						Name:    "tls-login-from",
						Usage:   "`PART` of a client certificate EXTERNAL logs in as: distinguished_name or common_name",
						Value:   string(auth.LoginFromDistinguishedName),
						EnvVars: []string{"WARREN_TLS_LOGIN_FROM"},
					},
					&cli.StringFlag{
						Name:    "load-definitions",
						Usage:   "import a RabbitMQ definitions `FILE` (JSON) at boot; a file that cannot be imported stops the boot",
						EnvVars: []string{"WARREN_LOAD_DEFINITIONS"},
					},
					&cli.StringFlag{
						Name:  "cpu-profile",
						Usage: "write a Go CPU profile of the whole run to `FILE` (for go tool pprof)",
					},
					&cli.StringFlag{
						Name:  "heap-profile",
						Usage: "on SIGTERM/SIGINT, before shutting down, write a Go heap profile to `FILE` FILE.txt (with the runtime's memory statistics) and a goroutine profile to FILE.goroutines (for go tool pprof)",
					},
					&cli.StringFlag{
						Name:    "log-level",
						Usage:   "`LEVEL` of logs written to stderr: debug, info, warn or error",
						Value:   "info",
						EnvVars: []string{"WARREN_LOG_LEVEL"},
					},
					&cli.StringFlag{
						Name:    "log-format",
						Usage:   "`FORMAT` of logs written to stderr: text (key=value) or json (one JSON object a line, for log shippers)",
						Value:   "text",
						EnvVars: []string{"WARREN_LOG_FORMAT"},
					},
				},
				Action: func(c *cli.Context) error {
					if c.NArg() > 0 {
						return fmt.Errorf("serve takes no arguments, got %q", c.Args().Slice())
					}
					level, err := parseLevel(c.String("log-level"))
					if err != nil {
						return err
					}
					logger, err := newLogger(stderr, c.String("log-format"), level)
					if err != nil {
						return err
					}
					slog.SetDefault(logger)
					cfg := server.DefaultConfig()
					cfg.Version = version
					cfg.AMQPListen = c.String("amqp-listen")
					cfg.StreamListen = c.String("stream-listen")
					cfg.StreamTLSListen = c.String("stream-tls-listen")
					cfg.StreamAdvertisedHost = c.String("stream-advertised-host")
					cfg.StreamAdvertisedPort = c.Int("stream-advertised-port")
					cfg.DataDir = c.String("data-dir")
					cfg.MemoryHighWatermark = c.Float64("memory-high-watermark")
					if cfg.DiskFreeLimit, err = parseSize(c.String("disk-free-limit")); err != nil {
						return fmt.Errorf("--disk-free-limit: %w", err)
					}
					cfg.ConsumerTimeout = c.Duration("consumer-timeout")
					cfg.NodeID = c.String("node-id")
					cfg.ClusterListen = c.String("cluster-listen")
					cfg.ClusterJoin = c.Bool("cluster-join")
					if cfg.ClusterPeers, err = parsePeers(c.String("cluster-peers")); err != nil {
						return err
					}
					if len(cfg.ClusterPeers) > 0 {
						if _, ok := cfg.ClusterPeers[cfg.NodeID]; !ok {
							return fmt.Errorf("--cluster-peers must include this node (%s)", cfg.NodeID)
						}
						if cfg.ClusterListen == "" {
							return errors.New("--cluster-peers needs --cluster-listen")
						}
					}
					cfg.DefaultUser = c.String("default-user")
					cfg.DefaultPass = c.String("default-pass")
					cfg.LoopbackUsers = []string{}
					for _, u := range strings.Split(c.String("loopback-users"), ",") {
						if u = strings.TrimSpace(u); u != "" {
							cfg.LoopbackUsers = append(cfg.LoopbackUsers, u)
						}
					}
					cfg.AMQPSListen = c.String("amqps-listen")
					cfg.TLS = tlsconf.Options{CertFile: c.String("tls-cert"), KeyFile: c.String("tls-key"),
						CAFile: c.String("tls-ca"), VerifyPeer: c.Bool("tls-verify-peer")}
					if cfg.TLSLoginFrom, err = auth.ParseLoginFrom(c.String("tls-login-from")); err != nil {
						return fmt.Errorf("--tls-login-from: %w", err)
					}
					cfg.LoadDefinitions = c.String("load-definitions")
					cfg.Logger = logger
					if path := c.String("cpu-profile"); path != "" {
						f, err := os.Create(path)
						if err != nil {
							return fmt.Errorf("--cpu-profile: %w", err)
						}
						defer f.Close()
						if err := pprof.StartCPUProfile(f); err != nil {
							return fmt.Errorf("--cpu-profile: %w", err)
						}
						defer pprof.StopCPUProfile()
					}
					return serve(c.Context, cfg, listeners{http: c.String("http-listen"), https: c.String("https-listen"),
						prometheus: c.String("prometheus-listen"), heapProfile: c.String("heap-profile")})
				},
			},
			{
				Name:  "version",
				Usage: "print the version",
				Action: func(c *cli.Context) error {
					_, err := fmt.Fprintf(stdout, "warren %s\n", version)
					return err
				},
			},
			ctl.Command(),
			clustercmd.Command(),
			perf.Command(),
			dlq.Command(),
		},
	}
}

// writeProfiles writes the heap profile to path, the same as text with the runtime's memory
// statistics to path.txt, and the goroutine profile to path.goroutines.
func writeProfiles(path string) {
	for _, p := range []struct {
		name, file string
		debug      int
	}{{"heap", path, 0}, {"heap", path + ".txt", 1}, {"goroutine", path + ".goroutines", 0}} {
		f, err := os.Create(p.file)
		if err != nil {
			fmt.Fprintf(os.Stderr, "--heap-profile: %v\n", err)
			continue
		}
		if err := pprof.Lookup(p.name).WriteTo(f, p.debug); err != nil {
			fmt.Fprintf(os.Stderr, "--heap-profile: %s: %v\n", p.name, err)
		}
		f.Close()
	}
}

// exitCode is the process's exit status for err: the code a command chose (warren ctl uses
// rabbitmqctl's), else 1.
func exitCode(err error) int {
	var ec cli.ExitCoder
	if errors.As(err, &ec) && ec.ExitCode() != 0 {
		return ec.ExitCode()
	}
	return 1
}

// parsePeers reads --cluster-peers: id1=host:port,id2=host:port,...
func parsePeers(s string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	peers := make(map[string]string)
	for _, p := range strings.Split(s, ",") {
		id, addr, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok || id == "" || addr == "" {
			return nil, fmt.Errorf("--cluster-peers: %q is not id=host:port", p)
		}
		if _, dup := peers[id]; dup {
			return nil, fmt.Errorf("--cluster-peers: node %q listed twice", id)
		}
		peers[id] = addr
	}
	return peers, nil
}

// parseSize reads a byte count with an optional unit: 50000000, 50MB, 2GB, 512MiB.
func parseSize(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if len(s) > len(u.suffix) && s[len(s)-len(u.suffix):] == u.suffix {
			s, mult = s[:len(s)-len(u.suffix)], u.mult
			break
		}
	}
	var n int64
	if _, err := fmt.Sscanf(s, "%d", &n); err != nil || n < 0 {
		return 0, fmt.Errorf("invalid size %q", s)
	}
	return n * mult, nil
}

// parseLevel maps a --log-level value onto a slog level.
// newLogger is the broker's logger: slog's text or JSON handler on w.
func newLogger(w io.Writer, format string, level slog.Level) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "text", "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format: %q is neither text nor json", format)
}

func parseLevel(s string) (slog.Level, error) {
	switch s {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("invalid log level %q: want debug, info, warn or error", s)
}

// listeners are serve's listener addresses ("" turns one off) and where to write a heap profile
// at exit ("" writes none).
type listeners struct{ http, https, prometheus, heapProfile string }

// shutdowner is an HTTP listener serve stops before the broker.
type shutdowner interface {
	Shutdown(ctx context.Context) error
}

// gcHeapFloor is the least the heap may grow between two collections (gctune.go).
const gcHeapFloor = 64 << 20

// serve runs a broker with cfg until SIGTERM or SIGINT (or ctx ends), then shuts it down:
// the listener stops, clients get connection.close 320, and serve returns nil once every
// connection has ended, or an error if that takes longer than shutdownTimeout.
func serve(ctx context.Context, cfg server.Config, ls listeners) error {
	httpListen, httpsListen, heapProfile := ls.http, ls.https, ls.heapProfile
	if os.Getenv("GOGC") == "" {
		// A broker's heap is mostly long-lived indexes and buffers: collecting at +50% instead of
		// +100% keeps RSS well inside its budget (a 1M-message backlog drains at 221 MB instead of
		// 304 MB) for a few percent of CPU; but a small heap gets at least gcHeapFloor of room
		// (gctune.go). GOGC in the environment still wins.
		defer startGCTuner(50, gcHeapFloor).stop()
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	cfg.StartAbort = ctx.Done()
	var httpsTLS *tlsconf.Config
	if httpsListen != "" {
		var err error
		if httpsTLS, err = tlsconf.Load(cfg.TLS); err != nil {
			return fmt.Errorf("--https-listen: %w", err)
		}
	}

	srv, err := server.New(cfg)
	if err != nil {
		return fmt.Errorf("configure broker: %w", err)
	}
	if err := srv.Start(); err != nil {
		return fmt.Errorf("start broker: %w", err)
	}
	idle := idlemem.Start(cfg.Logger) // returns garbage to the OS when the broker goes quiet
	defer idle.Stop()
	startedArgs := []any{"version", version, "amqp", srv.Addr().String()}
	if a := srv.TLSAddr(); a != nil {
		startedArgs = append(startedArgs, "amqps", a.String())
	}
	var apis []shutdowner
	stopAll := func() {
		shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		for _, api := range apis {
			if err := api.Shutdown(shutdownCtx); err != nil {
				cfg.Logger.Warn("cannot stop the HTTP API cleanly", "err", err)
			}
		}
		_ = srv.Shutdown(shutdownCtx)
	}
	for _, l := range []struct {
		addr, name string
		tls        *tlsconf.Config
	}{{httpListen, "http", nil}, {httpsListen, "https", httpsTLS}} {
		if l.addr == "" {
			continue
		}
		api, err := httpapi.Listen(l.addr, srv, httpapi.Options{Version: version, Logger: cfg.Logger, TLS: l.tls})
		if err != nil {
			stopAll()
			return err
		}
		apis = append(apis, api)
		startedArgs = append(startedArgs, l.name, api.Addr().String())
	}
	if ls.prometheus != "" {
		exp, err := metrics.Listen(ls.prometheus, srv, metrics.Options{Version: version, Logger: cfg.Logger})
		if err != nil {
			stopAll()
			return err
		}
		apis = append(apis, exp)
		startedArgs = append(startedArgs, "prometheus", exp.Addr().String())
	}
	cfg.Logger.Info("warren started", append(startedArgs, "data_dir", cfg.DataDir)...)

	// SIGHUP reloads the TLS certificates; connections opened afterwards use the new ones.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-hup:
			failed := false
			for _, reload := range []func() error{srv.ReloadTLS, func() error {
				if httpsTLS == nil {
					return nil
				}
				return httpsTLS.Reload()
			}} {
				if err := reload(); err != nil {
					failed = true
					cfg.Logger.Error("SIGHUP: TLS certificates not reloaded", "err", err)
				}
			}
			if !failed {
				cfg.Logger.Info("SIGHUP: TLS certificates reloaded")
			}
		}
	}
	if heapProfile != "" {
		writeProfiles(heapProfile)
	}
	stop() // a second signal now kills the process the default way
	cfg.Logger.Info("shutting down", "timeout", shutdownTimeout)

	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	for _, api := range apis {
		if err := api.Shutdown(shutdownCtx); err != nil {
			cfg.Logger.Warn("cannot stop the HTTP API cleanly", "err", err)
		}
	}
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shut down broker: %w", err)
	}
	return nil
}
