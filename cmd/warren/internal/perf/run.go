package perf

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	wire "warren/amqp"
)

// headerSize is the smallest message body: every body starts with the producer id (2 bytes),
// the sequence number (6 bytes) and the send time in Unix nanoseconds (8 bytes), big-endian,
// then is padded with zeros to the requested size.
const headerSize = 16

// maxProducers is the largest producer count the 2-byte producer id can tell apart.
const maxProducers = 1 << 16

// RunConfig describes one load run. Zero values of the optional fields take the defaults
// documented on each field.
type RunConfig struct {
	URI           string        // broker to load
	Producers     int           // publishing connections (one channel each)
	Consumers     int           // consuming connections (one channel each)
	Queues        int           // queues declared (default 1)
	QueuePattern  string        // fmt pattern with one %d, numbered from 1 (default "perf-q-%d")
	QueueType     string        // classic (default), quorum or stream: sent as x-queue-type
	StreamOffset  string        // x-stream-offset for stream consumers: first, last, next or a number
	ExchangeType  string        // direct (default), fanout or topic
	Exchange      string        // exchange name (default "perf-" + ExchangeType; with Predeclared, the default exchange)
	Size          int           // message body size in bytes (at least headerSize)
	Persistent    bool          // delivery mode 2 and durable queues
	Confirm       int           // outstanding publisher-confirm window; 0 = no confirms
	QoS           int           // consumer prefetch count; 0 = unlimited
	AutoAck       bool          // consume with no-ack
	MultiAckEvery int           // ack with multiple=true every N deliveries (manual ack only)
	Rate          float64       // messages per second per producer; 0 = unlimited
	Duration      time.Duration // bound on the publishing phase; 0 = until PMessages/CMessages
	PMessages     uint64        // messages per producer, then it stops; 0 = unlimited
	CMessages     uint64        // messages per consumer, then it stops; 0 = unlimited
	Predeclared   bool          // queues and exchange exist: declare, bind and delete nothing
	NoCleanup     bool          // leave declared queues and exchange in place afterwards
	// Partitions, when positive, makes Exchange a super stream (Warren's x-super-stream exchange
	// with that many partitions) instead of declaring queues: producers publish to it with routing
	// keys that vary per message, consumers consume it (with ConsumerGroup, as one group).
	Partitions    int
	ConsumerGroup string     // x-stream-consumer-group of the consumers
	ConsumerURI   string     // consumers connect here (default URI): another node of a cluster
	StreamArgs    amqp.Table // extra arguments of declared streams (x-initial-cluster-size, ...)

	// Client is the AMQP client of the producers and consumers: "amqp091" (default), the
	// Go client applications use, or "lean", the tool's own single-goroutine client (see
	// leanConn), which adds less of its own latency and CPU. Lean does not do confirms.
	Client string
	// ConsumerClient, when set, is the consumers' client instead of Client: lean consumers
	// with amqp091 producers that need confirms, so that reading a stream back measures the
	// broker rather than amqp091-go's hand-offs.
	ConsumerClient string

	// ConsumeAfterPublish starts the consumers only once every producer has finished and its
	// confirms are in: the queue is filled as a backlog, then drained.
	ConsumeAfterPublish bool
	// DrainTimeout bounds the drain after publishing stops (default 30s).
	DrainTimeout time.Duration
	// DrainIdle ends the drain when no message arrived for this long (default 1s).
	DrainIdle time.Duration
	// ConfirmTimeout bounds the wait for outstanding confirms after publishing (default 30s).
	ConfirmTimeout time.Duration

	// ConnectionsOnly, when positive, opens that many idle connections with one channel each,
	// holds them for Duration and closes them; nothing is published.
	ConnectionsOnly int

	// Progress, when set, receives a line per ProgressEvery (default 1s) while the run lasts.
	Progress      io.Writer
	ProgressEvery time.Duration
	// OnPhase, when set, is called as the run enters each phase: "publish", "drain", "done".
	OnPhase func(phase string)
}

func (c *RunConfig) setDefaults() {
	if c.Queues == 0 {
		c.Queues = 1
	}
	if c.QueuePattern == "" {
		c.QueuePattern = "perf-q-%d"
	}
	if c.QueueType == "" {
		c.QueueType = "classic"
	}
	if c.ExchangeType == "" {
		c.ExchangeType = "direct"
	}
	if c.Exchange == "" && !c.Predeclared {
		c.Exchange = "perf-" + c.ExchangeType
	}
	if c.Size < headerSize {
		c.Size = headerSize
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 30 * time.Second
	}
	if c.DrainIdle == 0 {
		c.DrainIdle = time.Second
	}
	if c.ConfirmTimeout == 0 {
		c.ConfirmTimeout = 30 * time.Second
	}
	if c.ProgressEvery == 0 {
		c.ProgressEvery = time.Second
	}
	if c.Client == "" {
		c.Client = clientAMQP091
	}
	if c.ConsumerClient == "" {
		c.ConsumerClient = c.Client
	}
}

// The clients --client chooses from.
const (
	clientAMQP091 = "amqp091"
	clientLean    = "lean"
)

func (c *RunConfig) validate() error {
	switch {
	case c.URI == "":
		return errors.New("no broker URI")
	case c.Producers < 0 || c.Consumers < 0 || c.Queues < 1 || c.Confirm < 0 || c.QoS < 0 || c.MultiAckEvery < 0 || c.Rate < 0:
		return errors.New("producers, consumers, confirm, qos, multi-ack-every and rate must not be negative; queues must be at least 1")
	case c.Producers >= maxProducers:
		return fmt.Errorf("at most %d producers", maxProducers-1)
	case c.QoS > 65535:
		return errors.New("qos must be at most 65535")
	case strings.Count(c.QueuePattern, "%") != 1 || !strings.Contains(c.QueuePattern, "%d"):
		return fmt.Errorf("queue pattern %q must contain exactly one %%d", c.QueuePattern)
	case c.ConnectionsOnly == 0 && c.Producers == 0 && c.Consumers == 0:
		return errors.New("nothing to do: no producers, no consumers and no --connections-only")
	case c.ConnectionsOnly == 0 && c.Duration == 0 && c.PMessages == 0 && c.CMessages == 0:
		return errors.New("unbounded run: give a duration, pmessages or cmessages")
	}
	switch c.QueueType {
	case "classic", "quorum":
	case "stream":
		if c.AutoAck || c.QoS == 0 {
			return errors.New("stream queues need manual acks and a prefetch: use --qos N without --auto-ack")
		}
	default:
		return fmt.Errorf("unknown queue type %q: want classic, quorum or stream", c.QueueType)
	}
	switch c.ExchangeType {
	case "direct", "fanout", "topic":
	default:
		return fmt.Errorf("unknown exchange type %q: want direct, fanout or topic", c.ExchangeType)
	}
	if c.Partitions > 0 && (c.QueueType != "stream" || c.ExchangeType != "direct") {
		return errors.New("a super stream (partitions) needs --queue-type stream")
	}
	if c.Predeclared && c.Exchange == "" && c.ExchangeType == "fanout" {
		return errors.New("--predeclared with a fanout exchange needs its name: --exchange NAME")
	}
	for _, client := range []string{c.Client, c.ConsumerClient} {
		if client != clientAMQP091 && client != clientLean {
			return fmt.Errorf("unknown client %q: want %s or %s", client, clientAMQP091, clientLean)
		}
	}
	if c.Client == clientLean && c.Confirm > 0 {
		return errors.New("--client lean does not do confirms: use --client amqp091 (and --consumer-client lean)")
	}
	if c.AutoAck && c.MultiAckEvery > 0 {
		return errors.New("--multi-ack-every needs manual acks: drop --auto-ack")
	}
	if c.QoS > 0 && c.MultiAckEvery > c.QoS {
		return fmt.Errorf("--multi-ack-every %d exceeds the prefetch %d: consumers would stall", c.MultiAckEvery, c.QoS)
	}
	return nil
}

// Result is what a run measured. Rates are messages per second; latencies are end-to-end
// (consume time minus the send time in the body) in microseconds.
type Result struct {
	Producers    int     `json:"producers"`
	Consumers    int     `json:"consumers"`
	Queues       int     `json:"queues"`
	QueueType    string  `json:"queue_type"`
	ExchangeType string  `json:"exchange_type"`
	Size         int     `json:"size"`
	Persistent   bool    `json:"persistent"`
	Confirm      int     `json:"confirm"`
	QoS          int     `json:"qos"`
	AutoAck      bool    `json:"auto_ack"`
	Rate         float64 `json:"rate"`

	PublishSeconds float64 `json:"publish_seconds"` // first publish to last publish
	ConfirmSeconds float64 `json:"confirm_seconds"` // first publish to last confirm
	ConsumeSeconds float64 `json:"consume_seconds"` // consumers' start to last delivery

	Published  uint64 `json:"published"`
	Confirmed  uint64 `json:"confirmed"`
	Nacked     uint64 `json:"nacked"`
	Consumed   uint64 `json:"consumed"`        // deliveries of this run's messages, duplicates included
	Duplicates uint64 `json:"duplicates"`      // deliveries of a message already consumed
	Stale      uint64 `json:"stale,omitempty"` // deliveries of messages not published by this run

	// LossChecked says whether Lost is meaningful: confirms were on and every producer's
	// messages went to a queue with a consumer.
	LossChecked    bool              `json:"loss_checked"`
	Lost           uint64            `json:"lost"` // confirmed, never consumed
	LostByProducer map[string]uint64 `json:"lost_by_producer,omitempty"`
	NotConsumed    uint64            `json:"not_consumed"` // published (confirmed or not), never consumed

	PublishRate float64 `json:"publish_rate"`
	ConfirmRate float64 `json:"confirm_rate"`
	ConsumeRate float64 `json:"consume_rate"`

	Latency LatencyStats `json:"latency_us"`

	Connections *IdleResult `json:"connections,omitempty"`

	Errors []string `json:"errors,omitempty"`
}

// LatencyStats summarises end-to-end latencies, in microseconds.
type LatencyStats struct {
	Samples uint64  `json:"samples"`
	Mean    float64 `json:"mean"`
	P50     float64 `json:"p50"`
	P75     float64 `json:"p75"`
	P95     float64 `json:"p95"`
	P99     float64 `json:"p99"`
	Max     float64 `json:"max"`
}

// runner holds the state of one run.
type runner struct {
	cfg        RunConfig
	queues     []string
	fanout     bool
	startNanos int64 // the run's start; messages sent earlier are stale
	stopping   atomic.Bool
	stop       chan struct{} // closed to stop producers
	consumed   [][]*seqSet   // [queue index if fanout, else 0][producer]
	producers  []*producer
	consMu     sync.Mutex // guards consumers, which the progress reporter reads
	consumers  []*consumer
	consStart  time.Time

	errMu sync.Mutex
	errs  []string
}

type producer struct {
	id       int
	conn     *amqp.Connection
	raw      *coalescingConn
	ch       *amqp.Channel
	lean     *leanConn // with --client lean, instead of conn, raw and ch
	exchange string
	key      string
	sem      chan struct{} // confirm window
	confirms chan amqp.Confirmation
	closed   chan *amqp.Error // the channel's close reason
	wg       sync.WaitGroup   // the confirm loop

	confirmedSet seqSet
	sent         atomic.Uint64
	confirmed    atomic.Uint64
	nacked       atomic.Uint64
	lastConfirm  atomic.Int64 // Unix nanos
	endNanos     atomic.Int64 // when publishing ended
	done         chan struct{}
}

type consumer struct {
	id         int
	queue      int // index into runner.queues
	track      int // first index into runner.consumed
	conn       *amqp.Connection
	raw        *coalescingConn
	ch         *amqp.Channel
	lean       *leanConn // with --client lean, instead of conn, raw, ch and deliveries
	deliveries <-chan amqp.Delivery
	closed     chan *amqp.Error // the channel's close reason
	stop       chan struct{}
	done       chan struct{}

	received atomic.Uint64 // this run's messages, duplicates included
	fresh    atomic.Uint64 // first deliveries of this run's messages
	dups     atomic.Uint64
	stale    atomic.Uint64
	last     atomic.Int64 // Unix nanos of the last delivery
	hist     histogram

	unacked uint64 // deliveries since the last multiple ack (consumer goroutine only)
	lastTag uint64
}

func (r *runner) addErr(format string, args ...any) {
	r.errMu.Lock()
	defer r.errMu.Unlock()
	if len(r.errs) < 50 {
		r.errs = append(r.errs, fmt.Sprintf(format, args...))
	}
}

// dial opens a connection named for the broker's connection list, writing through a
// coalescingConn so that publishes and acks do not each cost a system call.
func dial(uri, name string) (*amqp.Connection, error) {
	conn, _, err := dialRaw(uri, name)
	return conn, err
}

// dialRaw is dial that also returns the socket, which abort can close under a client
// blocked in a write.
func dialRaw(uri, name string) (*amqp.Connection, *coalescingConn, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(name)
	var raw *coalescingConn
	conn, err := amqp.DialConfig(uri, amqp.Config{
		Properties: props,
		Locale:     "en_US",
		Dial: func(network, addr string) (net.Conn, error) {
			c, err := amqp.DefaultDial(10*time.Second)(network, addr)
			if err != nil {
				return nil, err
			}
			raw = newCoalescingConn(c)
			return raw, nil
		},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s: %w", redact(uri), err)
	}
	return conn, raw, nil
}

// stuckTimeout is how long a stopping producer or consumer may stay blocked (say, by a broker
// that stopped reading, or blocked publishers with connection.blocked) before its socket is
// closed under it.
const stuckTimeout = 10 * time.Second

// abortSocket returns a function that closes the socket of whichever client a producer or
// consumer uses.
func abortSocket(raw *coalescingConn, lean *leanConn) func() {
	return func() {
		switch {
		case lean != nil:
			lean.abort()
		case raw != nil:
			_ = raw.Conn.Close()
		}
	}
}

// waitOrAbort waits for done; at deadline it calls abort (which closes the socket under a
// stuck client) and waits again.
func waitOrAbort(done <-chan struct{}, abort func(), deadline time.Time) (aborted bool) {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-done:
		return false
	case <-t.C:
	}
	abort()
	<-done
	return true
}

// redact hides the password of an AMQP URI.
func redact(uri string) string {
	u, err := url.Parse(uri)
	if err != nil {
		return "(unparseable URI)"
	}
	if u.User != nil {
		u.User = url.User(u.User.Username())
	}
	return u.String()
}

// Run performs one load run as cfg describes and returns what it measured. It returns an
// error only when the run cannot start (bad configuration, broker unreachable, declarations
// refused); trouble once messages flow is reported in Result.Errors.
func Run(ctx context.Context, cfg RunConfig) (*Result, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.ConnectionsOnly > 0 {
		return runIdle(ctx, cfg)
	}
	r := &runner{cfg: cfg, fanout: cfg.ExchangeType == "fanout", stop: make(chan struct{})}
	for i := 1; i <= cfg.Queues; i++ {
		r.queues = append(r.queues, fmt.Sprintf(cfg.QueuePattern, i))
	}
	tracks := 1
	if r.fanout {
		tracks = cfg.Queues
	}
	r.consumed = make([][]*seqSet, tracks)
	for t := range r.consumed {
		r.consumed[t] = make([]*seqSet, cfg.Producers)
		for p := range r.consumed[t] {
			r.consumed[t][p] = &seqSet{}
		}
	}

	setup, err := dial(cfg.URI, "warren-perf setup")
	if err != nil {
		return nil, err
	}
	defer setup.Close()
	declared := false
	finished := false
	// finish closes every client connection and deletes what was declared; on the normal path
	// it runs before the result is computed so cleanup problems are reported.
	finish := func() {
		if finished {
			return
		}
		finished = true
		r.closeAll()
		if declared && !cfg.NoCleanup {
			r.cleanup(setup)
		}
	}
	defer finish()
	if !cfg.Predeclared {
		declared = true // a half-done declaration is cleaned up too
		if err := r.declare(setup); err != nil {
			return nil, err
		}
	}

	// Messages sent before this instant are not this run's (leftovers in the queues); it is
	// fixed before any consumer starts.
	r.startNanos = time.Now().UnixNano()
	if !cfg.ConsumeAfterPublish {
		if err := r.startConsumers(); err != nil {
			return nil, err
		}
	}
	if err := r.openProducers(); err != nil {
		return nil, err
	}

	start := time.Now()
	if !cfg.ConsumeAfterPublish {
		r.consStart = start
	}
	stopProgress := r.startProgress(start)
	r.phase("publish")
	for _, p := range r.producers {
		go p.publish(r)
	}
	r.waitPublishing(ctx)
	r.waitConfirms(ctx)
	pubEnd := time.Now()

	if cfg.ConsumeAfterPublish && cfg.Consumers > 0 && ctx.Err() == nil {
		r.phase("drain")
		if err := r.startConsumers(); err != nil {
			r.addErr("%v", err)
		}
		r.drain(ctx, pubEnd)
	} else if len(r.consumers) > 0 && cfg.Producers > 0 {
		r.phase("drain")
		r.drain(ctx, pubEnd)
	}
	r.stopConsumers()
	stopProgress()
	finish()
	r.phase("done")
	return r.result(start), nil
}

func (r *runner) phase(name string) {
	if r.cfg.OnPhase != nil {
		r.cfg.OnPhase(name)
	}
}

// declare creates the exchange and queues and binds them.
func (r *runner) declare(conn *amqp.Connection) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open setup channel: %w", err)
	}
	defer ch.Close()
	if r.cfg.Partitions > 0 {
		args := amqp.Table{"x-partitions": int64(r.cfg.Partitions)}
		for k, v := range r.cfg.StreamArgs {
			args[k] = v
		}
		if err := ch.ExchangeDeclare(r.cfg.Exchange, "x-super-stream", true, false, false, false, args); err != nil {
			return fmt.Errorf("declare super stream %q: %w", r.cfg.Exchange, err)
		}
		return nil
	}
	if err := ch.ExchangeDeclare(r.cfg.Exchange, r.cfg.ExchangeType, false, false, false, false, nil); err != nil {
		return fmt.Errorf("declare %s exchange %q: %w", r.cfg.ExchangeType, r.cfg.Exchange, err)
	}
	durable := r.cfg.Persistent || r.cfg.QueueType != "classic"
	for _, q := range r.queues {
		args := amqp.Table{"x-queue-type": r.cfg.QueueType}
		if r.cfg.QueueType == "stream" {
			for k, v := range r.cfg.StreamArgs {
				args[k] = v
			}
		}
		if _, err := ch.QueueDeclare(q, durable, false, false, false, args); err != nil {
			return fmt.Errorf("declare %s queue %q: %w", r.cfg.QueueType, q, err)
		}
		key := q
		if r.fanout {
			key = ""
		}
		if err := ch.QueueBind(q, key, r.cfg.Exchange, false, nil); err != nil {
			return fmt.Errorf("bind queue %q to %q: %w", q, r.cfg.Exchange, err)
		}
	}
	return nil
}

// cleanup deletes what declare created; failures are only reported.
func (r *runner) cleanup(conn *amqp.Connection) {
	ch, err := conn.Channel()
	if err != nil {
		r.addErr("cleanup: open channel: %v", err)
		return
	}
	defer ch.Close()
	if r.cfg.Partitions > 0 {
		if err := ch.ExchangeDelete(r.cfg.Exchange, false, false); err != nil {
			r.addErr("cleanup: delete super stream %q: %v", r.cfg.Exchange, err)
		}
		return
	}
	for _, q := range r.queues {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			r.addErr("cleanup: delete queue %q: %v", q, err)
			return
		}
	}
	if err := ch.ExchangeDelete(r.cfg.Exchange, false, false); err != nil {
		r.addErr("cleanup: delete exchange %q: %v", r.cfg.Exchange, err)
	}
}

// openProducers connects every producer and puts its channel in confirm mode if asked.
func (r *runner) openProducers() error {
	for i := 0; i < r.cfg.Producers; i++ {
		p := &producer{id: i, exchange: r.cfg.Exchange, done: make(chan struct{})}
		p.key = r.queues[i%len(r.queues)]
		if r.fanout {
			p.key = ""
		}
		name := fmt.Sprintf("warren-perf producer %d", i)
		if r.cfg.Client == clientLean {
			l, err := dialLean(r.cfg.URI, name)
			if err != nil {
				return err
			}
			p.lean, p.closed = l, l.closed
			r.producers = append(r.producers, p)
			l.startReader()
			continue
		}
		conn, raw, err := dialRaw(r.cfg.URI, name)
		if err != nil {
			return err
		}
		p.conn, p.raw = conn, raw
		r.producers = append(r.producers, p)
		if p.ch, err = conn.Channel(); err != nil {
			return fmt.Errorf("producer %d: open channel: %w", i, err)
		}
		p.closed = p.ch.NotifyClose(make(chan *amqp.Error, 1))
		if r.cfg.Confirm > 0 {
			if err := p.ch.Confirm(false); err != nil {
				return fmt.Errorf("producer %d: confirm.select: %w", i, err)
			}
			p.sem = make(chan struct{}, r.cfg.Confirm)
			p.confirms = p.ch.NotifyPublish(make(chan amqp.Confirmation, r.cfg.Confirm+1))
			p.wg.Add(1)
			go p.confirmLoop()
		}
	}
	return nil
}

// publish is a producer's loop; it ends on stop, PMessages or a channel error.
func (p *producer) publish(r *runner) {
	defer close(p.done)
	defer func() { p.endNanos.Store(time.Now().UnixNano()) }()
	body := make([]byte, r.cfg.Size)
	binary.BigEndian.PutUint16(body[0:2], uint16(p.id))
	msg := amqp.Publishing{Body: body, DeliveryMode: amqp.Transient}
	if r.cfg.Persistent {
		msg.DeliveryMode = amqp.Persistent
	}
	send := func() error { return p.ch.Publish(p.exchange, p.key, false, false, msg) }
	if r.cfg.Partitions > 0 {
		var keyBuf []byte
		var seq uint64
		send = func() error {
			seq++
			keyBuf = strconv.AppendUint(append(keyBuf[:0], 'k'), seq%997, 10)
			return p.ch.Publish(p.exchange, string(keyBuf), false, false, msg)
		}
	}
	if p.lean != nil {
		send = func() error { return p.lean.publish(p.exchange, p.key, msg.DeliveryMode, body) }
	}
	var pace *time.Timer
	var interval float64
	if r.cfg.Rate > 0 {
		interval = float64(time.Second) / r.cfg.Rate
		pace = time.NewTimer(time.Hour)
		pace.Stop()
		defer pace.Stop()
	}
	start := time.Now()
	for seq := uint64(1); r.cfg.PMessages == 0 || seq <= r.cfg.PMessages; seq++ {
		if r.stopping.Load() {
			return
		}
		if pace != nil {
			if d := time.Until(start.Add(time.Duration(float64(seq-1) * interval))); d > 0 {
				pace.Reset(d)
				select {
				case <-pace.C:
				case <-r.stop:
					return
				}
			}
		}
		if p.sem != nil {
			select {
			case p.sem <- struct{}{}:
			case <-r.stop:
				return
			}
		}
		put48(body[2:8], seq)
		binary.BigEndian.PutUint64(body[8:16], uint64(time.Now().UnixNano()))
		if err := send(); err != nil {
			if !r.stopping.Load() {
				r.addErr("producer %d: publish: %v (%s)", p.id, err, closeReason(p.closed))
			}
			return
		}
		p.sent.Add(1)
	}
}

// confirmLoop records confirms (delivery tag = sequence number) and frees window slots.
func (p *producer) confirmLoop() {
	defer p.wg.Done()
	for c := range p.confirms {
		if c.Ack {
			p.confirmedSet.add(c.DeliveryTag)
			p.confirmed.Add(1)
		} else {
			p.nacked.Add(1)
		}
		p.lastConfirm.Store(time.Now().UnixNano())
		select {
		case <-p.sem:
		default:
		}
	}
}

// closeReason describes why an AMQP channel closed, waiting briefly for the reason to arrive.
func closeReason(closed <-chan *amqp.Error) string {
	select {
	case e, ok := <-closed:
		if ok && e != nil {
			return e.Error()
		}
	case <-time.After(100 * time.Millisecond):
	}
	return "closed without a reason"
}

func put48(b []byte, v uint64) {
	b[0], b[1], b[2], b[3], b[4], b[5] = byte(v>>40), byte(v>>32), byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
}

func get48(b []byte) uint64 {
	return uint64(b[0])<<40 | uint64(b[1])<<32 | uint64(b[2])<<24 | uint64(b[3])<<16 | uint64(b[4])<<8 | uint64(b[5])
}

// startConsumers connects every consumer and waits for its consume-ok.
func (r *runner) startConsumers() error {
	args := amqp.Table{}
	if r.cfg.QueueType == "stream" && r.cfg.StreamOffset != "" {
		args["x-stream-offset"] = streamOffset(r.cfg.StreamOffset)
	}
	if r.cfg.ConsumerGroup != "" {
		args["x-stream-consumer-group"] = r.cfg.ConsumerGroup
	}
	consumeFrom := func(i int) string { return r.queues[i] }
	if r.cfg.Partitions > 0 {
		consumeFrom = func(int) string { return r.cfg.Exchange }
	}
	uri := r.cfg.URI
	if r.cfg.ConsumerURI != "" {
		uri = r.cfg.ConsumerURI
	}
	var started []*consumer
	fail := func(err error) error {
		for _, c := range started {
			c.close()
		}
		return err
	}
	for i := 0; i < r.cfg.Consumers; i++ {
		c := &consumer{id: i, queue: i % len(r.queues), stop: make(chan struct{}), done: make(chan struct{})}
		if r.fanout {
			c.track = c.queue
		}
		name := fmt.Sprintf("warren-perf consumer %d", i)
		if r.cfg.ConsumerClient == clientLean {
			l, err := dialLean(uri, name)
			if err != nil {
				return fail(err)
			}
			c.lean = l
			started = append(started, c)
			if err := l.consume(consumeFrom(c.queue), r.cfg.QoS, r.cfg.AutoAck, wire.Table(args)); err != nil {
				return fail(fmt.Errorf("consumer %d: consume from %q: %w", i, consumeFrom(c.queue), err))
			}
			continue
		}
		conn, raw, err := dialRaw(uri, name)
		if err != nil {
			return fail(err)
		}
		c.conn, c.raw = conn, raw
		started = append(started, c)
		if c.ch, err = conn.Channel(); err != nil {
			return fail(fmt.Errorf("consumer %d: open channel: %w", i, err))
		}
		c.closed = c.ch.NotifyClose(make(chan *amqp.Error, 1))
		if r.cfg.QoS > 0 {
			if err := c.ch.Qos(r.cfg.QoS, 0, false); err != nil {
				return fail(fmt.Errorf("consumer %d: basic.qos: %w", i, err))
			}
		}
		if c.deliveries, err = c.ch.Consume(consumeFrom(c.queue), "", r.cfg.AutoAck, false, false, false, args); err != nil {
			return fail(fmt.Errorf("consumer %d: consume from %q: %w", i, consumeFrom(c.queue), err))
		}
	}
	r.consMu.Lock()
	r.consumers = started
	r.consMu.Unlock()
	r.consStart = time.Now()
	for _, c := range r.consumers {
		if c.lean != nil {
			go c.runLean(r)
		} else {
			go c.run(r)
		}
	}
	return nil
}

// streamOffset turns a --stream-offset value into what x-stream-offset expects: a number
// for an offset, otherwise the string (first, last, next, or an interval such as 10m).
func streamOffset(s string) any {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n
	}
	return s
}

// run is a consumer's loop; it ends when stopped, after CMessages, or when its channel closes.
func (c *consumer) run(r *runner) {
	defer close(c.done)
	for {
		select {
		case d, ok := <-c.deliveries:
			if !ok {
				if !c.stopped() {
					r.addErr("consumer %d: deliveries ended: %s", c.id, closeReason(c.closed))
				}
				return
			}
			c.handle(r, &d)
			if r.cfg.CMessages > 0 && c.received.Load()+c.stale.Load() >= r.cfg.CMessages {
				c.ackPending(r)
				return
			}
		case <-c.stop:
			c.ackPending(r)
			return
		}
	}
}

// runLean is run for a consumer on the lean client: it reads each delivery itself.
func (c *consumer) runLean(r *runner) {
	defer close(c.done)
	quit := make(chan struct{})
	defer close(quit)
	go func() {
		select {
		case <-c.stop:
			if err := c.lean.cancel(); err != nil {
				c.lean.abort()
			}
		case <-quit:
		}
	}()
	for {
		tag, body, err := c.lean.next()
		if err != nil {
			if !errors.Is(err, errCancelled) && !c.stopped() {
				r.addErr("consumer %d: deliveries ended: %v", c.id, err)
			}
			c.ackPending(r)
			return
		}
		c.handle(r, &amqp.Delivery{DeliveryTag: tag, Body: body})
		if r.cfg.CMessages > 0 && c.received.Load()+c.stale.Load() >= r.cfg.CMessages {
			c.ackPending(r)
			return
		}
	}
}

// close closes the consumer's connection (amqp091 or lean) without waiting long.
func (c *consumer) close() {
	switch {
	case c.lean != nil:
		_ = c.lean.Close(5 * time.Second)
	case c.conn != nil:
		_ = c.conn.CloseDeadline(time.Now().Add(5 * time.Second))
	}
}

func (c *consumer) stopped() bool {
	select {
	case <-c.stop:
		return true
	default:
		return false
	}
}

// handle accounts for one delivery and acknowledges it as configured.
func (c *consumer) handle(r *runner, d *amqp.Delivery) {
	now := time.Now().UnixNano()
	body := d.Body
	ours := false
	if len(body) >= headerSize {
		pid := int(binary.BigEndian.Uint16(body[0:2]))
		seq := get48(body[2:8])
		sent := int64(binary.BigEndian.Uint64(body[8:16]))
		switch {
		case r.cfg.Producers == 0 && sent > 0 && sent <= now: // consume-only run
			ours = true
			c.hist.record(time.Duration(now - sent))
			c.fresh.Add(1)
		case pid < r.cfg.Producers && sent >= r.startNanos && sent <= now:
			ours = true
			c.hist.record(time.Duration(now - sent))
			if r.consumed[c.track][pid].add(seq) {
				c.fresh.Add(1)
			} else {
				c.dups.Add(1)
			}
		}
	}
	if ours {
		c.received.Add(1)
	} else {
		c.stale.Add(1)
	}
	c.last.Store(now)
	if r.cfg.AutoAck {
		return
	}
	if r.cfg.MultiAckEvery > 1 {
		c.unacked++
		c.lastTag = d.DeliveryTag
		if c.unacked >= uint64(r.cfg.MultiAckEvery) {
			c.ack(r, d.DeliveryTag, true)
			c.unacked = 0
		}
		return
	}
	c.ack(r, d.DeliveryTag, false)
}

func (c *consumer) ack(r *runner, tag uint64, multiple bool) {
	var err error
	if c.lean != nil {
		err = c.lean.ack(tag, multiple)
	} else {
		err = c.ch.Ack(tag, multiple)
	}
	if err != nil && !r.stopping.Load() {
		r.addErr("consumer %d: ack: %v", c.id, err)
	}
}

// ackPending acknowledges deliveries held back by --multi-ack-every.
func (c *consumer) ackPending(r *runner) {
	if c.unacked > 0 {
		c.ack(r, c.lastTag, true)
		c.unacked = 0
	}
}

// waitPublishing returns when every producer has finished, or the duration is over, or (for
// a consume-only run) every consumer has reached CMessages, or ctx ends; then it stops the
// producers.
func (r *runner) waitPublishing(ctx context.Context) {
	var timeout <-chan time.Time
	if r.cfg.Duration > 0 {
		t := time.NewTimer(r.cfg.Duration)
		defer t.Stop()
		timeout = t.C
	}
	allDone := make(chan struct{})
	var watchers sync.WaitGroup
	quit := make(chan struct{})
	defer func() { close(quit); watchers.Wait() }()
	watchers.Add(1)
	go func() {
		defer watchers.Done()
		switch {
		case len(r.producers) > 0:
			for _, p := range r.producers {
				select {
				case <-p.done:
				case <-quit:
					return
				}
			}
		case r.cfg.CMessages > 0 && len(r.consumers) > 0:
			for _, c := range r.consumers {
				select {
				case <-c.done:
				case <-quit:
					return
				}
			}
		default:
			return // wait for the duration or ctx alone
		}
		close(allDone)
	}()
	select {
	case <-allDone:
	case <-timeout:
	case <-ctx.Done():
	}
	r.stopping.Store(true)
	close(r.stop)
	deadline := time.Now().Add(stuckTimeout)
	for _, p := range r.producers {
		if waitOrAbort(p.done, abortSocket(p.raw, p.lean), deadline) {
			r.addErr("producer %d: publish still blocked %s after the stop (connection.blocked or a broker not reading?); its connection was closed", p.id, stuckTimeout)
		}
	}
}

// waitConfirms waits, bounded by ConfirmTimeout and ctx, until every published message of
// every producer is confirmed or nacked.
func (r *runner) waitConfirms(ctx context.Context) {
	if r.cfg.Confirm == 0 {
		return
	}
	deadline := time.Now().Add(r.cfg.ConfirmTimeout)
	for _, p := range r.producers {
		for p.confirmed.Load()+p.nacked.Load() < p.sent.Load() && time.Now().Before(deadline) && ctx.Err() == nil && !p.conn.IsClosed() {
			time.Sleep(2 * time.Millisecond)
		}
	}
}

// drain waits until consumers have seen everything they can expect, or nothing arrived for
// DrainIdle, or DrainTimeout passed, or ctx ended.
func (r *runner) drain(ctx context.Context, from time.Time) {
	var expected uint64
	hasConsumer := make([]bool, len(r.queues))
	for _, c := range r.consumers {
		hasConsumer[c.queue] = true
	}
	for _, p := range r.producers {
		n := p.sent.Load()
		if r.cfg.Confirm > 0 {
			n = p.confirmed.Load()
		}
		if r.fanout {
			for _, ok := range hasConsumer {
				if ok {
					expected += n
				}
			}
		} else if hasConsumer[p.id%len(r.queues)] {
			expected += n
		}
	}
	deadline := from.Add(r.cfg.DrainTimeout)
	idleSince := from
	lastSeen := int64(0)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		var fresh uint64
		var last int64
		running := 0
		for _, c := range r.consumers {
			fresh += c.fresh.Load()
			if l := c.last.Load(); l > last {
				last = l
			}
			if !c.stopped() {
				select {
				case <-c.done:
				default:
					running++
				}
			}
		}
		if (r.cfg.Producers > 0 && fresh >= expected) || running == 0 {
			return
		}
		if last != lastSeen {
			lastSeen = last
			idleSince = time.Now()
		}
		if time.Since(idleSince) >= r.cfg.DrainIdle {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stopConsumers ends every consumer loop and closes its connection.
func (r *runner) stopConsumers() {
	r.stopping.Store(true)
	for _, c := range r.consumers {
		close(c.stop)
	}
	deadline := time.Now().Add(stuckTimeout)
	for _, c := range r.consumers {
		if waitOrAbort(c.done, abortSocket(c.raw, c.lean), deadline) {
			r.addErr("consumer %d: still blocked %s after the stop; its connection was closed", c.id, stuckTimeout)
		}
	}
}

// closeAll closes every producer and consumer connection in parallel and waits for the
// producers' confirm loops.
func (r *runner) closeAll() {
	var wg sync.WaitGroup
	closeConn := func(conn *amqp.Connection) {
		defer wg.Done()
		if conn != nil {
			_ = conn.CloseDeadline(time.Now().Add(5 * time.Second))
		}
	}
	for _, p := range r.producers {
		wg.Add(1)
		if p.lean != nil {
			go func() {
				defer wg.Done()
				_ = p.lean.Close(5 * time.Second)
			}()
			continue
		}
		go closeConn(p.conn)
	}
	for _, c := range r.consumers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.close()
		}()
	}
	wg.Wait()
	for _, p := range r.producers {
		p.wg.Wait()
	}
}

// result computes the run's figures once every producer and consumer has stopped.
func (r *runner) result(start time.Time) *Result {
	cfg := r.cfg
	res := &Result{
		Producers: cfg.Producers, Consumers: cfg.Consumers, Queues: cfg.Queues,
		QueueType: cfg.QueueType, ExchangeType: cfg.ExchangeType, Size: cfg.Size,
		Persistent: cfg.Persistent, Confirm: cfg.Confirm, QoS: cfg.QoS, AutoAck: cfg.AutoAck, Rate: cfg.Rate,
	}
	startNanos := start.UnixNano()
	var pubEnd, confEnd int64
	for _, p := range r.producers {
		res.Published += p.sent.Load()
		res.Confirmed += p.confirmed.Load()
		res.Nacked += p.nacked.Load()
		pubEnd = max(pubEnd, p.endNanos.Load())
		confEnd = max(confEnd, p.lastConfirm.Load())
	}
	var snap histSnapshot
	var consEnd int64
	for _, c := range r.consumers {
		res.Consumed += c.received.Load()
		res.Duplicates += c.dups.Load()
		res.Stale += c.stale.Load()
		consEnd = max(consEnd, c.last.Load())
		snap.addFinal(&c.hist)
	}
	if pubEnd > startNanos {
		res.PublishSeconds = float64(pubEnd-startNanos) / 1e9
		res.PublishRate = float64(res.Published) / res.PublishSeconds
	}
	if confEnd > startNanos {
		res.ConfirmSeconds = float64(confEnd-startNanos) / 1e9
		res.ConfirmRate = float64(res.Confirmed) / res.ConfirmSeconds
	}
	if cs := r.consStart.UnixNano(); consEnd > cs && !r.consStart.IsZero() {
		res.ConsumeSeconds = float64(consEnd-cs) / 1e9
		res.ConsumeRate = float64(res.Consumed) / res.ConsumeSeconds
	}
	res.Latency = snap.stats()

	// The loss check: for every queue with a consumer, each producer routed there must have
	// had every confirmed message consumed from it.
	hasConsumer := make([]bool, len(r.queues))
	for _, c := range r.consumers {
		hasConsumer[c.queue] = true
	}
	res.LossChecked = cfg.Confirm > 0 && len(r.consumers) > 0
	for _, p := range r.producers {
		for t := range r.consumed {
			q := t
			if !r.fanout {
				q = p.id % len(r.queues)
			}
			if !hasConsumer[q] {
				res.LossChecked = false
				continue
			}
			got := r.consumed[t][p.id]
			if distinct := got.count(); distinct < p.sent.Load() {
				res.NotConsumed += p.sent.Load() - distinct
			}
			if cfg.Confirm > 0 {
				if lost := got.missingFrom(&p.confirmedSet); lost > 0 {
					res.Lost += lost
					if res.LostByProducer == nil {
						res.LostByProducer = map[string]uint64{}
					}
					res.LostByProducer[strconv.Itoa(p.id)] += lost
				}
			}
		}
	}
	r.errMu.Lock()
	res.Errors = append(res.Errors, r.errs...)
	r.errMu.Unlock()
	return res
}
