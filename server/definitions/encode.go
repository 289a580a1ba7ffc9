package definitions

import (
	"encoding/json"
	"fmt"
	"time"

	"warren/amqp"
	"warren/server/policy"
)

// The document as RabbitMQ writes it, keys in its order. Lists are never null.
type exportDoc struct {
	RabbitVersion       string `json:"rabbit_version,omitempty"`
	RabbitMQVersion     string `json:"rabbitmq_version,omitempty"`
	ProductName         string `json:"product_name,omitempty"`
	ProductVersion      string `json:"product_version,omitempty"`
	DefinitionFormat    string `json:"rabbitmq_definition_format,omitempty"`
	OriginalClusterName string `json:"original_cluster_name,omitempty"`
	OriginalVHostName   string `json:"original_vhost_name,omitempty"`
	Explanation         string `json:"explanation,omitempty"`

	Users            []exportUser            `json:"users"`
	VHosts           []exportVHost           `json:"vhosts"`
	Permissions      []exportPermission      `json:"permissions"`
	TopicPermissions []exportTopicPermission `json:"topic_permissions"`
	Parameters       []exportParameter       `json:"parameters"`
	GlobalParameters []exportGlobalParameter `json:"global_parameters"`
	Policies         []exportPolicy          `json:"policies"`
	Queues           []exportQueue           `json:"queues"`
	Exchanges        []exportExchange        `json:"exchanges"`
	Bindings         []exportBinding         `json:"bindings"`
}

type exportUser struct {
	Name             string           `json:"name"`
	PasswordHash     string           `json:"password_hash"`
	HashingAlgorithm string           `json:"hashing_algorithm"`
	Tags             []string         `json:"tags"`
	Limits           map[string]int64 `json:"limits"`
}

type exportVHost struct {
	Name        string         `json:"name"`
	Description string         `json:"description"`
	Tags        []string       `json:"tags"`
	Metadata    map[string]any `json:"metadata"`
}

type exportPermission struct {
	User      string `json:"user"`
	VHost     string `json:"vhost"`
	Configure string `json:"configure"`
	Write     string `json:"write"`
	Read      string `json:"read"`
}

type exportTopicPermission struct {
	User     string `json:"user"`
	VHost    string `json:"vhost"`
	Exchange string `json:"exchange"`
	Write    string `json:"write"`
	Read     string `json:"read"`
}

type exportParameter struct {
	Value     any    `json:"value"`
	VHost     string `json:"vhost"`
	Component string `json:"component"`
	Name      string `json:"name"`
}

type exportGlobalParameter struct {
	Name  string          `json:"name"`
	Value json.RawMessage `json:"value"`
}

type exportPolicyValue struct {
	Pattern    string            `json:"pattern"`
	Definition policy.Definition `json:"definition"`
	Priority   float64           `json:"priority"`
	ApplyTo    policy.ApplyTo    `json:"apply-to"`
}

type exportPolicy struct {
	VHost      string            `json:"vhost"`
	Name       string            `json:"name"`
	Pattern    string            `json:"pattern"`
	ApplyTo    policy.ApplyTo    `json:"apply-to"`
	Definition policy.Definition `json:"definition"`
	Priority   float64           `json:"priority"`
}

type exportQueue struct {
	Name       string         `json:"name"`
	VHost      string         `json:"vhost"`
	Type       string         `json:"type"`
	Durable    bool           `json:"durable"`
	AutoDelete bool           `json:"auto_delete"`
	Arguments  map[string]any `json:"arguments"`
}

type exportExchange struct {
	Name       string         `json:"name"`
	VHost      string         `json:"vhost"`
	Type       string         `json:"type"`
	Durable    bool           `json:"durable"`
	AutoDelete bool           `json:"auto_delete"`
	Internal   bool           `json:"internal"`
	Arguments  map[string]any `json:"arguments"`
}

type exportBinding struct {
	Source          string         `json:"source"`
	VHost           string         `json:"vhost"`
	Destination     string         `json:"destination"`
	DestinationType string         `json:"destination_type"`
	RoutingKey      string         `json:"routing_key"`
	Arguments       map[string]any `json:"arguments"`
}

// Encode writes d as RabbitMQ's definitions JSON, in the shape RabbitMQ 3.10 and 4.x export and
// import: operator policies and vhost limits go back into "parameters", users carry their hash
// and algorithm (never a clear-text password), vhosts their metadata, and a quorum queue or
// stream always has x-queue-type among its arguments, so that the file declares the same type
// on any RabbitMQ whatever its vhost's default queue type.
func Encode(d *Definitions) ([]byte, error) {
	doc := exportDoc{
		RabbitVersion: d.RabbitVersion, RabbitMQVersion: d.RabbitMQVersion,
		ProductName: d.ProductName, ProductVersion: d.ProductVersion,
		DefinitionFormat: d.DefinitionFormat, OriginalClusterName: d.OriginalClusterName,
		OriginalVHostName: d.OriginalVHostName, Explanation: d.Explanation,
		Users: []exportUser{}, VHosts: []exportVHost{}, Permissions: []exportPermission{},
		TopicPermissions: []exportTopicPermission{}, Parameters: []exportParameter{},
		GlobalParameters: []exportGlobalParameter{}, Policies: []exportPolicy{}, Queues: []exportQueue{},
		Exchanges: []exportExchange{}, Bindings: []exportBinding{},
	}
	for _, u := range d.Users {
		limits := u.Limits
		if limits == nil {
			limits = map[string]int64{}
		}
		doc.Users = append(doc.Users, exportUser{Name: u.Name, PasswordHash: u.PasswordHash,
			HashingAlgorithm: u.Algorithm(d.RabbitVersion), Tags: nonNil(u.Tags), Limits: limits})
	}
	for _, v := range d.VHosts {
		meta := map[string]any{}
		for k, val := range v.Metadata {
			meta[k] = val
		}
		meta["description"] = v.Description
		meta["tags"] = nonNil(v.Tags)
		if v.DefaultQueueType != "" {
			meta["default_queue_type"] = v.DefaultQueueType
		}
		doc.VHosts = append(doc.VHosts, exportVHost{Name: v.Name, Description: v.Description, Tags: nonNil(v.Tags), Metadata: meta})
	}
	for _, p := range d.Permissions {
		doc.Permissions = append(doc.Permissions, exportPermission{p.User, p.VHost, p.Configure, p.Write, p.Read})
	}
	for _, p := range d.TopicPermissions {
		doc.TopicPermissions = append(doc.TopicPermissions, exportTopicPermission{p.User, p.VHost, p.Exchange, p.Write, p.Read})
	}
	for _, p := range d.OperatorPolicies {
		doc.Parameters = append(doc.Parameters, exportParameter{
			Value: exportPolicyValue{Pattern: p.Pattern, Definition: nonNilDef(p.Definition), Priority: p.Priority, ApplyTo: applyTo(p.ApplyTo)},
			VHost: p.VHost, Component: componentOperatorPolicy, Name: p.Name})
	}
	for _, l := range d.VHostLimits {
		limits := l.Limits
		if limits == nil {
			limits = map[string]int64{}
		}
		doc.Parameters = append(doc.Parameters, exportParameter{Value: limits, VHost: l.VHost, Component: componentVHostLimits, Name: "limits"})
	}
	for _, p := range d.Parameters {
		if !json.Valid(p.Value) {
			return nil, fmt.Errorf("definitions: parameter %s/%s in vhost %q: value is not JSON", p.Component, p.Name, p.VHost)
		}
		doc.Parameters = append(doc.Parameters, exportParameter{Value: json.RawMessage(p.Value), VHost: p.VHost, Component: p.Component, Name: p.Name})
	}
	for _, g := range d.GlobalParameters {
		if !json.Valid(g.Value) {
			return nil, fmt.Errorf("definitions: global parameter %s: value is not JSON", g.Name)
		}
		doc.GlobalParameters = append(doc.GlobalParameters, exportGlobalParameter{Name: g.Name, Value: g.Value})
	}
	for _, p := range d.Policies {
		doc.Policies = append(doc.Policies, exportPolicy{VHost: p.VHost, Name: p.Name, Pattern: p.Pattern,
			ApplyTo: applyTo(p.ApplyTo), Definition: nonNilDef(p.Definition), Priority: p.Priority})
	}
	for _, q := range d.Queues {
		args := cloneArgs(q.Arguments)
		typ := q.Type
		if typ == "" {
			typ = "classic"
		}
		if typ != "classic" {
			args["x-queue-type"] = typ
		}
		doc.Queues = append(doc.Queues, exportQueue{Name: q.Name, VHost: q.VHost, Type: typ, Durable: q.Durable, AutoDelete: q.AutoDelete, Arguments: args})
	}
	for _, x := range d.Exchanges {
		doc.Exchanges = append(doc.Exchanges, exportExchange{Name: x.Name, VHost: x.VHost, Type: x.Type, Durable: x.Durable,
			AutoDelete: x.AutoDelete, Internal: x.Internal, Arguments: cloneArgs(x.Arguments)})
	}
	for _, b := range d.Bindings {
		doc.Bindings = append(doc.Bindings, exportBinding{Source: b.Source, VHost: b.VHost, Destination: b.Destination,
			DestinationType: b.DestinationType, RoutingKey: b.RoutingKey, Arguments: cloneArgs(b.Arguments)})
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("definitions: encoding: %w", err)
	}
	return append(out, '\n'), nil
}

func applyTo(a policy.ApplyTo) policy.ApplyTo {
	if a == "" {
		return policy.ApplyToAll
	}
	return a
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func nonNilDef(d policy.Definition) policy.Definition {
	if d == nil {
		return policy.Definition{}
	}
	return d
}

func cloneArgs(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Table converts JSON arguments (as Decode gives them) to an AMQP field table for a declare or
// a bind, as RabbitMQ's rabbit_misc:to_amqp_table does: integers become int64, other numbers
// float64, objects tables, lists arrays.
func Table(args map[string]any) amqp.Table {
	if args == nil {
		return nil
	}
	t := make(amqp.Table, len(args))
	for k, v := range args {
		t[k] = tableValue(v)
	}
	return t
}

func tableValue(v any) any {
	switch v := v.(type) {
	case json.Number:
		if n, err := v.Int64(); err == nil {
			return n
		}
		if f, err := v.Float64(); err == nil {
			return f
		}
		return string(v)
	case map[string]any:
		return Table(v)
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = tableValue(e)
		}
		return out
	}
	return v // string, bool, nil
}

// Arguments converts an AMQP field table to JSON arguments for Encode, as RabbitMQ's
// rabbit_misc:amqp_table renders one: byte strings as strings, timestamps as seconds,
// decimals as numbers, nested tables as objects.
func Arguments(t amqp.Table) map[string]any {
	out := make(map[string]any, len(t))
	for k, v := range t {
		out[k] = argumentValue(v)
	}
	return out
}

func argumentValue(v any) any {
	switch v := v.(type) {
	case []byte:
		return string(v)
	case time.Time:
		return v.Unix()
	case amqp.Decimal:
		f := float64(v.Value)
		for range v.Scale {
			f /= 10
		}
		return f
	case amqp.Table:
		return Arguments(v)
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = argumentValue(e)
		}
		return out
	}
	return v
}
