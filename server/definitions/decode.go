package definitions

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"warren/exchange"
	"warren/server/policy"
)

// Problem is one reason a document cannot be imported, at a path such as queues[3].durable.
type Problem struct {
	Path   string
	Reason string
}

func (p Problem) String() string {
	if p.Path == "" {
		return p.Reason
	}
	return p.Path + ": " + p.Reason
}

// Error lists every problem Decode or Validate found.
type Error struct {
	Problems []Problem
}

func (e *Error) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = p.String()
	}
	return "invalid definitions: " + strings.Join(parts, "; ")
}

// maxProblems bounds the problems reported for one document: a wrong file should not produce
// a megabyte of errors.
const maxProblems = 100

// Options tune Decode.
type Options struct {
	// VHost, when set, decodes a single-vhost document (POST /api/definitions/{vhost}, or a
	// GET /api/definitions/{vhost} export): every exchange, queue, binding, policy and
	// parameter belongs to VHost whatever its own vhost field says, as RabbitMQ imports it, and
	// users, vhosts, permissions and global parameters are skipped. Without it, an item without
	// a vhost is a problem.
	VHost string
}

// Decode parses a definitions document strictly (see the package doc). An empty document is
// an empty Definitions, as in RabbitMQ; a leading UTF-8 byte order mark is ignored. Errors are
// *Error.
func Decode(data []byte, opts Options) (*Definitions, error) {
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))
	d := &Definitions{}
	if len(bytes.TrimSpace(data)) == 0 {
		return d, nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var top any
	if err := dec.Decode(&top); err != nil {
		return nil, &Error{Problems: []Problem{{Reason: "not JSON: " + jsonError(err, data)}}}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, &Error{Problems: []Problem{{Reason: "not JSON: data after the top-level object"}}}
	}
	r := &reader{opts: opts, d: d}
	m, ok := top.(map[string]any)
	if !ok {
		return nil, &Error{Problems: []Problem{{Reason: "want a JSON object at the top level, got " + kindOf(top)}}}
	}
	r.decode(m)
	if len(r.problems) > 0 {
		return nil, &Error{Problems: r.problems}
	}
	return d, nil
}

func jsonError(err error, data []byte) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		line := 1 + bytes.Count(data[:min(int(se.Offset), len(data))], []byte("\n"))
		return fmt.Sprintf("%v (line %d, byte %d)", se, line, se.Offset)
	}
	return err.Error()
}

type reader struct {
	opts     Options
	d        *Definitions
	problems []Problem
	full     bool

	skippedExchanges [][2]string // vhost, name of exchanges of types Warren lacks
	noVHostSeen      bool        // an item without a vhost was reported
}

func (r *reader) fail(path, format string, args ...any) {
	if len(r.problems) >= maxProblems {
		if !r.full {
			r.problems = append(r.problems, Problem{Reason: fmt.Sprintf("more than %d problems; stopped", maxProblems)})
			r.full = true
		}
		return
	}
	r.problems = append(r.problems, Problem{Path: path, Reason: fmt.Sprintf(format, args...)})
}

func (r *reader) skip(path, what, reason string) {
	r.d.Skipped = append(r.d.Skipped, Skipped{Path: path, What: what, Reason: reason})
}

// kindOf names a JSON value's type for error texts.
func kindOf(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case bool:
		return fmt.Sprintf("the boolean %v", v)
	case json.Number:
		return "the number " + string(v)
	case string:
		if len(v) > 40 {
			v = v[:40] + "..."
		}
		return fmt.Sprintf("the string %q", v)
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

// item is one JSON object being read, with its path.
type item struct {
	r    *reader
	path string
	m    map[string]any
}

func (it item) p(key string) string { return it.path + "." + key }

// str reads a string field; absent is def (or a problem when required).
func (it item) str(key string, required bool, def string) string {
	v, ok := it.m[key]
	if !ok {
		if required {
			it.r.fail(it.p(key), "missing")
		}
		return def
	}
	s, isStr := v.(string)
	if !isStr {
		it.r.fail(it.p(key), "want a string, got %s", kindOf(v))
		return def
	}
	return s
}

func (it item) boolean(key string, def bool) bool {
	v, ok := it.m[key]
	if !ok {
		return def
	}
	b, isBool := v.(bool)
	if !isBool {
		it.r.fail(it.p(key), "want true or false, got %s", kindOf(v))
		return def
	}
	return b
}

// object reads an object field such as arguments: absent, null and [] (RabbitMQ's empty
// proplist) are empty.
func (it item) object(key string) map[string]any {
	v, ok := it.m[key]
	if !ok || v == nil {
		return map[string]any{}
	}
	switch v := v.(type) {
	case map[string]any:
		return v
	case []any:
		if len(v) == 0 {
			return map[string]any{}
		}
	}
	it.r.fail(it.p(key), "want an object, got %s", kindOf(v))
	return map[string]any{}
}

// vhost reads an item's vhost: the Options' in a single-vhost document.
func (it item) vhost() string {
	if it.r.opts.VHost != "" {
		return it.r.opts.VHost
	}
	v, ok := it.m["vhost"]
	if !ok {
		if it.r.noVHostSeen {
			it.r.fail(it.p("vhost"), "missing")
		} else {
			it.r.fail(it.p("vhost"), "missing: a file exported from one virtual host can only be imported into a virtual host")
			it.r.noVHostSeen = true
		}
		return ""
	}
	s, isStr := v.(string)
	if !isStr {
		it.r.fail(it.p("vhost"), "want a string, got %s", kindOf(v))
	}
	return s
}

// tags reads a list of strings or a comma-separated string (older exports); ok is false when
// the field is absent.
func (it item) tags(key string) ([]string, bool) {
	v, present := it.m[key]
	if !present {
		return nil, false
	}
	out := []string{}
	add := func(s string) {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	switch v := v.(type) {
	case nil:
	case string:
		for _, t := range strings.Split(v, ",") {
			add(t)
		}
	case []any:
		for i, e := range v {
			s, ok := e.(string)
			if !ok {
				it.r.fail(fmt.Sprintf("%s[%d]", it.p(key), i), "want a string, got %s", kindOf(e))
				continue
			}
			add(s)
		}
	default:
		it.r.fail(it.p(key), "want a list of strings or a comma-separated string, got %s", kindOf(v))
	}
	return out, true
}

// limits reads an object of integer limits.
func (it item) limits(path string, v any, allowed ...string) map[string]int64 {
	m, ok := v.(map[string]any)
	if !ok {
		if l, isList := v.([]any); v == nil || (isList && len(l) == 0) {
			return nil
		}
		it.r.fail(path, "want an object of limits, got %s", kindOf(v))
		return nil
	}
	out := map[string]int64{}
	for _, k := range sortedKeys(m) {
		if len(allowed) > 0 && !contains(allowed, k) {
			it.r.fail(path+"."+k, "unknown limit (want one of %s)", strings.Join(allowed, ", "))
			continue
		}
		n, isNum := m[k].(json.Number)
		i, err := n.Int64()
		if !isNum || err != nil {
			it.r.fail(path+"."+k, "want an integer, got %s", kindOf(m[k]))
			continue
		}
		out[k] = i
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// topLevel are the document's keys; others are listed as skipped.
var topLevel = map[string]bool{
	"rabbit_version": true, "rabbitmq_version": true, "product_name": true, "product_version": true,
	"rabbitmq_definition_format": true, "original_cluster_name": true, "original_vhost_name": true,
	"explanation": true, "users": true, "vhosts": true, "permissions": true, "topic_permissions": true,
	"parameters": true, "global_parameters": true, "policies": true, "queues": true, "exchanges": true,
	"bindings": true,
	// A 4.x single-vhost export describes its vhost at the top level; informational.
	"metadata": true, "description": true, "limits": true,
}

func (r *reader) decode(m map[string]any) {
	top := item{r: r, path: "", m: m}
	d := r.d
	d.RabbitVersion = top.str("rabbit_version", false, "")
	d.RabbitMQVersion = top.str("rabbitmq_version", false, "")
	d.ProductName = top.str("product_name", false, "")
	d.ProductVersion = top.str("product_version", false, "")
	d.DefinitionFormat = top.str("rabbitmq_definition_format", false, "")
	d.OriginalClusterName = top.str("original_cluster_name", false, "")
	d.OriginalVHostName = top.str("original_vhost_name", false, "")
	d.Explanation = top.str("explanation", false, "")
	for _, k := range sortedKeys(m) {
		if !topLevel[k] {
			r.skip(k, "top-level key "+k, "not part of RabbitMQ's definitions format; ignored")
		}
	}
	single := r.opts.VHost != ""
	r.each(m, "users", single, r.user)
	r.each(m, "vhosts", single, r.vhostItem)
	r.each(m, "permissions", single, r.permission)
	r.each(m, "topic_permissions", single, r.topicPermission)
	r.each(m, "parameters", false, r.parameter)
	r.each(m, "global_parameters", single, r.globalParameter)
	r.each(m, "policies", false, r.policyItem)
	r.each(m, "exchanges", false, r.exchangeItem)
	r.each(m, "queues", false, r.queue)
	r.each(m, "bindings", false, r.binding)
	r.vhostLimitsFromVHosts(m)
	r.skipBindingsOfSkippedExchanges()
}

// each decodes one list of items; in a single-vhost document the cluster-wide lists are
// skipped whole.
func (r *reader) each(m map[string]any, key string, skipAll bool, fn func(item)) {
	v, ok := m[key]
	if !ok || v == nil {
		return
	}
	list, isList := v.([]any)
	if !isList {
		r.fail(key, "want a list, got %s", kindOf(v))
		return
	}
	if skipAll {
		if len(list) > 0 {
			r.skip(key, fmt.Sprintf("%d %s", len(list), key), "not imported into a single virtual host")
		}
		return
	}
	for i, e := range list {
		path := fmt.Sprintf("%s[%d]", key, i)
		obj, isObj := e.(map[string]any)
		if !isObj {
			r.fail(path, "want an object, got %s", kindOf(e))
			continue
		}
		fn(item{r: r, path: path, m: obj})
	}
}

func (r *reader) user(it item) {
	u := User{Name: it.str("name", true, "")}
	u.PasswordHash = it.str("password_hash", false, "")
	_, hasHash := it.m["password_hash"]
	if _, ok := it.m["password"]; ok {
		u.Password, u.HasPassword = it.str("password", false, ""), true
		if hasHash {
			r.fail(it.path, "both password and password_hash are given")
		}
	}
	if u.PasswordHash != "" {
		if _, err := base64.StdEncoding.DecodeString(u.PasswordHash); err != nil {
			r.fail(it.p("password_hash"), "not base64: %v", err)
		}
	}
	u.HashingAlgorithm = it.str("hashing_algorithm", false, "")
	switch u.HashingAlgorithm {
	case "", HashSHA256, HashSHA512, HashMD5:
	default:
		r.fail(it.p("hashing_algorithm"), "unknown hashing algorithm %q (want %s, %s or %s)", u.HashingAlgorithm, HashSHA256, HashSHA512, HashMD5)
	}
	tags, ok := it.tags("tags")
	if !ok {
		// Files of RabbitMQ 2.x say "administrator": true instead of tags.
		switch v := it.m["administrator"].(type) {
		case bool:
			ok, tags = true, nil
			if v {
				tags = []string{"administrator"}
			}
		case string:
			ok, tags = true, nil
			if v == "true" {
				tags = []string{"administrator"}
			}
		}
		if !ok {
			r.fail(it.p("tags"), "missing")
		}
	}
	if tags == nil {
		tags = []string{}
	}
	u.Tags = tags
	if v, ok := it.m["limits"]; ok {
		u.Limits = it.limits(it.p("limits"), v, "max-connections", "max-channels")
	}
	r.d.Users = append(r.d.Users, u)
}

func (r *reader) vhostItem(it item) {
	v := VHost{Name: it.str("name", true, "")}
	meta := it.object("metadata")
	mi := item{r: r, path: it.p("metadata"), m: meta}
	v.Description = it.str("description", false, mi.str("description", false, ""))
	tags, ok := it.tags("tags")
	if !ok {
		tags, _ = mi.tags("tags")
	}
	if tags == nil {
		tags = []string{}
	}
	v.Tags = tags
	v.DefaultQueueType = it.str("default_queue_type", false, mi.str("default_queue_type", false, ""))
	if _, ok := it.m["default_queue_type"]; ok || meta["default_queue_type"] != nil {
		switch v.DefaultQueueType {
		case "classic", "quorum", "stream":
		case "":
			r.fail(it.p("default_queue_type"), "default_queue_type must not be an empty string")
		default:
			r.fail(it.p("default_queue_type"), "%s is not a valid queue type", v.DefaultQueueType)
		}
	}
	if len(meta) > 0 {
		v.Metadata = meta
	}
	r.d.VHosts = append(r.d.VHosts, v)
}

// vhostLimitsFromVHosts takes a 4.x vhost's "limits" when no vhost-limits parameter gives them.
func (r *reader) vhostLimitsFromVHosts(m map[string]any) {
	list, _ := m["vhosts"].([]any)
	if r.opts.VHost != "" {
		return
	}
	for i, e := range list {
		obj, _ := e.(map[string]any)
		name, _ := obj["name"].(string)
		lv, ok := obj["limits"]
		if !ok || name == "" {
			continue
		}
		it := item{r: r, path: fmt.Sprintf("vhosts[%d]", i), m: obj}
		limits := it.limits(it.p("limits"), lv, "max-connections", "max-queues")
		if len(limits) == 0 {
			continue
		}
		if !containsFunc(r.d.VHostLimits, func(l VHostLimits) bool { return l.VHost == name }) {
			r.d.VHostLimits = append(r.d.VHostLimits, VHostLimits{VHost: name, Limits: limits, src: it.path})
		}
	}
}

func containsFunc[T any](list []T, f func(T) bool) bool {
	for _, e := range list {
		if f(e) {
			return true
		}
	}
	return false
}

func (r *reader) permission(it item) {
	p := Permission{User: it.str("user", true, ""), VHost: it.vhost(), src: it.path}
	p.Configure = r.pattern(it, "configure")
	p.Write = r.pattern(it, "write")
	p.Read = r.pattern(it, "read")
	r.d.Permissions = append(r.d.Permissions, p)
}

func (r *reader) topicPermission(it item) {
	p := TopicPermission{User: it.str("user", true, ""), VHost: it.vhost(), Exchange: it.str("exchange", true, ""), src: it.path}
	p.Write = r.pattern(it, "write")
	p.Read = r.pattern(it, "read")
	r.d.TopicPermissions = append(r.d.TopicPermissions, p)
}

// pattern reads a permission pattern and checks that it compiles, as RabbitMQ does when it
// sets permissions.
func (r *reader) pattern(it item, key string) string {
	s := it.str(key, true, "")
	if _, err := policy.CompilePattern(s); err != nil {
		r.fail(it.p(key), "%q is not a valid regular expression: %v", s, err)
	}
	return s
}

// The runtime-parameter components Warren imports; others are kept and listed as skipped.
const (
	componentOperatorPolicy = "operator_policy"
	componentVHostLimits    = "vhost-limits"
)

func (r *reader) parameter(it item) {
	vhost := it.vhost()
	comp := it.str("component", true, "")
	name := it.str("name", true, "")
	val, hasValue := it.m["value"]
	if !hasValue {
		r.fail(it.p("value"), "missing")
		return
	}
	switch comp {
	case componentOperatorPolicy:
		obj, ok := val.(map[string]any)
		if !ok {
			r.fail(it.p("value"), "want an object, got %s", kindOf(val))
			return
		}
		r.compilePolicy(it.path, it.p("value"), policy.ComponentOperatorPolicy, vhost, name, obj, &r.d.OperatorPolicies, &r.d.operatorPolicyPaths)
	case componentVHostLimits:
		limits := it.limits(it.p("value"), val, "max-connections", "max-queues")
		r.d.VHostLimits = append(r.d.VHostLimits, VHostLimits{VHost: vhost, Limits: limits, src: it.path})
	default:
		raw, err := json.Marshal(val)
		if err != nil {
			r.fail(it.p("value"), "%v", err)
			return
		}
		r.d.Parameters = append(r.d.Parameters, Parameter{VHost: vhost, Component: comp, Name: name, Value: raw, src: it.path})
		r.skip(it.path, fmt.Sprintf("%s parameter '%s' in vhost '%s'", comp, name, vhost), skipReason(comp))
	}
}

func skipReason(component string) string {
	switch component {
	case "federation-upstream", "federation-upstream-set":
		return "Warren has no federation"
	case "shovel":
		return "Warren has no shovels"
	}
	return "Warren has no runtime parameters of this component"
}

func (r *reader) globalParameter(it item) {
	name := it.str("name", true, "")
	val, ok := it.m["value"]
	if !ok {
		r.fail(it.p("value"), "missing")
		return
	}
	raw, err := json.Marshal(val)
	if err != nil {
		r.fail(it.p("value"), "%v", err)
		return
	}
	r.d.GlobalParameters = append(r.d.GlobalParameters, GlobalParameter{Name: name, Value: raw})
	if name != "cluster_name" {
		r.skip(it.path, "global parameter '"+name+"'", "Warren has no use for it")
	}
}

func (r *reader) policyItem(it item) {
	vhost := it.vhost()
	name := it.str("name", true, "")
	r.compilePolicy(it.path, it.path, policy.ComponentPolicy, vhost, name, it.m, &r.d.Policies, &r.d.policyPaths)
}

// compilePolicy validates a policy or operator policy as the management API would and lists
// its ignored keys as skipped.
func (r *reader) compilePolicy(src, path string, c policy.Component, vhost, name string, fields map[string]any, dst *[]policy.Policy, paths *[]string) {
	if _, ok := fields["pattern"]; !ok {
		r.fail(path+".pattern", "missing")
		return
	}
	if _, ok := fields["definition"]; !ok {
		r.fail(path+".definition", "missing")
		return
	}
	p, err := policy.FromFields(vhost, name, fields)
	if err == nil {
		var cp *policy.Compiled
		if cp, err = policy.Compile(c, p); err == nil {
			*dst = append(*dst, cp.Policy)
			*paths = append(*paths, src)
			for _, k := range cp.Ignored {
				r.skip(path+".definition."+k, fmt.Sprintf("key %s of %s '%s' in vhost '%s'", k, c, name, vhost),
					"kept, but Warren does not act on it")
			}
			return
		}
	}
	var pe *policy.Error
	if errors.As(err, &pe) {
		field := pe.Field
		if field != "pattern" && field != "priority" && field != "apply-to" && field != "definition" {
			field = "definition." + field
		}
		r.fail(path+"."+field, "%s", pe.Reason)
		return
	}
	r.fail(path, "%v", err)
}

func (r *reader) queue(it item) {
	q := Queue{Name: it.str("name", true, ""), VHost: it.vhost(), src: it.path}
	q.Durable = it.boolean("durable", true)
	q.AutoDelete = it.boolean("auto_delete", false)
	q.Arguments = it.object("arguments")
	argType, hasArgType := q.Arguments["x-queue-type"]
	if hasArgType {
		s, ok := argType.(string)
		if !ok {
			r.fail(it.p("arguments.x-queue-type"), "want a string, got %s", kindOf(argType))
		}
		q.Type = s
	}
	if t := it.str("type", false, ""); t != "" {
		if hasArgType && t != q.Type {
			r.fail(it.p("type"), "%q disagrees with arguments.x-queue-type %q", t, q.Type)
		}
		q.Type = t
	}
	if q.Type == "" {
		q.Type = "classic"
	}
	switch q.Type {
	case "classic":
	case "quorum", "stream":
		if !q.Durable {
			r.fail(it.p("durable"), "invalid property 'non-durable' for queue '%s' in vhost '%s'", q.Name, q.VHost)
		}
		if q.AutoDelete {
			r.fail(it.p("auto_delete"), "invalid property 'auto-delete' for queue '%s' in vhost '%s'", q.Name, q.VHost)
		}
	default:
		r.fail(it.p("type"), "unknown queue type %q (want classic, quorum or stream)", q.Type)
	}
	if strings.HasPrefix(q.Name, "amq.") {
		r.skip(it.path, fmt.Sprintf("queue '%s' in vhost '%s'", q.Name, q.VHost), "names beginning with amq. are reserved; RabbitMQ skips them too")
		return
	}
	r.d.Queues = append(r.d.Queues, q)
}

func (r *reader) exchangeItem(it item) {
	x := Exchange{Name: it.str("name", true, ""), VHost: it.vhost(), Type: it.str("type", true, ""), src: it.path}
	x.Durable = it.boolean("durable", true)
	x.AutoDelete = it.boolean("auto_delete", false)
	x.Internal = it.boolean("internal", false)
	x.Arguments = it.object("arguments")
	what := fmt.Sprintf("exchange '%s' in vhost '%s'", x.Name, x.VHost)
	switch {
	case x.Name == "":
		r.skip(it.path, "the default exchange in vhost '"+x.VHost+"'", "it always exists")
		return
	case strings.HasPrefix(x.Name, "amq."):
		r.skip(it.path, what, "names beginning with amq. are reserved; RabbitMQ skips them too")
		return
	}
	if _, present := it.m["type"]; present && x.Type == "" {
		r.fail(it.p("type"), "want an exchange type, got an empty string")
	}
	if _, ok := exchange.ParseKind(x.Type); !ok && x.Type != "" {
		r.skip(it.path, what+" of type "+x.Type, "Warren has no exchange type "+x.Type+"; its bindings are skipped too")
		r.skippedExchanges = append(r.skippedExchanges, [2]string{x.VHost, x.Name})
		return
	}
	r.d.Exchanges = append(r.d.Exchanges, x)
}

func (r *reader) binding(it item) {
	b := Binding{VHost: it.vhost(), Source: it.str("source", true, ""), Destination: it.str("destination", true, ""), src: it.path}
	b.DestinationType = it.str("destination_type", true, "")
	switch b.DestinationType {
	case "queue", "exchange", "":
	default:
		r.fail(it.p("destination_type"), "want queue or exchange, got %q", b.DestinationType)
	}
	b.RoutingKey = it.str("routing_key", false, "")
	b.Arguments = it.object("arguments")
	if b.Source == "" {
		r.skip(it.path, fmt.Sprintf("binding of the default exchange to '%s' in vhost '%s'", b.Destination, b.VHost),
			"bindings of the default exchange are implicit")
		return
	}
	r.d.Bindings = append(r.d.Bindings, b)
}

// skipBindingsOfSkippedExchanges drops the bindings from or to an exchange that was skipped
// for its type.
func (r *reader) skipBindingsOfSkippedExchanges() {
	if len(r.skippedExchanges) == 0 {
		return
	}
	skipped := func(vhost, name string) bool {
		return containsFunc(r.skippedExchanges, func(x [2]string) bool { return x == [2]string{vhost, name} })
	}
	kept := r.d.Bindings[:0]
	for _, b := range r.d.Bindings {
		if skipped(b.VHost, b.Source) || (b.DestinationType == "exchange" && skipped(b.VHost, b.Destination)) {
			r.skip(b.src, fmt.Sprintf("binding of '%s' to %s '%s' in vhost '%s'", b.Source, b.DestinationType, b.Destination, b.VHost),
				"its exchange was skipped")
			continue
		}
		kept = append(kept, b)
	}
	r.d.Bindings = kept
}
