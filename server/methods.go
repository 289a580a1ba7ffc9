package server

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"warren/amqp"
	"warren/exchange"
	"warren/server/queue"
	"warren/storage"
)

const (
	replyToQueue  = "amq.rabbitmq.reply-to"
	replyToPrefix = "amq.rabbitmq.reply-to."
)

// handleMethod dispatches one method on an open channel. A returned soft error closes the channel,
// a hard one the connection.
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
	switch m := m.(type) {
	case *amqp.ChannelClose:
		// Confirms already earned go out before close-ok: nothing may follow it on this channel.
		ch.flushConfirm()
		ch.release()
		ch.gone = true
		c.dropChannel(ch.id)
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
		return ch.exchangeDeclare(m)
	case *amqp.ExchangeDelete:
		x, found := c.vhost.exchanges.Get(m.Exchange)
		if err := c.vhost.exchanges.Delete(m.Exchange, m.IfUnused); err != nil {
			return err
		}
		if found && x.Durable {
			if err := c.s.proposeMeta(amqp.Table{"op": "exchange.delete", "vhost": c.vhost.name, "name": m.Exchange}); err != nil {
				return err
			}
		}
		if err := ch.syncMeta(); err != nil {
			return err
		}
		return ch.reply(m.NoWait, &amqp.ExchangeDeleteOk{})
	case *amqp.ExchangeBind:
		if err := c.vhost.exchanges.Bind(exchange.Binding{Source: m.Source, Dest: m.Destination, DestKind: exchange.ToExchange,
			Key: m.RoutingKey, Args: m.Arguments}); err != nil {
			return err
		}
		if err := ch.replicateBinding("bind", m.Source, m.Destination, "exchange", m.RoutingKey, m.Arguments); err != nil {
			return err
		}
		if err := ch.syncMeta(); err != nil {
			return err
		}
		return ch.reply(m.NoWait, &amqp.ExchangeBindOk{})
	case *amqp.ExchangeUnbind:
		if err := c.vhost.exchanges.Unbind(exchange.Binding{Source: m.Source, Dest: m.Destination, DestKind: exchange.ToExchange,
			Key: m.RoutingKey, Args: m.Arguments}); err != nil {
			return err
		}
		if err := ch.replicateBinding("unbind", m.Source, m.Destination, "exchange", m.RoutingKey, m.Arguments); err != nil {
			return err
		}
		if err := ch.syncMeta(); err != nil {
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
		e, err := ch.useQueue(m.Queue)
		if err != nil {
			return err
		}
		if e.stream != nil {
			return amqp.Errorf(amqp.NotImplemented, "queue.purge not supported by stream queues queue '%s' in vhost '%s'", e.name, c.vhost.name)
		}
		n, perr := e.q.PurgeErr()
		if perr != nil {
			return amqp.Errorf(amqp.InternalError, "queue.purge of queue '%s' in vhost '%s' failed: %v", e.name, c.vhost.name, perr)
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
		return ch.reply(m.NoWait, &amqp.ConfirmSelectOk{})
	case *amqp.TxSelect:
		if ch.confirm {
			return amqp.Errorf(amqp.PreconditionFailed, "cannot switch from confirm to tx mode")
		}
		ch.tx = true
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

func (ch *channel) exchangeDeclare(m *amqp.ExchangeDeclare) *amqp.Error {
	_, created, err := ch.c.vhost.exchanges.Declare(m.Exchange, m.Type, m.Durable, m.AutoDelete, m.Internal, m.Passive, m.Arguments)
	if err != nil {
		return err
	}
	if created && m.Durable {
		if err := ch.c.s.proposeMeta(amqp.Table{"op": "exchange.declare", "vhost": ch.c.vhost.name, "name": m.Exchange,
			"type": m.Type, "auto_delete": m.AutoDelete, "internal": m.Internal, "arguments": m.Arguments}); err != nil {
			ch.c.vhost.exchanges.Delete(m.Exchange, false)
			return err
		}
		if err := ch.syncMeta(); err != nil {
			return err
		}
	}
	return ch.reply(m.NoWait, &amqp.ExchangeDeclareOk{})
}

// replicateBinding sends a binding change to the cluster when both ends are replicated (durable
// exchanges, quorum queues).
func (ch *channel) replicateBinding(op, source, dest, destType, key string, args amqp.Table) *amqp.Error {
	v := ch.c.vhost
	if x, ok := v.exchanges.Get(source); !ok || !x.Durable {
		return nil
	}
	if destType == "exchange" {
		if x, ok := v.exchanges.Get(dest); !ok || !x.Durable {
			return nil
		}
	} else if e := v.lookupQueue(dest); e == nil || e.group == 0 {
		return nil
	}
	return ch.c.s.proposeMeta(amqp.Table{"op": op, "vhost": v.name, "source": source, "destination": dest,
		"destination_type": destType, "routing_key": key, "arguments": args})
}

// syncMeta makes the vhost's durable metadata durable before a reply goes out.
func (ch *channel) syncMeta() *amqp.Error {
	if err := ch.c.vhost.syncMeta(); err != nil {
		ch.c.log.Error("cannot store metadata", "err", err)
		return amqp.Errorf(amqp.InternalError, "cannot store metadata: %v", err)
	}
	return nil
}

// resolveQueueName applies the spec's rule that an empty queue name means the channel's last declared queue.
func (ch *channel) resolveQueueName(name string) (string, *amqp.Error) {
	if name != "" {
		return name, nil
	}
	if ch.lastQueue == "" {
		return "", amqp.Errorf(amqp.NotFound, "no previously declared queue")
	}
	return ch.lastQueue, nil
}

func (ch *channel) queueNotFound(name string) *amqp.Error {
	return amqp.Errorf(amqp.NotFound, "no queue '%s' in vhost '%s'", name, ch.c.vhost.name)
}

func (ch *channel) lockedError(name string) *amqp.Error {
	return amqp.Errorf(amqp.ResourceLocked,
		"cannot obtain exclusive access to locked queue '%s' in vhost '%s'. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration.",
		name, ch.c.vhost.name)
}

// useQueue finds a queue this connection may use.
func (ch *channel) useQueue(name string) (*queueEntry, *amqp.Error) {
	name, err := ch.resolveQueueName(name)
	if err != nil {
		return nil, err
	}
	e := ch.c.vhost.lookupQueue(name)
	if e == nil {
		return nil, ch.queueNotFound(name)
	}
	if e.owner != nil && e.owner != ch.c {
		return nil, ch.lockedError(name)
	}
	return e, nil
}

func (ch *channel) queueDeclare(m *amqp.QueueDeclare) *amqp.Error {
	c := ch.c
	v := c.vhost
	name := m.Queue
	if name == "" && !m.Passive {
		name = newName("amq.gen-")
	} else if name == "" {
		var err *amqp.Error
		if name, err = ch.resolveQueueName(name); err != nil {
			return err
		}
	}
	if !m.Passive && strings.HasPrefix(name, "amq.") && m.Queue != "" {
		return amqp.Errorf(amqp.AccessRefused, "queue name '%s' contains reserved prefix 'amq.*'", name)
	}
	v.mu.Lock()
	e := v.queues[name]
	if e != nil {
		if e.owner != nil && e.owner != c {
			v.mu.Unlock()
			return ch.lockedError(name)
		}
		if e.q != nil {
			e.q.Touch()
		}
		if !m.Passive {
			if err := checkQueueEquivalence(e, m, v.name); err != nil {
				v.mu.Unlock()
				if err.Code == amqp.ResourceLocked {
					return ch.lockedError(name)
				}
				return err
			}
		}
		v.mu.Unlock()
	} else {
		if m.Passive {
			v.mu.Unlock()
			return ch.queueNotFound(name)
		}
		settings, err := parseQueueArgs(name, v.name, m.Arguments)
		if err == nil && settings.stream {
			err = checkStreamDeclare(m, name, v.name)
		}
		if err == nil && settings.quorum {
			err = checkReplicatedDeclare(m, name, v.name, "rabbit_quorum_queue")
		}
		if err != nil {
			v.mu.Unlock()
			return err
		}
		// In a cluster, durable classic queues are replicated too, with one voter (this node) and a
		// non-voting replica on every other node: every node sees them and serves their clients,
		// and they are unavailable while their home node is down, as in RabbitMQ.
		classicShared := !settings.quorum && !settings.stream && m.Durable && !m.Exclusive && !m.AutoDelete &&
			m.Queue != "" && c.s.clustered()
		if settings.quorum || classicShared {
			v.mu.Unlock()
			if e, err = ch.declareReplicated(name, m.Arguments, settings); err != nil {
				return err
			}
		} else if e, err = ch.createQueue(m, name, settings); err != nil {
			return err
		}
	}
	ch.lastQueue = name
	if m.NoWait {
		return nil
	}
	ready, consumers := e.counts()
	c.out.sendMethod(ch.id, &amqp.QueueDeclareOk{Queue: name, MessageCount: uint32(ready), ConsumerCount: uint32(consumers)})
	return nil
}

// createQueue creates a queue on this node only (v.mu held by the caller; released here).
func (ch *channel) createQueue(m *amqp.QueueDeclare, name string, settings queueSettings) (*queueEntry, *amqp.Error) {
	c := ch.c
	v := c.vhost
	id := c.s.nextQueueID.Add(1)
	opts, hooks := c.s.newQueueOptions(v, name, m.Durable, m.Exclusive, m.AutoDelete, settings, id)
	e := &queueEntry{args: m.Arguments, v: v, settings: settings, hooks: hooks,
		name: name, durable: m.Durable, autoDel: m.AutoDelete, id: id}
	if settings.stream {
		sq, serr := c.s.openStream(v, name, id, settings)
		if serr != nil {
			v.mu.Unlock()
			return nil, amqp.Errorf(amqp.InternalError, "cannot create stream '%s': %v", name, serr)
		}
		e.stream = sq
	} else {
		e.q = queue.New(opts)
	}
	hooks.e.Store(e)
	if m.Exclusive {
		e.owner = c
		if c.exclusiveQs == nil {
			c.exclusiveQs = make(map[*queueEntry]struct{})
		}
		c.exclusiveQs[e] = struct{}{}
	}
	v.queues[name] = e
	v.mu.Unlock()
	if m.Durable && !m.Exclusive {
		if err := ch.syncMeta(); err != nil {
			return nil, err
		}
	}
	return e, nil
}

func (ch *channel) queueBind(qname, exName, key string, args amqp.Table, noWait, bind bool) *amqp.Error {
	c := ch.c
	v := c.vhost
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
	v.mu.Lock()
	e := v.queues[qname]
	if e == nil {
		v.mu.Unlock()
		if !bind {
			// RabbitMQ answers unbind-ok for a missing queue only when the exchange is also checked.
			if _, ok := v.exchanges.Get(exName); !ok {
				return amqp.Errorf(amqp.NotFound, "no exchange '%s' in vhost '%s'", exName, v.name)
			}
		}
		return ch.queueNotFound(qname)
	}
	if e.owner != nil && e.owner != c {
		v.mu.Unlock()
		return ch.lockedError(qname)
	}
	b := exchange.Binding{Source: exName, Dest: qname, DestKind: exchange.ToQueue, Key: key, Args: args}
	if bind {
		err = v.exchanges.Bind(b)
	} else {
		err = v.exchanges.Unbind(b)
	}
	v.mu.Unlock()
	if err != nil {
		return err
	}
	if e.group != 0 {
		op := "bind"
		if !bind {
			op = "unbind"
		}
		if err := ch.replicateBinding(op, exName, qname, "queue", key, args); err != nil {
			return err
		}
	}
	if e.durable && e.owner == nil {
		if err := ch.syncMeta(); err != nil {
			return err
		}
	}
	if bind {
		return ch.reply(noWait, &amqp.QueueBindOk{})
	}
	c.out.sendMethod(ch.id, &amqp.QueueUnbindOk{})
	return nil
}

func (ch *channel) queueDelete(m *amqp.QueueDelete) *amqp.Error {
	c := ch.c
	name, err := ch.resolveQueueName(m.Queue)
	if err != nil {
		return err
	}
	e := c.vhost.lookupQueue(name)
	if e == nil {
		return ch.reply(m.NoWait, &amqp.QueueDeleteOk{MessageCount: 0})
	}
	if e.owner != nil && e.owner != c {
		return ch.lockedError(name)
	}
	defer ch.holdServerCancels()() // after the reply, whatever the queue type
	ready, consumers := e.counts()
	if e.stream != nil {
		consumers = e.stream.consumerCount()
	}
	if m.IfUnused && consumers > 0 {
		return amqp.Errorf(amqp.PreconditionFailed, "queue '%s' in vhost '%s' in use", name, c.vhost.name)
	}
	if m.IfEmpty && ready > 0 {
		return amqp.Errorf(amqp.PreconditionFailed, "queue '%s' in vhost '%s' not empty", name, c.vhost.name)
	}
	if e.group != 0 {
		if err := c.s.proposeMeta(amqp.Table{"op": "queue.delete", "vhost": c.vhost.name, "name": name, "group": int64(e.group)}); err != nil {
			return err
		}
		return ch.reply(m.NoWait, &amqp.QueueDeleteOk{MessageCount: uint32(ready)})
	}
	n := c.deleteQueue(e)
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
	e, err := ch.useQueue(m.Queue)
	if err != nil {
		return err
	}
	if e.stream != nil {
		return ch.consumeStream(m, e, tag)
	}
	if e.settings.quorum && ch.globalLimit.Load() > 0 {
		return amqp.Errorf(amqp.NotImplemented, "queue '%s' in vhost '%s' does not support global qos", e.name, c.vhost.name)
	}
	priority := int32(0)
	if v, ok := m.Arguments["x-priority"]; ok {
		n, ok := amqp.AsInt64(v)
		if !ok {
			return amqp.Errorf(amqp.PreconditionFailed, "invalid arg 'x-priority' for consumer '%s': must be an integer", tag)
		}
		priority = int32(n)
	}
	cs := &consumer{ch: ch, tag: tag, id: queue.ConsumerID(c.s.nextConsumerID.Add(1)), entry: e, noAck: m.NoAck}
	ch.mu.Lock()
	ch.addConsumerLocked(tag, cs)
	ch.mu.Unlock()
	// consume-ok must reach the client before the first delivery: AddConsumer sends it once the
	// consumer is accepted and before the dispatcher can see it.
	var onAdded func()
	if !m.NoWait {
		onAdded = func() { c.out.sendMethod(ch.id, &amqp.BasicConsumeOk{ConsumerTag: tag}) }
	}
	spec := queue.ConsumerSpec{ID: cs.id, Prefetch: ch.prefetch, Priority: priority, NoAck: m.NoAck}
	if e.group != 0 {
		// A replicated classic queue cannot count a channel-wide limit across nodes: as RabbitMQ 4.3
		// does, a global prefetch applies per consumer.
		cs.perConsumerGlobal = true
		if g := ch.globalLimit.Load(); g > 0 && (spec.Prefetch == 0 || g < spec.Prefetch) {
			spec.Prefetch = g
		}
	}
	if err := e.q.AddConsumer(spec, m.Exclusive, cs, onAdded); err != nil {
		ch.mu.Lock()
		delete(ch.consumers, tag)
		ch.mu.Unlock()
		if err == queue.ErrQueueDeleted {
			return ch.queueNotFound(e.q.Name)
		}
		if errors.Is(err, queue.ErrNoQuorum) {
			return amqp.Errorf(amqp.InternalError, "cannot consume from quorum queue '%s' in vhost '%s': %v", e.q.Name, c.vhost.name, err)
		}
		return amqp.Errorf(amqp.AccessRefused, "queue '%s' in vhost '%s' in exclusive use", e.q.Name, c.vhost.name)
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

// replyConsumer returns the channel's direct reply-to consumer, if any (ch.mu held).
func (ch *channel) replyConsumerLocked() *consumer {
	for _, cs := range ch.consumers {
		if cs.entry == nil {
			return cs
		}
	}
	return nil
}

// kickConsumers wakes the queues of this channel's consumers (global prefetch room appeared).
func (ch *channel) kickConsumers() {
	ch.mu.Lock()
	qs := make([]*queue.Queue, 0, len(ch.consumers))
	for _, cs := range ch.consumers {
		if cs.entry != nil && cs.entry.q != nil {
			qs = append(qs, cs.entry.q)
		}
	}
	ch.mu.Unlock()
	for _, q := range qs {
		q.Kick()
	}
}

func (ch *channel) basicGet(m *amqp.BasicGet) *amqp.Error {
	e, err := ch.useQueue(m.Queue)
	if err != nil {
		return err
	}
	if e.stream != nil {
		return amqp.Errorf(amqp.NotImplemented, "basic.get not supported by stream queues queue '%s' in vhost '%s'", e.name, ch.c.vhost.name)
	}
	d, remaining, ok, gerr := e.q.GetFrom(m.NoAck, ch.c.s.tag)
	if gerr != nil {
		return amqp.Errorf(amqp.InternalError, "basic.get on queue '%s' in vhost '%s' failed: %v", e.name, ch.c.vhost.name, gerr)
	}
	if !ok {
		ch.c.out.sendMethod(ch.id, &amqp.BasicGetEmpty{})
		return nil
	}
	ch.mu.Lock()
	ch.nextTag++
	tag := ch.nextTag
	if !m.NoAck {
		ch.unacked.push(unackedEntry{tag: tag, q: e.q, id: d.ID})
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
	returnEntries(entries, true)
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
		known := a.tag == 0 && a.multiple || ch.unacked.find(a.tag) >= 0 || (a.multiple && a.tag <= ch.nextTag)
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
	// The entries and ids buffers are reused: acks run on the reader goroutine, one at a time.
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
			entries = ch.unacked.takeUpTo(entries, a.tag)
			if len(entries) == 0 && a.tag > ch.nextTag {
				ch.mu.Unlock()
				return amqp.Errorf(amqp.PreconditionFailed, "unknown delivery tag %d", a.tag)
			}
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
	entries, err := ch.settleStream(entries, a.kind)
	if err != nil {
		return err
	}
	if len(entries) == 0 {
		return nil
	}
	switch {
	case a.kind == 80:
		ch.idBuf = forEachQueue(entries, ch.idBuf, (*queue.Queue).Settle)
	default:
		returnEntries(entries, a.requeue)
	}
	return nil
}

func (ch *channel) commit() *amqp.Error {
	pubs, acks := ch.txPubs, ch.txAcks
	ch.txPubs, ch.txAcks = nil, nil
	for _, p := range pubs {
		if err := ch.route(p.msg, p.mandatory, nil); err != nil {
			return err
		}
	}
	if len(pubs) > 0 {
		// The committer works in order: once this empty batch is done, so are the publishes'.
		if err := ch.c.s.db.CommitSync(&storage.Batch{}); err != nil {
			return amqp.Errorf(amqp.InternalError, "cannot store messages: %v", err)
		}
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
		return amqp.Errorf(amqp.NotImplemented, "immediate=true")
	}
	ch.pub = pendingPublish{
		state:      pubWantHeader,
		exchange:   string(p.Exchange),
		routingKey: string(p.RoutingKey),
		mandatory:  p.Mandatory,
	}
	return nil
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
			return amqp.Errorf(amqp.UnexpectedFrame, "expected content body, got non content body frame instead")
		}
		cls, size, props, err := amqp.ParseContentHeader(f.Payload)
		if err != nil {
			return amqp.Errorf(amqp.FrameError, "malformed content header: %v", err)
		}
		if cls != amqp.ClassBasic {
			return amqp.Errorf(amqp.FrameError, "content header for class %d, expected 60", cls)
		}
		if size > ch.c.s.cfg.MaxMessageSize {
			p.state = pubIdle
			return &amqp.Error{Code: amqp.PreconditionFailed, ClassID: amqp.ClassBasic, MethodID: 40,
				Text: fmt.Sprintf("PRECONDITION_FAILED - message size %d is larger than configured max size %d", size, ch.c.s.cfg.MaxMessageSize)}
		}
		p.bodySize = size
		p.props = append([]byte(nil), props...)
		if size == 0 {
			return ch.publishComplete()
		}
		p.body = make([]byte, 0, size)
		p.state = pubWantBody
		return nil
	default: // body
		if p.state != pubWantBody {
			if p.state == pubIdle {
				return amqp.Errorf(amqp.UnexpectedFrame, "expected method frame, got non method frame instead")
			}
			return amqp.Errorf(amqp.UnexpectedFrame, "expected content header for class 60, got non content header frame instead")
		}
		if uint64(len(p.body))+uint64(len(f.Payload)) > p.bodySize {
			return amqp.Errorf(amqp.FrameError, "content body is longer than the declared size %d", p.bodySize)
		}
		p.body = append(p.body, f.Payload...)
		if uint64(len(p.body)) == p.bodySize {
			return ch.publishComplete()
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
		// Check the exchange now, as RabbitMQ does, route at commit.
		if err := ch.checkPublishExchange(msg.Exchange); err != nil {
			return err
		}
		ch.txPubs = append(ch.txPubs, &txPublish{msg: msg, mandatory: mandatory})
		return nil
	}
	if ch.confirm {
		ch.publishSeq++
	}
	var cg *confirmGroup
	if msg.Persistent || ch.confirm {
		// Persistent messages (and every message a stream stores) may be written to disk: count them
		// against the connection's credit and let the queues' commit callbacks finish the group.
		cg = &confirmGroup{ch: ch, seq: ch.publishSeq, bytes: int64(len(msg.Body))}
		cg.remaining.Store(1) // held until routing is done
		ch.c.credit.acquire(cg.bytes)
	}
	ch.rejected = false
	if err := ch.route(msg, mandatory, cg); err != nil {
		if cg != nil {
			cg.finish(nil)
		}
		return err
	}
	rejected := ch.rejected
	if cg != nil && cg.remaining.Load() > 1 {
		// Some queue writes to disk: the confirm goes out from the commit callback.
		if ch.confirm {
			cg.confirm = true
			ch.awaitConfirm(cg.seq)
		}
		cg.finish(nil)
		return nil
	}
	if cg != nil {
		// Every queue write has finished already (a write refused for want of disk space comes back at
		// once): a failed one nacks the publish, as a rejection does.
		if cg.failed.Load() {
			rejected = true
		}
		cg.finish(nil)
	}
	if !ch.confirm {
		return nil
	}
	if ch.asyncConfirms.Load() > 0 {
		// Earlier confirms still wait for the disk: keep the order by queueing behind them.
		seq := ch.publishSeq
		ch.awaitConfirm(seq)
		var nackErr error
		if rejected {
			nackErr = errConfirmFailed
		}
		ch.c.s.db.Commit(&storage.Batch{}, func(err error) {
			if err == nil {
				err = nackErr
			}
			ch.confirmAsync(seq, err)
		})
		return nil
	}
	if rejected {
		// x-overflow reject-publish: confirm what came before, then nack this one.
		ch.confirmMu.Lock()
		o := ch.c.out
		if o.lockAppend() {
			if ch.confirmed > ch.acked {
				o.buf = amqp.AppendBasicAck(o.buf, ch.id, ch.confirmed, ch.confirmed-ch.acked > 1)
			}
			o.buf = amqp.AppendBasicNack(o.buf, ch.id, ch.publishSeq, false, false)
			o.unlockAppend()
		}
		ch.acked = ch.publishSeq
		ch.confirmed = ch.publishSeq
		ch.confirmMu.Unlock()
		return nil
	}
	ch.confirmed = ch.publishSeq
	ch.c.markConfirmDirty(ch)
	return nil
}

// confirmGroup counts a persistent publish's outstanding queue writes. The last one to finish gives
// the bytes back to the connection's credit and, in confirm mode, confirms the publish.
type confirmGroup struct {
	ch        *channel
	seq       uint64
	bytes     int64
	confirm   bool // set before the hold is released, so callbacks see it
	remaining atomic.Int32
	failed    atomic.Bool
}

func (g *confirmGroup) finish(err error) {
	if err != nil {
		g.failed.Store(true)
	}
	if g.remaining.Add(-1) != 0 {
		return
	}
	g.ch.c.credit.release(g.bytes)
	if g.confirm {
		var ferr error
		if g.failed.Load() {
			ferr = errConfirmFailed
		}
		g.ch.confirmAsync(g.seq, ferr)
	}
}

var errConfirmFailed = errors.New("a queue write failed")

// awaitConfirm registers a publish whose confirm will come from confirmAsync (reader goroutine).
func (ch *channel) awaitConfirm(seq uint64) {
	ch.asyncConfirms.Add(1)
	ch.confirmMu.Lock()
	ch.waiting = append(ch.waiting, pendingConfirm{seq: seq})
	ch.confirmMu.Unlock()
}

// confirmAsync confirms (or nacks, when the write failed) a publish from a commit callback. Confirms
// go out in sequence: one that finishes before an earlier one waits for it.
func (ch *channel) confirmAsync(seq uint64, err error) {
	ch.asyncConfirms.Add(-1)
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.confirmMu.Lock()
	defer ch.confirmMu.Unlock()
	for i := range ch.waiting {
		if ch.waiting[i].seq == seq {
			ch.waiting[i].done, ch.waiting[i].err = true, err
			break
		}
	}
	n := 0
	for n < len(ch.waiting) && ch.waiting[n].done {
		n++
	}
	ready := ch.waiting[:n]
	ch.waiting = ch.waiting[n:]
	if ch.closed || len(ready) == 0 {
		return
	}
	o := ch.c.out
	if !o.lockAppend() {
		return
	}
	var lastOK uint64
	for _, p := range ready {
		if p.seq <= ch.acked {
			continue
		}
		if p.err == nil {
			lastOK = p.seq
			continue
		}
		if p.seq-ch.acked > 1 {
			o.buf = amqp.AppendBasicAck(o.buf, ch.id, p.seq-1, p.seq-1-ch.acked > 1)
		}
		o.buf = amqp.AppendBasicNack(o.buf, ch.id, p.seq, false, false)
		ch.acked = p.seq
	}
	if lastOK > ch.acked {
		o.buf = amqp.AppendBasicAck(o.buf, ch.id, lastOK, lastOK-ch.acked > 1)
		ch.acked = lastOK
	}
	o.unlockAppend()
}

func (ch *channel) checkPublishExchange(name string) *amqp.Error {
	ex, ok := ch.c.vhost.exchanges.Get(name)
	if !ok {
		return amqp.Errorf(amqp.NotFound, "no exchange '%s' in vhost '%s'", name, ch.c.vhost.name)
	}
	if ex.Internal {
		return amqp.Errorf(amqp.AccessRefused, "cannot publish to internal exchange '%s' in vhost '%s'", name, ch.c.vhost.name)
	}
	return nil
}

// route delivers a complete message to its queues, or returns it when mandatory and unroutable.
// When cg is not nil, each queue that writes the message to disk adds to it.
func (ch *channel) route(msg *queue.Message, mandatory bool, cg *confirmGroup) *amqp.Error {
	c := ch.c
	if err := ch.checkPublishExchange(msg.Exchange); err != nil {
		return err
	}
	var headers amqp.Table
	var extra []string
	var fv string
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
		fv = filterValue(headers)
		extra = appendKeys(extra, headers["CC"])
		if bcc, ok := headers["BCC"]; ok {
			n := len(extra)
			extra = appendKeys(extra, bcc)
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
	if msg.Exchange == "" && strings.HasPrefix(msg.RoutingKey, replyToPrefix) {
		if target := c.s.lookupReplyTo(msg.RoutingKey[len(replyToPrefix):]); target != nil && target.deliverReply(msg) {
			return nil
		}
		if mandatory {
			ch.sendReturn(msg)
		}
		return nil
	}
	var ok bool
	ch.routeQueues, ch.routeNames, ok = c.vhost.route(ch.routeQueues[:0], ch.routeNames, msg.Exchange, msg.RoutingKey, extra, headers)
	if !ok {
		return amqp.Errorf(amqp.NotFound, "no exchange '%s' in vhost '%s'", msg.Exchange, c.vhost.name)
	}
	delivered := false
	var done func(error)
	if cg != nil {
		done = cg.finish
	}
	for i, e := range ch.routeQueues {
		if cg != nil {
			cg.remaining.Add(1)
		}
		status, async := e.publish(msg, fv, done)
		if cg != nil && !async {
			cg.remaining.Add(-1)
		}
		switch status {
		case queue.Accepted:
			delivered = true
		case queue.Rejected:
			ch.rejected = true
			if cg != nil {
				cg.failed.Store(true)
			}
		}
		ch.routeQueues[i] = nil
	}
	if !delivered && !ch.rejected && mandatory {
		ch.sendReturn(msg)
	}
	return nil
}

// appendKeys adds the string members of a CC/BCC header value.
func appendKeys(dst []string, v any) []string {
	switch v := v.(type) {
	case []any:
		for _, x := range v {
			switch s := x.(type) {
			case string:
				dst = append(dst, s)
			case []byte:
				dst = append(dst, string(s))
			}
		}
	case string:
		dst = append(dst, v)
	}
	return dst
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
