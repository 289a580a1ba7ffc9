// Package definitions reads and writes RabbitMQ's definitions JSON: the document of
// GET/POST /api/definitions (and /api/definitions/{vhost}), rabbitmqctl export_definitions and
// load_definitions, as RabbitMQ 3.x and 4.x write it.
//
// Decode is strict: a document that is not JSON, or an item with a field of the wrong type, is
// an error naming the item by its path (queues[3].durable). Validate then checks what needs the
// broker's state: that every item's vhost and user exist (in the file or on the broker), that
// policies, operator policies and permission patterns are valid. Both report every problem they
// find, so an importer can refuse a file whole before changing anything. What Warren does not
// implement (federation and shovel parameters, mirroring keys of policies, exchanges of plugin
// types) is not an error: Skipped lists it so the importer can report it.
//
// An importer applies the items in RabbitMQ's order (rabbit_definitions:apply_defs): users,
// vhosts, vhost limits, permissions, exchanges, topic permissions, global parameters,
// policies, operator policies and other parameters, queues, bindings. Existing queues and
// exchanges are left as they are; queues and exchanges named amq.* and the default exchange
// are skipped.
//
// The package does no I/O and keeps no state.
package definitions

import (
	"encoding/json"

	"warren/server/policy"
)

// Password hashing algorithms as definitions files name them.
const (
	HashSHA256 = "rabbit_password_hashing_sha256"
	HashSHA512 = "rabbit_password_hashing_sha512"
	HashMD5    = "rabbit_password_hashing_md5"
)

// Definitions is one definitions document.
type Definitions struct {
	RabbitVersion   string // rabbit_version
	RabbitMQVersion string // rabbitmq_version
	ProductName     string // product_name
	ProductVersion  string // product_version
	// 4.x export metadata: rabbitmq_definition_format ("cluster" or "single_virtual_host"),
	// original_cluster_name, original_vhost_name, explanation. Informational.
	DefinitionFormat    string
	OriginalClusterName string
	OriginalVHostName   string
	Explanation         string

	Users            []User
	VHosts           []VHost
	Permissions      []Permission
	TopicPermissions []TopicPermission
	// Parameters are the runtime parameters other than operator policies and vhost limits,
	// which have their own fields (in the file all three are "parameters").
	Parameters       []Parameter
	GlobalParameters []GlobalParameter
	Policies         []policy.Policy
	OperatorPolicies []policy.Policy
	VHostLimits      []VHostLimits
	Queues           []Queue
	Exchanges        []Exchange
	Bindings         []Binding

	// Skipped lists what the document holds that Warren does not import or does not act on.
	Skipped []Skipped

	// Where Decode found each policy and operator policy, for Validate's problems.
	policyPaths, operatorPolicyPaths []string
}

// User is a user with its password hash as RabbitMQ stores it.
type User struct {
	Name string
	// PasswordHash is base64 of salt ++ hash, as in the file; "" for a user without a
	// password (who cannot log in with one).
	PasswordHash string
	// HashingAlgorithm is the file's hashing_algorithm, "" when absent; use Algorithm.
	HashingAlgorithm string
	// Password is a clear-text password from a hand-written file ("password" instead of
	// "password_hash"). It is never encoded.
	Password    string
	HasPassword bool
	Tags        []string
	// Limits are max-connections and max-channels when set.
	Limits map[string]int64
}

// Algorithm is the hashing algorithm of the user's hash: the one the file names, else what
// RabbitMQ assumes for files without it (rabbit_auth_backend_internal:hashing_algorithm): MD5
// for exports of RabbitMQ 3.0 to 3.5, SHA-256 otherwise.
func (u User) Algorithm(fileVersion string) string {
	if u.HashingAlgorithm != "" {
		return u.HashingAlgorithm
	}
	if len(fileVersion) >= 4 && fileVersion[:2] == "3." && fileVersion[2] >= '0' && fileVersion[2] <= '5' && fileVersion[3] == '.' {
		return HashMD5
	}
	return HashSHA256
}

// VHost is a virtual host.
type VHost struct {
	Name             string
	Description      string
	Tags             []string
	DefaultQueueType string // "", "classic", "quorum" or "stream"
	// Metadata holds the file's metadata object as given (4.x), for keys beyond the three above.
	Metadata map[string]any
}

// Permission is a user's configure, write and read patterns in a vhost.
type Permission struct {
	User, VHost            string
	Configure, Write, Read string

	src string // the path Decode found it at
}

// TopicPermission is a user's write and read patterns on routing keys of a topic exchange.
type TopicPermission struct {
	User, VHost, Exchange string
	Write, Read           string

	src string // the path Decode found it at
}

// Parameter is a runtime parameter (federation upstreams, shovels...), kept as given.
type Parameter struct {
	VHost, Component, Name string
	Value                  json.RawMessage

	src string // the path Decode found it at
}

// GlobalParameter is a cluster-wide runtime parameter (cluster_name...).
type GlobalParameter struct {
	Name  string
	Value json.RawMessage
}

// VHostLimits are a vhost's limits ("max-connections", "max-queues"), the runtime parameter
// of component vhost-limits.
type VHostLimits struct {
	VHost  string
	Limits map[string]int64

	src string // the path Decode found it at
}

// Queue is a queue declaration.
type Queue struct {
	Name, VHost string
	// Type is classic, quorum or stream: the file's "type" (4.x) or x-queue-type.
	Type       string
	Durable    bool
	AutoDelete bool
	// Arguments are the x-arguments as JSON values (numbers json.Number); Table converts
	// them for a declare.
	Arguments map[string]any

	src string
}

// Exchange is an exchange declaration.
type Exchange struct {
	Name, VHost, Type string
	Durable           bool
	AutoDelete        bool
	Internal          bool
	Arguments         map[string]any

	src string
}

// Binding binds a queue or an exchange to a source exchange.
type Binding struct {
	VHost, Source, Destination string
	DestinationType            string // "queue" or "exchange"
	RoutingKey                 string
	Arguments                  map[string]any

	src string
}

// Skipped is one thing the document holds that Warren does not import (a federation
// upstream) or imports without acting on (a policy's ha-mode).
type Skipped struct {
	Path   string // e.g. parameters[2], policies[0].definition.ha-mode
	What   string // e.g. federation-upstream parameter 'up' in vhost 'v'
	Reason string
}
