package core

import (
	"fmt"
	"time"

	"warren/amqp"
	"warren/server/queue"
	"warren/stream"
)

// equivalenceArgs are the queue arguments RabbitMQ compares when a queue is redeclared; others are
// ignored, as in RabbitMQ.
func equivalenceArgs() [15]string {
	return [...]string{
		"x-queue-type", "x-message-ttl", "x-expires", "x-max-length", "x-max-length-bytes",
		"x-dead-letter-exchange", "x-dead-letter-routing-key", "x-max-priority", "x-overflow",
		"x-single-active-consumer", "x-delivery-limit", "x-queue-leader-locator",
		"x-quorum-initial-group-size", "x-max-age", "x-stream-max-segment-size-bytes",
	}
}

func boolText(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

// checkQueueEquivalence compares a redeclaration with the existing queue, with RabbitMQ's texts.
func checkQueueEquivalence(e *Queue, m QueueDecl, vhost string) *amqp.Error {
	ineq := func(arg string, received, current bool) *amqp.Error {
		return amqp.Errorf(amqp.PreconditionFailed, "inequivalent arg '%s' for queue '%s' in vhost '%s': received '%s' but current is '%s'",
			arg, e.name, vhost, boolText(received), boolText(current))
	}
	if m.Durable != e.durable {
		return ineq("durable", m.Durable, e.durable)
	}
	if m.Exclusive != (e.owner != nil) {
		return &amqp.Error{Code: amqp.ResourceLocked}
	}
	if m.AutoDelete != e.autoDelete {
		return ineq("auto_delete", m.AutoDelete, e.autoDelete)
	}
	for _, k := range equivalenceArgs() {
		rv, rok := m.Args[k]
		cv, cok := e.args[k]
		if k == "x-queue-type" && e.kind != "stream" {
			// A missing type means the default (classic); RabbitMQ reports "none" against a stream.
			if !rok {
				rv, rok = "classic", true
			}
			if !cok {
				cv, cok = "classic", true
			}
		}
		if rok == cok && (!rok || amqp.ValuesEqual(rv, cv)) {
			continue
		}
		if rok && cok {
			// RabbitMQ shows bare values when both sides have the argument.
			return amqp.Errorf(amqp.PreconditionFailed, "inequivalent arg '%s' for queue '%s' in vhost '%s': received '%s' but current is '%s'",
				k, e.name, vhost, argValueText(rv), argValueText(cv))
		}
		return amqp.Errorf(amqp.PreconditionFailed, "inequivalent arg '%s' for queue '%s' in vhost '%s': received %s but current is %s",
			k, e.name, vhost, describeArg(rv, rok), describeArg(cv, cok))
	}
	return nil
}

// describeArg renders a value the way RabbitMQ's equivalence errors do.
func describeArg(v any, ok bool) string {
	if !ok {
		return "none"
	}
	return fmt.Sprintf("the value '%s' of type '%s'", argValueText(v), amqp.TypeName(v))
}

func argValueText(v any) string {
	switch v := v.(type) {
	case []byte:
		return string(v)
	case time.Time:
		return fmt.Sprint(v.Unix())
	default:
		return fmt.Sprint(v)
	}
}

// queueSettings are the lifecycle settings a queue's x-arguments ask for.
type queueSettings struct {
	messageTTL      int64 // ms; -1 none
	expires         int64 // ms; -1 none
	maxLength       int64 // -1 none
	maxLengthBytes  int64 // -1 none
	overflow        string
	maxPriority     uint8
	dlx             string
	hasDLX          bool
	dlrk            string
	hasDLRK         bool
	singleActive    bool
	deliveryLimit   int64 // -1 none
	consumerTimeout int64 // ms; -1 = the server default

	other           string // x-queue-type of a type added to the core (not classic, quorum, stream)
	stream          bool   // x-queue-type=stream
	quorum          bool   // x-queue-type=quorum
	groupSize       int    // x-quorum-initial-group-size; 0 = default (3)
	maxAge          time.Duration
	maxSegmentBytes int64
}

// parseQueueArgs validates a new queue's arguments with RabbitMQ's texts and returns its settings.
// known reports whether a queue type is registered (x-queue-type values other than classic,
// quorum and stream are types added to the core, tests' among them).
func parseQueueArgs(name, vhost string, args amqp.Table, known func(string) bool) (queueSettings, *amqp.Error) {
	st := queueSettings{messageTTL: -1, expires: -1, maxLength: -1, maxLengthBytes: -1, overflow: "drop-head",
		deliveryLimit: -1, consumerTimeout: -1}
	invalid := func(arg, format string, a ...any) *amqp.Error {
		return amqp.Errorf(amqp.PreconditionFailed, "invalid arg '%s' for queue '%s' in vhost '%s': %s",
			arg, name, vhost, fmt.Sprintf(format, a...))
	}
	// integer reads a non-negative integer argument (zeroOK=false also refuses 0).
	integer := func(arg string, zeroOK bool) (int64, bool, *amqp.Error) {
		v, ok := args[arg]
		if !ok {
			return 0, false, nil
		}
		n, isInt := amqp.AsInt64(v)
		if !isInt {
			return 0, false, invalid(arg, "\"expected integer, got %s\"", amqp.TypeName(v))
		}
		if n < 0 {
			return 0, false, invalid(arg, "{value_negative,%d}", n)
		}
		if n == 0 && !zeroOK {
			return 0, false, invalid(arg, "{value_zero,0}")
		}
		return n, true, nil
	}
	str := func(arg string) (string, bool, *amqp.Error) {
		v, ok := args[arg]
		if !ok {
			return "", false, nil
		}
		switch v := v.(type) {
		case string:
			return v, true, nil
		case []byte:
			return string(v), true, nil
		}
		return "", false, amqp.Errorf(amqp.PreconditionFailed, "invalid type '%s' for arg '%s' in queue '%s' in vhost '%s'",
			amqp.TypeName(v), arg, name, vhost)
	}
	var err *amqp.Error
	var ok bool
	var n int64
	if n, ok, err = integer("x-message-ttl", true); err != nil {
		return st, err
	} else if ok {
		if n > maxTTL {
			return st, invalid("x-message-ttl", "{value_too_large,%d}", n)
		}
		st.messageTTL = n
	}
	if n, ok, err = integer("x-expires", false); err != nil {
		return st, err
	} else if ok {
		if n > maxTTL {
			return st, invalid("x-expires", "{value_too_large,%d}", n)
		}
		st.expires = n
	}
	if n, ok, err = integer("x-max-length", true); err != nil {
		return st, err
	} else if ok {
		st.maxLength = n
	}
	if n, ok, err = integer("x-max-length-bytes", true); err != nil {
		return st, err
	} else if ok {
		st.maxLengthBytes = n
	}
	if n, isInt := amqp.AsInt64(args["x-delivery-limit"]); isInt && n < 0 && quorumType(args) {
		st.deliveryLimit = -1 // RabbitMQ 4.x: a negative limit on a quorum queue means none
	} else if n, ok, err = integer("x-delivery-limit", true); err != nil {
		return st, err
	} else if ok {
		st.deliveryLimit = n
	}
	if n, ok, err = integer("x-consumer-timeout", true); err != nil {
		return st, err
	} else if ok {
		st.consumerTimeout = n
	}
	if n, ok, err = integer("x-max-priority", true); err != nil {
		return st, err
	} else if ok {
		if n > 255 {
			return st, invalid("x-max-priority", "{max_value_exceeded,%d}", n)
		}
		st.maxPriority = uint8(n)
	}
	if v, present := args["x-overflow"]; present {
		s, isStr := v.(string)
		if b, isBytes := v.([]byte); isBytes {
			s, isStr = string(b), true
		}
		if !isStr {
			return st, invalid("x-overflow", "{unacceptable_type,%s}", amqp.TypeName(v))
		}
		switch s {
		case "drop-head", "reject-publish", "reject-publish-dlx":
			st.overflow = s
		default:
			return st, invalid("x-overflow", "invalid_overflow")
		}
	}
	if v, present := args["x-single-active-consumer"]; present {
		b, isBool := v.(bool)
		if !isBool {
			return st, invalid("x-single-active-consumer", "{unacceptable_type,%s}", amqp.TypeName(v))
		}
		st.singleActive = b
	}
	if st.dlx, st.hasDLX, err = str("x-dead-letter-exchange"); err != nil {
		return st, err
	}
	if v, present := args["x-dead-letter-routing-key"]; present {
		switch v := v.(type) {
		case string:
			st.dlrk, st.hasDLRK = v, true
		case []byte:
			st.dlrk, st.hasDLRK = string(v), true
		default:
			return st, invalid("x-dead-letter-routing-key", "{unacceptable_type,%s}", amqp.TypeName(v))
		}
	}
	if st.hasDLRK && !st.hasDLX {
		return st, invalid("x-dead-letter-routing-key", "routing_key_but_no_dlx_defined")
	}
	if v, present := args["x-queue-type"]; present {
		t, _ := v.(string)
		if b, isBytes := v.([]byte); isBytes {
			t = string(b)
		}
		switch t {
		case "classic":
		case "stream":
			st.stream = true
		case "quorum":
			st.quorum = true
		default:
			if known == nil || !known(t) {
				return st, invalid("x-queue-type", "\"unsupported queue type '%s'\"", t)
			}
			st.other = t
		}
	}
	if st.quorum {
		// RabbitMQ refuses the arguments of the other queue types (x-stream-filter-size-bytes is 4.x's).
		for _, k := range [...]string{"x-max-priority", "x-queue-mode", "x-queue-version", "x-queue-master-locator",
			"x-max-age", "x-stream-max-segment-size-bytes", "x-stream-filter-size-bytes", "x-initial-cluster-size"} {
			if _, present := args[k]; present {
				return st, amqp.Errorf(amqp.PreconditionFailed, "invalid arg '%s' for queue '%s' in vhost '%s' of queue type rabbit_quorum_queue",
					k, name, vhost)
			}
		}
		if _, set := args["x-delivery-limit"]; !set {
			st.deliveryLimit = defaultQuorumDeliveryLimit
		}
		if n, ok, err := integer("x-quorum-initial-group-size", false); err != nil {
			return st, err
		} else if ok {
			st.groupSize = int(min(n, 255))
		}
	}
	if st.stream {
		for _, k := range [...]string{"x-message-ttl", "x-expires", "x-max-length", "x-dead-letter-exchange",
			"x-dead-letter-routing-key", "x-max-priority", "x-overflow", "x-delivery-limit", "x-single-active-consumer",
			"x-queue-mode", "x-max-in-memory-length", "x-max-in-memory-bytes", "x-queue-master-locator",
			"x-queue-version", "x-dead-letter-strategy", "x-quorum-initial-group-size"} {
			if _, present := args[k]; present {
				return st, amqp.Errorf(amqp.PreconditionFailed, "invalid arg '%s' for queue '%s' in vhost '%s' of queue type rabbit_stream_queue",
					k, name, vhost)
			}
		}
		if v, present := args["x-max-age"]; present {
			s, isStr := v.(string)
			if b, isBytes := v.([]byte); isBytes {
				s, isStr = string(b), true
			}
			if !isStr {
				return st, invalid("x-max-age", "{unacceptable_type,%s}", amqp.TypeName(v))
			}
			d, perr := stream.ParseMaxAge(s)
			if perr != nil {
				return st, invalid("x-max-age", "invalid_max_age")
			}
			st.maxAge = d
		}
		if n, ok, err = integer("x-stream-max-segment-size-bytes", true); err != nil {
			return st, err
		} else if ok {
			st.maxSegmentBytes = n
		}
	}
	return st, nil
}

// quorumType reports whether args ask for a quorum queue.
func quorumType(args amqp.Table) bool {
	switch t := args["x-queue-type"].(type) {
	case string:
		return t == "quorum"
	case []byte:
		return string(t) == "quorum"
	}
	return false
}

// defaultQuorumDeliveryLimit is RabbitMQ 4.x's delivery limit of quorum queues.
const defaultQuorumDeliveryLimit = 20

// checkStreamDeclare refuses what streams (and quorum queues: kind "rabbit_quorum_queue") cannot be,
// with RabbitMQ's texts.
func checkStreamDeclare(m QueueDecl, name, vhost string) *amqp.Error {
	return checkReplicatedDeclare(m, name, vhost, "rabbit_stream_queue")
}

func checkReplicatedDeclare(m QueueDecl, name, vhost, kind string) *amqp.Error {
	if kind == "rabbit_quorum_queue" && !m.ServerNamed {
		// RabbitMQ checks a quorum queue's properties in this order.
		switch {
		case m.AutoDelete:
			return amqp.Errorf(amqp.PreconditionFailed, "invalid property 'auto-delete' for queue '%s' in vhost '%s'", name, vhost)
		case m.Exclusive:
			return amqp.Errorf(amqp.PreconditionFailed, "invalid property 'exclusive-owner' for queue '%s' in vhost '%s'", name, vhost)
		}
	}
	switch {
	case m.ServerNamed:
		return amqp.Errorf(amqp.PreconditionFailed, "Cannot declare a server-named queue for type %s", kind)
	case !m.Durable:
		return amqp.Errorf(amqp.PreconditionFailed, "invalid property 'non-durable' for queue '%s' in vhost '%s'", name, vhost)
	case m.Exclusive:
		return amqp.Errorf(amqp.PreconditionFailed, "invalid property 'exclusive-owner' for queue '%s' in vhost '%s'", name, vhost)
	case m.AutoDelete:
		return amqp.Errorf(amqp.PreconditionFailed, "invalid property 'auto-delete' for queue '%s' in vhost '%s'", name, vhost)
	}
	return nil
}

// maxTTL is RabbitMQ's largest TTL or expiry: ten years in milliseconds.
const maxTTL = 315360000000

// kind is the queue type the settings ask for, as x-queue-type names it.
func (st queueSettings) kind() string {
	switch {
	case st.other != "":
		return st.other
	case st.stream:
		return "stream"
	case st.quorum:
		return "quorum"
	}
	return "classic"
}

// lifecycle turns validated queue arguments into the queue machine's lifecycle configuration.
func (st queueSettings) lifecycle() queue.Config {
	cfg := queue.DefaultConfig()
	cfg.MessageTTL = st.messageTTL
	cfg.MaxLength = st.maxLength
	cfg.MaxLengthBytes = st.maxLengthBytes
	switch st.overflow {
	case "reject-publish":
		cfg.Overflow = queue.RejectPublish
	case "reject-publish-dlx":
		cfg.Overflow = queue.RejectPublishDLX
	default:
		cfg.Overflow = queue.DropHead
	}
	cfg.MaxPriority = st.maxPriority
	cfg.DeliveryLimit = st.deliveryLimit
	cfg.SingleActiveConsumer = st.singleActive
	return cfg
}
