package session

import (
	"context"
	"errors"
	"strings"
	"time"

	"warren/amqp"
	"warren/exchange"
	"warren/server/auth"
	"warren/server/core"
	"warren/server/queue"
	"warren/server/stats"
)

const (
	replyToQueue  = "amq.rabbitmq.reply-to"
	replyToPrefix = "amq.rabbitmq.reply-to."
)

// handleMethod dispatches one method on an open channel. A returned soft error closes the
// channel, a hard one the connection.
func (ch *channel) handleMethod(cls, mid uint16, args []byte) *amqp.Error {
	// The hot methods are parsed without building a method struct.
	if cls == amqp.ClassBasic {
		switch mid {
		case 40:
			ch.c.waitWhileBlocked()
			p, err := amqp.ParseBasicPublish(args)
			if err != nil {
				return decodeError(err)
			}
			return ch.basicPublish(p)
		case 80:
			tag, multiple, err := amqp.ParseBasicAck(args)
			if err != nil {
				return decodeError(err)
			}
			return ch.settle(txAck{kind: 80, tag: tag, multiple: multiple})
		case 90:
			tag, requeue, err := amqp.ParseBasicReject(args)
			if err != nil {
				return decodeError(err)
			}
			return ch.settle(txAck{kind: 90, tag: tag, requeue: requeue})
		case 120:
			tag, multiple, requeue, err := amqp.ParseBasicNack(args)
			if err != nil {
				return decodeError(err)
			}
			return ch.settle(txAck{kind: 120, tag: tag, multiple: multiple, requeue: requeue})
		}
	}
	m := amqp.NewMethod(cls, mid)
	if m == nil {
		return decodeError(&amqp.UnknownMethodError{ClassID: cls, MethodID: mid})
	}
	if err := m.Decode(args); err != nil {
		return decodeError(err)
	}
	c := ch.c
	ctx := context.Background()
	switch m := m.(type) {
	case *amqp.ChannelClose:
		// Confirms already earned go out before close-ok: nothing may follow it on this channel.
		ch.flushConfirm()
		ch.release()
		ch.gone = true
		c.dropChannel(ch.id)
		c.closedInRead = append(c.closedInRead, ch.id)
		c.out.sendMethod(ch.id, &amqp.ChannelCloseOk{})
		return nil
	case *amqp.ChannelCloseOk:
		return nil
	case *amqp.ChannelOpen:
		return amqp.Errorf(amqp.ChannelError, "second 'channel.open' seen")
	case *amqp.ChannelFlow:
		if !m.Active {
			return amqp.Errorf(amqp.NotImplemented, "active=false")
		}
		c.out.sendMethod(ch.id, &amqp.ChannelFlowOk{Active: true})
		return nil
	case *amqp.ExchangeDeclare:
		if !m.Passive {
			if err := ch.checkExchangeDeclare(m); err != nil {
				return err
			}
		}
		if err := c.vhost.DeclareExchange(c.actor(ctx), core.ExchangeDecl{Name: m.Exchange, Type: m.Type, Passive: m.Passive,
			Durable: m.Durable, AutoDelete: m.AutoDelete, Internal: m.Internal, Args: m.Arguments}); err != nil {
			return err
		}
		return ch.reply(m.NoWait, &amqp.ExchangeDeclareOk{})
	case *amqp.ExchangeDelete:
		if m.Exchange != "" && !strings.HasPrefix(m.Exchange, "amq.") {
			if err := aclErr(ch.acl.ExchangeDelete(m.Exchange)); err != nil {
				return err
			}
			if err := ch.checkSuperStreamDelete(m.Exchange); err != nil {
				return err
			}
		}
		if err := c.vhost.DeleteExchange(c.actor(ctx), m.Exchange, m.IfUnused); err != nil {
			return err
		}
		return ch.reply(m.NoWait, &amqp.ExchangeDeleteOk{})
	case *amqp.ExchangeBind:
		if err := ch.checkBinding(auth.Exchange, m.Destination, m.Source, m.RoutingKey); err != nil {
			return err
		}
		b := exchange.Binding{Source: m.Source, Dest: m.Destination, DestKind: exchange.ToExchange, Key: m.RoutingKey, Args: m.Arguments}
		if err := c.vhost.Bind(ctx, b, c); err != nil {
			return err
		}
		return ch.reply(m.NoWait, &amqp.ExchangeBindOk{})
	case *amqp.ExchangeUnbind:
		if err := ch.checkBinding(auth.Exchange, m.Destination, m.Source, m.RoutingKey); err != nil {
			return err
		}
		b := exchange.Binding{Source: m.Source, Dest: m.Destination, DestKind: exchange.ToExchange, Key: m.RoutingKey, Args: m.Arguments}
		if err := c.vhost.Unbind(ctx, b, c); err != nil {
			return err
		}
		return ch.reply(m.NoWait, &amqp.ExchangeUnbindOk{})
	case *amqp.QueueDeclare:
		return ch.queueDeclare(m)
	case *amqp.QueueBind:
		return ch.queueBind(m.Queue, m.Exchange, m.RoutingKey, m.Arguments, m.NoWait, true)
	case *amqp.QueueUnbind:
		return ch.queueBind(m.Queue, m.Exchange, m.RoutingKey, m.Arguments, false, false)
	case *amqp.QueuePurge:
		name, err := ch.resolveQueueName(m.Queue)
		if err != nil {
			return err
		}
		if err := aclErr(ch.acl.QueuePurge(name)); err != nil {
			return err
		}
		q, err := ch.useQueue(name)
		if err != nil {
			return err
		}
		n, perr := q.Purge()
		if perr != nil {
			return ch.queueError(q, "queue.purge", perr)
		}
		return ch.reply(m.NoWait, &amqp.QueuePurgeOk{MessageCount: uint32(n)})
	case *amqp.QueueDelete:
		return ch.queueDelete(m)
	case *amqp.BasicQos:
		if m.PrefetchSize != 0 {
			return amqp.Errorf(amqp.NotImplemented, "prefetch_size!=0 (%d)", m.PrefetchSize)
		}
		if m.Global {
			ch.globalLimit.Store(uint32(m.PrefetchCount))
			ch.kickConsumers()
		} else {
			ch.prefetch = uint32(m.PrefetchCount)
			ch.prefetchShown.Store(ch.prefetch)
		}
		c.out.sendMethod(ch.id, &amqp.BasicQosOk{})
		return nil
	case *amqp.BasicConsume:
		return ch.basicConsume(m)
	case *amqp.BasicCancel:
		ch.basicCancel(m.ConsumerTag)
		return ch.reply(m.NoWait, &amqp.BasicCancelOk{ConsumerTag: m.ConsumerTag})
	case *amqp.BasicGet:
		return ch.basicGet(m)
	case *amqp.BasicRecover:
		return ch.recover(m.Requeue, true)
	case *amqp.BasicRecoverAsync:
		return ch.recover(m.Requeue, false)
	case *amqp.ConfirmSelect:
		if ch.tx {
			return amqp.Errorf(amqp.PreconditionFailed, "cannot switch from tx to confirm mode")
		}
		ch.confirm = true
		ch.mode.Store(modeConfirm)
		return ch.reply(m.NoWait, &amqp.ConfirmSelectOk{})
	case *amqp.TxSelect:
		if ch.confirm {
			return amqp.Errorf(amqp.PreconditionFailed, "cannot switch from confirm to tx mode")
		}
		ch.tx = true
		ch.mode.Store(modeTx)
		c.out.sendMethod(ch.id, &amqp.TxSelectOk{})
		return nil
	case *amqp.TxCommit:
		if !ch.tx {
			return amqp.Errorf(amqp.PreconditionFailed, "channel is not transactional")
		}
		if err := ch.commit(); err != nil {
			return err
		}
		c.out.sendMethod(ch.id, &amqp.TxCommitOk{})
		return nil
	case *amqp.TxRollback:
		if !ch.tx {
			return amqp.Errorf(amqp.PreconditionFailed, "channel is not transactional")
		}
		ch.txPubs, ch.txAcks = nil, nil
		c.out.sendMethod(ch.id, &amqp.TxRollbackOk{})
		return nil
	default:
		return amqp.Errorf(amqp.CommandInvalid, "unexpected method '%s' from client", m.Name())
	}
}

func (ch *channel) reply(noWait bool, m amqp.Method) *amqp.Error {
	if !noWait {
		ch.c.out.sendMethod(ch.id, m)
	}
	return nil
}

// queueError turns a queue type's error into the channel or connection error RabbitMQ gives.
func (ch *channel) queueError(q *core.Queue, op string, err error) *amqp.Error {
	var ae *amqp.Error
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, queue.ErrGone):
		return ch.c.vhost.QueueNotFound(q.Name())
	case errors.Is(err, queue.ErrInExclusiveUse):
		return amqp.Errorf(amqp.AccessRefused, "queue '%s' in vhost '%s' in exclusive use", q.Name(), ch.c.vhost.Name())
	case errors.Is(err, queue.ErrNoQuorum):
		return amqp.Errorf(amqp.InternalError, "%s on queue '%s' in vhost '%s' failed: %v", op, q.Name(), ch.c.vhost.Name(), err)
	}
	return amqp.Errorf(amqp.InternalError, "%s on queue '%s' in vhost '%s' failed: %v", op, q.Name(), ch.c.vhost.Name(), err)
}

// resolveQueueName applies the spec's rule that an empty queue name means the channel's last
// declared queue.
func (ch *channel) resolveQueueName(name string) (string, *amqp.Error) {
	if name != "" {
		return name, nil
	}
	if ch.lastQueue == "" {
		return "", amqp.Errorf(amqp.NotFound, "no previously declared queue")
	}
	return ch.lastQueue, nil
}

// useQueue finds a queue this connection may use.
func (ch *channel) useQueue(name string) (*core.Queue, *amqp.Error) {
	name, err := ch.resolveQueueName(name)
	if err != nil {
		return nil, err
	}
	return ch.c.vhost.UseQueue(name, ch.c)
}

func (ch *channel) queueDeclare(m *amqp.QueueDeclare) *amqp.Error {
	c := ch.c
	d := core.QueueDecl{Name: m.Queue, Passive: m.Passive, Durable: m.Durable, Exclusive: m.Exclusive,
		AutoDelete: m.AutoDelete, Args: m.Arguments}
	switch {
	case m.Queue == "" && !m.Passive:
		d.Name, d.ServerNamed = newName("amq.gen-"), true
	case m.Queue == "":
		var err *amqp.Error
		if d.Name, err = ch.resolveQueueName(""); err != nil {
			return err
		}
	}
	if !d.Passive && (d.ServerNamed || !strings.HasPrefix(d.Name, "amq.")) {
		if err := aclErr(ch.acl.QueueDeclare(d.Name)); err != nil {
			return err
		}
		if dlx, ok := m.Arguments["x-dead-letter-exchange"].(string); ok && c.vhost.Queue(d.Name) == nil {
			if err := aclErr(ch.acl.DeadLetterExchange(d.Name, dlx)); err != nil {
				return err
			}
		}
	}
	var dw core.Deferred
	q, err := c.vhost.DeclareQueue(c.actor(core.WithDeferred(context.Background(), &dw)), d, c)
	if err != nil {
		return err
	}
	if q.Owner() == c {
		if c.exclusiveQs == nil {
			c.exclusiveQs = make(map[*core.Queue]struct{})
		}
		c.exclusiveQs[q] = struct{}{}
	}
	ch.lastQueue = d.Name
	msgs, consumers := queue.DeclareCounts(q.Queue)
	ch.replyWhenDurable(&dw, m.NoWait, &amqp.QueueDeclareOk{Queue: d.Name, MessageCount: uint32(msgs), ConsumerCount: uint32(consumers)})
	return nil
}

// replyWhenDurable sends a method's reply once the record write it handed to dw is durable (at
// once if it handed none). The reader goes on meanwhile; the channel's next method waits for the
// reply (channel.waitDurable), so replies stay in order. A failed write closes the connection.
func (ch *channel) replyWhenDurable(dw *core.Deferred, noWait bool, m amqp.Method) {
	if !dw.Used() {
		ch.reply(noWait, m)
		return
	}
	ch.durable.Add(1)
	dw.Then(func(err *amqp.Error) {
		defer ch.durable.Done()
		if err != nil {
			ch.c.forceClose(err)
			return
		}
		if !noWait {
			ch.c.out.sendMethod(ch.id, m)
		}
	})
}

// waitDurable waits for the replies still waiting for their writes (before the channel's next
// method is handled).
func (ch *channel) waitDurable() { ch.durable.Wait() }

func (ch *channel) queueBind(qname, exName, key string, args amqp.Table, noWait, bind bool) *amqp.Error {
	c := ch.c
	if qname == "" && key == "" {
		// The spec: with no queue name and no routing key, bind the last declared queue by its name.
		key = ch.lastQueue
	}
	qname, err := ch.resolveQueueName(qname)
	if err != nil {
		return err
	}
	if strings.HasPrefix(qname, replyToQueue) {
		return amqp.Errorf(amqp.AccessRefused, "cannot bind or unbind to a volatile (direct reply-to) queue")
	}
	if err := ch.checkBinding(auth.Queue, qname, exName, key); err != nil {
		return err
	}
	b := exchange.Binding{Source: exName, Dest: qname, DestKind: exchange.ToQueue, Key: key, Args: args}
	var dw core.Deferred
	ctx := core.WithDeferred(context.Background(), &dw)
	if bind {
		if err := c.vhost.Bind(ctx, b, c); err != nil {
			return err
		}
		ch.replyWhenDurable(&dw, noWait, &amqp.QueueBindOk{})
		return nil
	}
	if err := c.vhost.Unbind(ctx, b, c); err != nil {
		return err
	}
	ch.replyWhenDurable(&dw, false, &amqp.QueueUnbindOk{})
	return nil
}

func (ch *channel) queueDelete(m *amqp.QueueDelete) *amqp.Error {
	c := ch.c
	name, err := ch.resolveQueueName(m.Queue)
	if err != nil {
		return err
	}
	if err := aclErr(ch.acl.QueueDelete(name)); err != nil {
		return err
	}
	q := c.vhost.Queue(name)
	if q == nil {
		return ch.reply(m.NoWait, &amqp.QueueDeleteOk{MessageCount: 0})
	}
	defer ch.holdServerCancels()() // after the reply, whatever the queue type
	n, err := c.vhost.DeleteQueue(c.actor(context.Background()), q, m.IfUnused, m.IfEmpty, c)
	if err != nil {
		return err
	}
	delete(c.exclusiveQs, q)
	return ch.reply(m.NoWait, &amqp.QueueDeleteOk{MessageCount: uint32(n)})
}

func (ch *channel) basicConsume(m *amqp.BasicConsume) *amqp.Error {
	c := ch.c
	tag := m.ConsumerTag
	ch.mu.Lock()
	_, dup := ch.consumers[tag]
	ch.mu.Unlock()
	if tag != "" && dup {
		return amqp.Errorf(amqp.NotAllowed, "attempt to reuse consumer tag '%s'", tag)
	}
	if tag == "" {
		tag = newName("amq.ctag-")
	}
	if m.Queue == replyToQueue {
		return ch.consumeReplyTo(m, tag)
	}
	qname, err := ch.resolveQueueName(m.Queue)
	if err != nil {
		return err
	}
	if err := aclErr(ch.acl.Consume(qname)); err != nil {
		return err
	}
	var q *core.Queue
	if g, ok := m.Arguments["x-stream-consumer-group"]; ok {
		// A group member reads whichever partitions it is given: it needs read on all of them, as
		// a stream-protocol consumer of each partition would.
		if q, err = c.vhost.GroupQueue(qname, g); err == nil {
			for _, p := range q.GroupPartitions() {
				if p == qname {
					continue
				}
				if err := aclErr(ch.acl.Consume(p)); err != nil {
					return err
				}
			}
		}
	} else {
		q, err = ch.useQueue(qname)
	}
	if err != nil {
		return err
	}
	priority := int32(0)
	if v, ok := m.Arguments["x-priority"]; ok {
		n, ok := amqp.AsInt64(v)
		if !ok {
			return amqp.Errorf(amqp.PreconditionFailed, "invalid arg 'x-priority' for consumer '%s': must be an integer", tag)
		}
		priority = int32(n)
	}
	cs := &consumer{ch: ch, tag: tag, id: c.s.core.NextConsumerID(), q: q, noAck: m.NoAck,
		exclusive: m.Exclusive, prefetch: ch.prefetch, args: consumerArgs(m.Arguments)}
	ch.mu.Lock()
	ch.addConsumerLocked(tag, cs)
	ch.mu.Unlock()
	spec := queue.ConsumeSpec{ID: cs.id, Tag: tag, Prefetch: ch.prefetch, GlobalPrefetch: ch.globalLimit.Load(),
		Priority: priority, NoAck: m.NoAck, Exclusive: m.Exclusive, Args: m.Arguments}
	// consume-ok must reach the client before the first delivery: the queue runs OnAdded once the
	// consumer is accepted and before anything can be delivered to it.
	if !m.NoWait {
		spec.OnAdded = func() { c.out.sendMethod(ch.id, &amqp.BasicConsumeOk{ConsumerTag: tag}) }
	}
	if err := q.Consume(spec, cs); err != nil {
		ch.mu.Lock()
		delete(ch.consumers, tag)
		ch.mu.Unlock()
		return ch.queueError(q, "basic.consume", err)
	}
	return nil
}

func (ch *channel) consumeReplyTo(m *amqp.BasicConsume, tag string) *amqp.Error {
	if !m.NoAck {
		return amqp.Errorf(amqp.PreconditionFailed, "reply consumer cannot acknowledge")
	}
	if ch.replyKey != "" {
		return amqp.Errorf(amqp.PreconditionFailed, "reply consumer already set")
	}
	cs := &consumer{ch: ch, tag: tag, noAck: true}
	ch.mu.Lock()
	ch.addConsumerLocked(tag, cs)
	ch.mu.Unlock()
	ch.replyKey = newName("")
	ch.c.s.registerReplyTo(ch.replyKey, ch)
	return ch.reply(m.NoWait, &amqp.BasicConsumeOk{ConsumerTag: tag})
}

func (ch *channel) basicCancel(tag string) {
	ch.mu.Lock()
	cs := ch.consumers[tag]
	if cs != nil {
		delete(ch.consumers, tag)
		cs.cancelled = true
	}
	ch.mu.Unlock()
	if cs != nil {
		ch.detach(cs)
	}
}

// replyConsumerLocked returns the channel's direct reply-to consumer, if any (ch.mu held).
func (ch *channel) replyConsumerLocked() *consumer {
	for _, cs := range ch.consumers {
		if cs.q == nil {
			return cs
		}
	}
	return nil
}

// kickConsumers wakes the queues of this channel's consumers (global prefetch room appeared).
func (ch *channel) kickConsumers() {
	ch.mu.Lock()
	qs := make([]*core.Queue, 0, len(ch.consumers))
	for _, cs := range ch.consumers {
		if cs.q != nil {
			qs = append(qs, cs.q)
		}
	}
	ch.mu.Unlock()
	for _, q := range qs {
		q.Kick()
	}
}

func (ch *channel) basicGet(m *amqp.BasicGet) *amqp.Error {
	qname, err := ch.resolveQueueName(m.Queue)
	if err != nil {
		return err
	}
	if err := aclErr(ch.acl.Get(qname)); err != nil {
		return err
	}
	q, err := ch.useQueue(qname)
	if err != nil {
		return err
	}
	q.Touch()
	d, remaining, ok, gerr := q.Get(m.NoAck)
	if gerr != nil {
		return ch.queueError(q, "basic.get", gerr)
	}
	qc := q.Counters()
	if !ok {
		ch.counters.Inc(stats.GetEmpty)
		qc.Inc(stats.GetEmpty)
		ch.c.out.sendMethod(ch.id, &amqp.BasicGetEmpty{})
		return nil
	}
	if m.NoAck {
		ch.counters.Inc(stats.GetNoAck)
		qc.Inc(stats.GetNoAck)
	} else {
		ch.counters.Inc(stats.GetAck)
		qc.Inc(stats.GetAck)
	}
	if d.Redelivered {
		ch.counters.Inc(stats.Redelivered)
		qc.Inc(stats.Redelivered)
	}
	ch.mu.Lock()
	ch.nextTag++
	tag := ch.nextTag
	if !m.NoAck {
		ch.unacked.push(unackedEntry{tag: tag, q: q.Queue, id: d.ID, count: d.DeliveryCount, qc: qc})
	}
	msg := d.Msg
	if d.DeliveryCount > 0 {
		msg = withDeliveryCount(msg, d.DeliveryCount)
	}
	o := ch.c.out
	if o.lockAppend() {
		o.buf = amqp.AppendBasicGetOk(o.buf, ch.id, tag, d.Redelivered, msg.Exchange, msg.RoutingKey, uint32(remaining))
		o.buf = amqp.AppendContentHeaderFrame(o.buf, ch.id, amqp.ClassBasic, uint64(len(msg.Body)), msg.Props)
		o.buf = amqp.AppendBodyFrames(o.buf, ch.id, msg.Body, o.frameMax)
		o.unlockAppend()
	}
	ch.mu.Unlock()
	return nil
}

// recover redelivers every unacked message of the channel (requeue=true only, as RabbitMQ).
func (ch *channel) recover(requeue, sync bool) *amqp.Error {
	if !requeue {
		return amqp.Errorf(amqp.NotImplemented, "requeue=false")
	}
	ch.mu.Lock()
	entries := ch.unacked.takeAll(nil)
	ch.mu.Unlock()
	ch.releaseGlobal(entries)
	settleEntries(entries, queue.SettleRequeue, nil)
	if sync {
		ch.c.out.sendMethod(ch.id, &amqp.BasicRecoverOk{})
	}
	return nil
}

// releaseGlobal gives back global-prefetch credit held by settled entries.
func (ch *channel) releaseGlobal(entries []unackedEntry) {
	n := 0
	for i := range entries {
		if entries[i].global {
			n++
		}
	}
	if n > 0 {
		ch.globalInflight.Add(int64(-n))
		ch.kickConsumers()
	}
}

// settle handles basic.ack, basic.nack and basic.reject (buffered inside a transaction).
func (ch *channel) settle(a txAck) *amqp.Error {
	if ch.tx {
		// Validate now so an unknown tag fails at once, apply at commit.
		ch.mu.Lock()
		known := a.tag == 0 && a.multiple || ch.unacked.find(a.tag) >= 0
		ch.mu.Unlock()
		if !known {
			return amqp.Errorf(amqp.PreconditionFailed, "unknown delivery tag %d", a.tag)
		}
		ch.txAcks = append(ch.txAcks, a)
		return nil
	}
	return ch.applySettle(a)
}

func (ch *channel) applySettle(a txAck) *amqp.Error {
	// The entries and tags buffers are reused: acks run on the reader goroutine, one at a time.
	entries := ch.settleBuf[:0]
	ch.mu.Lock()
	if _, ok := ch.revoked[a.tag]; ok && !a.multiple {
		// The delivery was taken back when its consumer timed out: nothing to settle.
		delete(ch.revoked, a.tag)
		ch.mu.Unlock()
		return nil
	}
	if a.multiple {
		if a.tag == 0 {
			entries = ch.unacked.takeAll(entries)
		} else {
			// As RabbitMQ's collect_acks: the tag itself must be unacknowledged, even when
			// earlier ones are (ack(82, multiple) with only tag 1 outstanding is 406).
			if _, revoked := ch.revoked[a.tag]; !revoked && ch.unacked.find(a.tag) < 0 {
				ch.mu.Unlock()
				return amqp.Errorf(amqp.PreconditionFailed, "unknown delivery tag %d", a.tag)
			}
			delete(ch.revoked, a.tag)
			entries = ch.unacked.takeUpTo(entries, a.tag)
		}
	} else {
		e, ok := ch.unacked.take(a.tag)
		if !ok {
			ch.mu.Unlock()
			return amqp.Errorf(amqp.PreconditionFailed, "unknown delivery tag %d", a.tag)
		}
		entries = append(entries, e)
	}
	ch.mu.Unlock()
	used := entries
	defer func() {
		clear(used) // drop the queue and consumer pointers
		if cap(used) <= 4096 {
			ch.settleBuf = used[:0]
		}
	}()
	ch.releaseGlobal(entries)
	op := queue.SettleAck
	switch {
	case a.kind == 80:
		countAcks(ch.counters, entries)
	case a.requeue:
		op = queue.SettleRequeue
	default:
		op = queue.SettleDiscard
	}
	var err error
	ch.tagBuf, err = settleEntries(entries, op, ch.tagBuf)
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) {
			return ae
		}
		return amqp.Errorf(amqp.InternalError, "settle failed: %v", err)
	}
	return nil
}

// commit applies a transaction: its publishes are routed and tx.commit-ok waits until every
// target queue has them as safe as its type promises; then its acks are applied.
func (ch *channel) commit() *amqp.Error {
	pubs, acks := ch.txPubs, ch.txAcks
	ch.txPubs, ch.txAcks = nil, nil
	w := newTxWait(len(pubs))
	for _, p := range pubs {
		out := &pubOutcome{ch: ch, tx: w}
		out.remaining.Store(1)
		if err := ch.route(p.msg, p.mandatory, out); err != nil {
			out.abandoned.Store(true)
			out.release()
			return err
		}
		out.release()
	}
	select {
	case <-w.done:
	case <-ch.c.quit:
		return amqp.Errorf(amqp.ConnectionForced, "broker shutdown")
	}
	if w.failed {
		return amqp.Errorf(amqp.InternalError, "tx.commit failed: a queue could not store a message of the transaction")
	}
	for _, a := range acks {
		if err := ch.applySettle(a); err != nil {
			return err
		}
	}
	return nil
}

// basicPublish starts assembling a message.
func (ch *channel) basicPublish(p amqp.PublishArgs) *amqp.Error {
	if p.Immediate {
		return publishError(amqp.Errorf(amqp.NotImplemented, "immediate=true"))
	}
	ch.pub = pendingPublish{
		state:      pubWantHeader,
		exchange:   string(p.Exchange),
		routingKey: string(p.RoutingKey),
		mandatory:  p.Mandatory,
	}
	return nil
}

// publishError marks an error caused by a publish as coming from basic.publish (class 60,
// method 40), as RabbitMQ's channel.close does, so clients can match it to the publish.
func publishError(e *amqp.Error) *amqp.Error {
	if e != nil && e.ClassID == 0 && e.MethodID == 0 {
		e.ClassID, e.MethodID = amqp.ClassBasic, 40
	}
	return e
}

// handleContent takes a content header or body frame.
func (ch *channel) handleContent(f amqp.Frame) *amqp.Error {
	p := &ch.pub
	switch f.Type {
	case amqp.FrameHeader:
		if p.state != pubWantHeader {
			if p.state == pubIdle {
				return amqp.Errorf(amqp.UnexpectedFrame, "expected method frame, got non method frame instead")
			}
			return p.interrupted()
		}
		cls, size, props, err := amqp.ParseContentHeader(f.Payload)
		if err != nil {
			return amqp.Errorf(amqp.FrameError, "malformed content header: %v", err)
		}
		if cls != amqp.ClassBasic {
			return amqp.Errorf(amqp.UnexpectedFrame, "expected content header for class 60, got one for class %d instead", cls)
		}
		if size > ch.c.s.cfg.MaxMessageSize {
			p.state = pubIdle
			return publishError(amqp.Errorf(amqp.PreconditionFailed, "message size %d is larger than configured max size %d", size, ch.c.s.cfg.MaxMessageSize))
		}
		p.bodySize = size
		p.props = append([]byte(nil), props...)
		if size == 0 {
			return publishError(ch.publishComplete())
		}
		p.body = make([]byte, 0, size)
		p.state = pubWantBody
		return nil
	default: // body
		if p.state != pubWantBody {
			if p.state == pubIdle {
				return amqp.Errorf(amqp.UnexpectedFrame, "expected method frame, got non method frame instead")
			}
			return p.interrupted()
		}
		if uint64(len(p.body))+uint64(len(f.Payload)) > p.bodySize {
			return amqp.Errorf(amqp.FrameError, "content body is longer than the declared size %d", p.bodySize)
		}
		p.body = append(p.body, f.Payload...)
		if uint64(len(p.body)) == p.bodySize {
			return publishError(ch.publishComplete())
		}
		return nil
	}
}

func (ch *channel) publishComplete() *amqp.Error {
	p := &ch.pub
	msg := &queue.Message{
		Exchange:   p.exchange,
		RoutingKey: p.routingKey,
		Props:      p.props,
		Body:       p.body,
		Persistent: amqp.PropsDeliveryMode(p.props) == 2,
	}
	if msg.Body == nil {
		msg.Body = []byte{}
	}
	mandatory := p.mandatory
	*p = pendingPublish{}
	if err := ch.checkPublish(msg.Exchange, msg.RoutingKey, msg.Props); err != nil {
		return err
	}
	if len(msg.Props) >= 2 && msg.Props[0]&byte((amqp.FlagPriority|amqp.FlagExpiration)>>8) != 0 {
		props, err := amqp.DecodeProperties(msg.Props)
		if err != nil {
			return amqp.Errorf(amqp.SyntaxError, "malformed content properties: %v", err)
		}
		msg.Priority = props.Priority
		ms, aerr := parseExpiration(props.Expiration)
		if aerr != nil {
			return aerr
		}
		if ms >= 0 {
			msg.ExpiresAt = time.Now().UnixMilli() + ms
			if msg.ExpiresAt == 0 {
				msg.ExpiresAt = 1
			}
		}
	}
	if ch.tx {
		// Check the exchange and a direct reply-to now, as RabbitMQ does, route at commit.
		if err := ch.c.vhost.CheckPublishExchange(msg.Exchange); err != nil {
			return err
		}
		if err := ch.checkReplyTo(msg.Props); err != nil {
			return err
		}
		ch.txPubs = append(ch.txPubs, &txPublish{msg: msg, mandatory: mandatory})
		return nil
	}
	var out *pubOutcome
	if msg.Persistent || ch.confirm {
		// Persistent messages (and every message a stream stores) may be written to disk: count
		// them against the connection's credit. In confirm mode the outcome confirms the publish.
		out = &pubOutcome{ch: ch, bytes: int64(len(msg.Body))}
		if ch.confirm {
			out.seq = ch.confirms.add()
		}
		out.remaining.Store(1) // the reader's hold, released once routing is done
		ch.c.credit.acquire(out.bytes)
	}
	err := ch.route(msg, mandatory, out)
	if out != nil {
		if err != nil {
			out.abandoned.Store(true)
		}
		out.release()
	}
	return err
}

// checkReplyTo refuses a publish whose reply-to asks for direct reply-to on a channel without a
// reply consumer (route checks it again when it rewrites the property).
func (ch *channel) checkReplyTo(rawProps []byte) *amqp.Error {
	if len(rawProps) < 2 || rawProps[0]&byte(amqp.FlagReplyTo>>8) == 0 || ch.replyKey != "" {
		return nil
	}
	props, err := amqp.DecodeProperties(rawProps)
	if err != nil {
		return amqp.Errorf(amqp.SyntaxError, "malformed content properties: %v", err)
	}
	if props.ReplyTo == replyToQueue {
		return amqp.Errorf(amqp.PreconditionFailed, "fast reply consumer does not exist")
	}
	return nil
}

// route delivers a complete message to its queues, or returns it when mandatory and unroutable.
// When out is not nil, each target queue reports its outcome to it.
func (ch *channel) route(msg *queue.Message, mandatory bool, out *pubOutcome) *amqp.Error {
	c := ch.c
	v := c.vhost
	if err := v.CheckPublishExchange(msg.Exchange); err != nil {
		return err
	}
	var headers amqp.Table
	var extra []string
	var dedupeErr *amqp.Error
	if len(msg.Props) >= 2 && msg.Props[0]&(byte(amqp.FlagHeaders>>8)|byte(amqp.FlagReplyTo>>8)) != 0 {
		props, err := amqp.DecodeProperties(msg.Props)
		if err != nil {
			return amqp.Errorf(amqp.SyntaxError, "malformed content properties: %v", err)
		}
		changed := false
		if props.ReplyTo == replyToQueue {
			if ch.replyKey == "" {
				return amqp.Errorf(amqp.PreconditionFailed, "fast reply consumer does not exist")
			}
			props.ReplyTo = replyToPrefix + ch.replyKey
			changed = true
		}
		headers = props.Headers
		msg.FilterValue = core.FilterValue(headers)
		msg.PublisherID, msg.PublishingID, dedupeErr = core.PublisherDedupe(headers)
		extra = exchange.AppendKeys(extra, headers["CC"])
		if bcc, ok := headers["BCC"]; ok {
			n := len(extra)
			extra = exchange.AppendKeys(extra, bcc)
			msg.BCC = append([]string(nil), extra[n:]...)
			delete(headers, "BCC")
			changed = true
		}
		if changed {
			props.Flags = 0
			if len(props.Headers) == 0 {
				props.Headers = nil
			}
			msg.Props = props.Append(nil)
		}
	}
	ch.counters.Inc(stats.Published)
	if ch.mode.Load()&modeConfirm != 0 {
		ch.counters.Inc(stats.PublishedConfirm)
	}
	if msg.Exchange == "" && strings.HasPrefix(msg.RoutingKey, replyToPrefix) {
		if target := c.s.lookupReplyTo(msg.RoutingKey[len(replyToPrefix):]); target != nil && target.deliverReply(msg) {
			ch.counters.Inc(stats.Routed)
			return nil
		}
		if mandatory {
			ch.counters.Inc(stats.UnroutableReturned)
			ch.sendReturn(msg)
		} else {
			ch.counters.Inc(stats.UnroutableDropped)
		}
		return nil
	}
	var ok bool
	ch.routeQueues, ch.routeNames, ok = v.Route(ch.routeQueues[:0], ch.routeNames, msg.Exchange, msg.RoutingKey, extra, headers)
	if !ok {
		return amqp.Errorf(amqp.NotFound, "no exchange '%s' in vhost '%s'", msg.Exchange, v.Name())
	}
	if dedupeErr != nil {
		for _, q := range ch.routeQueues {
			if q.Kind() == "stream" {
				clear(ch.routeQueues)
				return dedupeErr
			}
		}
	}
	delivered, rejected := false, false
	var done queue.Done
	if out != nil {
		done = out
	}
	for i, q := range ch.routeQueues {
		if out != nil {
			out.remaining.Add(1)
		}
		q.Counters().Inc(stats.Published)
		switch q.Publish(msg, done) {
		case queue.Accepted:
			delivered = true
		case queue.Rejected:
			rejected = true
		}
		ch.routeQueues[i] = nil
	}
	switch {
	case !delivered && !rejected && mandatory:
		ch.counters.Inc(stats.UnroutableReturned)
		ch.sendReturn(msg)
	case len(ch.routeQueues) == 0:
		ch.counters.Inc(stats.UnroutableDropped)
	default:
		ch.counters.Inc(stats.Routed)
	}
	return nil
}

// countAcks counts acknowledged deliveries on the channel and on their queues, one add per run
// of entries of the same queue.
func countAcks(ch *stats.Object, entries []unackedEntry) {
	ch.Add(stats.Acknowledged, uint64(len(entries)))
	for i := 0; i < len(entries); {
		qc, j := entries[i].qc, i+1
		for j < len(entries) && entries[j].qc == qc {
			j++
		}
		if qc != nil {
			qc.Add(stats.Acknowledged, uint64(j-i))
		}
		i = j
	}
}

func (ch *channel) sendReturn(msg *queue.Message) {
	o := ch.c.out
	if !o.lockAppend() {
		return
	}
	o.buf = amqp.AppendBasicReturn(o.buf, ch.id, amqp.NoRoute, "NO_ROUTE", msg.Exchange, msg.RoutingKey)
	o.buf = amqp.AppendContentHeaderFrame(o.buf, ch.id, amqp.ClassBasic, uint64(len(msg.Body)), msg.Props)
	o.buf = amqp.AppendBodyFrames(o.buf, ch.id, msg.Body, o.frameMax)
	o.unlockAppend()
}

// deliverReply hands a reply straight to this channel's direct reply-to consumer.
func (ch *channel) deliverReply(msg *queue.Message) bool {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.closed {
		return false
	}
	cs := ch.replyConsumerLocked()
	if cs == nil {
		return false
	}
	ch.nextTag++
	ch.writeDelivery(cs.tag, ch.nextTag, false, msg)
	return true
}

// flushConfirm sends the confirms that are due.
func (ch *channel) flushConfirm() { ch.confirms.flush(ch) }
