// Package httpapi serves Warren's HTTP API: the part of RabbitMQ's management API
// (/api/...) that operators' scripts, monitoring checks and client test suites use, with
// RabbitMQ's paths, JSON field names, status codes and basic authentication.
//
// Served: GET /api/overview, /api/whoami, /api/connections, /api/connections/{name} (and
// DELETE, which closes it with 320 CONNECTION_FORCED), /api/queues[/{vhost}[/{name}]] (with
// policy and effective_policy_definition), /api/exchanges[/{vhost}[/{name}]],
// /api/health/checks/alarms, /api/nodes[/{name}], /api/auth/attempts/{node}; and, with GET, PUT
// and DELETE, /api/users[/{name}[/permissions|/topic-permissions]],
// /api/vhosts[/{name}[/permissions|/topic-permissions]], /api/permissions[/{vhost}/{user}],
// /api/topic-permissions[/{vhost}/{user}], /api/policies[/{vhost}[/{name}]],
// /api/operator-policies[/{vhost}[/{name}]], /api/vhost-limits[/{vhost}[/{name}]]; GET and POST
// /api/definitions[/{vhost}]. Every request authenticates with HTTP Basic as an AMQP login would,
// and each endpoint applies RabbitMQ's tag rule (auth.AuthorizeHTTP).
package httpapi

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"warren/amqp"
	"warren/server"
	"warren/server/auth"
	"warren/server/core"
	"warren/server/netserve"
	"warren/server/tlsconf"
)

// Options configure the API.
type Options struct {
	// Version is the broker's version, reported as product_version.
	Version string
	// Logger receives the API's logs; nil means slog.Default().
	Logger *slog.Logger
	// TLS, if set, serves HTTPS with these certificates (--https-listen); they reload with them.
	TLS *tlsconf.Config
}

// api answers the requests for one broker.
type api struct {
	b       *server.Server
	c       *core.Broker
	opt     Options
	routes  []route
	self    *listener // the HTTP listener serving this API (Listen), for the overview and checks
	started time.Time // for the nodes' uptime
}

// route is one endpoint: a method and the path's segments after /api/, where "*" takes any
// one segment and hands it, unescaped, to the handler; access is RabbitMQ's authorisation rule
// for it, and vhostArg the index of the argument that names a vhost (-1: none).
type route struct {
	method   string
	pattern  []string
	access   auth.HTTPAccess
	vhostArg int
	handle   func(a *api, w http.ResponseWriter, r *http.Request, args []string)
}

// apiRoutes are the endpoints, matched in order. Paths are split by hand rather than with
// http.ServeMux because RabbitMQ's paths carry the vhost as one segment, and the default vhost
// "/" arrives as %2F, which ServeMux does not match as a segment.
func apiRoutes() []route {
	const (
		any     = auth.HTTPAny
		admin   = auth.HTTPAdministrator
		mon     = auth.HTTPMonitor
		vh      = auth.HTTPVhost
		vis     = auth.HTTPVhostVisible
		pol     = auth.HTTPPolicies
		owner   = auth.HTTPOwner
		noVhost = -1
	)
	return append([]route{
		{"GET", []string{"overview"}, any, noVhost, (*api).overview},
		{"GET", []string{"whoami"}, any, noVhost, (*api).whoami},
		{"GET", []string{"vhosts"}, any, noVhost, (*api).vhosts},
		{"GET", []string{"vhosts", "*"}, admin, 0, (*api).vhost},
		{"PUT", []string{"vhosts", "*"}, admin, noVhost, (*api).putVHost},
		{"DELETE", []string{"vhosts", "*"}, admin, 0, (*api).deleteVHost},
		{"GET", []string{"vhosts", "*", "permissions"}, admin, 0, (*api).vhostPermissions},
		{"GET", []string{"vhosts", "*", "topic-permissions"}, admin, 0, (*api).vhostTopicPermissions},
		{"GET", []string{"users"}, admin, noVhost, (*api).users},
		{"GET", []string{"users", "*"}, admin, noVhost, (*api).user},
		{"PUT", []string{"users", "*"}, admin, noVhost, (*api).putUser},
		{"DELETE", []string{"users", "*"}, admin, noVhost, (*api).deleteUser},
		{"GET", []string{"users", "*", "permissions"}, admin, noVhost, (*api).userPermissions},
		{"GET", []string{"users", "*", "topic-permissions"}, admin, noVhost, (*api).userTopicPermissions},
		{"GET", []string{"permissions"}, admin, noVhost, (*api).permissions},
		{"GET", []string{"permissions", "*", "*"}, admin, 0, (*api).permission},
		{"PUT", []string{"permissions", "*", "*"}, admin, 0, (*api).putPermission},
		{"DELETE", []string{"permissions", "*", "*"}, admin, 0, (*api).deletePermission},
		{"GET", []string{"topic-permissions"}, admin, noVhost, (*api).topicPermissions},
		{"GET", []string{"topic-permissions", "*", "*"}, admin, 0, (*api).topicPermission},
		{"PUT", []string{"topic-permissions", "*", "*"}, admin, 0, (*api).putTopicPermission},
		{"DELETE", []string{"topic-permissions", "*", "*"}, admin, 0, (*api).deleteTopicPermission},
		{"DELETE", []string{"topic-permissions", "*", "*", "*"}, admin, 0, (*api).deleteTopicPermission},
		{"GET", []string{"policies"}, vh, noVhost, (*api).policies},
		{"GET", []string{"policies", "*"}, vh, 0, (*api).policies},
		{"GET", []string{"policies", "*", "*"}, pol, 0, (*api).policyItem},
		{"PUT", []string{"policies", "*", "*"}, pol, 0, (*api).putPolicy},
		{"DELETE", []string{"policies", "*", "*"}, pol, 0, (*api).deletePolicy},
		{"GET", []string{"operator-policies"}, vh, noVhost, (*api).operatorPolicies},
		{"GET", []string{"operator-policies", "*"}, vh, 0, (*api).operatorPolicies},
		{"GET", []string{"operator-policies", "*", "*"}, admin, 0, (*api).operatorPolicyItem},
		{"PUT", []string{"operator-policies", "*", "*"}, admin, 0, (*api).putOperatorPolicy},
		{"DELETE", []string{"operator-policies", "*", "*"}, admin, 0, (*api).deleteOperatorPolicy},
		{"GET", []string{"vhost-limits"}, vis, noVhost, (*api).vhostLimits},
		{"GET", []string{"vhost-limits", "*"}, vis, 0, (*api).vhostLimits},
		{"PUT", []string{"vhost-limits", "*", "*"}, admin, 0, (*api).putVHostLimit},
		{"DELETE", []string{"vhost-limits", "*", "*"}, admin, 0, (*api).deleteVHostLimit},
		{"GET", []string{"definitions"}, admin, noVhost, (*api).exportDefinitions},
		{"GET", []string{"definitions", "*"}, admin, 0, (*api).exportDefinitions},
		{"POST", []string{"definitions"}, admin, noVhost, (*api).importDefinitions},
		{"POST", []string{"definitions", "*"}, admin, 0, (*api).importDefinitions},
		{"GET", []string{"nodes"}, mon, noVhost, (*api).nodes},
		{"GET", []string{"nodes", "*"}, mon, noVhost, (*api).nodes},
		{"GET", []string{"auth", "attempts", "*"}, mon, noVhost, (*api).authAttempts},
		{"GET", []string{"connections"}, any, noVhost, (*api).connections},
		{"GET", []string{"connections", "*"}, owner, noVhost, (*api).connection},
		{"DELETE", []string{"connections", "*"}, owner, noVhost, (*api).closeConnection},
		{"GET", []string{"queues"}, vh, noVhost, (*api).queues},
		{"GET", []string{"queues", "*"}, vh, 0, (*api).queues},
		{"GET", []string{"queues", "*", "*"}, vh, 0, (*api).queue},
		{"GET", []string{"exchanges"}, vh, noVhost, (*api).exchanges},
		{"GET", []string{"exchanges", "*"}, vh, 0, (*api).exchanges},
		{"GET", []string{"exchanges", "*", "*"}, vh, 0, (*api).exchange},
		{"GET", []string{"health", "checks", "alarms"}, any, noVhost, (*api).alarms},
	}, memberRoutes()...)
}

// Handler returns the API's handler for broker b.
func Handler(b *server.Server, opt Options) http.Handler {
	return newAPI(b, opt)
}

func newAPI(b *server.Server, opt Options) *api {
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	return &api{b: b, c: b.Core(), opt: opt, routes: slices.Concat(apiRoutes(), streamRoutes(), manageRoutes(), browseRoutes()), started: time.Now()}
}

// ServeHTTP serves the API under /api/ and the web console everywhere else.
func (a *api) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.HasPrefix(r.URL.Path, "/api/") {
		serveConsole(w, r)
		return
	}
	a.serve(w, r)
}

// principalKey is the request context's key for the authenticated user.
type principalKey struct{}

// cacheKey is the connection context's key for its password-check cache.
type cacheKey struct{}

// connCache is one HTTP connection's password-check cache (HTTP/2 may run its requests at once).
type connCache struct {
	mu sync.Mutex
	c  auth.Cache
}

// ConnContext gives each HTTP connection its password-check cache: a client that sends the same
// Basic credentials on every request of a keep-alive connection costs one hash, not one per
// request.
func ConnContext(ctx context.Context, _ net.Conn) context.Context {
	return context.WithValue(ctx, cacheKey{}, &connCache{})
}

func (a *api) serve(w http.ResponseWriter, r *http.Request) {
	p, err := a.authenticate(r)
	if err != nil {
		// A script's request (the web console's, marked as XHR libraries mark them) gets no
		// challenge, so the browser does not open its own login dialog over the page's.
		if r.Header.Get("X-Requested-With") != "XMLHttpRequest" {
			w.Header().Set("WWW-Authenticate", `Basic realm="RabbitMQ Management"`)
		}
		reason := "Login failed"
		var le *auth.LoginError
		if errors.As(err, &le) && strings.Contains(le.Reason, "can only connect via localhost") {
			reason = "User can only log in via localhost"
		}
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "not_authorized", "reason": reason})
		return
	}
	segs, ok := apiSegments(r.URL.EscapedPath())
	if !ok {
		notFound(w)
		return
	}
	var allowed []string
	for _, rt := range a.routes {
		args, ok := rt.match(segs)
		if !ok {
			continue
		}
		if rt.method == r.Method || (rt.method == "GET" && r.Method == "HEAD") {
			req := auth.HTTPRequest{User: p.Name, Tags: p.Tags, Method: r.Method}
			if rt.vhostArg >= 0 && rt.vhostArg < len(args) {
				if _, exists := a.c.LookupVHost(args[rt.vhostArg]); exists {
					req.Vhost = args[rt.vhostArg]
					req.VhostAccess = a.c.VHostGrant(p.Name, req.Vhost) != nil
				}
			}
			if rt.access == auth.HTTPOwner && len(args) > 0 {
				if c, ok := a.findConnection(args[0]); ok {
					req.Owner = c.User
				}
			}
			if err := auth.AuthorizeHTTP(rt.access, req); err != nil {
				var he *auth.HTTPError
				if errors.As(err, &he) {
					writeJSON(w, he.Status, map[string]string{"error": he.Err, "reason": he.Reason})
					return
				}
				writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "not_authorised", "reason": err.Error()})
				return
			}
			ctx := context.WithValue(r.Context(), principalKey{}, p)
			ctx = core.WithActor(ctx, core.Actor{User: p.Name, Via: "http", Peer: r.RemoteAddr})
			rt.handle(a, w, r.WithContext(ctx), args)
			return
		}
		allowed = append(allowed, rt.method)
	}
	if len(allowed) > 0 {
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "method_not_allowed", "reason": "Method Not Allowed"})
		return
	}
	notFound(w)
}

// principal is the request's authenticated user.
func principal(r *http.Request) core.Principal {
	p, _ := r.Context().Value(principalKey{}).(core.Principal)
	return p
}

// apiSegments splits an escaped path below /api/ into unescaped segments; a trailing slash is
// dropped, as RabbitMQ accepts both forms.
func apiSegments(escaped string) ([]string, bool) {
	rest, ok := strings.CutPrefix(escaped, "/api/")
	if !ok {
		return nil, false
	}
	rest = strings.TrimSuffix(rest, "/")
	if rest == "" {
		return nil, false
	}
	segs := strings.Split(rest, "/")
	for i, s := range segs {
		u, err := url.PathUnescape(s)
		if err != nil {
			return nil, false
		}
		segs[i] = u
	}
	return segs, true
}

func (rt route) match(segs []string) ([]string, bool) {
	if len(segs) != len(rt.pattern) {
		return nil, false
	}
	var args []string
	for i, p := range rt.pattern {
		switch {
		case p == "*":
			args = append(args, segs[i])
		case p != segs[i]:
			return nil, false
		}
	}
	return args, true
}

// authenticate checks the request's basic-auth credentials as an AMQP login from the same
// address would be checked.
func (a *api) authenticate(r *http.Request) (core.Principal, error) {
	user, pass, ok := r.BasicAuth()
	if !ok {
		return core.Principal{}, errors.New("no credentials")
	}
	host, port, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return core.Principal{}, err
	}
	pn, _ := strconv.Atoi(port)
	remote := &net.TCPAddr{IP: net.ParseIP(host), Port: pn}
	if cc, ok := r.Context().Value(cacheKey{}).(*connCache); ok {
		cc.mu.Lock()
		defer cc.mu.Unlock()
		return a.b.Authenticate(user, pass, remote, &cc.c)
	}
	return a.b.Authenticate(user, pass, remote, nil)
}

func (a *api) overview(w http.ResponseWriter, r *http.Request, args []string) {
	conns := a.b.Connections()
	channels := 0
	for _, c := range conns {
		channels += c.Channels
	}
	queues := a.b.Queues()
	var ready, unacked, consumers int
	for _, q := range queues {
		if q.Type == "stream" {
			ready += queueMessageCount(q)
		} else {
			ready += q.Ready
		}
		unacked += q.Unacked
		consumers += q.Consumers
	}
	ms, churn := overviewStats(a.c.Stats().Global())
	listeners := []map[string]any{}
	for _, l := range a.listeners() {
		listeners = append(listeners, listenerJSON(a.b.NodeName(), l))
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"product_name":              "Warren",
		"product_version":           a.opt.Version,
		"rabbitmq_version":          rabbitmqVersion,
		"management_version":        rabbitmqVersion,
		"rates_mode":                "basic",
		"statistics_db_event_queue": 0,
		"node":                      a.b.NodeName(),
		"cluster_name":              a.b.NodeName(),
		"message_stats":             ms,
		"churn_rates":               churn,
		"object_totals": map[string]int{
			"connections": len(conns),
			"channels":    channels,
			"queues":      len(queues),
			"exchanges":   len(a.b.Exchanges()),
			"consumers":   consumers,
		},
		"queue_totals": map[string]any{
			"messages":                        ready + unacked,
			"messages_ready":                  ready,
			"messages_unacknowledged":         unacked,
			"messages_details":                rate(0),
			"messages_ready_details":          rate(0),
			"messages_unacknowledged_details": rate(0),
		},
		"listeners":                 listeners,
		"contexts":                  []any{},
		"sample_retention_policies": map[string][]int{"global": {600, 3600, 28800, 86400}, "basic": {600, 3600}, "detailed": {600}},
	})
}

// rabbitmqVersion is the RabbitMQ release whose management API Warren's answers follow (tools
// read rabbitmq_version to choose features).
const rabbitmqVersion = "3.10.8"

func (a *api) whoami(w http.ResponseWriter, r *http.Request, args []string) {
	p := principal(r)
	tags := p.Tags
	if tags == nil {
		tags = []string{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"name": p.Name, "tags": tags})
}

func (a *api) connections(w http.ResponseWriter, r *http.Request, args []string) {
	p := principal(r)
	out := []map[string]any{}
	for _, c := range a.b.Connections() {
		if c.User == p.Name || auth.SeesOthersConnections(p.Tags) {
			out = append(out, a.connectionJSON(c))
		}
	}
	writeList(w, r, out)
}

func (a *api) findConnection(name string) (server.ConnectionInfo, bool) {
	for _, c := range a.b.Connections() {
		if c.Name == name {
			return c, true
		}
	}
	return server.ConnectionInfo{}, false
}

func (a *api) connection(w http.ResponseWriter, r *http.Request, args []string) {
	c, ok := a.findConnection(args[0])
	if !ok {
		notFound(w)
		return
	}
	writeJSON(w, http.StatusOK, a.connectionJSON(c))
}

// closeConnection closes a connection; the X-Reason header, as in RabbitMQ, becomes the
// close's reply text.
func (a *api) closeConnection(w http.ResponseWriter, r *http.Request, args []string) {
	name := args[0]
	if !a.b.CloseConnection(name, r.Header.Get("X-Reason")) {
		notFound(w)
		return
	}
	user, _, _ := r.BasicAuth()
	a.opt.Logger.Info("connection closed through the HTTP API", "connection", name, "reason", r.Header.Get("X-Reason"), "user", user, "from", r.RemoteAddr)
	w.WriteHeader(http.StatusNoContent)
}

func (a *api) connectionJSON(c server.ConnectionInfo) map[string]any {
	peerHost, peerPort := splitAddr(c.Peer)
	host, port := splitAddr(c.Local)
	return map[string]any{
		"name":              c.Name,
		"node":              a.b.NodeName(),
		"type":              "network",
		"state":             c.State,
		"protocol":          "AMQP 0-9-1",
		"user":              c.User,
		"vhost":             c.VHost,
		"peer_host":         peerHost,
		"peer_port":         peerPort,
		"host":              host,
		"port":              port,
		"channels":          c.Channels,
		"channel_max":       c.ChannelMax,
		"frame_max":         c.FrameMax,
		"timeout":           int(c.Heartbeat / time.Second),
		"connected_at":      c.ConnectedAt.UnixMilli(),
		"client_properties": tableJSON(c.ClientProperties),
	}
}

func splitAddr(addr string) (string, int) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr, 0
	}
	p, _ := strconv.Atoi(port)
	return host, p
}

// queues lists every queue, or a vhost's queues when the path names one.
func (a *api) queues(w http.ResponseWriter, r *http.Request, args []string) {
	node := a.b.NodeName()
	listInVhost(a, w, r, args, a.b.Queues(), func(q server.QueueInfo) string { return q.VHost },
		func(q server.QueueInfo) object { return queueObject(q, node) })
}

func (a *api) queue(w http.ResponseWriter, r *http.Request, args []string) {
	q, ok := a.b.Queue(args[0], args[1])
	if !ok {
		notFound(w)
		return
	}
	writeJSON(w, http.StatusOK, queueObject(q, a.b.NodeName()))
}

// listInVhost writes items as JSON, all of them or, when args names a vhost, those in it; an
// unknown vhost is 404, as in RabbitMQ. Only the items the user may see are built.
func listInVhost[T any, O map[string]any | object](a *api, w http.ResponseWriter, r *http.Request, args []string, items []T, vhostOf func(T) string, view func(T) O) {
	if len(args) > 0 && !a.requireVHost(w, args[0]) {
		return
	}
	p := principal(r)
	sees := map[string]bool{} // by vhost, for this request
	out := make([]O, 0, len(items))
	for _, it := range items {
		vhost := vhostOf(it)
		if len(args) > 0 && vhost != args[0] {
			continue
		}
		ok, known := sees[vhost]
		if !known {
			ok = auth.ListsVhostObjects(p.Tags, a.c.VHostGrant(p.Name, vhost) != nil)
			sees[vhost] = ok
		}
		if ok {
			out = append(out, view(it))
		}
	}
	writeList(w, r, out)
}

// queueObject is a queue as RabbitMQ's API shows it, on node (a quorum queue's leader instead
// when it has one).
func queueObject(q server.QueueInfo, node string) object {
	msgs := queueMessageCount(q)
	ready := q.Ready
	if q.Type == "stream" {
		ready = msgs
	}
	// In key order (see object.sorted); the fields of streams and quorum queues are sorted in.
	n := 24
	if q.Type == "stream" {
		n += 4
	}
	if q.Members != nil {
		n += 3
	}
	out := make(object, 0, n)
	out = append(out,
		field{"arguments", tableJSON(q.Arguments)},
		field{"auto_delete", q.AutoDelete},
		field{"consumer_utilisation", nil},
		field{"consumers", q.Consumers},
		field{"durable", q.Durable},
		field{"effective_policy_definition", q.EffectivePolicyDefinition},
		field{"exclusive", q.Exclusive},
		field{"exclusive_consumer_tag", nil},
		field{"memory", q.Stats.ReadyBytes},
		field{"message_bytes_ready", q.Stats.ReadyBytes},
		field{"message_stats", trafficObject(q.Traffic)},
		field{"messages", msgs},
		field{"messages_details", rateDetail(0)},
		field{"messages_ready", ready},
		field{"messages_ready_details", rateDetail(0)},
		field{"messages_unacknowledged", q.Unacked},
		field{"messages_unacknowledged_details", rateDetail(0)},
		field{"name", q.Name},
		field{"node", node},
		field{"operator_policy", nullable(q.OperatorPolicy)},
		field{"policy", nullable(q.Policy)},
		field{"state", "running"},
		field{"type", q.Type},
		field{"vhost", q.VHost},
	)
	if q.Type == "stream" {
		out = append(out,
			field{"first_offset", q.Stats.FirstOffset},
			field{"last_offset", q.Stats.LastOffset},
			field{"segments", q.Stats.Segments},
			field{"message_bytes", q.Stats.Bytes})
		out.set("memory", 0)
	}
	if m := q.Members; m != nil {
		membersJSON(&out, *m)
	}
	return out.sorted()
}

// nullable is a name the API shows as null when empty.
func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// exchanges lists every exchange, or a vhost's exchanges when the path names one.
func (a *api) exchanges(w http.ResponseWriter, r *http.Request, args []string) {
	listInVhost(a, w, r, args, a.b.Exchanges(), func(e server.ExchangeInfo) string { return e.VHost }, exchangeJSON)
}

func (a *api) exchange(w http.ResponseWriter, r *http.Request, args []string) {
	// RabbitMQ names the default exchange "amq.default" in paths.
	name := args[1]
	if name == "amq.default" {
		name = ""
	}
	for _, e := range a.b.Exchanges() {
		if e.VHost == args[0] && e.Name == name {
			writeJSON(w, http.StatusOK, exchangeJSON(e))
			return
		}
	}
	notFound(w)
}

func exchangeJSON(e server.ExchangeInfo) map[string]any {
	return map[string]any{
		"policy":      nullable(e.Policy),
		"name":        e.Name,
		"vhost":       e.VHost,
		"type":        e.Type,
		"durable":     e.Durable,
		"auto_delete": e.AutoDelete,
		"internal":    e.Internal,
		"arguments":   tableJSON(e.Arguments),
	}
}

// requireVHost reports whether the vhost a path names exists, answering 404 when it does not.
func (a *api) requireVHost(w http.ResponseWriter, name string) bool {
	if !a.vhostExists(name) {
		notFound(w)
		return false
	}
	return true
}

// requireUser reports whether the user a path names exists, answering 404 when it does not.
func (a *api) requireUser(w http.ResponseWriter, name string) bool {
	if _, ok := a.c.LookupUser(name); !ok {
		notFound(w)
		return false
	}
	return true
}

func (a *api) vhostExists(name string) bool {
	for _, v := range a.b.VHosts() {
		if v == name {
			return true
		}
	}
	return false
}

// alarms is RabbitMQ's health check: 200 when no resource alarm is raised, 503 listing them.
func (a *api) alarms(w http.ResponseWriter, r *http.Request, args []string) {
	raised := a.b.Alarms()
	if len(raised) == 0 {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		return
	}
	list := make([]map[string]string, len(raised))
	for i, res := range raised {
		list[i] = map[string]string{"node": a.b.NodeName(), "resource": res}
	}
	writeJSON(w, http.StatusServiceUnavailable, map[string]any{
		"status": "failed", "reason": "There are alarms in effect in the cluster", "alarms": list,
	})
}

func notFound(w http.ResponseWriter) {
	writeJSON(w, http.StatusNotFound, map[string]string{"error": "Object Not Found", "reason": "Not Found"})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	e, err := encodeJSON(v)
	if err != nil {
		status = http.StatusInternalServerError
		e = &jsonEncoder{buf: []byte(`{"error":"internal_error","reason":"cannot encode the response"}`)}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("Content-Length", strconv.Itoa(e.size()))
	w.WriteHeader(status)
	for _, c := range e.chunks {
		if _, err := w.Write(c); err != nil {
			return
		}
	}
	_, _ = w.Write(e.buf)
}

// tableJSON turns an AMQP table into what encoding/json can write, the way RabbitMQ renders
// one: byte arrays and long strings as strings, decimals and timestamps as numbers.
func tableJSON(t amqp.Table) map[string]any {
	out := make(map[string]any, len(t))
	for k, v := range t {
		out[k] = valueJSON(v)
	}
	return out
}

func valueJSON(v any) any {
	switch v := v.(type) {
	case amqp.Table:
		return tableJSON(v)
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = valueJSON(e)
		}
		return out
	case []byte:
		return string(v)
	case amqp.Decimal:
		return float64(v.Value) / math.Pow10(int(v.Scale))
	case time.Time:
		return v.Unix()
	case float32:
		return finite(float64(v))
	case float64:
		return finite(v)
	}
	return v
}

// finite keeps NaN and infinities, which JSON has no numbers for, as strings.
func finite(f float64) any {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return strconv.FormatFloat(f, 'g', -1, 64)
	}
	return f
}

// Listener is the API served on a TCP address.
type Listener = netserve.HTTPListener

// Listen serves the API for broker b on addr until Shutdown.
func Listen(addr string, b *server.Server, opt Options) (*Listener, error) {
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("HTTP API: listen on %s: %w", addr, err)
	}
	h := newAPI(b, opt)
	h.self = &listener{Protocol: "http", Addr: ln.Addr().String()}
	if opt.TLS != nil {
		h.self.Protocol = "https"
		ln = tls.NewListener(ln, opt.TLS.TLSConfig())
	}
	return netserve.ServeHTTP("HTTP API", ln, h, opt.Logger, ConnContext), nil
}
