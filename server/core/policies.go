package core

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"time"

	"warren/amqp"
	"warren/server/policy"
	"warren/server/queue"
	"warren/storage"
)

// Policies and operator policies are replicated records like the others (one per policy). Every
// node keeps them compiled in an immutable policy.Set, matches each new queue and exchange
// against it, and after a change re-matches only the objects of that vhost the change can
// affect (policy.Set.Reapply). A queue's effective settings are its arguments met with its
// policy and operator policy by the rules of its type (policy.Match.Queue); dead-lettering reads
// them from the core, and the queue type is handed the new lifecycle settings through
// Reconfigurer when it implements it.

// Reconfigurer is implemented by queue types whose lifecycle settings can change while the queue
// runs (a policy set, changed or deleted). The core calls Reconfigure on every node that has the
// queue, with the fields of queue.OpenConfig that settings fill (Lifecycle, Expires,
// ConsumerTimeout, and Args: the declared arguments with the policy's stream settings merged in,
// for types that read them there); the other fields are as at Open. It must not block on the
// queue's goroutines. A replicated type changes its state machine through its own log (the
// leader proposes the change, so every replica applies it at the same point); the core calls
// every replica, so a leader elected later can compare what it was last given with its state.
type Reconfigurer interface {
	Reconfigure(cfg queue.OpenConfig) error
}

// policyRecord is a policy or operator policy as stored.
type policyRecord struct {
	Component policy.Component
	policy.Policy
}

func policyKey(c policy.Component, vhost, name string) []byte {
	kind := kindPolicy
	if c == policy.ComponentOperatorPolicy {
		kind = kindOperatorPolicy
	}
	return metaKey(kind, vhost, name)
}

func encodePolicyRecord(r policyRecord) []byte {
	js, err := json.Marshal(r.Policy)
	if err != nil {
		js = []byte("{}")
	}
	return encodeRecord(amqp.Table{"component": string(r.Component), "vhost": r.VHost, "name": r.Name, "json": js})
}

func decodePolicyRecord(b []byte) (policyRecord, error) {
	t, err := decodeRecord(b)
	if err != nil {
		return policyRecord{}, err
	}
	r := policyRecord{Component: policy.Component(str(t, "component"))}
	if js, ok := t["json"].([]byte); ok && len(js) > 0 {
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.UseNumber()
		if err := dec.Decode(&r.Policy); err != nil {
			return r, fmt.Errorf("%w: policy: %v", errBadRecord, err)
		}
	}
	r.VHost, r.Name = str(t, "vhost"), str(t, "name")
	return r, nil
}

// policySet returns the node's compiled policies.
func (b *Broker) policySet() *policy.Set { return b.policies.Load() }

// Policies lists a component's policies of a vhost ("" = every vhost), in match order.
func (b *Broker) Policies(c policy.Component, vhost string) []*policy.Compiled {
	s := b.policySet()
	if vhost != "" {
		return s.List(c, vhost)
	}
	var out []*policy.Compiled
	for _, v := range s.VHosts() {
		out = append(out, s.List(c, v)...)
	}
	return out
}

// LookupPolicy returns the named policy, or nil.
func (b *Broker) LookupPolicy(c policy.Component, vhost, name string) *policy.Compiled {
	return b.policySet().Get(c, vhost, name)
}

// PutPolicy validates a policy as RabbitMQ does (a *policy.Error names the key at fault) and
// replicates it; it applies at once to the vhost's existing and new queues and exchanges.
func (b *Broker) PutPolicy(ctx context.Context, c policy.Component, p policy.Policy) error {
	if _, ok := b.LookupVHost(p.VHost); !ok {
		return ErrNoVHost
	}
	if _, err := policy.Compile(c, p); err != nil {
		return err
	}
	return b.proposeErr(ctx, opPutPolicy, encodePolicyRecord(policyRecord{Component: c, Policy: p}))
}

// DeletePolicy deletes a policy (ErrNoPerm-like ErrNoPolicy if there is none).
func (b *Broker) DeletePolicy(ctx context.Context, c policy.Component, vhost, name string) error {
	if b.LookupPolicy(c, vhost, name) == nil {
		return ErrNoPolicy
	}
	return b.proposeErr(ctx, opDeletePolicy, encodePolicyRecord(policyRecord{Component: c, Policy: policy.Policy{VHost: vhost, Name: name}}))
}

// ErrNoPolicy is the error of deleting a policy that does not exist.
var ErrNoPolicy = fmt.Errorf("no such policy")

func (b *Broker) applyPutPolicy(r policyRecord, batch *storage.Batch) {
	cp, err := policy.Compile(r.Component, r.Policy)
	if err != nil {
		b.log.Warn("replicated policy not applied", "vhost", r.VHost, "policy", r.Name, "err", err)
		return
	}
	b.policyMu.Lock()
	b.policies.Store(b.policySet().With(cp))
	b.policyMu.Unlock()
	batch.Set(policyKey(r.Component, r.VHost, r.Name), encodePolicyRecord(r))
	if len(cp.Ignored) > 0 {
		b.log.Info("policy keys accepted without effect in Warren", "vhost", r.VHost, "policy", r.Name, "keys", cp.Ignored)
	}
	b.reapplyPolicies(r.VHost, r.Component, r.Name)
}

func (b *Broker) applyDeletePolicy(r policyRecord, batch *storage.Batch) {
	b.policyMu.Lock()
	b.policies.Store(b.policySet().Without(r.Component, r.VHost, r.Name))
	b.policyMu.Unlock()
	batch.Delete(policyKey(r.Component, r.VHost, r.Name))
	b.reapplyPolicies(r.VHost, r.Component, r.Name)
}

// dropVHostPolicies removes a deleted vhost's policies.
func (b *Broker) dropVHostPolicies(vhost string, batch *storage.Batch) {
	b.policyMu.Lock()
	s := b.policySet()
	for _, c := range [...]policy.Component{policy.ComponentPolicy, policy.ComponentOperatorPolicy} {
		for _, p := range s.List(c, vhost) {
			batch.Delete(policyKey(c, vhost, p.Name))
		}
	}
	b.policies.Store(s.WithoutVHost(vhost))
	b.policyMu.Unlock()
}

// reapplyPolicies brings a vhost's queues and exchanges up to date after a policy change.
func (b *Broker) reapplyPolicies(vhost string, c policy.Component, name string) {
	v := b.VHost(vhost)
	if v == nil {
		return
	}
	s := b.policySet()
	qs := v.Queues()
	byName := make(map[string]*Queue, len(qs))
	objects := func(yield func(policy.Object) bool) {
		for _, q := range qs {
			byName[q.name] = q
			if !yield(policy.Object{Name: q.name, Type: policy.QueueType(q.kind), Current: q.PolicyMatch()}) {
				return
			}
		}
	}
	s.Reapply(vhost, c, name, iter.Seq[policy.Object](objects), func(o policy.Object, m policy.Match) {
		if q := byName[o.Name]; q != nil {
			q.applyPolicy(m)
		}
	})
	xs := v.ex.Exchanges()
	xobjects := func(yield func(policy.Object) bool) {
		for _, x := range xs {
			if x.Name == "" {
				continue
			}
			if !yield(policy.Object{Name: x.Name, Type: policy.Exchange, Current: v.exchangePolicy(x.Name)}) {
				return
			}
		}
	}
	s.Reapply(vhost, c, name, iter.Seq[policy.Object](xobjects), func(o policy.Object, m policy.Match) {
		v.setExchangePolicy(o.Name, m)
	})
}

// queuePolicy is what applies to a queue now: its Match and the settings it gives.
type queuePolicy struct {
	match policy.Match
	st    queueSettings
}

// PolicyMatch is the queue's policy and operator policy now.
func (q *Queue) PolicyMatch() policy.Match {
	if p := q.pol.Load(); p != nil {
		return p.match
	}
	return policy.Match{}
}

// effective is the queue's settings with its policies applied.
func (q *Queue) effective() queueSettings {
	if p := q.pol.Load(); p != nil {
		return p.st
	}
	return q.settings
}

// EffectivePolicyDefinition is the merged definition of the queue's policy and operator policy,
// as the management API shows it.
func (q *Queue) EffectivePolicyDefinition() policy.Definition {
	return q.PolicyMatch().EffectiveDefinition()
}

// withPolicy returns the settings st (from the queue's arguments) with m applied by the rules of
// the queue's type.
func withPolicy(st queueSettings, kind string, args amqp.Table, m policy.Match) queueSettings {
	if m.Policy == nil && m.OperatorPolicy == nil {
		return st
	}
	qs := m.Queue(policy.QueueType(kind), args)
	if qs.MessageTTL.Set {
		st.messageTTL = qs.MessageTTL.Value
	}
	if qs.Expires.Set {
		st.expires = qs.Expires.Value
	}
	if qs.MaxLength.Set {
		st.maxLength = qs.MaxLength.Value
	}
	if qs.MaxLengthBytes.Set {
		st.maxLengthBytes = qs.MaxLengthBytes.Value
	}
	if qs.Overflow.Set {
		st.overflow = qs.Overflow.Value
	}
	if qs.DeadLetterExchange.Set {
		st.dlx, st.hasDLX = qs.DeadLetterExchange.Value, true
	}
	if qs.DeadLetterRoutingKey.Set {
		st.dlrk, st.hasDLRK = qs.DeadLetterRoutingKey.Value, true
	}
	if qs.DeliveryLimit.Set {
		st.deliveryLimit = qs.DeliveryLimit.Value
		if st.deliveryLimit < 0 {
			st.deliveryLimit = -1
		}
	}
	if qs.ConsumerTimeout.Set {
		st.consumerTimeout = qs.ConsumerTimeout.Value
	}
	if qs.MaxAge.Set {
		st.maxAge = qs.MaxAge.Value
	}
	if qs.StreamMaxSegmentSizeBytes.Set {
		st.maxSegmentBytes = qs.StreamMaxSegmentSizeBytes.Value
	}
	return st
}

// typeArgs are the arguments a queue type is opened (or reconfigured) with: the declared ones,
// with a stream's policy settings merged in (streams read their retention from arguments).
func typeArgs(st queueSettings, args amqp.Table) amqp.Table {
	if !st.stream {
		return args
	}
	out := amqp.Table{}
	for k, v := range args {
		out[k] = v
	}
	if st.maxAge > 0 {
		out["x-max-age"] = fmt.Sprintf("%ds", int64(st.maxAge/time.Second))
	}
	if st.maxSegmentBytes > 0 {
		out["x-stream-max-segment-size-bytes"] = st.maxSegmentBytes
	}
	if st.maxLengthBytes >= 0 {
		out["x-max-length-bytes"] = st.maxLengthBytes
	}
	return out
}

// applyPolicy gives the queue a new Match and hands the resulting settings to its type.
func (q *Queue) applyPolicy(m policy.Match) {
	st := withPolicy(q.settings, q.kind, q.args, m)
	old := q.effective()
	q.pol.Store(&queuePolicy{match: m, st: st})
	b := q.vhost.b
	b.log.Debug("queue policy changed", "vhost", q.vhost.name, "queue", q.name, "policy", m.PolicyName(), "operator_policy", m.OperatorPolicyName())
	if st == old {
		return
	}
	r, ok := q.Queue.(Reconfigurer)
	if !ok {
		b.log.Warn("this queue's type cannot change its settings while it runs; the policy applies to its dead-lettering now and to the rest when it is next opened",
			"vhost", q.vhost.name, "queue", q.name, "type", q.kind)
		return
	}
	if err := r.Reconfigure(q.openConfig(st)); err != nil {
		b.log.Warn("cannot apply a policy to a queue", "vhost", q.vhost.name, "queue", q.name, "err", err)
	}
}

// openConfig is the queue type's configuration for settings st.
func (q *Queue) openConfig(st queueSettings) queue.OpenConfig {
	b := q.vhost.b
	timeout := st.consumerTimeout
	if timeout < 0 {
		timeout = b.opts.ConsumerTimeout.Milliseconds()
	}
	return queue.OpenConfig{
		VHost: q.vhost.name, Name: q.name, Durable: q.durable, Exclusive: q.owner != nil, AutoDelete: q.autoDelete,
		ID: q.id, Args: typeArgs(st, q.args), Lifecycle: st.lifecycle(), Expires: st.expires, ConsumerTimeout: timeout,
		DB: b.db, Logger: b.log, Hooks: q.hooks,
	}
}

// exchangePolicy is an exchange's policy now.
func (v *VHost) exchangePolicy(name string) policy.Match {
	v.xpolMu.Lock()
	defer v.xpolMu.Unlock()
	return v.xpol[name]
}

// ExchangePolicy is the named exchange's policy and operator policy now.
func (v *VHost) ExchangePolicy(name string) policy.Match { return v.exchangePolicy(name) }

// setExchangePolicy records an exchange's Match and applies its alternate exchange.
func (v *VHost) setExchangePolicy(name string, m policy.Match) {
	v.xpolMu.Lock()
	if m == (policy.Match{}) {
		delete(v.xpol, name)
	} else {
		if v.xpol == nil {
			v.xpol = map[string]policy.Match{}
		}
		v.xpol[name] = m
	}
	v.xpolMu.Unlock()
	ae := ""
	if pv, ok := m.Get("alternate-exchange"); ok {
		ae, _ = pv.(string)
	}
	v.ex.SetPolicyAlternate(name, ae)
}

// matchExchange applies the current policies to a new exchange.
func (v *VHost) matchExchange(name string) {
	if name == "" {
		return
	}
	m := v.b.policySet().Match(v.name, name, policy.Exchange)
	if m != (policy.Match{}) || v.exchangePolicy(name) != (policy.Match{}) {
		v.setExchangePolicy(name, m)
	}
}
