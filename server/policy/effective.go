package policy

import (
	"time"

	"warren/amqp"
	"warren/stream"
)

// EffectiveDefinition is the merge of the policy's and the operator policy's definitions, as
// the management API shows it in effective_policy_definition (rabbit_policy:
// effective_definition): every key of either, and for a key both set, the merged value (see
// the package doc). Queue arguments are not part of it. The result is a new map; it is empty,
// not nil, when neither policy applies, as the API shows {}.
func (m Match) EffectiveDefinition() Definition {
	out := Definition{}
	if m.Policy != nil {
		for k, v := range m.Policy.Definition {
			out[k] = v
		}
	}
	if m.OperatorPolicy != nil {
		for k, ov := range m.OperatorPolicy.Definition {
			if pv, ok := out[k]; ok {
				out[k] = mergeValues(k, pv, ov)
			} else {
				out[k] = ov
			}
		}
	}
	return out
}

// Get returns the merged value of one key (rabbit_policy:get).
func (m Match) Get(key string) (any, bool) {
	var pv, ov any
	var pok, ook bool
	if m.Policy != nil {
		pv, pok = m.Policy.Definition[key]
	}
	if m.OperatorPolicy != nil {
		ov, ook = m.OperatorPolicy.Definition[key]
	}
	switch {
	case pok && ook:
		return mergeValues(key, pv, ov), true
	case pok:
		return pv, true
	case ook:
		return ov, true
	}
	return nil, false
}

// mergeValues merges a key set by both a policy and an operator policy (rabbit_policies:
// merge_policy_value and rabbit_quorum_queue:merge_policy_value).
func mergeValues(key string, pv, ov any) any {
	pn, pInt := intValue(pv)
	on, oInt := intValue(ov)
	switch key {
	case "message-ttl", "max-length", "max-length-bytes", "max-in-memory-length", "max-in-memory-bytes", "expires", "delayed-retry-max":
		if pInt && oInt && pn < on {
			return pv
		}
		return ov
	case "delivery-limit":
		if pInt && oInt {
			if pn < 0 || on < 0 {
				if pn > on {
					return pv
				}
				return ov
			}
			if pn < on {
				return pv
			}
		}
		return ov
	case "target-group-size", "delayed-retry-min":
		if pInt && oInt && pn > on {
			return pv
		}
		return ov
	}
	// overflow, queue-version, member-placement-tag, delayed-retry-type, booleans: the
	// operator's. RabbitMQ has no rule for other keys both may set; the operator's is the safe
	// reading of "operator policies override".
	return ov
}

// Int is an optional integer setting.
type Int struct {
	Value int64
	Set   bool
}

// String is an optional string setting.
type String struct {
	Value string
	Set   bool
}

// Duration is an optional duration setting (max-age).
type Duration struct {
	Value time.Duration
	Set   bool
}

// QueueSettings are the effective values of the settings Warren acts on for one queue, after
// its arguments meet its policy and operator policy by the rules of its type. A setting is
// unset when neither the arguments nor the policies give it; a setting that does not exist for
// the queue's type (delivery-limit on a classic queue) is never set. Time values are in
// milliseconds, as RabbitMQ's arguments are.
type QueueSettings struct {
	MessageTTL                Int
	Expires                   Int
	MaxLength                 Int
	MaxLengthBytes            Int
	Overflow                  String
	DeadLetterExchange        String
	DeadLetterRoutingKey      String
	DeadLetterStrategy        String
	DeliveryLimit             Int
	MaxAge                    Duration
	StreamMaxSegmentSizeBytes Int
	StreamFilterSizeBytes     Int
	InitialClusterSize        Int
	QueueLeaderLocator        String
	ConsumerTimeout           Int
}

// rule is how a merged policy value P and a queue argument A resolve.
type rule uint8

const (
	ruleMin           rule = iota // min(P, A)
	ruleArg                       // A if present, else P
	rulePolicy                    // P if present, else A
	ruleDeliveryLimit             // min(P, A); if either is negative, max(P, A)
)

type setting struct {
	key, arg string
	rule     rule
}

// queueRules are the per-type tables of the package doc, from RabbitMQ 4.x's source.
var queueRules = [numObjectTypes][]setting{
	ClassicQueue: {
		{"expires", "x-expires", ruleMin},
		{"message-ttl", "x-message-ttl", ruleMin},
		{"max-length", "x-max-length", ruleMin},
		{"max-length-bytes", "x-max-length-bytes", ruleMin},
		{"overflow", "x-overflow", ruleArg},
		{"dead-letter-exchange", "x-dead-letter-exchange", ruleArg},
		{"dead-letter-routing-key", "x-dead-letter-routing-key", ruleArg},
		{"queue-leader-locator", "x-queue-leader-locator", rulePolicy},
		{"consumer-timeout", "x-consumer-timeout", ruleMin},
	},
	QuorumQueue: {
		{"expires", "x-expires", ruleMin},
		{"message-ttl", "x-message-ttl", ruleMin},
		{"max-length", "x-max-length", ruleMin},
		{"max-length-bytes", "x-max-length-bytes", ruleMin},
		{"overflow", "x-overflow", rulePolicy},
		{"dead-letter-exchange", "x-dead-letter-exchange", ruleArg},
		{"dead-letter-routing-key", "x-dead-letter-routing-key", ruleArg},
		{"dead-letter-strategy", "x-dead-letter-strategy", ruleArg},
		{"delivery-limit", "x-delivery-limit", ruleDeliveryLimit},
		{"queue-leader-locator", "x-queue-leader-locator", rulePolicy},
		{"consumer-timeout", "x-consumer-timeout", ruleMin},
	},
	Stream: {
		{"max-length-bytes", "x-max-length-bytes", rulePolicy},
		{"max-age", "x-max-age", rulePolicy},
		{"stream-max-segment-size-bytes", "x-stream-max-segment-size-bytes", rulePolicy},
		{"stream-filter-size-bytes", "x-stream-filter-size-bytes", rulePolicy},
		{"initial-cluster-size", "x-initial-cluster-size", rulePolicy},
		{"queue-leader-locator", "x-queue-leader-locator", rulePolicy},
		{"consumer-timeout", "x-consumer-timeout", ruleMin},
	},
}

// Queue resolves the settings of a queue of type t with arguments args under this Match
// (rabbit_queue_type_util:args_policy_lookup with each type's resolver). The arguments are
// assumed validated at declare; a value of the wrong type counts as absent.
func (m Match) Queue(t ObjectType, args amqp.Table) QueueSettings {
	var qs QueueSettings
	if t >= numObjectTypes {
		return qs
	}
	for _, s := range queueRules[t] {
		pv, pok := m.Get(s.key)
		av, aok := args[s.arg]
		v, ok := resolve(s.rule, pv, pok, av, aok)
		if !ok {
			continue
		}
		qs.set(s.key, v)
	}
	return qs
}

// normalize puts one side's value in a common form: integers as int64, strings as string.
func normalize(v any) (any, bool) {
	if n, ok := intValue(v); ok {
		return n, true
	}
	if n, ok := amqp.AsInt64(v); ok {
		return n, true
	}
	switch v := v.(type) {
	case string:
		return v, true
	case []byte:
		return string(v), true
	}
	return nil, false
}

func resolve(r rule, pv any, pok bool, av any, aok bool) (any, bool) {
	if pok {
		pv, pok = normalize(pv)
	}
	if aok {
		av, aok = normalize(av)
	}
	switch {
	case !pok && !aok:
		return nil, false
	case !pok:
		return av, true
	case !aok:
		return pv, true
	}
	switch r {
	case ruleArg:
		return av, true
	case rulePolicy:
		return pv, true
	}
	pn, pInt := pv.(int64)
	an, aInt := av.(int64)
	if !pInt || !aInt {
		return pv, true
	}
	if r == ruleDeliveryLimit && (pn < 0 || an < 0) {
		return max(pn, an), true
	}
	return min(pn, an), true
}

func (qs *QueueSettings) set(key string, v any) {
	n, isInt := v.(int64)
	s, isStr := v.(string)
	setInt := func(dst *Int) {
		if isInt {
			*dst = Int{Value: n, Set: true}
		}
	}
	setStr := func(dst *String) {
		if isStr {
			*dst = String{Value: s, Set: true}
		}
	}
	switch key {
	case "message-ttl":
		setInt(&qs.MessageTTL)
	case "expires":
		setInt(&qs.Expires)
	case "max-length":
		setInt(&qs.MaxLength)
	case "max-length-bytes":
		setInt(&qs.MaxLengthBytes)
	case "overflow":
		setStr(&qs.Overflow)
	case "dead-letter-exchange":
		setStr(&qs.DeadLetterExchange)
	case "dead-letter-routing-key":
		setStr(&qs.DeadLetterRoutingKey)
	case "dead-letter-strategy":
		setStr(&qs.DeadLetterStrategy)
	case "delivery-limit":
		setInt(&qs.DeliveryLimit)
	case "max-age":
		if isStr {
			if d, err := stream.ParseMaxAge(s); err == nil {
				qs.MaxAge = Duration{Value: d, Set: true}
			}
		}
	case "stream-max-segment-size-bytes":
		setInt(&qs.StreamMaxSegmentSizeBytes)
	case "stream-filter-size-bytes":
		setInt(&qs.StreamFilterSizeBytes)
	case "initial-cluster-size":
		setInt(&qs.InitialClusterSize)
	case "queue-leader-locator":
		setStr(&qs.QueueLeaderLocator)
	case "consumer-timeout":
		setInt(&qs.ConsumerTimeout)
	}
}

// AlternateExchange resolves an exchange's alternate exchange: its own argument
// alternate-exchange wins over the policy key (rabbit_policy:get_arg).
func (m Match) AlternateExchange(args amqp.Table) (string, bool) {
	pv, pok := m.Get("alternate-exchange")
	av, aok := args["alternate-exchange"]
	v, ok := resolve(ruleArg, pv, pok, av, aok)
	s, isStr := v.(string)
	return s, ok && isStr
}
