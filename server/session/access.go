package session

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"warren/amqp"
	"warren/exchange"
	"warren/server/auth"
	"warren/server/core"
)

// This file is access control in the AMQP session: the login (PLAIN, AMQPLAIN, EXTERNAL)
// through the core's users, connection.open's vhost checks, and each channel's permission
// checks, made with server/auth in RabbitMQ's order and with its texts. A channel takes its
// user's permissions when it opens, so a permission change applies to channels opened after it.

// mechanisms is connection.start's list: EXTERNAL only where a verified certificate can name the
// user.
func (c *conn) mechanisms() string {
	if c.tlsVerifyPeer {
		return "PLAIN AMQPLAIN EXTERNAL"
	}
	return "PLAIN AMQPLAIN"
}

// login authenticates connection.start-ok's response. A refusal is RabbitMQ's 403 for clients
// that advertise authentication_failure_close and a closed socket for the others.
func (c *conn) login(mechanism, response string) error {
	var p core.Principal
	var err error
	remote := c.nc.RemoteAddr()
	switch mechanism {
	case "EXTERNAL":
		var cs *tls.ConnectionState
		if tc, ok := c.nc.(*tls.Conn); ok {
			st := tc.ConnectionState()
			cs = &st
		}
		var name string
		if name, err = auth.External(cs, c.tlsVerifyPeer, c.s.cfg.LoginFrom); err == nil {
			p, err = c.s.core.LoginExternal(name, remote)
		} else {
			c.s.core.LoginRefused(name, remote, err)
		}
	default:
		user, pass, perr := parseCredentials(mechanism, response)
		if perr != nil {
			var ae *amqp.Error
			if errors.As(perr, &ae) {
				return perr
			}
			return amqp.Errorf(amqp.SyntaxError, "%v", perr)
		}
		var cache auth.Cache
		p, err = c.s.core.Login(mechanism, user, pass, remote, &cache)
	}
	if err != nil {
		var le *auth.LoginError
		if c.capAuthFailure && errors.As(err, &le) {
			return le.Close()
		}
		return fmt.Errorf("login refused: %w", err)
	}
	c.user, c.tags = p.Name, p.Tags
	return nil
}

// openVHost is connection.open's checks, in RabbitMQ's order: the vhost exists and is under its
// connection limit (rabbit_reader:is_over_vhost_connection_limit, whose "vhost X not found" does
// not quote the name), then the user has a permission there.
func (c *conn) openVHost(name string) (*core.VHost, *amqp.Error) {
	v := c.s.core.VHost(name)
	if v == nil || v.Deleted() {
		return nil, amqp.Errorf(amqp.NotAllowed, "vhost %s not found", name)
	}
	if err := c.s.core.CheckConnectionLimit(name, c.user); err != nil {
		return nil, err
	}
	if err := auth.VhostAccess(c.user, name, c.s.core.VHostGrant(c.user, name)); err != nil {
		var ae *amqp.Error
		errors.As(err, &ae)
		return nil, ae
	}
	return v, nil
}

// setACL gives a new channel its permission checker: the user's permissions in the vhost now.
func (c *conn) setACL(ch *channel) {
	topics := c.s.core.TopicGrants(c.user, c.vhost.Name())
	ch.acl = auth.NewChannel(c.user, c.vhost.Name(), c.tags, c.s.core.VHostGrant(c.user, c.vhost.Name()), topics)
	ch.hasTopics = len(topics) > 0
}

// aclErr converts a refusal of the auth package into the channel error it carries.
func aclErr(err error) *amqp.Error {
	if err == nil {
		return nil
	}
	var ae *amqp.Error
	if errors.As(err, &ae) {
		return ae
	}
	return amqp.Errorf(amqp.AccessRefused, "%v", err)
}

// isTopic reports whether the named exchange of the channel's vhost is a topic exchange.
func (ch *channel) isTopic(name string) bool {
	x, ok := ch.c.vhost.Exchange(name)
	return ok && x.Kind == exchange.Topic
}

// checkExchangeDeclare is exchange.declare's permission check (not passive): configure on the
// exchange and, for a new exchange with an alternate exchange, read on it and write on the
// alternate. An unknown type, the default exchange and amq.* names are the registry's errors,
// which RabbitMQ reports first or instead.
func (ch *channel) checkExchangeDeclare(m *amqp.ExchangeDeclare) *amqp.Error {
	if _, ok := exchange.ParseKind(m.Type); !ok || m.Exchange == "" {
		return nil
	}
	if err := ch.acl.ExchangeDeclare(m.Exchange); err != nil {
		return aclErr(err)
	}
	if _, exists := ch.c.vhost.Exchange(m.Exchange); exists || strings.HasPrefix(m.Exchange, "amq.") {
		return nil
	}
	if m.Type == core.SuperStreamType {
		return ch.checkSuperStreamDeclare(m)
	}
	if ae, ok := m.Arguments["alternate-exchange"].(string); ok {
		return aclErr(ch.acl.AlternateExchange(m.Exchange, ae))
	}
	return nil
}

// checkSuperStreamDeclare is the check of a new super stream beyond configure on its exchange: it
// declares partition streams and binds them, so it needs what queue.declare and queue.bind of
// each partition need (configure and write on the partition, read on the exchange). A malformed
// x-partitions is left to the core's 406.
func (ch *channel) checkSuperStreamDeclare(m *amqp.ExchangeDeclare) *amqp.Error {
	n, ok := amqp.AsInt64(m.Arguments["x-partitions"])
	if !ok || n < 1 || n > core.MaxPartitions {
		return nil
	}
	for i := range n {
		part := m.Exchange + "-" + strconv.FormatInt(i, 10)
		if err := ch.acl.QueueDeclare(part); err != nil {
			return aclErr(err)
		}
		if err := ch.checkBinding(auth.Queue, part, m.Exchange, strconv.FormatInt(i, 10)); err != nil {
			return err
		}
	}
	return nil
}

// checkSuperStreamDelete is exchange.delete's check of a super stream beyond configure on its
// exchange: it deletes the partitions, so it needs configure on each, as queue.delete would.
func (ch *channel) checkSuperStreamDelete(name string) *amqp.Error {
	x, ok := ch.c.vhost.Exchange(name)
	if !ok || x.Kind != exchange.SuperStream {
		return nil
	}
	for _, part := range ch.c.vhost.Partitions(name) {
		if err := ch.acl.QueueDelete(part); err != nil {
			return aclErr(err)
		}
	}
	return nil
}

// checkBinding is queue.bind/unbind and exchange.bind/unbind: write on the destination, read on
// the source, then the topic read permission on the binding key for a topic source.
func (ch *channel) checkBinding(destKind auth.Kind, dest, source, key string) *amqp.Error {
	if err := ch.acl.Check(auth.Write, destKind, dest); err != nil {
		return aclErr(err)
	}
	if source == "" || (destKind == auth.Exchange && dest == "") {
		return amqp.Errorf(amqp.AccessRefused, "operation not permitted on the default exchange")
	}
	if err := ch.acl.Check(auth.Read, auth.Exchange, source); err != nil {
		return aclErr(err)
	}
	if ch.isTopic(source) {
		return aclErr(ch.acl.BindTopic(source, key))
	}
	return nil
}

// checkPublish is basic.publish's checks, in RabbitMQ's order: write on the exchange, then (the
// exchange looked up: 404, internal 403) the topic write permission on the routing key, then the
// user-id property. The lookup is made here only when a later check needs it; otherwise routing
// makes it.
func (ch *channel) checkPublish(exName, key string, props []byte) *amqp.Error {
	if err := ch.acl.Publish(exName); err != nil {
		return aclErr(err)
	}
	userID := len(props) >= 2 && binary.BigEndian.Uint16(props)&amqp.FlagUserID != 0
	topics := ch.hasTopics
	if !userID && !topics {
		return nil
	}
	if err := ch.c.vhost.CheckPublishExchange(exName); err != nil {
		return err
	}
	if topics && ch.isTopic(exName) {
		if err := ch.acl.PublishTopic(exName, key); err != nil {
			return aclErr(err)
		}
	}
	if userID {
		p, err := amqp.DecodeProperties(props)
		if err != nil {
			return amqp.Errorf(amqp.SyntaxError, "malformed content properties: %v", err)
		}
		return aclErr(ch.acl.UserID(p.UserID, true))
	}
	return nil
}
