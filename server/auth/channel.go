package auth

import (
	"slices"

	"warren/amqp"
)

// DefaultExchangeName is the name the default exchange ("") is checked under, so that a
// permission can grant or deny publishing to it (rabbit_access_control:check_resource_access/4).
const DefaultExchangeName = "amq.default"

// VhostNotFound is connection.open's 530 for a vhost that does not exist, checked before access
// (rabbit_reader: is_over_vhost_connection_limit/2). RabbitMQ does not quote the name here.
func VhostNotFound(vhost string) error {
	return amqp.Errorf(amqp.NotAllowed, "vhost %s not found", vhost)
}

// VhostAccess is connection.open's check: a user may open a connection to a vhost only if they
// have a permission record there, whatever its patterns (rabbit_auth_backend_internal:
// check_vhost_access/3). grant is the user's Grant in vhost, nil if none.
func VhostAccess(user, vhost string, grant *Grant) error {
	if grant == nil {
		return amqp.Errorf(amqp.NotAllowed, "access to vhost '%s' refused for user '%s'", vhost, user)
	}
	return nil
}

// Channel checks the operations of one AMQP channel against the permissions its user had when
// the channel opened, so that a permission change applies to every channel opened after it (as in
// RabbitMQ, whose channels cache their permission checks). Each method below is the check one
// AMQP method needs, in RabbitMQ's order (rabbit_channel.erl); the session calls it before doing
// the operation and sends the returned *amqp.Error (as error) as the channel.close. Methods not
// listed (passive declares, qos, ack, cancel, tx, confirm, recover, and consuming from
// amq.rabbitmq.reply-to) need no permission.
//
// A Channel belongs to the goroutine that handles its channel's methods.
type Channel struct {
	user, vhost  string
	impersonator bool
	grant        *Grant
	topics       map[string]*TopicGrant
	// allowed remembers the last few checks that needed a regular expression and passed
	// (RabbitMQ's channels keep such a list too): a channel publishing to one exchange
	// matches its pattern once. Checks against ".*" skip both.
	allowed [4]allowedCheck
	next    uint8
}

// allowedCheck is one remembered successful check.
type allowedCheck struct {
	perm Perm
	kind Kind
	name string
}

// NewChannel returns the checker for a channel of user, tagged tags, in vhost. grant is the
// user's Grant there (nil: every check fails; connection.open will have refused such a user
// already). topics maps exchange names to the user's topic grants in vhost; an exchange without
// one is unrestricted. The map is read, never written: the core hands every channel the same
// immutable snapshot.
func NewChannel(user, vhost string, tags []string, grant *Grant, topics map[string]*TopicGrant) *Channel {
	return &Channel{
		user: user, vhost: vhost,
		impersonator: slices.Contains(tags, TagImpersonator),
		grant:        grant,
		topics:       topics,
	}
}

// User is the authenticated user the channel checks for.
func (c *Channel) User() string { return c.user }

// Kind is the kind of resource a permission check is about.
type Kind uint8

// The resources permissions apply to.
const (
	Exchange Kind = iota
	Queue
)

// String is the kind as RabbitMQ's reply texts name it.
func (k Kind) String() string {
	if k == Queue {
		return "queue"
	}
	return "exchange"
}

// Check requires perm on the exchange or queue called name; the default exchange is checked as
// amq.default. The error is RabbitMQ's 403: "ACCESS_REFUSED - access to queue 'q' in vhost 'v'
// refused for user 'u'".
func (c *Channel) Check(perm Perm, kind Kind, name string) error {
	if kind == Exchange && name == "" {
		name = DefaultExchangeName
	}
	if c.grant != nil {
		p := c.grant.pattern(perm)
		if p != nil && p.all {
			return nil
		}
		for _, a := range c.allowed {
			if a.perm == perm && a.kind == kind && a.name == name && name != "" {
				return nil
			}
		}
		if p != nil && p.Match(name) {
			c.allowed[c.next%uint8(len(c.allowed))] = allowedCheck{perm: perm, kind: kind, name: name}
			c.next++
			return nil
		}
	}
	return amqp.Errorf(amqp.AccessRefused, "access to %s '%s' in vhost '%s' refused for user '%s'",
		kind, name, c.vhost, c.user)
}

// CheckTopic requires the topic permission perm (Write: publish, Read: bind) for routingKey on
// the topic exchange called exchange. Without a topic permission for that exchange everything is
// allowed. The error is RabbitMQ's 403: "ACCESS_REFUSED - access to topic 'k' in exchange 'x' in
// vhost 'v' refused for user 'u'".
func (c *Channel) CheckTopic(perm Perm, exchange, routingKey string) error {
	g, ok := c.topics[exchange]
	if !ok || g.Allows(perm, routingKey) {
		return nil
	}
	return amqp.Errorf(amqp.AccessRefused, "access to topic '%s' in exchange '%s' in vhost '%s' refused for user '%s'",
		routingKey, exchange, c.vhost, c.user)
}

// ExchangeDeclare is exchange.declare (not passive): configure on the exchange. The session
// refuses the default exchange ("operation not permitted on the default exchange") first.
func (c *Channel) ExchangeDeclare(exchange string) error {
	return c.Check(Configure, Exchange, exchange)
}

// AlternateExchange is the extra check of an exchange.declare that creates exchange with an
// alternate-exchange argument: read on the new exchange and write on the alternate. It is not made
// when the exchange already exists.
func (c *Channel) AlternateExchange(exchange, alternate string) error {
	if err := c.Check(Read, Exchange, exchange); err != nil {
		return err
	}
	return c.Check(Write, Exchange, alternate)
}

// ExchangeDelete is exchange.delete: configure on the exchange. RabbitMQ refuses the default
// exchange and amq.* exchanges before it.
func (c *Channel) ExchangeDelete(exchange string) error {
	return c.Check(Configure, Exchange, exchange)
}

// QueueDeclare is queue.declare (not passive), exclusive or not: configure on the queue. A
// server-named queue is checked under the name the server chose (amq.gen-...), so a user whose
// configure pattern does not match it cannot declare one.
func (c *Channel) QueueDeclare(queue string) error { return c.Check(Configure, Queue, queue) }

// DeadLetterExchange is the extra check of a queue.declare that creates queue with an
// x-dead-letter-exchange argument: read on the queue and write on the dead-letter exchange (""
// is amq.default). It is not made when the queue already exists.
func (c *Channel) DeadLetterExchange(queue, dlx string) error {
	if err := c.Check(Read, Queue, queue); err != nil {
		return err
	}
	return c.Check(Write, Exchange, dlx)
}

// QueueDelete is queue.delete: configure on the queue.
func (c *Channel) QueueDelete(queue string) error { return c.Check(Configure, Queue, queue) }

// QueuePurge is queue.purge: read on the queue.
func (c *Channel) QueuePurge(queue string) error { return c.Check(Read, Queue, queue) }

// Consume is basic.consume: read on the queue. Direct reply-to consumers need no permission.
func (c *Channel) Consume(queue string) error { return c.Check(Read, Queue, queue) }

// Get is basic.get: read on the queue.
func (c *Channel) Get(queue string) error { return c.Check(Read, Queue, queue) }

// Publish is basic.publish: write on the exchange ("" is amq.default). It comes before the
// exchange is looked up, so publishing to a missing exchange without permission is a 403, not a
// 404. For a topic exchange the session then calls PublishTopic, after its internal-exchange
// check, and UserID after that.
func (c *Channel) Publish(exchange string) error { return c.Check(Write, Exchange, exchange) }

// PublishTopic is basic.publish's topic check on a topic exchange: topic write on the routing key.
func (c *Channel) PublishTopic(exchange, routingKey string) error {
	return c.CheckTopic(Write, exchange, routingKey)
}

// QueueBind is queue.bind and queue.unbind: write on the queue, then read on the exchange. When
// the exchange exists and is a topic exchange, the session then calls BindTopic.
func (c *Channel) QueueBind(queue, exchange string) error {
	if err := c.Check(Write, Queue, queue); err != nil {
		return err
	}
	return c.Check(Read, Exchange, exchange)
}

// ExchangeBind is exchange.bind and exchange.unbind: write on the destination, then read on the
// source. When the source exists and is a topic exchange, the session then calls BindTopic.
func (c *Channel) ExchangeBind(destination, source string) error {
	if err := c.Check(Write, Exchange, destination); err != nil {
		return err
	}
	return c.Check(Read, Exchange, source)
}

// BindTopic is the topic check of a binding from a topic exchange: topic read on the binding key.
func (c *Channel) BindTopic(exchange, routingKey string) error {
	return c.CheckTopic(Read, exchange, routingKey)
}

// UserID is basic.publish's user-id check: a message whose user-id property is set must carry
// the authenticated user's name, unless the user has the impersonator tag. The error is
// RabbitMQ's 406: "PRECONDITION_FAILED - user_id property set to 'x' but authenticated user was
// 'u'". userIDSet is whether the property is present (an empty user-id is checked too).
func (c *Channel) UserID(userID string, userIDSet bool) error {
	if !userIDSet || userID == c.user || c.impersonator {
		return nil
	}
	return amqp.Errorf(amqp.PreconditionFailed, "user_id property set to '%s' but authenticated user was '%s'",
		userID, c.user)
}
