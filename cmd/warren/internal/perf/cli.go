// Package perf is `warren perf`, a load tool in the spirit of RabbitMQ's PerfTest, and
// `warren perf bench`, the fixed scenario set `make bench` runs against Warren and a reference
// RabbitMQ.
//
// Every message body starts with the producer id (2 bytes), a per-producer sequence number
// (6 bytes) and the send time in Unix nanoseconds (8 bytes), so consumers measure end-to-end
// latency and the tool checks, by sequence number, that every confirmed message was consumed.
package perf

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"
)

// DefaultURI is the broker `warren perf run` loads when given no --uri.
const DefaultURI = "amqp://guest:guest@127.0.0.1:5672/"

// DefaultRefURI is the reference RabbitMQ `warren perf bench` compares with
// (see /work/shared/tools/rabbitmq.sh).
const DefaultRefURI = "amqp://guest:guest@127.0.0.1:5682/"

// Command returns the `perf` command: `perf run` (also its default action) and `perf bench`.
func Command() *cli.Command {
	return &cli.Command{
		Name:  "perf",
		Usage: "load-test an AMQP 0-9-1 broker (like RabbitMQ's PerfTest); `perf run` is the default",
		Description: "Runs producers and consumers against a broker and reports publish, confirm and\n" +
			"consume rates, end-to-end latency percentiles, and a check by sequence numbers that\n" +
			"every confirmed message was consumed. `perf bench` runs the fixed scenario set.",
		Flags:  runFlags(),
		Action: runAction,
		Subcommands: append([]*cli.Command{
			{
				Name:   "run",
				Usage:  "one load run (the default action of `warren perf`)",
				Flags:  runFlags(),
				Action: runAction,
			},
			{
				Name:   "bench",
				Usage:  "run the S1-S14 scenario set against Warren and a reference RabbitMQ; write docs/benchmarks.md",
				Flags:  benchFlags(),
				Action: benchAction,
			},
			declareCommand(),
			backlogCommand(),
			streamCommand(),
		}, append(floorCommands(), clusterCommand())...),
	}
}

func runFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "uri", Value: DefaultURI, Usage: "AMQP `URI` of the broker"},
		&cli.IntFlag{Name: "producers", Aliases: []string{"x"}, Value: 1, Usage: "producer connections"},
		&cli.IntFlag{Name: "consumers", Aliases: []string{"y"}, Value: 1, Usage: "consumer connections"},
		&cli.IntFlag{Name: "queues", Value: 1, Usage: "queues; producer i publishes to queue i mod N, consumer j reads queue j mod N"},
		&cli.StringFlag{Name: "queue-pattern", Value: "perf-q-%d", Usage: "queue names, a fmt `PATTERN` with one %d numbered from 1"},
		&cli.StringFlag{Name: "queue-type", Value: "classic", Usage: "x-queue-type: classic, quorum or stream (stream needs --qos and manual ack)"},
		&cli.StringFlag{Name: "stream-offset", Usage: "x-stream-offset for stream consumers: first, last, next, a number or an interval"},
		&cli.StringFlag{Name: "exchange-type", Aliases: []string{"t"}, Value: "direct", Usage: "direct, fanout (binds every queue) or topic"},
		&cli.StringFlag{Name: "exchange", Aliases: []string{"e"}, Usage: "exchange `NAME` (default perf-<exchange-type>; with --predeclared, the default exchange)"},
		&cli.IntFlag{Name: "size", Aliases: []string{"s"}, Value: headerSize, Usage: fmt.Sprintf("message body `BYTES` (at least %d: producer id, sequence, send time)", headerSize)},
		&cli.BoolFlag{Name: "persistent", Aliases: []string{"f"}, Usage: "persistent messages (delivery mode 2) to durable queues"},
		&cli.IntFlag{Name: "confirm", Aliases: []string{"c"}, Usage: "publisher-confirm window: at most `N` unconfirmed messages per producer; 0 = no confirms"},
		&cli.IntFlag{Name: "qos", Aliases: []string{"q"}, Usage: "consumer prefetch count; 0 = unlimited"},
		&cli.BoolFlag{Name: "auto-ack", Aliases: []string{"a"}, Usage: "consume without acknowledgements"},
		&cli.IntFlag{Name: "multi-ack-every", Aliases: []string{"A"}, Usage: "acknowledge with multiple=true every `N` messages"},
		&cli.Float64Flag{Name: "rate", Aliases: []string{"r"}, Usage: "messages per second per producer; 0 = unlimited"},
		&cli.DurationFlag{Name: "duration", Aliases: []string{"z"}, Value: 10 * time.Second, Usage: "how long producers publish (unlimited when --pmessages or --cmessages is given without it)"},
		&cli.Uint64Flag{Name: "pmessages", Aliases: []string{"C"}, Usage: "messages per producer, then it stops"},
		&cli.Uint64Flag{Name: "cmessages", Aliases: []string{"D"}, Usage: "messages per consumer, then it stops"},
		&cli.BoolFlag{Name: "consume-after-publish", Usage: "start consumers only once publishing and confirms are done (fill a backlog, then drain it)"},
		&cli.DurationFlag{Name: "drain-timeout", Value: 30 * time.Second, Usage: "bound on the wait for consumers to drain after publishing stops"},
		&cli.BoolFlag{Name: "json", Usage: "print the result as one JSON object"},
		&cli.BoolFlag{Name: "quiet", Usage: "no progress lines on stderr"},
		&cli.BoolFlag{Name: "predeclared", Usage: "the queues and exchange exist: declare, bind and delete nothing"},
		&cli.BoolFlag{Name: "no-declare-cleanup", Usage: "leave the declared queues and exchange in place"},
		&cli.StringFlag{Name: "client", Value: clientAMQP091, Usage: "AMQP client of producers and consumers: amqp091 (amqp091-go, as applications use) or lean (the tool's own one-goroutine client: less latency and CPU of its own; no confirms)"},
		&cli.StringFlag{Name: "consumer-client", Usage: "AMQP client of the consumers when it differs from --client's: lean consumers with amqp091 producers that need confirms"},
		&cli.IntFlag{Name: "connections-only", Usage: "open `N` idle connections with one channel each, hold them for --duration, close them"},
	}
}

// signalContext is ctx cancelled on SIGINT or SIGTERM, so an interrupted run still reports.
func signalContext(c *cli.Context) (context.Context, context.CancelFunc) {
	ctx := c.Context
	if ctx == nil {
		ctx = context.Background()
	}
	return signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
}

func runAction(c *cli.Context) error {
	if c.NArg() > 0 {
		return fmt.Errorf("perf run takes flags only, got %q", c.Args().Slice())
	}
	cfg := RunConfig{
		URI:                 c.String("uri"),
		Producers:           c.Int("producers"),
		Consumers:           c.Int("consumers"),
		Queues:              c.Int("queues"),
		QueuePattern:        c.String("queue-pattern"),
		QueueType:           c.String("queue-type"),
		StreamOffset:        c.String("stream-offset"),
		ExchangeType:        c.String("exchange-type"),
		Exchange:            c.String("exchange"),
		Size:                c.Int("size"),
		Persistent:          c.Bool("persistent"),
		Confirm:             c.Int("confirm"),
		QoS:                 c.Int("qos"),
		AutoAck:             c.Bool("auto-ack"),
		MultiAckEvery:       c.Int("multi-ack-every"),
		Rate:                c.Float64("rate"),
		Duration:            c.Duration("duration"),
		PMessages:           c.Uint64("pmessages"),
		CMessages:           c.Uint64("cmessages"),
		ConsumeAfterPublish: c.Bool("consume-after-publish"),
		DrainTimeout:        c.Duration("drain-timeout"),
		Predeclared:         c.Bool("predeclared"),
		NoCleanup:           c.Bool("no-declare-cleanup"),
		ConnectionsOnly:     c.Int("connections-only"),
		Client:              c.String("client"),
		ConsumerClient:      c.String("consumer-client"),
	}
	if cfg.Size < headerSize {
		return fmt.Errorf("--size %d is below the %d-byte header (producer id, sequence, send time)", cfg.Size, headerSize)
	}
	if !c.IsSet("duration") && (cfg.PMessages > 0 || cfg.CMessages > 0) {
		cfg.Duration = 0
	}
	if !c.Bool("quiet") {
		cfg.Progress = c.App.ErrWriter
	}
	ctx, stop := signalContext(c)
	defer stop()
	res, err := Run(ctx, cfg)
	if err != nil {
		return fmt.Errorf("perf run: %w", err)
	}
	if c.Bool("json") {
		err = writeJSON(c.App.Writer, res)
	} else {
		err = writeHuman(c.App.Writer, res)
	}
	if err != nil {
		return err
	}
	if res.Lost > 0 {
		return fmt.Errorf("perf run: %d confirmed messages were never consumed", res.Lost)
	}
	return nil
}

func benchFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "warren-uri", Usage: "AMQP `URI` of a running Warren; empty: start this binary's `serve` on a free port with a temporary data directory"},
		&cli.StringFlag{Name: "warren-bin", Usage: "warren binary to start when --warren-uri is empty (default: this executable)"},
		&cli.StringFlag{Name: "ref-uri", Value: DefaultRefURI, Usage: "AMQP `URI` of the reference RabbitMQ; skipped with a note if unreachable"},
		&cli.StringFlag{Name: "ref-node", Value: "warrenref", Usage: "RabbitMQ node name, to find its beam.smp process if the port lookup fails"},
		&cli.IntFlag{Name: "runs", Value: 3, Usage: "runs per scenario and broker; the median is reported"},
		&cli.StringFlag{Name: "scenarios", Value: strings.Join(allScenarioIDs(), ","), Usage: "comma-separated scenario `IDS`"},
		&cli.StringFlag{Name: "out", Value: "docs/benchmarks.md", Usage: "Markdown `FILE` to write the results to; empty: do not write"},
		&cli.DurationFlag{Name: "duration", Value: 10 * time.Second, Usage: "publishing time of each throughput and latency run"},
		&cli.IntFlag{Name: "idle-connections", Value: 10000, Usage: "connections opened by S6"},
		&cli.IntFlag{Name: "backlog", Value: 1000000, Usage: "messages filled and drained by S7"},
		&cli.DurationFlag{Name: "backlog-timeout", Value: 5 * time.Minute, Usage: "bound on each of S7's and S8's fill and drain"},
		&cli.IntFlag{Name: "stream-messages", Value: 500000, Usage: "messages published to and consumed from the stream by S8"},
		&cli.IntFlag{Name: "declare-queues", Value: 10000, Usage: "durable queues S10 declares and binds (its targets are set at 10,000)"},
		&cli.IntFlag{Name: "declare-large-queues", Value: 100000, Usage: "queues of S10's large run (Warren only, once); 0: no large run"},
		&cli.IntFlag{Name: "declare-channels", Value: 8, Usage: "channels declaring in parallel in S10"},
		&cli.IntFlag{Name: "declare-connections", Value: defaultDeclareConnections, Usage: "connections S10's channels are spread over"},
		&cli.DurationFlag{Name: "declare-timeout", Value: 5 * time.Minute, Usage: "bound on each of S10's declare phases (what was declared by then is measured)"},
	}
}

func benchAction(c *cli.Context) error {
	if c.NArg() > 0 {
		return fmt.Errorf("perf bench takes flags only, got %q", c.Args().Slice())
	}
	cfg := BenchConfig{
		WarrenURI:          c.String("warren-uri"),
		WarrenBin:          c.String("warren-bin"),
		RefURI:             c.String("ref-uri"),
		RefNode:            c.String("ref-node"),
		Runs:               c.Int("runs"),
		Out:                c.String("out"),
		Duration:           c.Duration("duration"),
		IdleConnections:    c.Int("idle-connections"),
		Backlog:            c.Int("backlog"),
		BacklogTimeout:     c.Duration("backlog-timeout"),
		StreamMessages:     c.Int("stream-messages"),
		DeclareQueues:      c.Int("declare-queues"),
		DeclareLargeQueues: c.Int("declare-large-queues"),
		DeclareChannels:    c.Int("declare-channels"),
		DeclareConnections: c.Int("declare-connections"),
		DeclareTimeout:     c.Duration("declare-timeout"),
		CommandLine:        shellJoin(os.Args),
		Stdout:             c.App.Writer,
		Log:                c.App.ErrWriter,
	}
	for _, s := range strings.Split(c.String("scenarios"), ",") {
		if s = strings.TrimSpace(s); s != "" {
			cfg.Scenarios = append(cfg.Scenarios, strings.ToUpper(s))
		}
	}
	ctx, stop := signalContext(c)
	defer stop()
	if err := Bench(ctx, cfg); err != nil {
		return fmt.Errorf("perf bench: %w", err)
	}
	return nil
}

// shellJoin quotes args so the command line can be pasted into a shell.
func shellJoin(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a != "" && strings.IndexFunc(a, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,@%+", r))
		}) < 0 {
			out[i] = a
			continue
		}
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(out, " ")
}

// defaultDeclareConnections is how many connections the declaring channels of `perf declare`
// and S10 share by default.
const defaultDeclareConnections = 1

// declareCommand is `perf declare`: the declare rate of S10 against any broker.
func declareCommand() *cli.Command {
	return &cli.Command{
		Name:  "declare",
		Usage: "declare durable queues, each bound to amq.direct, from parallel channels; report the rate; delete them",
		Description: "Declares --queues durable classic queues, each bound to amq.direct with its name as\n" +
			"routing key, from --channels channels in parallel, and reports queue+bind pairs per\n" +
			"second overall and over the first and the last --window pairs. The queues are deleted\n" +
			"afterwards unless --keep is given. `perf bench --scenarios S10` also measures restart and memory.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "uri", Value: DefaultURI, Usage: "AMQP `URI` of the broker"},
			&cli.IntFlag{Name: "queues", Value: 10000, Usage: "queue+bind pairs to declare"},
			&cli.IntFlag{Name: "channels", Value: 8, Usage: "channels declaring in parallel"},
			&cli.IntFlag{Name: "connections", Value: defaultDeclareConnections, Usage: "connections the channels are spread over"},
			&cli.StringFlag{Name: "queue-pattern", Value: "perf-declare-%d", Usage: "queue names, a fmt `PATTERN` with one %d numbered from 1"},
			&cli.IntFlag{Name: "window", Value: declareWindow, Usage: "pairs over which the first and last rates are taken"},
			&cli.DurationFlag{Name: "timeout", Usage: "stop declaring after this long and report what was declared; 0: no bound"},
			&cli.BoolFlag{Name: "keep", Usage: "leave the declared queues in place"},
			&cli.BoolFlag{Name: "json", Usage: "print the result as one JSON object"},
			&cli.BoolFlag{Name: "quiet", Usage: "no progress lines on stderr"},
		},
		Action: declareAction,
	}
}

func declareAction(c *cli.Context) error {
	if c.NArg() > 0 {
		return fmt.Errorf("perf declare takes flags only, got %q", c.Args().Slice())
	}
	cfg := DeclareConfig{
		URI: c.String("uri"), Queues: c.Int("queues"), Channels: c.Int("channels"), Connections: c.Int("connections"),
		Pattern: c.String("queue-pattern"), Window: c.Int("window"), Timeout: c.Duration("timeout"),
	}
	if !c.Bool("quiet") {
		cfg.Progress = c.App.ErrWriter
	}
	ctx, stop := signalContext(c)
	defer stop()
	res, err := Declare(ctx, cfg)
	if err != nil {
		return fmt.Errorf("perf declare: %w", err)
	}
	if !c.Bool("keep") {
		began := time.Now()
		// Interrupted or not, what was declared is deleted.
		dctx, cancel := context.WithTimeout(context.Background(), refCleanupLimit)
		defer cancel()
		if err := deleteQueues(dctx, cfg.URI, cfg.Pattern, res.Declared, cfg.Channels); err != nil {
			fmt.Fprintf(c.App.ErrWriter, "deleting the declared queues: %v\n", err)
		} else if !c.Bool("quiet") {
			fmt.Fprintf(c.App.ErrWriter, "deleted the %s declared queues in %.1f s\n", fmtInt(uint64(res.Declared)), time.Since(began).Seconds())
		}
	}
	if c.Bool("json") {
		if err := writeJSON(c.App.Writer, res); err != nil {
			return err
		}
	} else if _, err := io.WriteString(c.App.Writer, describeDeclare(res)); err != nil {
		return err
	}
	if res.FirstError != "" {
		return fmt.Errorf("perf declare: %s", res.FirstError)
	}
	return nil
}

// describeDeclare is the human-readable result of `perf declare`.
func describeDeclare(res *DeclareResult) string {
	w := fmtInt(uint64(min(res.Window, res.Declared)))
	s := fmt.Sprintf("declared %s of %s queue+bind pairs in %.2f s with %d channels on %d connection(s)\n"+
		"rate    : %s pairs/s overall, %s over the first %s, %s over the last %s\n",
		fmtInt(uint64(res.Declared)), fmtInt(uint64(res.Requested)), res.Seconds, res.Channels, res.Connections,
		fmtRate(res.Rate), fmtRate(res.FirstRate), w, fmtRate(res.LastRate), w)
	if res.TimedOut {
		s += "stopped : the --timeout was reached\n"
	}
	if res.FirstError != "" {
		s += "error   : " + res.FirstError + "\n"
	}
	return s
}
