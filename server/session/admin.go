package session

import (
	"warren/amqp"
	"warren/server/core"
)

// This file is the session's view for operators (core.ChannelLister): the channels and
// consumers of a connection, read from other goroutines. The reader's own channel map is not
// shared; conn.listed mirrors it under listMu, and the mode fields read here are atomics.

// listChannel records an opened channel for Channels (reader goroutine).
func (c *conn) listChannel(ch *channel) {
	c.listMu.Lock()
	if c.listed == nil {
		c.listed = make(map[uint16]*channel)
	}
	c.listed[ch.id] = ch
	c.listMu.Unlock()
}

// unlistChannel removes a channel recorded by listChannel.
func (c *conn) unlistChannel(id uint16) {
	c.listMu.Lock()
	delete(c.listed, id)
	c.listMu.Unlock()
}

// Channels implements core.ChannelLister.
func (c *conn) Channels() []core.ChannelInfo {
	c.listMu.Lock()
	chs := make([]*channel, 0, len(c.listed))
	for _, ch := range c.listed {
		chs = append(chs, ch)
	}
	c.listMu.Unlock()
	name := c.name()
	out := make([]core.ChannelInfo, 0, len(chs))
	for _, ch := range chs {
		mode := ch.mode.Load()
		ci := core.ChannelInfo{
			Connection: name, Number: ch.id, User: c.user, VHost: c.vhost.Name(),
			Confirm: mode&modeConfirm != 0, Tx: mode&modeTx != 0,
			Prefetch: ch.prefetchShown.Load(), GlobalPrefetch: ch.globalLimit.Load(),
			Counters: ch.counters,
		}
		ch.mu.Lock()
		ci.Unacked = ch.unacked.live
		for _, cs := range ch.consumers {
			if cs.q == nil {
				continue // the direct reply-to consumer
			}
			ci.Consumers = append(ci.Consumers, core.ConsumerInfo{Tag: cs.tag, Queue: cs.q.Name(),
				AckRequired: !cs.noAck, Exclusive: cs.exclusive, Prefetch: cs.prefetch, Args: cs.args})
		}
		ch.mu.Unlock()
		out = append(out, ci)
	}
	return out
}

// Channel modes, in channel.mode.
const (
	modeConfirm = 1 << iota
	modeTx
)

// consumerArgs keeps a consumer's arguments for the management API (nil stays nil).
func consumerArgs(t amqp.Table) amqp.Table {
	if len(t) == 0 {
		return nil
	}
	return t
}
