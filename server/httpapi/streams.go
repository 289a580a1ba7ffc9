package httpapi

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"time"

	"warren/amqp"
	"warren/server/auth"
	"warren/server/core"
)

// The stream paths: RabbitMQ 3.13's stream management paths where they exist (tracking,
// publishers, consumers) and Warren's consumer groups and replication status.
//
//	GET /api/stream/{vhost}/{stream}/tracking             stored offsets and publishers' sequences
//	GET /api/stream/publishers[/{vhost}[/{stream}]]       deduplicating publishers
//	GET /api/stream/consumers[/{vhost}]                   stream consumers on this node, with lag
//	GET /api/stream/consumer-groups/{vhost}/{s}[/{group}] groups: owners, committed offsets, lag
//	PUT /api/stream/consumer-groups/{vhost}/{s}/{group}/offsets  {"offset": "first"|"last"|"next"|N}
//	                                                      or {"timestamp": ms}: move a group's offsets
//	GET /api/stream/status/{vhost}/{stream}               replication status on this node
//
// Access follows RabbitMQ's rule for queues (a management tag and access to the vhost; lists show
// the vhosts the user may see); moving a group's offsets needs the policymaker rule, as changing
// a vhost's parameters does.
func streamRoutes() []route {
	const (
		vh      = auth.HTTPVhost
		pol     = auth.HTTPPolicies
		noVhost = -1
	)
	return []route{
		{"GET", []string{"stream", "publishers"}, vh, noVhost, (*api).streamPublishers},
		{"GET", []string{"stream", "publishers", "*"}, vh, 0, (*api).streamPublishers},
		{"GET", []string{"stream", "publishers", "*", "*"}, vh, 0, (*api).streamPublishers},
		{"GET", []string{"stream", "consumers"}, vh, noVhost, (*api).streamConsumers},
		{"GET", []string{"stream", "consumers", "*"}, vh, 0, (*api).streamConsumers},
		{"GET", []string{"stream", "consumer-groups", "*", "*"}, vh, 0, (*api).consumerGroups},
		{"GET", []string{"stream", "consumer-groups", "*", "*", "*"}, vh, 0, (*api).consumerGroups},
		{"PUT", []string{"stream", "consumer-groups", "*", "*", "*", "offsets"}, pol, 0, (*api).resetGroupOffsets},
		{"GET", []string{"stream", "status", "*", "*"}, vh, 0, (*api).streamStatus},
		{"GET", []string{"stream", "*", "*", "tracking"}, vh, 0, (*api).streamTracking},
	}
}

// visibleVhost reports whether the request's user may list objects of vhost.
func (a *api) visibleVhost(r *http.Request, vhost string) bool {
	p := principal(r)
	return auth.ListsVhostObjects(p.Tags, a.c.VHostGrant(p.Name, vhost) != nil)
}

func (a *api) streamTracking(w http.ResponseWriter, r *http.Request, args []string) {
	offsets, writers, ok := a.b.StreamTracking(args[0], args[1])
	if !ok {
		notFound(w)
		return
	}
	out := map[string]any{}
	switch r.URL.Query().Get("type") {
	case "offset":
		out["offsets"] = offsets
	case "writer":
		out["writers"] = writers
	default:
		out["offsets"], out["writers"] = offsets, writers
	}
	writeJSON(w, http.StatusOK, out)
}

func queueRef(vhost, name string) map[string]string {
	return map[string]string{"name": name, "vhost": vhost}
}

func (a *api) streamPublishers(w http.ResponseWriter, r *http.Request, args []string) {
	if len(args) > 0 && !a.requireVHost(w, args[0]) {
		return
	}
	out := []map[string]any{}
	for _, p := range a.b.StreamPublishers() {
		if len(args) > 0 && p.VHost != args[0] || len(args) > 1 && p.Stream != args[1] || !a.visibleVhost(r, p.VHost) {
			continue
		}
		out = append(out, map[string]any{"reference": p.Reference, "queue": queueRef(p.VHost, p.Stream),
			"sequence": p.Sequence, "publishing_id": p.Sequence})
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *api) streamConsumers(w http.ResponseWriter, r *http.Request, args []string) {
	if len(args) > 0 && !a.requireVHost(w, args[0]) {
		return
	}
	out := []map[string]any{}
	for _, c := range a.b.StreamConsumers() {
		if len(args) > 0 && c.VHost != args[0] || !a.visibleVhost(r, c.VHost) {
			continue
		}
		props := map[string]any{}
		if c.Name != "" {
			props["name"] = c.Name
		}
		out = append(out, map[string]any{"queue": queueRef(c.VHost, c.Stream), "consumer_tag": c.Tag,
			"offset": c.Offset, "offset_lag": c.Lag, "credits": max(c.Prefetch-c.Unacked, 0), "unacked": c.Unacked,
			"active": c.Active, "activity_status": activity(c.Active), "properties": props})
	}
	writeJSON(w, http.StatusOK, out)
}

func activity(active bool) string {
	if active {
		return "single_active"
	}
	return "waiting"
}

func memberJSON(m *core.GroupMemberInfo) any {
	if m == nil {
		return nil
	}
	return map[string]any{"consumer_tag": m.ConsumerTag, "node": m.Node}
}

func groupJSON(g core.GroupInfo) map[string]any {
	members := []any{}
	for _, m := range g.Members {
		members = append(members, memberJSON(&m))
	}
	parts := []any{}
	for _, p := range g.Partitions {
		pj := map[string]any{"partition": p.Partition, "owner": memberJSON(p.Owner), "moving_to": memberJSON(p.MovingTo),
			"committed_offset": nil, "last_offset": nil, "lag": p.Lag}
		if p.HasCommitted {
			pj["committed_offset"] = p.Committed
		}
		if p.HasLast {
			pj["last_offset"] = p.Last
		}
		parts = append(parts, pj)
	}
	return map[string]any{"group": g.Name, "members": members, "partitions": parts}
}

func (a *api) consumerGroups(w http.ResponseWriter, _ *http.Request, args []string) {
	gs, ok := a.b.ConsumerGroups(args[0], args[1])
	if !ok {
		notFound(w)
		return
	}
	if len(args) == 3 {
		for _, g := range gs {
			if g.Name == args[2] {
				writeJSON(w, http.StatusOK, groupJSON(g))
				return
			}
		}
		notFound(w)
		return
	}
	out := []any{}
	for _, g := range gs {
		out = append(out, groupJSON(g))
	}
	writeJSON(w, http.StatusOK, out)
}

// resetGroupOffsets moves a group's offsets: 204, 400 for a bad body, 404, 409 while the group has
// members.
func (a *api) resetGroupOffsets(w http.ResponseWriter, r *http.Request, args []string) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<16))
	if err != nil {
		badRequest(w, "cannot read the request body")
		return
	}
	var req struct {
		Offset    json.RawMessage `json:"offset"`
		Timestamp *int64          `json:"timestamp"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		badRequest(w, "the body must be a JSON object with \"offset\" or \"timestamp\"")
		return
	}
	var spec any
	switch {
	case req.Timestamp != nil:
		spec = time.UnixMilli(*req.Timestamp)
	case len(req.Offset) > 0:
		var s string
		var n int64
		if json.Unmarshal(req.Offset, &s) == nil && (s == "first" || s == "last" || s == "next") {
			spec = s
		} else if json.Unmarshal(req.Offset, &n) == nil && n >= 0 {
			spec = n
		} else {
			badRequest(w, `"offset" must be "first", "last", "next" or a non-negative integer`)
			return
		}
	default:
		badRequest(w, "the body must give \"offset\" or \"timestamp\"")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	if aerr := a.b.ResetGroupOffsets(ctx, args[0], args[1], args[2], spec); aerr != nil {
		switch {
		case aerr == core.ErrGroupHasMembers:
			writeJSON(w, http.StatusConflict, map[string]string{"error": "conflict", "reason": "the consumer group has members: stop them first"})
		case aerr.Code == amqp.NotFound:
			notFound(w)
		case aerr.Code == amqp.PreconditionFailed:
			badRequest(w, aerr.Text)
		default:
			writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "internal_error", "reason": aerr.Text})
		}
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *api) streamStatus(w http.ResponseWriter, _ *http.Request, args []string) {
	st, ok := a.b.StreamStatus(args[0], args[1])
	if !ok {
		notFound(w)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"name": args[1], "vhost": args[0], "role": st.Role, "epoch": st.Epoch,
		"first_offset": st.First, "committed_offset": st.Committed, "written_offset": st.Written, "durable_offset": st.Durable,
		"followers": st.Followers, "voters": st.Voters, "nonvoters": st.Nonvoters, "coordination_leader": st.CoordinationLeader})
}
