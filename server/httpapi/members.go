package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"

	"warren/server/auth"
	"warren/server/core"
)

// This file is the membership part of the management API, with RabbitMQ's paths (its
// management plugin's quorum queue replica endpoints and rebalance), administrators only:
//
//	POST   /api/queues/quorum/{vhost}/{name}/replicas/add      {"node": "n4"}   add_member
//	DELETE /api/queues/quorum/{vhost}/{name}/replicas/delete   {"node": "n4"}   delete_member (POST too)
//	POST   /api/queues/quorum/replicas/on/{node}/grow          {"strategy": "all"|"even",
//	                                                            "vhost_pattern": ".*", "queue_pattern": ".*"}
//	DELETE /api/queues/quorum/replicas/on/{node}/shrink                          shrink
//	POST   /api/rebalance/queues                                                  rebalance quorum leaders
//
// Each answers 204 once the change is made; a request naming what is not there 404 or 400 with
// the reason; a change the cluster could not make 503. A quorum queue's object in
// /api/queues carries leader, members and online as RabbitMQ's does.

// memberRequestTimeout bounds a whole grow, shrink or rebalance request.
const memberRequestTimeout = 5 * time.Minute

func memberRoutes() []route {
	const admin, noVhost = auth.HTTPAdministrator, -1
	return []route{
		{"POST", []string{"queues", "quorum", "replicas", "on", "*", "grow"}, admin, noVhost, (*api).growMembers},
		{"DELETE", []string{"queues", "quorum", "replicas", "on", "*", "shrink"}, admin, noVhost, (*api).shrinkMembers},
		{"POST", []string{"queues", "quorum", "*", "*", "replicas", "add"}, admin, 0, (*api).addMember},
		{"DELETE", []string{"queues", "quorum", "*", "*", "replicas", "delete"}, admin, 0, (*api).deleteMember},
		{"POST", []string{"queues", "quorum", "*", "*", "replicas", "delete"}, admin, 0, (*api).deleteMember},
		{"POST", []string{"rebalance", "queues"}, admin, noVhost, (*api).rebalance},
	}
}

// membersJSON adds a quorum queue's leader, members and online nodes to its object; node is the
// leader's, as RabbitMQ shows it.
func membersJSON(out *object, m core.QueueMembers) {
	members, online := m.Members, m.Online
	if members == nil {
		members = []string{}
	}
	if online == nil {
		online = []string{}
	}
	out.set("members", members)
	out.set("online", online)
	out.set("leader", nullable(m.Leader))
	if m.Leader != "" {
		out.set("node", m.Leader)
	}
}

// bodyNode reads the "node" field of a replica request.
func bodyNode(w http.ResponseWriter, r *http.Request) (string, bool) {
	body, _, ok := readBody(w, r)
	if !ok {
		return "", false
	}
	node, _ := body["node"].(string)
	if node == "" {
		badRequest(w, "node is required")
		return "", false
	}
	return node, true
}

func (a *api) addMember(w http.ResponseWriter, r *http.Request, args []string) {
	node, ok := bodyNode(w, r)
	if !ok {
		return
	}
	memberResult(w, a.c.AddQueueMember(r.Context(), args[0], args[1], node))
}

func (a *api) deleteMember(w http.ResponseWriter, r *http.Request, args []string) {
	node, ok := bodyNode(w, r)
	if !ok {
		return
	}
	memberResult(w, a.c.DeleteQueueMember(r.Context(), args[0], args[1], node))
}

func (a *api) growMembers(w http.ResponseWriter, r *http.Request, args []string) {
	body, _, ok := readBody(w, r)
	if !ok {
		return
	}
	strategy, _ := body["strategy"].(string)
	if strategy == "" {
		strategy = string(core.GrowAll)
	}
	var patterns [2]*regexp.Regexp
	for i, k := range []string{"vhost_pattern", "queue_pattern"} {
		s, _ := body[k].(string)
		if s == "" {
			continue
		}
		re, err := regexp.Compile(s)
		if err != nil {
			badRequest(w, fmt.Sprintf("%s: %v", k, err))
			return
		}
		patterns[i] = re
	}
	ctx, cancel := context.WithTimeout(r.Context(), memberRequestTimeout)
	defer cancel()
	changes, err := a.c.GrowQueues(ctx, args[0], core.GrowStrategy(strategy), patterns[0], patterns[1])
	changesResult(w, changes, err)
}

func (a *api) shrinkMembers(w http.ResponseWriter, r *http.Request, args []string) {
	ctx, cancel := context.WithTimeout(r.Context(), memberRequestTimeout)
	defer cancel()
	changes, err := a.c.ShrinkQueues(ctx, args[0])
	changesResult(w, changes, err)
}

func (a *api) rebalance(w http.ResponseWriter, r *http.Request, args []string) {
	ctx, cancel := context.WithTimeout(r.Context(), memberRequestTimeout)
	defer cancel()
	_, err := a.c.RebalanceLeaders(ctx)
	memberResult(w, err)
}

// memberResult answers a membership change: 204, or the refusal or failure.
func memberResult(w http.ResponseWriter, err error) {
	var me *core.MemberError
	switch {
	case err == nil:
		w.WriteHeader(http.StatusNoContent)
	case errors.As(err, &me) && me.NotFound:
		notFound(w)
	case errors.As(err, &me):
		badRequest(w, me.Text)
	default:
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "internal_error", "reason": err.Error()})
	}
}

// changesResult answers a grow or shrink: 204 when every queue changed, otherwise the first
// refusal (400) or failure (503) with every failed queue named in the reason.
func changesResult(w http.ResponseWriter, changes []core.MemberChange, err error) {
	if err != nil {
		memberResult(w, err)
		return
	}
	var failed []string
	var first error
	for _, c := range changes {
		if c.Err != nil {
			failed = append(failed, c.Err.Error())
			if first == nil {
				first = c.Err
			}
		}
	}
	if first == nil {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	reason := strings.Join(failed, "; ")
	var me *core.MemberError
	if errors.As(first, &me) {
		badRequest(w, reason)
		return
	}
	writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "internal_error", "reason": reason})
}
