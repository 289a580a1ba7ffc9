package exchange

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"warren/amqp"
)

// Registry holds one virtual host's exchanges and bindings. It is safe for
// concurrent use: mutations take a write lock, Route a read lock.
type Registry struct {
	vhost string

	mu        sync.RWMutex
	exchanges map[string]*Exchange
	// incoming maps each binding destination to the exchanges with bindings
	// to it, with the number of such bindings.
	incoming map[destRef]map[*Exchange]int
	// partition picks a super stream's partition for a routing key (set once, before use).
	partition func(key string, n int) int
}

// SetPartitioner sets how a super stream picks the partition of a routing key among n (the
// broker passes stream/partition.Index, the hash RabbitMQ's stream clients use). Without one,
// super streams route nothing. Call it before the registry is used.
func (r *Registry) SetPartitioner(f func(key string, n int) int) {
	r.mu.Lock()
	r.partition = f
	r.mu.Unlock()
}

// aeArg is the exchange argument naming an alternate exchange.
const aeArg = "alternate-exchange"

// NewRegistry creates a vhost's exchanges with the defaults RabbitMQ
// declares: "" (the default exchange, direct), amq.direct, amq.fanout,
// amq.topic, amq.headers and amq.match (headers), all durable.
func NewRegistry(vhost string) *Registry {
	r := &Registry{
		vhost:     vhost,
		exchanges: make(map[string]*Exchange),
		incoming:  make(map[destRef]map[*Exchange]int),
	}
	for _, d := range []struct {
		name string
		kind Kind
	}{
		{"", Direct},
		{"amq.direct", Direct},
		{"amq.fanout", Fanout},
		{"amq.topic", Topic},
		{"amq.headers", Headers},
		{"amq.match", Headers},
	} {
		r.exchanges[d.name] = newExchange(d.name, d.kind, true, false, false, nil)
	}
	return r
}

func newExchange(name string, kind Kind, durable, autoDelete, internal bool, args amqp.Table) *Exchange {
	x := &Exchange{
		Name: name, Kind: kind, Durable: durable, AutoDelete: autoDelete, Internal: internal,
		Args: maps.Clone(args),
		out:  make(map[destRef][]*binding),
	}
	if ae, ok := binaryValue(args[aeArg]); ok {
		x.alternate = ae
	}
	switch kind {
	case Direct:
		x.direct = make(map[string]*destSet)
	case Topic:
		x.topic = newTopicTrie()
	}
	return x
}

// Vhost returns the name of the virtual host the registry belongs to.
func (r *Registry) Vhost() string { return r.vhost }

func (r *Registry) errDefaultExchange() *amqp.Error {
	return amqp.Errorf(amqp.AccessRefused, "operation not permitted on the default exchange")
}

func (r *Registry) errNoExchange(name string) *amqp.Error {
	return amqp.Errorf(amqp.NotFound, "no exchange '%s' in vhost '%s'", name, r.vhost)
}

// Declare creates or checks an exchange, as exchange.declare does in
// RabbitMQ (CR and LF are dropped from the name), in RabbitMQ's order of
// checks:
//   - passive: "" is 403, a missing exchange 404, anything else succeeds
//     without further checks (kind and flags are ignored);
//   - an unknown kind is a 503 connection error, even for "" and existing
//     exchanges;
//   - "" is 403;
//   - an existing exchange (amq.* ones included) must be equivalent: same
//     kind, durable, auto_delete, internal and alternate-exchange argument,
//     else 406 "inequivalent arg ...";
//   - a new name starting with "amq." is 403;
//   - a new exchange's alternate-exchange argument must be a longstr (406).
//
// created reports whether the exchange was newly created; ex is nil on error.
func (r *Registry) Declare(name, kind string, durable, autoDelete, internal, passive bool, args amqp.Table) (ex *Exchange, created bool, err *amqp.Error) {
	return r.declare(name, kind, durable, autoDelete, internal, passive, args, true)
}

// Check runs Declare's checks without creating anything: for a missing exchange it reports
// (nil, nil) when Declare would create it. The broker core checks a durable declaration this way
// on the node that received it before it replicates the declaration.
func (r *Registry) Check(name, kind string, durable, autoDelete, internal, passive bool, args amqp.Table) (*Exchange, *amqp.Error) {
	x, _, err := r.declare(name, kind, durable, autoDelete, internal, passive, args, false)
	return x, err
}

func (r *Registry) declare(name, kind string, durable, autoDelete, internal, passive bool, args amqp.Table, create bool) (ex *Exchange, created bool, err *amqp.Error) {
	name = stripCRLF(name)
	if passive {
		if name == "" {
			return nil, false, r.errDefaultExchange()
		}
		r.mu.RLock()
		x := r.exchanges[name]
		r.mu.RUnlock()
		if x == nil {
			return nil, false, r.errNoExchange(name)
		}
		return x, false, nil
	}
	k, ok := ParseKind(kind)
	if !ok {
		// RabbitMQ says "invalid exchange type" instead when the name happens
		// to be an atom its VM already knows ("foo", "true", ""); "unknown" is
		// its answer for everything else.
		return nil, false, amqp.Errorf(amqp.CommandInvalid, "unknown exchange type '%s'", kind)
	}
	if name == "" {
		return nil, false, r.errDefaultExchange()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if x := r.exchanges[name]; x != nil {
		if err := r.checkEquivalent(x, k, durable, autoDelete, internal, args); err != nil {
			return nil, false, err
		}
		return x, false, nil
	}
	if strings.HasPrefix(name, "amq.") {
		return nil, false, amqp.Errorf(amqp.AccessRefused, "exchange name '%s' contains reserved prefix 'amq.*'", name)
	}
	if v, ok := args[aeArg]; ok {
		if _, isStr := v.(string); !isStr {
			return nil, false, amqp.Errorf(amqp.PreconditionFailed, "invalid type '%s' for arg '%s' in exchange '%s' in vhost '%s'",
				amqp.TypeName(v), aeArg, name, r.vhost)
		}
	}
	if !create {
		return nil, false, nil
	}
	x := newExchange(name, k, durable, autoDelete, internal, args)
	r.exchanges[name] = x
	return x, true, nil
}

// checkEquivalent compares a redeclaration with the existing exchange the
// way RabbitMQ does: type, durable, auto_delete, internal, then the
// alternate-exchange argument (the only argument that matters).
func (r *Registry) checkEquivalent(x *Exchange, k Kind, durable, autoDelete, internal bool, args amqp.Table) *amqp.Error {
	field := func(arg, received, current string) *amqp.Error {
		return amqp.Errorf(amqp.PreconditionFailed, "inequivalent arg '%s' for exchange '%s' in vhost '%s': received %s but current is %s",
			arg, x.Name, r.vhost, received, current)
	}
	quote := func(v any) string { return "'" + fmt.Sprint(v) + "'" }
	switch {
	case k != x.Kind:
		return field("type", quote(k), quote(x.Kind))
	case durable != x.Durable:
		return field("durable", quote(durable), quote(x.Durable))
	case autoDelete != x.AutoDelete:
		return field("auto_delete", quote(autoDelete), quote(x.AutoDelete))
	case internal != x.Internal:
		return field("internal", quote(internal), quote(x.Internal))
	}
	cur, hasCur := x.Args[aeArg]
	req, hasReq := args[aeArg]
	switch {
	case !hasCur && !hasReq:
		return nil
	case hasCur && hasReq:
		if argEquivalent(cur, req) {
			return nil
		}
		return field(aeArg, "'"+erlValue(req)+"'", "'"+erlValue(cur)+"'")
	}
	return field(aeArg, describeArg(req, hasReq), describeArg(cur, hasCur))
}

// argEquivalent is RabbitMQ's equality of an x-argument on redeclaration:
// values of the same type class (integers, floats) compare by value; other
// values must be the same term (a longstr and a binary with the same bytes
// are).
func argEquivalent(a, b any) bool {
	switch a.(type) {
	case amqp.Table, map[string]any, []any, []string, []amqp.Table:
		return identical(a, b)
	}
	return amqp.ValuesEqual(a, b)
}

// erlValue renders an argument value as RabbitMQ's "~s" (binaries) or "~p"
// (anything else).
func erlValue(v any) string {
	if s, ok := binaryValue(v); ok {
		return s
	}
	return erlTerm(v)
}

func describeArg(v any, present bool) string {
	if !present {
		return "none"
	}
	return "the value '" + erlValue(v) + "' of type '" + amqp.TypeName(v) + "'"
}

// SetPolicyAlternate sets the alternate exchange a policy gives the named exchange ("" for
// none); the exchange's own alternate-exchange argument still wins. It reports whether the
// exchange exists.
func (r *Registry) SetPolicyAlternate(name, alternate string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	x := r.exchanges[name]
	if x == nil {
		return false
	}
	x.policyAlternate = alternate
	return true
}

// alternateExchange is the exchange's alternate: its argument, else its policy's (the
// Registry's lock held).
func (x *Exchange) alternateExchange() string {
	if x.alternate != "" {
		return x.alternate
	}
	return x.policyAlternate
}

// Get returns the named exchange; "" is the default exchange.
func (r *Registry) Get(name string) (*Exchange, bool) {
	r.mu.RLock()
	x := r.exchanges[name]
	r.mu.RUnlock()
	return x, x != nil
}

// Delete deletes an exchange (CR and LF are dropped from the name) and
// every binding where it is the source or the destination. Deleting "" or
// any amq.* name is 403 (even a missing one); a missing exchange is not an
// error; with ifUnused, an exchange that is the source of a binding is 406
// (being a destination does not count). Auto-delete sources that lose their
// last binding through the deletion are deleted too.
func (r *Registry) Delete(name string, ifUnused bool) *amqp.Error {
	_, err := r.DeleteReport(name, ifUnused)
	return err
}

// Removed lists what one registry change removed, cascades included: the broker core deletes
// the stored records of the durable ones.
type Removed struct {
	Exchanges []*Exchange
	Bindings  []Binding
}

// DeleteReport is Delete reporting what it removed.
func (r *Registry) DeleteReport(name string, ifUnused bool) (Removed, *amqp.Error) {
	var rm Removed
	name = stripCRLF(name)
	if name == "" {
		return rm, r.errDefaultExchange()
	}
	if strings.HasPrefix(name, "amq.") {
		return rm, amqp.Errorf(amqp.AccessRefused, "deletion of system exchange '%s' in vhost '%s' not allowed", name, r.vhost)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	x := r.exchanges[name]
	if x == nil {
		return rm, nil
	}
	if ifUnused && x.nOut > 0 {
		return rm, amqp.Errorf(amqp.PreconditionFailed, "exchange '%s' in vhost '%s' in use", name, r.vhost)
	}
	r.deleteLocked(x, &rm)
	return rm, nil
}

// deleteLocked removes x, its bindings and the bindings to it, then
// auto-deletes sources left without bindings (recursively).
func (r *Registry) deleteLocked(x *Exchange, rm *Removed) {
	delete(r.exchanges, x.Name)
	rm.Exchanges = append(rm.Exchanges, x)
	for _, bs := range x.out {
		for _, b := range bs {
			r.dropIncoming(x, b.dest)
			rm.Bindings = append(rm.Bindings, b.public(x.Name))
		}
	}
	x.out, x.nOut = map[destRef][]*binding{}, 0
	x.direct, x.fanout, x.headers = map[string]*destSet{}, destSet{}, nil
	if x.topic != nil {
		x.topic = newTopicTrie()
	}
	r.removeAllTo(destRef{ToExchange, x.Name}, rm)
}

// removeAllTo removes every binding to dest, then applies auto-delete to
// the sources that lost bindings.
func (r *Registry) removeAllTo(dest destRef, rm *Removed) {
	srcs := r.incoming[dest]
	if len(srcs) == 0 {
		return
	}
	delete(r.incoming, dest)
	sources := slices.SortedFunc(maps.Keys(srcs), func(a, b *Exchange) int { return cmp.Compare(a.Name, b.Name) })
	for _, src := range sources {
		for _, b := range src.out[dest] {
			src.removeIndex(b)
			src.nOut--
			rm.Bindings = append(rm.Bindings, b.public(src.Name))
		}
		delete(src.out, dest)
	}
	for _, src := range sources {
		r.maybeAutoDelete(src, rm)
	}
}

func (r *Registry) maybeAutoDelete(x *Exchange, rm *Removed) {
	if x.AutoDelete && x.nOut == 0 && r.exchanges[x.Name] == x {
		r.deleteLocked(x, rm)
	}
}

func (r *Registry) dropIncoming(src *Exchange, dest destRef) {
	m := r.incoming[dest]
	if m[src]--; m[src] <= 0 {
		delete(m, src)
		if len(m) == 0 {
			delete(r.incoming, dest)
		}
	}
}

// stripCRLF removes carriage returns and line feeds from a name, as
// RabbitMQ does with the names in exchange.declare/delete/bind/unbind and
// queue.bind/unbind (but not in basic.publish).
func stripCRLF(name string) string {
	if !strings.ContainsAny(name, "\r\n") {
		return name
	}
	b := make([]byte, 0, len(name))
	for i := 0; i < len(name); i++ {
		if c := name[i]; c != '\r' && c != '\n' {
			b = append(b, c)
		}
	}
	return string(b)
}

// checkBindingEnds strips the names of b and applies the checks shared by
// Bind and Unbind.
func (r *Registry) checkBindingEnds(b *Binding) *amqp.Error {
	b.Source, b.Dest = stripCRLF(b.Source), stripCRLF(b.Dest)
	if b.DestKind != ToQueue && b.DestKind != ToExchange {
		return amqp.Errorf(amqp.InternalError, "invalid binding destination kind %d", b.DestKind)
	}
	if b.Source == "" || (b.DestKind == ToExchange && b.Dest == "") {
		return r.errDefaultExchange()
	}
	return nil
}

// Bind adds a binding (CR and LF are dropped from the source and
// destination names); binding again with the same source, destination, key
// and arguments is a no-op. The source must exist (404) and be neither
// "" nor, for exchange destinations, may the destination be "" (403);
// an exchange destination must exist (404, the source is checked first).
// Queue existence is checked by the caller. Bindings from a headers exchange
// must have a valid x-match (406).
func (r *Registry) Bind(b Binding) *amqp.Error {
	if err := r.checkBindingEnds(&b); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	src := r.exchanges[b.Source]
	if src == nil {
		return r.errNoExchange(b.Source)
	}
	var destX *Exchange
	if b.DestKind == ToExchange {
		if destX = r.exchanges[b.Dest]; destX == nil {
			return r.errNoExchange(b.Dest)
		}
	}
	if src.Kind == Headers {
		if err := checkXMatch(b.Args); err != nil {
			return err
		}
	}
	dest := destRef{b.DestKind, b.Dest}
	if src.find(dest, b.Key, b.Args) != nil {
		return nil
	}
	nb := &binding{dest: dest, destX: destX, key: b.Key, args: maps.Clone(b.Args)}
	if src.Kind == Headers {
		nb.match = compileHeadersMatch(nb.args)
	}
	src.out[dest] = append(src.out[dest], nb)
	src.nOut++
	src.addIndex(nb)
	m := r.incoming[dest]
	if m == nil {
		m = make(map[*Exchange]int)
		r.incoming[dest] = m
	}
	m[src]++
	return nil
}

func (x *Exchange) find(dest destRef, key string, args amqp.Table) *binding {
	for _, b := range x.out[dest] {
		if b.key == key && identicalTables(b.args, args) {
			return b
		}
	}
	return nil
}

// Unbind removes a binding. "" as source or exchange destination is 403;
// as in RabbitMQ, a missing source, destination or binding is not an error.
// An auto-delete source that loses its last binding is deleted.
func (r *Registry) Unbind(b Binding) *amqp.Error {
	_, err := r.UnbindReport(b)
	return err
}

// UnbindReport is Unbind reporting what it removed (the binding, and an auto-deleted source).
func (r *Registry) UnbindReport(b Binding) (Removed, *amqp.Error) {
	var rm Removed
	if err := r.checkBindingEnds(&b); err != nil {
		return rm, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	src := r.exchanges[b.Source]
	if src == nil {
		return rm, nil
	}
	dest := destRef{b.DestKind, b.Dest}
	old := src.find(dest, b.Key, b.Args)
	if old == nil {
		return rm, nil
	}
	rm.Bindings = append(rm.Bindings, old.public(src.Name))
	bs := src.out[dest]
	if i := slices.Index(bs, old); i >= 0 {
		bs = removeAt(bs, i)
	}
	if len(bs) == 0 {
		delete(src.out, dest)
	} else {
		src.out[dest] = bs
	}
	src.nOut--
	src.removeIndex(old)
	r.dropIncoming(src, dest)
	r.maybeAutoDelete(src, &rm)
	return rm, nil
}

// CheckBinding runs Bind's checks (bind) or Unbind's (!bind) without changing anything. The broker
// core checks a replicated binding this way before it proposes it.
func (r *Registry) CheckBinding(b Binding, bind bool) *amqp.Error {
	if err := r.checkBindingEnds(&b); err != nil || !bind {
		return err
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	src := r.exchanges[b.Source]
	if src == nil {
		return r.errNoExchange(b.Source)
	}
	if b.DestKind == ToExchange && r.exchanges[b.Dest] == nil {
		return r.errNoExchange(b.Dest)
	}
	if src.Kind == Headers {
		return checkXMatch(b.Args)
	}
	return nil
}

// InUse reports whether the named exchange is the source of a binding (exchange.delete
// if-unused).
func (r *Registry) InUse(name string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	x := r.exchanges[name]
	return x != nil && x.nOut > 0
}

// RemoveQueue drops every binding to the queue (called when the queue is
// deleted). Auto-delete exchanges left without bindings are deleted.
func (r *Registry) RemoveQueue(queue string) Removed {
	var rm Removed
	r.mu.Lock()
	defer r.mu.Unlock()
	r.removeAllTo(destRef{ToQueue, queue}, &rm)
	return rm
}

// Bindings lists every binding, sorted by source, destination kind,
// destination, key and arguments. The returned Args must not be modified.
func (r *Registry) Bindings() []Binding {
	r.mu.RLock()
	var out []Binding
	for _, x := range r.exchanges {
		for _, bs := range x.out {
			for _, b := range bs {
				out = append(out, b.public(x.Name))
			}
		}
	}
	r.mu.RUnlock()
	slices.SortFunc(out, func(a, b Binding) int {
		return cmp.Or(
			cmp.Compare(a.Source, b.Source),
			cmp.Compare(a.DestKind, b.DestKind),
			cmp.Compare(a.Dest, b.Dest),
			cmp.Compare(a.Key, b.Key),
			cmp.Compare(fmt.Sprint(a.Args), fmt.Sprint(b.Args)),
		)
	})
	return out
}

// Exchanges lists every exchange, the default exchange "" included, sorted by
// name.
func (r *Registry) Exchanges() []*Exchange {
	r.mu.RLock()
	out := slices.Collect(maps.Values(r.exchanges))
	r.mu.RUnlock()
	slices.SortFunc(out, func(a, b *Exchange) int { return cmp.Compare(a.Name, b.Name) })
	return out
}
