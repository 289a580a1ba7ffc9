package dlq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// defaultConfirmTimeout bounds the wait for a publisher confirm when Options gives none.
const defaultConfirmTimeout = 30 * time.Second

// Options configures a redrive.
type Options struct {
	URI   string // AMQP URI of the broker
	Queue string // the dead-letter queue to drain

	// To, when set, sends every message to this queue (through the default exchange) instead of
	// back to where it first died.
	To string
	// ToSourceQueue sends every message straight to the queue it first died in (through the
	// default exchange) instead of republishing it to its original exchange and routing keys,
	// which would also reach every other queue bound to them.
	ToSourceQueue bool

	Limit  int  // stop after this many messages; 0 = every message the queue held at the start
	DryRun bool // read the messages without removing them and report what would be moved

	// Window is the number of republished messages awaiting their publisher confirm at once
	// (default 100).
	Window int
	// ConfirmTimeout bounds the wait for a publisher confirm (default 30s).
	ConfirmTimeout time.Duration
	// Logger receives debug logs; nil means slog.Default().
	Logger *slog.Logger
}

// Group counts the messages of one reason, source queue and target.
type Group struct {
	Reason      string // why the messages first died; "" when they carry no x-death
	SourceQueue string // the queue they first died in; "" when they carry no x-death
	Target      string // where they go (or went), or why they cannot be moved
	Movable     bool   // false when no target could be determined
	Count       int    // messages seen (dry run) or handled (redrive)
	Moved       int    // messages republished, confirmed and removed from the dead-letter queue
	Failed      int    // messages left in the dead-letter queue
}

// Result reports what a redrive did, or what a dry run would do.
type Result struct {
	Queue  string
	DryRun bool
	Ready  int // messages ready in the dead-letter queue when the redrive started
	Moved  int // dry run: messages that would be moved
	Failed int // dry run: messages that could not be moved
	// InFlight counts the failed messages that were republished without a confirm when the
	// redrive stopped: they stay in the dead-letter queue and may also have reached their target
	// (at-least-once).
	InFlight int
	// Remaining is the number of messages ready in the dead-letter queue at the end (-1: unknown).
	Remaining int
	Groups    []*Group // sorted by source queue, reason, target
}

// inflight is a republished message waiting for its publisher confirm.
type inflight struct {
	seq      uint64 // publish sequence number
	tag      uint64 // delivery tag of the dead-letter queue message
	fp       string // fingerprint, to match a basic.return
	group    *Group
	target   target
	returned *amqp.Return
}

// event is a publisher confirm, a basic.return, or (both nil) the channel's end, in the order the
// client library received them.
type event struct {
	confirm *amqp.Confirmation
	ret     *amqp.Return
}

// redriver holds the state of one redrive.
type redriver struct {
	opts    Options
	log     *slog.Logger
	conn    *amqp.Connection
	ch      *amqp.Channel
	closes  chan *amqp.Error
	events  chan event
	res     *Result
	groups  map[string]*Group
	pending []*inflight
	exists  map[string]error // exchange name -> nil if it exists
	stopErr error            // why the redrive stops early
}

// Redrive moves the messages of a dead-letter queue back to where they first died (or to opts.To),
// or, with opts.DryRun, reports what it would move. Each message is removed from the dead-letter
// queue only after its republish was confirmed by the broker; a message the broker returns as
// unroutable or refuses (basic.nack) stays in the dead-letter queue and stops the redrive. A crash
// can therefore duplicate a message but never lose one.
//
// The Result is valid even when an error is returned; the error says why not everything was moved.
func Redrive(ctx context.Context, opts Options) (*Result, error) {
	if opts.Queue == "" {
		return nil, errors.New("no dead-letter queue given (--queue)")
	}
	if opts.To != "" && opts.ToSourceQueue {
		return nil, errors.New("--to and --to-source-queue exclude each other")
	}
	if opts.To == opts.Queue {
		return nil, fmt.Errorf("--to %q is the dead-letter queue itself", opts.To)
	}
	if opts.Limit < 0 {
		return nil, fmt.Errorf("--limit %d is negative", opts.Limit)
	}
	if opts.Window <= 0 {
		opts.Window = 100
	}
	if opts.ConfirmTimeout <= 0 {
		opts.ConfirmTimeout = defaultConfirmTimeout
	}
	r := &redriver{
		opts:   opts,
		log:    opts.Logger,
		res:    &Result{Queue: opts.Queue, DryRun: opts.DryRun, Remaining: -1},
		groups: map[string]*Group{},
		exists: map[string]error{},
	}
	if r.log == nil {
		r.log = slog.Default()
	}
	conn, err := amqp.DialConfig(opts.URI, amqp.Config{
		Properties: amqp.Table{"connection_name": "warren dlq redrive"},
	})
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", redactURI(opts.URI), err)
	}
	r.conn = conn
	defer conn.Close()

	err = r.run(ctx)
	r.finishGroups()
	return r.res, err
}

func (r *redriver) run(ctx context.Context) error {
	ch, err := r.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	r.ch = ch
	r.closes = ch.NotifyClose(make(chan *amqp.Error, 1))
	q, err := ch.QueueDeclarePassive(r.opts.Queue, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("dead-letter queue %q: %w", r.opts.Queue, err)
	}
	r.res.Ready = q.Messages
	if r.opts.To != "" {
		if err := r.checkQueue(r.opts.To); err != nil {
			return err
		}
	}
	// Take no more than the queue held at the start: a message that comes back into the dead-letter
	// queue while the redrive runs (or one that a target routes straight back) is not taken twice.
	bound := q.Messages
	if r.opts.Limit > 0 && r.opts.Limit < bound {
		bound = r.opts.Limit
	}
	if r.opts.DryRun {
		err = r.dryRun(ctx, bound)
	} else {
		err = r.redrive(ctx, bound)
	}
	if !r.conn.IsClosed() {
		// Every message taken and not moved is back in the queue, or on its way: RabbitMQ returns
		// a large batch of messages to a queue gradually, so wait (bounded) until it has.
		back := r.res.Failed
		if r.opts.DryRun {
			back += r.res.Moved
		}
		r.res.Remaining = r.waitReady(back)
	}
	return err
}

// waitReady waits up to ConfirmTimeout until the dead-letter queue holds at least n ready messages
// and returns how many it holds (-1 if that cannot be read).
func (r *redriver) waitReady(n int) int {
	ch, err := r.conn.Channel()
	if err != nil {
		return -1
	}
	defer ch.Close()
	deadline := time.Now().Add(r.opts.ConfirmTimeout)
	for {
		q, err := ch.QueueDeclarePassive(r.opts.Queue, false, false, false, false, nil)
		if err != nil {
			return -1
		}
		if q.Messages >= n || time.Now().After(deadline) {
			return q.Messages
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkQueue fails unless the queue exists, on a channel of its own (a missing queue closes it).
func (r *redriver) checkQueue(name string) error {
	ch, err := r.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if _, err := ch.QueueDeclarePassive(name, false, false, false, false, nil); err != nil {
		return fmt.Errorf("target queue %q: %w", name, err)
	}
	return ch.Close()
}

// checkExchange reports whether an exchange exists, on a channel of its own, remembering the answer.
func (r *redriver) checkExchange(name string) error {
	if name == "" {
		return nil // the default exchange always exists and cannot be declared
	}
	if err, ok := r.exists[name]; ok {
		return err
	}
	ch, err := r.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	err = ch.ExchangeDeclarePassive(name, "direct", false, false, false, false, nil)
	var aerr *amqp.Error
	if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
		r.exists[name] = fmt.Errorf("exchange %q does not exist", name)
		return r.exists[name]
	}
	if err != nil {
		return fmt.Errorf("check exchange %q: %w", name, err)
	}
	r.exists[name] = nil
	return ch.Close()
}

// plan decides where a dead-lettered message goes. It returns the target, and the reason and source
// queue of its first death for grouping ("" when it has no x-death).
func (r *redriver) plan(d *amqp.Delivery) (target, origin, error) {
	o, oerr := originOf(d.Headers)
	switch {
	case r.opts.To != "":
		return target{Key: r.opts.To}, o, nil
	case oerr != nil:
		return target{}, o, fmt.Errorf("cannot tell where it came from: %w (use --to QUEUE)", oerr)
	case r.opts.ToSourceQueue:
		return target{Key: o.Queue}, o, nil
	}
	return target{Exchange: o.Exchange, Key: o.Keys[0], CC: o.Keys[1:]}, o, nil
}

// group returns the group of a message, creating it.
func (r *redriver) group(o origin, t target, planErr error) *Group {
	g := &Group{Reason: o.Reason, SourceQueue: o.Queue, Target: t.String(), Movable: planErr == nil}
	if planErr != nil {
		g.Target = "cannot move: " + planErr.Error()
	}
	k := g.SourceQueue + "\x00" + g.Reason + "\x00" + g.Target
	if have, ok := r.groups[k]; ok {
		return have
	}
	r.groups[k] = g
	return g
}

func (r *redriver) finishGroups() {
	for _, g := range r.groups {
		r.res.Groups = append(r.res.Groups, g)
	}
	sort.Slice(r.res.Groups, func(i, j int) bool {
		a, b := r.res.Groups[i], r.res.Groups[j]
		if a.SourceQueue != b.SourceQueue {
			return a.SourceQueue < b.SourceQueue
		}
		if a.Reason != b.Reason {
			return a.Reason < b.Reason
		}
		return a.Target < b.Target
	})
}

// dryRun takes up to bound messages without acknowledging them, then returns them all to the
// dead-letter queue.
func (r *redriver) dryRun(ctx context.Context, bound int) error {
	var last uint64
	var stopErr error
	for n := 0; n < bound; n++ {
		if err := ctx.Err(); err != nil {
			stopErr = fmt.Errorf("interrupted: %w", err)
			break
		}
		d, ok, err := r.ch.Get(r.opts.Queue, false)
		if err != nil {
			return fmt.Errorf("basic.get from %q: %w", r.opts.Queue, err)
		}
		if !ok {
			break
		}
		last = d.DeliveryTag
		t, o, perr := r.plan(&d)
		if perr == nil && r.opts.To == "" {
			perr = r.checkExchange(t.Exchange)
		}
		g := r.group(o, t, perr)
		g.Count++
		if perr != nil {
			r.res.Failed++
		} else {
			r.res.Moved++
		}
	}
	if last > 0 {
		if err := r.ch.Nack(last, true, true); err != nil {
			return fmt.Errorf("return the messages to %q: %w (closing the connection returns them too)", r.opts.Queue, err)
		}
	}
	if err := r.ch.Close(); err != nil {
		return fmt.Errorf("close channel: %w", err)
	}
	return stopErr
}

// redrive moves up to bound messages, keeping up to Window republished messages awaiting their
// confirm at once.
func (r *redriver) redrive(ctx context.Context, bound int) error {
	if err := r.ch.Confirm(false); err != nil {
		return fmt.Errorf("enable publisher confirms: %w", err)
	}
	// Unbuffered listeners and one forwarding goroutine: the library hands over a basic.return and
	// the basic.ack of the same message in the order they arrived (RabbitMQ sends the return
	// first), so a confirm is never seen before the return of its message.
	confirms := r.ch.NotifyPublish(make(chan amqp.Confirmation))
	returns := r.ch.NotifyReturn(make(chan amqp.Return))
	r.events = make(chan event, 2*r.opts.Window+2) // at most one confirm and one return per message in flight
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(r.events)
		forward(confirms, returns, r.events, done)
	}()
	defer func() {
		close(done)
		_ = r.ch.Close() // returns every unacknowledged message to the dead-letter queue
		wg.Wait()
	}()

	var held []uint64 // messages that cannot be moved, returned to the queue at the end
	for n := 0; n < bound && r.stopErr == nil; n++ {
		if err := ctx.Err(); err != nil {
			r.stopErr = fmt.Errorf("interrupted: %w", err)
			break
		}
		for len(r.pending) >= r.opts.Window && r.stopErr == nil {
			r.waitEvent()
		}
		if r.stopErr != nil {
			break
		}
		r.drainEvents()
		d, ok, err := r.ch.Get(r.opts.Queue, false)
		if err != nil {
			r.stop(fmt.Errorf("basic.get from %q: %w", r.opts.Queue, err))
			break
		}
		if !ok {
			break
		}
		t, o, perr := r.plan(&d)
		if perr == nil {
			perr = r.checkExchange(t.Exchange)
		}
		g := r.group(o, t, perr)
		g.Count++
		if perr != nil {
			g.Failed++
			r.res.Failed++
			held = append(held, d.DeliveryTag)
			r.log.Debug("message left in the dead-letter queue", "queue", r.opts.Queue, "reason", perr)
			continue
		}
		pub := republishing(&d, t)
		p := &inflight{
			seq:    r.ch.GetNextPublishSeqNo(),
			tag:    d.DeliveryTag,
			fp:     fingerprint(t.Exchange, t.Key, pub),
			group:  g,
			target: t,
		}
		if err := r.ch.PublishWithContext(ctx, t.Exchange, t.Key, true, false, pub); err != nil {
			g.Failed++
			r.res.Failed++
			r.stop(fmt.Errorf("republish to %s: %w", t, err))
			break
		}
		r.pending = append(r.pending, p)
	}
	// Wait for the confirms of everything published, even when stopping early, so that every
	// confirmed message is removed from the dead-letter queue.
	for len(r.pending) > 0 && r.events != nil {
		r.waitEvent()
	}
	r.res.InFlight = len(r.pending)
	for _, p := range r.pending {
		p.group.Failed++
		r.res.Failed++
	}
	for _, tag := range held {
		if err := r.ch.Nack(tag, false, true); err != nil {
			r.stop(fmt.Errorf("return a message to %q: %w (closing the channel returns it too)", r.opts.Queue, err))
			break
		}
	}
	if r.stopErr == nil && r.res.Failed > 0 {
		r.stopErr = fmt.Errorf("%d message(s) could not be moved and stay in %q", r.res.Failed, r.opts.Queue)
	}
	return r.stopErr
}

// forward passes confirms and returns on, in the order the library delivers them, until the
// channel closes (the library closes both listeners) or done is closed.
func forward(confirms <-chan amqp.Confirmation, returns <-chan amqp.Return, events chan<- event, done <-chan struct{}) {
	for confirms != nil || returns != nil {
		var ev event
		select {
		case c, ok := <-confirms:
			if !ok {
				confirms = nil
				continue
			}
			ev.confirm = &c
		case rt, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			ev.ret = &rt
		}
		select {
		case events <- ev:
		case <-done:
			return
		}
	}
}

// stop records the first reason to stop.
func (r *redriver) stop(err error) {
	if r.stopErr == nil {
		r.stopErr = err
	}
}

// drainEvents handles the events that have already arrived.
func (r *redriver) drainEvents() {
	for r.events != nil {
		select {
		case ev, ok := <-r.events:
			r.handle(ev, ok)
		default:
			return
		}
	}
}

// waitEvent handles the next event, waiting up to ConfirmTimeout for it.
func (r *redriver) waitEvent() {
	timer := time.NewTimer(r.opts.ConfirmTimeout)
	defer timer.Stop()
	select {
	case ev, ok := <-r.events:
		r.handle(ev, ok)
	case <-timer.C:
		r.stop(fmt.Errorf("no publisher confirm within %s for %d republished message(s); they stay in %q (the broker may be blocking publishers)",
			r.opts.ConfirmTimeout, len(r.pending), r.opts.Queue))
		r.events = nil // stop waiting; closing the channel returns them to the queue
	}
}

// handle processes one event; ok=false means the channel has closed.
func (r *redriver) handle(ev event, ok bool) {
	switch {
	case !ok:
		r.events = nil
		err := errors.New("channel closed")
		select {
		case cerr := <-r.closes:
			if cerr != nil {
				err = cerr
			}
		default:
		}
		r.stop(fmt.Errorf("channel closed with %d republished message(s) unconfirmed (they stay in %q): %w", len(r.pending), r.opts.Queue, err))
	case ev.ret != nil:
		fp := returnFingerprint(*ev.ret)
		for _, p := range r.pending {
			if p.returned == nil && p.fp == fp {
				p.returned = ev.ret
				return
			}
		}
		r.log.Warn("basic.return matches no republished message", "exchange", ev.ret.Exchange, "routing_key", ev.ret.RoutingKey)
	case ev.confirm != nil:
		if len(r.pending) == 0 || r.pending[0].seq != ev.confirm.DeliveryTag {
			r.stop(fmt.Errorf("publisher confirm for unexpected sequence number %d", ev.confirm.DeliveryTag))
			return
		}
		p := r.pending[0]
		r.pending = r.pending[1:]
		r.settle(p, ev.confirm.Ack)
	}
}

// settle acknowledges a confirmed message in the dead-letter queue, or returns it there when the
// broker returned or refused its republish.
func (r *redriver) settle(p *inflight, ack bool) {
	if ack && p.returned == nil {
		if err := r.ch.Ack(p.tag, false); err != nil {
			p.group.Failed++
			r.res.Failed++
			r.stop(fmt.Errorf("acknowledge a moved message in %q: %w (it stays there and was also republished)", r.opts.Queue, err))
			return
		}
		p.group.Moved++
		r.res.Moved++
		return
	}
	p.group.Failed++
	r.res.Failed++
	if err := r.ch.Nack(p.tag, false, true); err != nil {
		r.stop(fmt.Errorf("return a message to %q: %w", r.opts.Queue, err))
	}
	if p.returned != nil {
		r.stop(fmt.Errorf("message unroutable: %s returned it (%d %s); it stays in %q",
			p.target, p.returned.ReplyCode, p.returned.ReplyText, r.opts.Queue))
		return
	}
	r.stop(fmt.Errorf("the broker refused (basic.nack) the message republished to %s; it stays in %q", p.target, r.opts.Queue))
}
