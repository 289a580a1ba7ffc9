// Package policy holds policies and operator policies as RabbitMQ has them: validation of a
// policy with RabbitMQ's rules and error texts, matching a policy to an exchange or queue by
// pattern, apply-to and priority, and the effective value of each setting given a queue's own
// x-arguments, its policy and its operator policy.
//
// The package is pure: it keeps no state besides immutable Sets and does no I/O. The broker
// core stores policies (replicated through the metadata group), keeps a *Set per node, matches
// new objects against it and calls Set.Reapply after a change. See docs/policies.md.
//
// # Precedence
//
// When both a policy and an operator policy set a key, they merge first (rabbit_policy:
// merge_operator_definitions and each key's merge strategy):
//
//	message-ttl, expires, max-length, max-length-bytes,
//	max-in-memory-length, max-in-memory-bytes          the lower value
//	delivery-limit                                     the lower value; if either is negative
//	                                                   (unlimited), the higher one (4.x)
//	overflow, queue-version                            the operator policy's
//	target-group-size, delayed-retry-min               the higher value
//	delayed-retry-max                                  the lower value
//	member-placement-tag, delayed-retry-type           the operator policy's
//	any other key set by both                          the operator policy's
//
// The merged value (P below) then meets the queue's own argument x-<key> (A below), by queue
// type (rabbit_amqqueue_process:process_args_policy for classic queues,
// rabbit_quorum_queue:gather_policy_config and dead_letter_handler for quorum queues,
// rabbit_stream_queue:update_stream_conf for streams, rabbit_queue_location:leader_locator,
// rabbit_queue_type:get_consumer_timeout):
//
//	key                        classic     quorum      stream
//	message-ttl                min(P,A)    min(P,A)    -
//	expires                    min(P,A)    min(P,A)(1) -
//	max-length                 min(P,A)    min(P,A)    -
//	max-length-bytes           min(P,A)    min(P,A)    P
//	overflow                   A           P           -
//	dead-letter-exchange       A           A           -
//	dead-letter-routing-key    A           A           -
//	dead-letter-strategy       -           A           -
//	delivery-limit             -           min(P,A)(2) -
//	max-age                    -           -           P
//	stream-max-segment-size-bytes -        -           P
//	stream-filter-size-bytes   (no effect) (no effect) P
//	initial-cluster-size       -           -           P (argument x-initial-cluster-size)
//	queue-leader-locator       P(3)        P           P
//	consumer-timeout           min(P,A)    min(P,A)    min(P,A)
//
//	exchanges: alternate-exchange      A (the exchange argument alternate-exchange) over P
//
// "-" means the key is not applicable to that queue type: RabbitMQ then does not apply the
// whole policy to such a queue (rabbit_queue_type:is_policy_applicable), and the next matching
// policy is tried. A policy with ha-mode, for example, never applies to a quorum queue or a
// stream, and one with max-age never applies to a classic or quorum queue.
//
//	(1) 3.10.8: the policy wins for a quorum queue's expires (later versions take the minimum).
//	(2) 4.x: if either value is negative (unlimited), the higher value; absent, quorum queues
//	    default to 20. 3.10.8: the minimum, and negative values are refused.
//	(3) 4.x only; in 3.10.8 queue-leader-locator is not applicable to classic queues.
package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"
)

// Component says whether a policy is an ordinary policy or an operator policy; the values are
// RabbitMQ's runtime-parameter component names, as they appear in definitions files.
type Component string

// The two components.
const (
	ComponentPolicy         Component = "policy"
	ComponentOperatorPolicy Component = "operator_policy"
)

// ApplyTo is the kind of object a policy applies to.
type ApplyTo string

// The apply-to values RabbitMQ accepts (the queue types' values since 3.12).
const (
	ApplyToAll           ApplyTo = "all"
	ApplyToExchanges     ApplyTo = "exchanges"
	ApplyToQueues        ApplyTo = "queues"
	ApplyToClassicQueues ApplyTo = "classic_queues"
	ApplyToQuorumQueues  ApplyTo = "quorum_queues"
	ApplyToStreams       ApplyTo = "streams"
)

// ObjectType is the kind of object a policy is matched against.
type ObjectType uint8

// The object types.
const (
	Exchange ObjectType = iota
	ClassicQueue
	QuorumQueue
	Stream
	numObjectTypes
)

// QueueType maps an x-queue-type value to its object type ("" and unknown values are classic,
// as RabbitMQ treats a missing type).
func QueueType(xQueueType string) ObjectType {
	switch xQueueType {
	case "quorum":
		return QuorumQueue
	case "stream":
		return Stream
	}
	return ClassicQueue
}

func (t ObjectType) String() string {
	switch t {
	case Exchange:
		return "exchange"
	case ClassicQueue:
		return "classic queue"
	case QuorumQueue:
		return "quorum queue"
	case Stream:
		return "stream"
	}
	return fmt.Sprintf("ObjectType(%d)", uint8(t))
}

// fits reports whether an apply-to value covers an object type (rabbit_policy:matches_type and
// matches_queue_type).
func (a ApplyTo) fits(t ObjectType) bool {
	switch a {
	case ApplyToAll:
		return true
	case ApplyToExchanges:
		return t == Exchange
	case ApplyToQueues:
		return t != Exchange
	case ApplyToClassicQueues:
		return t == ClassicQueue
	case ApplyToQuorumQueues:
		return t == QuorumQueue
	case ApplyToStreams:
		return t == Stream
	}
	return false
}

// Definition is a policy's definition: key to JSON value as given. Numbers are json.Number, so
// that 1000 and 1000.0 stay distinct as they are for RabbitMQ (an integer and a float); decode
// definitions with Definition's UnmarshalJSON or a json.Decoder with UseNumber.
type Definition map[string]any

// UnmarshalJSON decodes a definition keeping numbers as json.Number.
func (d *Definition) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return err
	}
	*d = m
	return nil
}

// Policy is a policy or an operator policy as the management API and definitions files carry
// it. Priority is a JSON number (RabbitMQ accepts 1.5); higher wins.
type Policy struct {
	VHost      string     `json:"vhost"`
	Name       string     `json:"name"`
	Pattern    string     `json:"pattern"`
	ApplyTo    ApplyTo    `json:"apply-to"`
	Priority   float64    `json:"priority"`
	Definition Definition `json:"definition"`
}

// Error is a policy that RabbitMQ would refuse, with RabbitMQ's text. Field is the definition
// key at fault, or "pattern", "apply-to", "priority" or "definition".
type Error struct {
	Field  string
	Reason string

	notValidation bool // a malformed body, reported without "Validation failed"
}

func (e *Error) Error() string {
	return fmt.Sprintf("invalid policy %s: %s", e.Field, e.Reason)
}

// ManagementReason is the "reason" the management API returns with its 400 for this error.
func (e *Error) ManagementReason() string {
	if e.notValidation {
		return e.Reason
	}
	return "Validation failed\n\n" + e.Reason + "\n"
}

func invalid(field, format string, args ...any) *Error {
	return &Error{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Compiled is a validated policy, ready to match: its pattern is compiled and its
// applicability to each object type is known. It is immutable; replacing a policy makes a new
// Compiled, so pointer equality tells whether an object's policy changed.
type Compiled struct {
	Policy
	Component Component
	// Ignored lists the definition keys, sorted, that RabbitMQ accepts and Warren keeps and
	// shows but does not act on (ha-*, queue-mode, federation-upstream...).
	Ignored []string

	pattern *Pattern
	applies [numObjectTypes]bool
}

// Compile validates p as RabbitMQ validates a policy of component c (rabbit_policy:validate,
// rabbit_policies:validate_policy and the plugins' validators), and compiles it. An empty
// ApplyTo means "all". Errors are *Error.
func Compile(c Component, p Policy) (*Compiled, error) {
	if c != ComponentPolicy && c != ComponentOperatorPolicy {
		return nil, fmt.Errorf("policy: unknown component %q", c)
	}
	if p.ApplyTo == "" {
		p.ApplyTo = ApplyToAll
	}
	if math.IsNaN(p.Priority) || math.IsInf(p.Priority, 0) {
		return nil, invalid("priority", "priority should be a number, actually was %v", p.Priority)
	}
	pat, err := CompilePattern(p.Pattern)
	if err != nil {
		return nil, &Error{Field: "pattern", Reason: err.Error()}
	}
	if !p.ApplyTo.valid() {
		return nil, invalid("apply-to", "apply-to '%s' unrecognised; should be one of: 'queues', 'classic_queues', "+
			" 'quorum_queues', 'streams', 'exchanges', or 'all'", p.ApplyTo)
	}
	ignored, err := validateDefinition(c, p.Definition)
	if err != nil {
		return nil, err
	}
	def := make(Definition, len(p.Definition))
	for k, v := range p.Definition {
		def[k] = v
	}
	p.Definition = def // a Compiled is immutable: it must not share the caller's map
	cp := &Compiled{Policy: p, Component: c, Ignored: ignored, pattern: pat}
	for t := range numObjectTypes {
		cp.applies[t] = p.ApplyTo.fits(t) && applicable(t, p.Definition)
	}
	return cp, nil
}

func (a ApplyTo) valid() bool {
	switch a {
	case ApplyToAll, ApplyToExchanges, ApplyToQueues, ApplyToClassicQueues, ApplyToQuorumQueues, ApplyToStreams:
		return true
	}
	return false
}

// Matches reports whether this policy applies to an object of type t named name: apply-to fits,
// no key of the definition is unsupported by the type, and the pattern matches.
func (cp *Compiled) Matches(name string, t ObjectType) bool {
	return t < numObjectTypes && cp.applies[t] && cp.pattern.MatchString(name)
}

// AppliesTo reports whether this policy can apply to objects of type t at all (apply-to and
// the definition's keys), whatever their names.
func (cp *Compiled) AppliesTo(t ObjectType) bool { return t < numObjectTypes && cp.applies[t] }

// validateDefinition checks every key with its validator, then the validators that look at
// several keys together, then refuses keys nobody recognises, in RabbitMQ's order: the first
// invalid key (keys sorted) is reported, unknown keys only when everything else is valid.
func validateDefinition(c Component, def Definition) ([]string, error) {
	if len(def) == 0 {
		return nil, invalid("definition", "no policy provided")
	}
	keys := make([]string, 0, len(def))
	for k := range def {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var unknown, ignored []string
	for _, k := range keys {
		spec, ok := keySpecs[k]
		if !ok || (c == ComponentOperatorPolicy && !spec.operator) {
			unknown = append(unknown, k)
			continue
		}
		if spec.ignored {
			ignored = append(ignored, k)
		}
		if spec.check == nil {
			continue // validated by a group validator below
		}
		if reason := spec.check(def[k]); reason != "" {
			return nil, &Error{Field: k, Reason: reason}
		}
	}
	if c == ComponentPolicy {
		if err := validateMirroring(def); err != nil {
			return nil, err
		}
		if err := validateFederation(def); err != nil {
			return nil, err
		}
	}
	if err := validateDelayedRetry(def); err != nil {
		return nil, err
	}
	if len(unknown) > 0 {
		parts := make([]string, len(unknown))
		for i, k := range unknown {
			parts[i] = "{" + erlTerm(k) + "," + erlTerm(def[k]) + "}"
		}
		return nil, &Error{Field: unknown[0], Reason: "[" + strings.Join(parts, ",") + "] are not recognised policy settings"}
	}
	return ignored, nil
}
