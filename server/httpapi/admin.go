package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"warren/server/auth"
	"warren/server/core"
	"warren/server/definitions"
	"warren/server/policy"
)

// This file is the management API of users, vhosts, permissions, topic permissions, policies,
// operator policies, vhost limits, definitions and nodes, with RabbitMQ's paths, bodies and
// status codes: PUT answers 201 when it created the object and 204 when it replaced one, DELETE
// 204, a missing object 404, a bad body 400 {"error":"bad_request","reason":...}.

// maxBody bounds a request body (a definitions file included).
const maxBody = 64 << 20

// badRequest answers 400 with reason, its < and > escaped as RabbitMQ's management API does
// (rabbit_mgmt_format:escape_html_tags): policy texts carry Erlang binaries such as <<"x">>.
func badRequest(w http.ResponseWriter, reason string) {
	reason = strings.NewReplacer("<", "&lt;", ">", "&gt;").Replace(reason)
	writeJSON(w, http.StatusBadRequest, map[string]string{"error": "bad_request", "reason": reason})
}

// readBody decodes a JSON object body (an empty body is an empty object, as RabbitMQ takes it).
func readBody(w http.ResponseWriter, r *http.Request) (map[string]any, []byte, bool) {
	data, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		badRequest(w, "cannot read the body: "+err.Error())
		return nil, nil, false
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return map[string]any{}, data, true
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil || m == nil {
		badRequest(w, "not_json")
		return nil, nil, false
	}
	return m, data, true
}

// changeError answers a failed change.
func changeError(w http.ResponseWriter, err error) {
	var ve *core.ValidationError
	var pe *policy.Error
	var de *definitions.Error
	switch {
	case errors.As(err, &ve):
		badRequest(w, ve.Reason)
	case errors.As(err, &pe):
		badRequest(w, pe.ManagementReason())
	case errors.As(err, &de):
		badRequest(w, de.Error())
	case errors.Is(err, core.ErrNoVHost), errors.Is(err, core.ErrNoUser), errors.Is(err, core.ErrNoPerm), errors.Is(err, core.ErrNoPolicy):
		notFound(w)
	default:
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "internal_error", "reason": err.Error()})
	}
}

// putStatus is 201 for a created object, 204 for a replaced one.
func putStatus(w http.ResponseWriter, existed bool) {
	if existed {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	w.WriteHeader(http.StatusCreated)
}

func strField(m map[string]any, k string) (string, bool) {
	s, ok := m[k].(string)
	return s, ok
}

// tagsField reads tags as a list or a comma-separated string, as RabbitMQ accepts both.
func tagsField(m map[string]any) ([]string, bool) {
	switch v := m["tags"].(type) {
	case nil:
		return []string{}, true
	case string:
		return auth.ParseTags(v), true
	case []any:
		out := []string{}
		for _, t := range v {
			s, ok := t.(string)
			if !ok {
				return nil, false
			}
			out = append(out, auth.ParseTags(s)...)
		}
		return out, true
	}
	return nil, false
}

func orEmpty(ss []string) []string {
	if ss == nil {
		return []string{}
	}
	return ss
}

// --- vhosts --------------------------------------------------------------------------------

func (a *api) vhostJSON(v core.VHostInfo) map[string]any {
	var ready, unacked int
	if vh := a.c.VHost(v.Name); vh != nil {
		for _, q := range vh.Queues() {
			st := q.Stats()
			ready += st.Ready
			unacked += st.Unacked
		}
	}
	return map[string]any{
		"messages": ready + unacked, "messages_ready": ready, "messages_unacknowledged": unacked,
		"name": v.Name, "description": v.Description, "tags": orEmpty(v.Tags), "tracing": false,
		"default_queue_type": nullable(v.DefaultQueueType),
		"metadata":           map[string]any{"description": v.Description, "tags": orEmpty(v.Tags)},
	}
}

func (a *api) vhosts(w http.ResponseWriter, r *http.Request, args []string) {
	p := principal(r)
	out := []map[string]any{}
	for _, v := range a.c.VHostInfos() {
		if auth.VhostVisible(p.Tags, a.c.VHostGrant(p.Name, v.Name) != nil) {
			out = append(out, a.vhostJSON(v))
		}
	}
	writeList(w, r, out)
}

func (a *api) vhost(w http.ResponseWriter, r *http.Request, args []string) {
	v, ok := a.c.LookupVHost(args[0])
	if !ok {
		notFound(w)
		return
	}
	writeJSON(w, http.StatusOK, a.vhostJSON(v))
}

func (a *api) putVHost(w http.ResponseWriter, r *http.Request, args []string) {
	m, _, ok := readBody(w, r)
	if !ok {
		return
	}
	info, existed := a.c.LookupVHost(args[0])
	info.Name = args[0]
	if d, ok := strField(m, "description"); ok {
		info.Description = d
	}
	if _, has := m["tags"]; has {
		tags, ok := tagsField(m)
		if !ok {
			badRequest(w, "tags must be a list of strings or a comma-separated string")
			return
		}
		info.Tags = tags
	}
	if t, ok := strField(m, "default_queue_type"); ok {
		switch t {
		case "classic", "quorum", "stream", "undefined":
			info.DefaultQueueType = t
		default:
			badRequest(w, fmt.Sprintf("Default queue type '%s' is invalid", t))
			return
		}
	}
	if err := a.c.PutVHost(r.Context(), info); err != nil {
		changeError(w, err)
		return
	}
	if !existed {
		// RabbitMQ grants the user who creates a vhost full permissions there
		// (rabbit_vhost:maybe_grant_full_permissions/2); stream-client suites rely on it.
		if u := principal(r).Name; u != "" {
			if _, known := a.c.LookupUser(u); known {
				if err := a.c.SetPermission(r.Context(), core.PermissionInfo{User: u, VHost: info.Name, Permission: auth.FullAccess}); err != nil {
					changeError(w, err)
					return
				}
			}
		}
	}
	a.audit(r, "vhost put", "vhost", info.Name)
	putStatus(w, existed)
}

func (a *api) deleteVHost(w http.ResponseWriter, r *http.Request, args []string) {
	if err := a.c.DeleteVHost(r.Context(), args[0]); err != nil {
		changeError(w, err)
		return
	}
	a.audit(r, "vhost deleted", "vhost", args[0])
	w.WriteHeader(http.StatusNoContent)
}

// audit logs a change made through the API, with who made it.
func (a *api) audit(r *http.Request, what string, kv ...any) {
	a.opt.Logger.Info("HTTP API: "+what, append(kv, "by", principal(r).Name, "from", r.RemoteAddr)...)
}

// --- users ---------------------------------------------------------------------------------

func userJSON(u core.User) map[string]any {
	limits := map[string]any{}
	for k, v := range u.Limits {
		limits[k] = v
	}
	return map[string]any{"name": u.Name, "password_hash": u.Hash.Encode(), "hashing_algorithm": string(u.Hash.Algorithm),
		"tags": orEmpty(u.Tags), "limits": limits}
}

func (a *api) users(w http.ResponseWriter, r *http.Request, args []string) {
	out := []map[string]any{}
	for _, u := range a.c.Users() {
		out = append(out, userJSON(u))
	}
	writeList(w, r, out)
}

func (a *api) user(w http.ResponseWriter, r *http.Request, args []string) {
	u, ok := a.c.LookupUser(args[0])
	if !ok {
		notFound(w)
		return
	}
	writeJSON(w, http.StatusOK, userJSON(u))
}

// putUser is PUT /api/users/{name}: {"password": ...} or {"password_hash": ...,
// "hashing_algorithm": ...}, and "tags". Without either password field an existing user keeps
// its password and a new one has none (it can log in only with EXTERNAL), as in RabbitMQ.
func (a *api) putUser(w http.ResponseWriter, r *http.Request, args []string) {
	m, _, ok := readBody(w, r)
	if !ok {
		return
	}
	old, existed := a.c.LookupUser(args[0])
	u := core.User{Name: args[0], Hash: old.Hash, Limits: old.Limits}
	tags, ok := tagsField(m)
	if !ok {
		badRequest(w, "tags must be a list of strings or a comma-separated string")
		return
	}
	u.Tags = tags
	if pw, has := m["password"]; has {
		s, ok := pw.(string)
		if !ok {
			badRequest(w, "password must be a string")
			return
		}
		h, err := auth.HashPassword(auth.DefaultAlgorithm, s)
		if err != nil {
			badRequest(w, err.Error())
			return
		}
		u.Hash = h
	} else if ph, has := m["password_hash"]; has {
		s, ok := ph.(string)
		if !ok {
			badRequest(w, "password_hash must be a string")
			return
		}
		alg, _ := strField(m, "hashing_algorithm")
		h, err := auth.ParseDefinitionHash(s, alg, "")
		if err != nil {
			badRequest(w, err.Error())
			return
		}
		u.Hash = h
	}
	if err := a.c.PutUser(r.Context(), u); err != nil {
		changeError(w, err)
		return
	}
	a.audit(r, "user put", "user", u.Name, "tags", strings.Join(u.Tags, ","))
	putStatus(w, existed)
}

func (a *api) deleteUser(w http.ResponseWriter, r *http.Request, args []string) {
	if err := a.c.DeleteUser(r.Context(), args[0]); err != nil {
		changeError(w, err)
		return
	}
	a.audit(r, "user deleted", "user", args[0])
	w.WriteHeader(http.StatusNoContent)
}

// --- permissions ---------------------------------------------------------------------------

func permJSON(p core.PermissionInfo) map[string]any {
	return map[string]any{"user": p.User, "vhost": p.VHost, "configure": p.Configure, "write": p.Write, "read": p.Read}
}

func topicJSON(p core.TopicPermissionInfo) map[string]any {
	return map[string]any{"user": p.User, "vhost": p.VHost, "exchange": p.Exchange, "write": p.Write, "read": p.Read}
}

// listKept writes, as a list, render of each of items that keep accepts (an empty list when none
// is kept): the permission and topic-permission listings.
func listKept[T any](w http.ResponseWriter, r *http.Request, items []T, keep func(T) bool, render func(T) map[string]any) {
	out := []map[string]any{}
	for _, it := range items {
		if keep(it) {
			out = append(out, render(it))
		}
	}
	writeList(w, r, out)
}

func (a *api) listPerms(w http.ResponseWriter, r *http.Request, keep func(core.PermissionInfo) bool) {
	listKept(w, r, a.c.Permissions(), keep, permJSON)
}

func (a *api) listTopics(w http.ResponseWriter, r *http.Request, keep func(core.TopicPermissionInfo) bool) {
	listKept(w, r, a.c.TopicPermissions(), keep, topicJSON)
}

func (a *api) permissions(w http.ResponseWriter, r *http.Request, args []string) {
	a.listPerms(w, r, func(core.PermissionInfo) bool { return true })
}

func (a *api) vhostPermissions(w http.ResponseWriter, r *http.Request, args []string) {
	if !a.requireVHost(w, args[0]) {
		return
	}
	a.listPerms(w, r, func(p core.PermissionInfo) bool { return p.VHost == args[0] })
}

func (a *api) userPermissions(w http.ResponseWriter, r *http.Request, args []string) {
	if !a.requireUser(w, args[0]) {
		return
	}
	a.listPerms(w, r, func(p core.PermissionInfo) bool { return p.User == args[0] })
}

func (a *api) permission(w http.ResponseWriter, r *http.Request, args []string) {
	g := a.c.VHostGrant(args[1], args[0])
	if g == nil {
		notFound(w)
		return
	}
	writeJSON(w, http.StatusOK, permJSON(core.PermissionInfo{User: args[1], VHost: args[0], Permission: g.Permission()}))
}

// keysMissing is RabbitMQ's 400 reason for a body without required keys.
func keysMissing(m map[string]any, keys ...string) string {
	var missing []string
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			missing = append(missing, "{key_missing,"+k+"}")
		}
	}
	if len(missing) == 0 {
		return ""
	}
	return "[" + strings.Join(missing, ",") + "]"
}

func (a *api) putPermission(w http.ResponseWriter, r *http.Request, args []string) {
	m, _, ok := readBody(w, r)
	if !ok {
		return
	}
	if reason := keysMissing(m, "configure", "write", "read"); reason != "" {
		badRequest(w, reason)
		return
	}
	c, _ := strField(m, "configure")
	wr, _ := strField(m, "write")
	rd, _ := strField(m, "read")
	existed := a.c.VHostGrant(args[1], args[0]) != nil
	err := a.c.SetPermission(r.Context(), core.PermissionInfo{User: args[1], VHost: args[0], Permission: auth.Permission{Configure: c, Write: wr, Read: rd}})
	if errors.Is(err, core.ErrNoUser) || errors.Is(err, core.ErrNoVHost) {
		badRequest(w, "vhost_or_user_not_found")
		return
	}
	if err != nil {
		changeError(w, err)
		return
	}
	a.audit(r, "permission set", "user", args[1], "vhost", args[0])
	putStatus(w, existed)
}

func (a *api) deletePermission(w http.ResponseWriter, r *http.Request, args []string) {
	if err := a.c.ClearPermission(r.Context(), args[1], args[0]); err != nil {
		changeError(w, err)
		return
	}
	a.audit(r, "permission cleared", "user", args[1], "vhost", args[0])
	w.WriteHeader(http.StatusNoContent)
}

func (a *api) topicPermissions(w http.ResponseWriter, r *http.Request, args []string) {
	a.listTopics(w, r, func(core.TopicPermissionInfo) bool { return true })
}

func (a *api) vhostTopicPermissions(w http.ResponseWriter, r *http.Request, args []string) {
	if !a.requireVHost(w, args[0]) {
		return
	}
	a.listTopics(w, r, func(p core.TopicPermissionInfo) bool { return p.VHost == args[0] })
}

func (a *api) userTopicPermissions(w http.ResponseWriter, r *http.Request, args []string) {
	if !a.requireUser(w, args[0]) {
		return
	}
	a.listTopics(w, r, func(p core.TopicPermissionInfo) bool { return p.User == args[0] })
}

func (a *api) topicPermission(w http.ResponseWriter, r *http.Request, args []string) {
	if len(a.c.TopicGrants(args[1], args[0])) == 0 {
		notFound(w)
		return
	}
	a.listTopics(w, r, func(p core.TopicPermissionInfo) bool { return p.VHost == args[0] && p.User == args[1] })
}

func (a *api) putTopicPermission(w http.ResponseWriter, r *http.Request, args []string) {
	m, _, ok := readBody(w, r)
	if !ok {
		return
	}
	if reason := keysMissing(m, "exchange", "write", "read"); reason != "" {
		badRequest(w, reason)
		return
	}
	x, _ := strField(m, "exchange")
	wr, _ := strField(m, "write")
	rd, _ := strField(m, "read")
	_, existed := a.c.TopicGrants(args[1], args[0])[x]
	err := a.c.SetTopicPermission(r.Context(), core.TopicPermissionInfo{User: args[1], VHost: args[0],
		TopicPermission: auth.TopicPermission{Exchange: x, Write: wr, Read: rd}})
	if errors.Is(err, core.ErrNoUser) || errors.Is(err, core.ErrNoVHost) {
		badRequest(w, "vhost_or_user_not_found")
		return
	}
	if err != nil {
		changeError(w, err)
		return
	}
	a.audit(r, "topic permission set", "user", args[1], "vhost", args[0], "exchange", x)
	putStatus(w, existed)
}

func (a *api) deleteTopicPermission(w http.ResponseWriter, r *http.Request, args []string) {
	x := ""
	if len(args) > 2 {
		x = args[2]
	}
	if err := a.c.ClearTopicPermissions(r.Context(), args[1], args[0], x); err != nil {
		changeError(w, err)
		return
	}
	a.audit(r, "topic permissions cleared", "user", args[1], "vhost", args[0], "exchange", x)
	w.WriteHeader(http.StatusNoContent)
}

// --- policies ------------------------------------------------------------------------------

func policyJSON(cp *policy.Compiled) map[string]any {
	return map[string]any{"vhost": cp.VHost, "name": cp.Name, "pattern": cp.Pattern, "apply-to": string(cp.ApplyTo),
		"definition": cp.Definition, "priority": cp.Priority}
}

func (a *api) listPolicies(w http.ResponseWriter, r *http.Request, args []string, c policy.Component) {
	vhost := ""
	if len(args) > 0 {
		if !a.requireVHost(w, args[0]) {
			return
		}
		vhost = args[0]
	}
	p := principal(r)
	out := []map[string]any{}
	for _, cp := range a.c.Policies(c, vhost) {
		if auth.ListsVhostObjects(p.Tags, a.c.VHostGrant(p.Name, cp.VHost) != nil) {
			out = append(out, policyJSON(cp))
		}
	}
	writeList(w, r, out)
}

func (a *api) getPolicy(w http.ResponseWriter, args []string, c policy.Component) {
	cp := a.c.LookupPolicy(c, args[0], args[1])
	if cp == nil {
		notFound(w)
		return
	}
	writeJSON(w, http.StatusOK, policyJSON(cp))
}

func (a *api) setPolicy(w http.ResponseWriter, r *http.Request, args []string, c policy.Component) {
	if !a.requireVHost(w, args[0]) {
		return
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		badRequest(w, err.Error())
		return
	}
	p, err := policy.ParseBody(args[0], args[1], data)
	if err != nil {
		changeError(w, err)
		return
	}
	existed := a.c.LookupPolicy(c, args[0], args[1]) != nil
	if err := a.c.PutPolicy(r.Context(), c, p); err != nil {
		changeError(w, err)
		return
	}
	a.audit(r, string(c)+" set", "vhost", args[0], "name", args[1])
	putStatus(w, existed)
}

func (a *api) removePolicy(w http.ResponseWriter, r *http.Request, args []string, c policy.Component) {
	if err := a.c.DeletePolicy(r.Context(), c, args[0], args[1]); err != nil {
		changeError(w, err)
		return
	}
	a.audit(r, string(c)+" deleted", "vhost", args[0], "name", args[1])
	w.WriteHeader(http.StatusNoContent)
}

func (a *api) policies(w http.ResponseWriter, r *http.Request, args []string) {
	a.listPolicies(w, r, args, policy.ComponentPolicy)
}
func (a *api) policyItem(w http.ResponseWriter, r *http.Request, args []string) {
	a.getPolicy(w, args, policy.ComponentPolicy)
}
func (a *api) putPolicy(w http.ResponseWriter, r *http.Request, args []string) {
	a.setPolicy(w, r, args, policy.ComponentPolicy)
}
func (a *api) deletePolicy(w http.ResponseWriter, r *http.Request, args []string) {
	a.removePolicy(w, r, args, policy.ComponentPolicy)
}
func (a *api) operatorPolicies(w http.ResponseWriter, r *http.Request, args []string) {
	a.listPolicies(w, r, args, policy.ComponentOperatorPolicy)
}
func (a *api) operatorPolicyItem(w http.ResponseWriter, r *http.Request, args []string) {
	a.getPolicy(w, args, policy.ComponentOperatorPolicy)
}
func (a *api) putOperatorPolicy(w http.ResponseWriter, r *http.Request, args []string) {
	a.setPolicy(w, r, args, policy.ComponentOperatorPolicy)
}
func (a *api) deleteOperatorPolicy(w http.ResponseWriter, r *http.Request, args []string) {
	a.removePolicy(w, r, args, policy.ComponentOperatorPolicy)
}

// --- vhost limits --------------------------------------------------------------------------

func (a *api) vhostLimits(w http.ResponseWriter, r *http.Request, args []string) {
	p := principal(r)
	out := []map[string]any{}
	for _, v := range a.c.VHostInfos() {
		if len(args) > 0 && v.Name != args[0] {
			continue
		}
		if !auth.IsMonitor(p.Tags) && a.c.VHostGrant(p.Name, v.Name) == nil {
			continue
		}
		if l := a.c.VHostLimits(v.Name); len(l) > 0 {
			out = append(out, map[string]any{"vhost": v.Name, "value": l})
		}
	}
	if len(args) > 0 && !a.requireVHost(w, args[0]) {
		return
	}
	writeList(w, r, out)
}

func (a *api) putVHostLimit(w http.ResponseWriter, r *http.Request, args []string) {
	if !a.requireVHost(w, args[0]) {
		return
	}
	m, _, ok := readBody(w, r)
	if !ok {
		return
	}
	if reason := keysMissing(m, "value"); reason != "" {
		badRequest(w, reason)
		return
	}
	num, isNum := m["value"].(json.Number)
	n, err := num.Int64()
	if !isNum || err != nil {
		badRequest(w, fmt.Sprintf("Validation failed\n\n%s is not a valid value for %s: it must be an integer\n", m["value"], args[1]))
		return
	}
	limits := a.c.VHostLimits(args[0])
	if limits == nil {
		limits = map[string]int64{}
	}
	_, existed := limits[args[1]]
	limits[args[1]] = n
	if err := a.c.SetVHostLimits(r.Context(), args[0], limits); err != nil {
		changeError(w, err)
		return
	}
	a.audit(r, "vhost limit set", "vhost", args[0], "limit", args[1], "value", n)
	putStatus(w, existed)
}

func (a *api) deleteVHostLimit(w http.ResponseWriter, r *http.Request, args []string) {
	limits := a.c.VHostLimits(args[0])
	if _, ok := limits[args[1]]; !ok {
		notFound(w)
		return
	}
	delete(limits, args[1])
	if err := a.c.SetVHostLimits(r.Context(), args[0], limits); err != nil {
		changeError(w, err)
		return
	}
	a.audit(r, "vhost limit cleared", "vhost", args[0], "limit", args[1])
	w.WriteHeader(http.StatusNoContent)
}

// --- definitions ---------------------------------------------------------------------------

func (a *api) exportDefinitions(w http.ResponseWriter, r *http.Request, args []string) {
	vhost := ""
	if len(args) > 0 {
		if !a.requireVHost(w, args[0]) {
			return
		}
		vhost = args[0]
	}
	body, err := definitions.Encode(a.c.ExportDefinitions(vhost, a.opt.Version))
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "internal_error", "reason": err.Error()})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-cache")
	if r.URL.Query().Get("download") != "" {
		w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", r.URL.Query().Get("download")))
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// importDefinitions is POST /api/definitions[/{vhost}]: the document is validated whole first
// and refused with 400 and every problem when anything in it is wrong; nothing is imported then.
// Success is 204 as in RabbitMQ, or 200 with {"skipped": [...]} listing what was not imported.
func (a *api) importDefinitions(w http.ResponseWriter, r *http.Request, args []string) {
	vhost := ""
	if len(args) > 0 {
		if !a.requireVHost(w, args[0]) {
			return
		}
		vhost = args[0]
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		badRequest(w, err.Error())
		return
	}
	d, err := definitions.Decode(data, definitions.Options{VHost: vhost})
	if err != nil {
		changeError(w, err)
		return
	}
	skipped, err := a.c.ImportDefinitions(r.Context(), d, vhost)
	if err != nil {
		changeError(w, err)
		return
	}
	a.audit(r, "definitions imported", "vhost", vhost, "skipped", len(skipped))
	if len(skipped) == 0 {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	list := make([]map[string]string, len(skipped))
	for i, s := range skipped {
		list[i] = map[string]string{"path": s.Path, "what": s.What, "reason": s.Reason}
	}
	writeJSON(w, http.StatusOK, map[string]any{"skipped": list})
}

// --- nodes ---------------------------------------------------------------------------------

func (a *api) nodes(w http.ResponseWriter, r *http.Request, args []string) {
	st := a.b.ClusterStatus()
	var out []map[string]any
	names := []string{a.b.NodeName()}
	for _, m := range st.Members {
		if !slices.Contains(names, m.ID) {
			names = append(names, m.ID)
		}
	}
	for _, n := range names {
		running := n == a.b.NodeName()
		for _, m := range st.Members {
			if m.ID == n {
				running = running || m.Up
			}
		}
		node := map[string]any{"name": n, "type": "disc", "running": running, "being_drained": false, "partitions": []string{}}
		if n == a.b.NodeName() {
			a.addNodeUsage(node)
		}
		out = append(out, node)
	}
	if len(args) > 0 {
		for _, n := range out {
			if n["name"] == args[0] {
				writeJSON(w, http.StatusOK, n)
				return
			}
		}
		notFound(w)
		return
	}
	writeList(w, r, out)
}

// addNodeUsage adds this node's memory, disk and process figures, as RabbitMQ's nodes show them.
func (a *api) addNodeUsage(node map[string]any) {
	if al := a.c.Alarms(); al != nil {
		u := al.Usage()
		node["mem_used"], node["mem_limit"], node["mem_alarm"] = u.RSS, u.MemLimit, u.MemoryAlarm
		node["disk_free"], node["disk_free_limit"], node["disk_free_alarm"] = u.DiskFree, u.DiskLimit, u.DiskAlarm
	}
	node["uptime"] = time.Since(a.started).Milliseconds()
	node["proc_used"] = runtime.NumGoroutine()
	node["sockets_used"] = len(a.b.Connections())
	node["run_queue"] = 0
	node["processors"] = runtime.NumCPU()
	node["os_pid"] = strconv.Itoa(os.Getpid())
}

func (a *api) authAttempts(w http.ResponseWriter, r *http.Request, args []string) {
	if args[0] != a.b.NodeName() {
		notFound(w)
		return
	}
	ok, failed := a.c.AuthAttempts()
	writeJSON(w, http.StatusOK, []map[string]any{{"protocol": "amqp091", "auth_attempts": ok + failed,
		"auth_attempts_succeeded": ok, "auth_attempts_failed": failed}})
}
