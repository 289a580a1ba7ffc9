package policy

import (
	"iter"
	"slices"
	"strings"
)

// Match is what applies to one object: its policy and its operator policy, either nil. Two
// Matches are equal exactly when the object's effective settings are the same, because a
// changed policy is a new *Compiled.
type Match struct {
	Policy         *Compiled
	OperatorPolicy *Compiled
}

// PolicyName is the policy's name, "" when none (the management API shows null).
func (m Match) PolicyName() string {
	if m.Policy == nil {
		return ""
	}
	return m.Policy.Name
}

// OperatorPolicyName is the operator policy's name, "" when none.
func (m Match) OperatorPolicyName() string {
	if m.OperatorPolicy == nil {
		return ""
	}
	return m.OperatorPolicy.Name
}

// Set is an immutable collection of compiled policies and operator policies, indexed by vhost
// and kept in match order (priority descending, then name ascending), so that matching an
// object walks one vhost's list once and stops at the first hit. Changes return a new Set
// sharing the other vhosts' lists: the core can publish it with an atomic pointer and match on
// any goroutine without a lock. The zero value is not usable; start from NewSet.
type Set struct {
	vhosts map[string]*vhostPolicies
}

type vhostPolicies struct {
	byComponent [2][]*Compiled // [policy, operator policy], in match order
}

func componentIndex(c Component) int {
	if c == ComponentOperatorPolicy {
		return 1
	}
	return 0
}

// NewSet returns an empty Set.
func NewSet() *Set { return &Set{vhosts: map[string]*vhostPolicies{}} }

// before orders policies for matching. RabbitMQ sorts the matching policies by priority
// (highest first) and breaks ties by the order of its runtime-parameter table, which is an ETS
// hash order with no meaning (3.10.8 picked "t2" out of six equal policies t1..t6). Warren
// breaks ties by name, in byte order, so that every node and every restart choose the same one.
func before(a, b *Compiled) int {
	switch {
	case a.Priority > b.Priority:
		return -1
	case a.Priority < b.Priority:
		return 1
	}
	return strings.Compare(a.Name, b.Name)
}

// With returns a Set in which cp replaces the policy of the same component, vhost and name, or
// is added.
func (s *Set) With(cp *Compiled) *Set {
	i := componentIndex(cp.Component)
	old := s.vhosts[cp.VHost]
	var list []*Compiled
	if old != nil {
		list = old.byComponent[i]
	}
	next := make([]*Compiled, 0, len(list)+1)
	for _, p := range list {
		if p.Name != cp.Name {
			next = append(next, p)
		}
	}
	pos, _ := slices.BinarySearchFunc(next, cp, before)
	next = slices.Insert(next, pos, cp)
	return s.replace(cp.VHost, i, next)
}

// Without returns a Set without the named policy (the same Set if there is none).
func (s *Set) Without(c Component, vhost, name string) *Set {
	old := s.vhosts[vhost]
	if old == nil {
		return s
	}
	i := componentIndex(c)
	idx := slices.IndexFunc(old.byComponent[i], func(p *Compiled) bool { return p.Name == name })
	if idx < 0 {
		return s
	}
	next := slices.Delete(slices.Clone(old.byComponent[i]), idx, idx+1)
	return s.replace(vhost, i, next)
}

// WithoutVHost returns a Set without any policy of vhost (for a deleted vhost).
func (s *Set) WithoutVHost(vhost string) *Set {
	if s.vhosts[vhost] == nil {
		return s
	}
	n := &Set{vhosts: make(map[string]*vhostPolicies, len(s.vhosts))}
	for k, v := range s.vhosts {
		if k != vhost {
			n.vhosts[k] = v
		}
	}
	return n
}

func (s *Set) replace(vhost string, i int, list []*Compiled) *Set {
	n := &Set{vhosts: make(map[string]*vhostPolicies, len(s.vhosts)+1)}
	for k, v := range s.vhosts {
		n.vhosts[k] = v
	}
	vp := &vhostPolicies{}
	if old := s.vhosts[vhost]; old != nil {
		*vp = *old
	}
	vp.byComponent[i] = list
	if len(vp.byComponent[0]) == 0 && len(vp.byComponent[1]) == 0 {
		delete(n.vhosts, vhost)
	} else {
		n.vhosts[vhost] = vp
	}
	return n
}

// Get returns the named policy, or nil.
func (s *Set) Get(c Component, vhost, name string) *Compiled {
	vp := s.vhosts[vhost]
	if vp == nil {
		return nil
	}
	for _, p := range vp.byComponent[componentIndex(c)] {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// List returns a vhost's policies of one component in match order. The slice is shared: do
// not modify it.
func (s *Set) List(c Component, vhost string) []*Compiled {
	vp := s.vhosts[vhost]
	if vp == nil {
		return nil
	}
	return vp.byComponent[componentIndex(c)]
}

// VHosts returns the vhosts that have policies, sorted.
func (s *Set) VHosts() []string {
	out := make([]string, 0, len(s.vhosts))
	for k := range s.vhosts {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Match finds the policy and the operator policy of an object: for each, the first in match
// order that applies to its type and whose pattern matches its name (rabbit_policy:match).
func (s *Set) Match(vhost, name string, t ObjectType) Match {
	vp := s.vhosts[vhost]
	if vp == nil {
		return Match{}
	}
	return Match{Policy: first(vp.byComponent[0], name, t), OperatorPolicy: first(vp.byComponent[1], name, t)}
}

func first(list []*Compiled, name string, t ObjectType) *Compiled {
	for _, p := range list {
		if p.Matches(name, t) {
			return p
		}
	}
	return nil
}

// Object is an existing exchange or queue as Reapply sees it: its name, type and the Match it
// has now.
type Object struct {
	Name    string
	Type    ObjectType
	Current Match
}

// Reapply brings one vhost's objects up to date after the policy of component c named name was
// put or deleted (s is the Set after the change). It walks objects once: only an object whose
// current policy of that component is the changed one, or that the changed policy now matches,
// can change, so the others cost one compiled-pattern test each. For each object whose Match
// differs from its current one, update is called with the new Match.
func (s *Set) Reapply(vhost string, c Component, name string, objects iter.Seq[Object], update func(Object, Match)) {
	changed := s.Get(c, vhost, name)
	i := componentIndex(c)
	for o := range objects {
		cur := o.Current.Policy
		if i == 1 {
			cur = o.Current.OperatorPolicy
		}
		if !(cur != nil && cur.Name == name) && !(changed != nil && changed.Matches(o.Name, o.Type)) {
			continue
		}
		if m := s.Match(vhost, o.Name, o.Type); m != o.Current {
			update(o, m)
		}
	}
}
