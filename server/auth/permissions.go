package auth

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// Perm is one of the three kinds of access RabbitMQ grants per user and vhost.
type Perm uint8

// The three permissions. Which methods need which is in channel.go.
const (
	Configure Perm = iota // create, delete, change an exchange or queue
	Write                 // publish to an exchange, bind to a queue or exchange
	Read                  // consume from or purge a queue, bind from an exchange
)

// String is the permission's name as RabbitMQ's API and definitions spell it.
func (p Perm) String() string {
	switch p {
	case Configure:
		return "configure"
	case Write:
		return "write"
	case Read:
		return "read"
	}
	return fmt.Sprintf("Perm(%d)", uint8(p))
}

// Permission is a user's permissions in one vhost as the API and definitions carry them: three
// regular expressions matched, unanchored, against exchange and queue names.
type Permission struct {
	Configure, Write, Read string
}

// Pattern is one compiled permission pattern. RabbitMQ runs it with re:run unanchored, so "foo"
// matches "xfooy"; the empty string means "^$", matching only the empty name (which for an
// exchange is checked as amq.default, so in effect nothing).
//
// Go's RE2 syntax is close to the PCRE RabbitMQ compiles with, but not the same: look-arounds and
// back-references are refused here (RabbitMQ accepts them), `$` matches only at the very end
// (PCRE also before a final newline), and `.` matches a UTF-8 character rather than a byte.
type Pattern struct {
	src string
	// all: the pattern matches every name (".*", "^.*"); allNoNL: every name without a newline
	// (".*$", "^.*$"). Both skip the regexp for the common full-access grants.
	all, allNoNL bool
	re           *regexp.Regexp
}

// CompilePattern compiles one permission pattern. The error is the one a management API 400
// shows.
func CompilePattern(src string) (*Pattern, error) {
	p := &Pattern{src: src}
	switch src {
	case ".*", "^.*":
		p.all = true
	case ".*$", "^.*$":
		p.allNoNL = true
	}
	expr := src
	if expr == "" {
		expr = "^$"
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		return nil, fmt.Errorf("invalid regular expression '%s': %w", src, err)
	}
	p.re = re
	return p, nil
}

// String returns the pattern as it was set.
func (p *Pattern) String() string { return p.src }

// Match reports whether name is allowed by p.
func (p *Pattern) Match(name string) bool {
	if p.all || p.allNoNL && strings.IndexByte(name, '\n') < 0 {
		return true
	}
	return p.re.MatchString(name)
}

// Grant is one user's compiled permissions in one vhost. The core keeps one per (user, vhost)
// record, made when the permission is set or imported, and hands it to every channel the user
// opens there; it is immutable and safe to share.
type Grant struct {
	perm                   Permission
	configure, write, read *Pattern
}

// NewGrant compiles p. The error names the permission whose pattern is invalid, for the API's
// 400.
func NewGrant(p Permission) (*Grant, error) {
	g := &Grant{perm: p}
	var err error
	if g.configure, err = CompilePattern(p.Configure); err != nil {
		return nil, fmt.Errorf("configure: %w", err)
	}
	if g.write, err = CompilePattern(p.Write); err != nil {
		return nil, fmt.Errorf("write: %w", err)
	}
	if g.read, err = CompilePattern(p.Read); err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	return g, nil
}

// FullAccess is ".*" for all three: what the default user gets on "/" at first boot.
var FullAccess = Permission{Configure: ".*", Write: ".*", Read: ".*"}

// Permission returns the patterns as set, for the API and exports.
func (g *Grant) Permission() Permission { return g.perm }

// Allows reports whether the grant gives perm on a resource called name. Exchange names must
// already have "" replaced by "amq.default" (Channel does this).
func (g *Grant) Allows(perm Perm, name string) bool {
	p := g.pattern(perm)
	return p != nil && p.Match(name)
}

// pattern returns the pattern for perm, nil for an unknown Perm.
func (g *Grant) pattern(perm Perm) *Pattern {
	switch perm {
	case Configure:
		return g.configure
	case Write:
		return g.write
	case Read:
		return g.read
	}
	return nil
}

// TopicPermission is a user's topic permission on one topic exchange in one vhost: regular
// expressions for the routing keys the user may publish with (write) and bind with (read). The
// patterns may contain the variables {username} and {vhost} (and, for protocols that have
// one, {client_id}), replaced literally, without escaping, before matching, as RabbitMQ does.
type TopicPermission struct {
	Exchange    string
	Write, Read string
}

// TopicGrant is one user's compiled topic permission on one exchange in one vhost, with
// {username} and {vhost} already expanded (a topic permission belongs to exactly one user and
// vhost, so this happens once, when it is set). Immutable and safe to share.
type TopicGrant struct {
	perm        TopicPermission
	user, vhost string
	write, read *Pattern
}

// NewTopicGrant validates p's patterns as set (the API's 400, as RabbitMQ compiles them before
// expansion) and compiles them expanded for user in vhost. If the expanded pattern does not
// compile (a user name with regexp syntax in it), that permission allows nothing.
func NewTopicGrant(user, vhost string, p TopicPermission) (*TopicGrant, error) {
	if _, err := CompilePattern(p.Write); err != nil {
		return nil, fmt.Errorf("write: %w", err)
	}
	if _, err := CompilePattern(p.Read); err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	vars := map[string]string{"username": user, "vhost": vhost}
	return &TopicGrant{
		perm: p, user: user, vhost: vhost,
		write: compileExpanded(p.Write, vars),
		read:  compileExpanded(p.Read, vars),
	}, nil
}

// WithVariables returns a copy of g whose patterns are also expanded with the extra variables
// of one connection (MQTT's {client_id}); AMQP 0-9-1 connections have none, so there "{client_id}"
// stays literal as in RabbitMQ. Call it once per connection, not per check.
func (g *TopicGrant) WithVariables(extra map[string]string) *TopicGrant {
	vars := map[string]string{}
	for k, v := range extra {
		vars[k] = v
	}
	vars["username"], vars["vhost"] = g.user, g.vhost
	c := *g
	c.write = compileExpanded(g.perm.Write, vars)
	c.read = compileExpanded(g.perm.Read, vars)
	return &c
}

// Permission returns the topic permission as set.
func (g *TopicGrant) Permission() TopicPermission { return g.perm }

// Allows reports whether routingKey may be used for perm (Write: publish, Read: bind).
// Configure is not a topic permission and is never allowed.
func (g *TopicGrant) Allows(perm Perm, routingKey string) bool {
	var p *Pattern
	switch perm {
	case Write:
		p = g.write
	case Read:
		p = g.read
	}
	return p != nil && p.Match(routingKey)
}

// compileExpanded replaces each {name} in src by vars[name] and compiles the result; nil if it
// does not compile (nothing matches).
func compileExpanded(src string, vars map[string]string) *Pattern {
	if strings.IndexByte(src, '{') >= 0 {
		// In key order, as RabbitMQ folds over its (small, hence ordered) map: a value that
		// itself contains "{vhost}" is expanded again by the later key, there as here.
		for _, k := range slices.Sorted(maps.Keys(vars)) {
			src = strings.ReplaceAll(src, "{"+k+"}", vars[k])
		}
	}
	p, err := CompilePattern(src)
	if err != nil {
		return nil
	}
	return p
}
