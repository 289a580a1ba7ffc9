package definitions

import (
	"fmt"
)

// Validate checks what Decode cannot: that every vhost and user an item refers to is either
// created by the document or exists on the broker (vhostExists, userExists; nil means none
// exists). It reports every problem as an *Error, so that an importer can refuse the document
// before it changes anything. A document built in Go rather than decoded is named by slice
// index in the paths.
func (d *Definitions) Validate(vhostExists, userExists func(name string) bool) error {
	vhosts := map[string]bool{}
	for _, v := range d.VHosts {
		vhosts[v.Name] = true
	}
	users := map[string]bool{}
	for _, u := range d.Users {
		users[u.Name] = true
	}
	var problems []Problem
	add := func(src, kind string, i int, format string, args ...any) {
		if len(problems) >= maxProblems {
			return
		}
		if src == "" {
			src = fmt.Sprintf("%s[%d]", kind, i)
		}
		problems = append(problems, Problem{Path: src, Reason: fmt.Sprintf(format, args...)})
	}
	vhostOK := func(name string) bool { return vhosts[name] || (vhostExists != nil && vhostExists(name)) }
	userOK := func(name string) bool { return users[name] || (userExists != nil && userExists(name)) }
	const noVHost = "vhost '%s' does not exist and is not created by this file"
	const noUser = "user '%s' does not exist and is not created by this file"

	for i, p := range d.Permissions {
		if !vhostOK(p.VHost) {
			add(p.src, "permissions", i, noVHost, p.VHost)
		}
		if !userOK(p.User) {
			add(p.src, "permissions", i, noUser, p.User)
		}
	}
	for i, p := range d.TopicPermissions {
		if !vhostOK(p.VHost) {
			add(p.src, "topic_permissions", i, noVHost, p.VHost)
		}
		if !userOK(p.User) {
			add(p.src, "topic_permissions", i, noUser, p.User)
		}
	}
	for i, p := range d.Parameters {
		if !vhostOK(p.VHost) {
			add(p.src, "parameters", i, noVHost, p.VHost)
		}
	}
	for i, l := range d.VHostLimits {
		if !vhostOK(l.VHost) {
			add(l.src, "vhost_limits", i, noVHost, l.VHost)
		}
	}
	for i, p := range d.Policies {
		if !vhostOK(p.VHost) {
			add(pathAt(d.policyPaths, i), "policies", i, noVHost, p.VHost)
		}
	}
	for i, p := range d.OperatorPolicies {
		if !vhostOK(p.VHost) {
			add(pathAt(d.operatorPolicyPaths, i), "operator_policies", i, noVHost, p.VHost)
		}
	}
	for i, x := range d.Exchanges {
		if !vhostOK(x.VHost) {
			add(x.src, "exchanges", i, noVHost, x.VHost)
		}
	}
	for i, q := range d.Queues {
		if !vhostOK(q.VHost) {
			add(q.src, "queues", i, noVHost, q.VHost)
		}
	}
	for i, b := range d.Bindings {
		if !vhostOK(b.VHost) {
			add(b.src, "bindings", i, noVHost, b.VHost)
		}
	}
	if len(problems) > 0 {
		return &Error{Problems: problems}
	}
	return nil
}

func pathAt(paths []string, i int) string {
	if i < len(paths) {
		return paths[i]
	}
	return ""
}
