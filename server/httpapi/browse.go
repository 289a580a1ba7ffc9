package httpapi

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"time"
	"unicode/utf8"

	"warren/server/auth"
	"warren/server/core"
	"warren/server/queue"
)

// Warren's own queue paths (not in RabbitMQ's API), for the web console and for scripts:
//
//	POST /api/queues/{vhost}/{name}/browse   {"count": N, "offset": O, "encoding", "truncate"}
//	     -> the first N ready messages (of a stream: records from offset O, default its first),
//	        in /get's shape plus "id" and "delivery_count"; nothing in the queue changes.
//	POST /api/queues/{vhost}/{name}/redrive  {"ids": [id, ...], "to_source_queue": bool}
//	     -> {"moved", "failed", "results": [{"id", "moved", "exchange", "routing_keys", "error"}]}:
//	        the named dead letters go back to where they first died; the others stay.
//
// Browsing needs read permission on the queue (as /get); a redrive also needs write permission on
// every exchange it publishes to.
func browseRoutes() []route {
	const vh = auth.HTTPVhost
	return []route{
		{"POST", []string{"queues", "*", "*", "browse"}, vh, 0, (*api).browseQueue},
		{"POST", []string{"queues", "*", "*", "redrive"}, vh, 0, (*api).redriveQueue},
	}
}

// maxBrowse bounds one browse: bodies are copied into the answer.
const maxBrowse = 1000

func (a *api) browseQueue(w http.ResponseWriter, r *http.Request, args []string) {
	v, q := a.lookupQueue(w, args[0], args[1])
	if q == nil {
		return
	}
	m, _, ok := readBody(w, r)
	if !ok {
		return
	}
	count := 10
	if _, has := m["count"]; has {
		n, err := intField(m, "count")
		if err != nil || n < 1 || n > maxBrowse {
			badRequest(w, "count must be an integer from 1 to 1000")
			return
		}
		count = n
	}
	var from *uint64
	if _, has := m["offset"]; has {
		n, err := intField(m, "offset")
		if err != nil || n < 0 {
			badRequest(w, "offset must be a non-negative integer")
			return
		}
		o := uint64(n)
		from = &o
	}
	enc := "auto"
	if s, has := strField(m, "encoding"); has {
		enc = s
	}
	if enc != "auto" && enc != "base64" {
		badRequest(w, "encoding must be auto or base64")
		return
	}
	truncate := -1
	if _, has := m["truncate"]; has {
		n, err := intField(m, "truncate")
		if err != nil || n < 0 {
			badRequest(w, "truncate must be a non-negative integer")
			return
		}
		truncate = n
	}
	if err := a.acl(r, v.Name()).Get(q.Name()); err != nil {
		aclError(w, err)
		return
	}
	got, err := q.Browse(count, from)
	if err != nil {
		if errors.Is(err, core.ErrNotBrowsable) {
			badRequest(w, err.Error())
			return
		}
		amqpError(w, queueErr(q, err))
		return
	}
	st := q.Stats()
	out := make([]map[string]any, 0, len(got))
	for i, d := range got {
		left := st.Ready - (i + 1)
		if q.Kind() == "stream" {
			left = int(min(st.LastOffset-min(d.ID, st.LastOffset), math.MaxInt32))
		}
		out = append(out, messageJSON(d, max(left, 0), enc, truncate))
	}
	writeJSON(w, http.StatusOK, out)
}

// messageJSON renders a delivery in the shape of RabbitMQ's /get answer, plus Warren's "id" (the
// message's id in its queue, a stream's offset) and "delivery_count".
func messageJSON(d queue.Delivery, left int, enc string, truncate int) map[string]any {
	body := d.Msg.Body
	size := len(body)
	if truncate >= 0 && len(body) > truncate {
		body = body[:truncate]
	}
	payload, penc := string(body), "string"
	if enc == "base64" || !utf8.Valid(body) {
		payload, penc = base64.StdEncoding.EncodeToString(body), "base64"
	}
	return map[string]any{
		"id": d.ID, "delivery_count": d.DeliveryCount,
		"payload_bytes": size, "redelivered": d.Redelivered, "exchange": d.Msg.Exchange,
		"routing_key": d.Msg.RoutingKey, "message_count": left, "properties": propertiesJSON(d.Msg.Props),
		"payload": payload, "payload_encoding": penc,
	}
}

func (a *api) redriveQueue(w http.ResponseWriter, r *http.Request, args []string) {
	v, q := a.lookupQueue(w, args[0], args[1])
	if q == nil {
		return
	}
	var req struct {
		IDs           []uint64 `json:"ids"`
		ToSourceQueue bool     `json:"to_source_queue"`
	}
	_, raw, ok := readBody(w, r)
	if !ok {
		return
	}
	if err := json.Unmarshal(raw, &req); err != nil || len(req.IDs) == 0 {
		badRequest(w, `the body must be {"ids": [message ids from browse, ...]} with at least one id`)
		return
	}
	if len(req.IDs) > maxBrowse {
		badRequest(w, "at most 1000 ids at a time")
		return
	}
	if q.Kind() == "stream" {
		badRequest(w, "a stream's messages cannot be moved: streams are append-only")
		return
	}
	acl := a.acl(r, v.Name())
	if err := acl.Get(q.Name()); err != nil {
		aclError(w, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 60*time.Second)
	defer cancel()
	results, err := q.Redrive(ctx, req.IDs, core.RedriveOptions{ToSourceQueue: req.ToSourceQueue, Allow: acl.Publish})
	moved, failed := 0, 0
	list := make([]map[string]any, 0, len(results))
	for _, res := range results {
		item := map[string]any{"id": res.ID, "moved": res.Moved, "exchange": res.Exchange, "routing_keys": res.Keys}
		if res.Keys == nil {
			item["routing_keys"] = []string{}
		}
		if res.Moved {
			moved++
		} else {
			failed++
			item["error"] = res.Err.Error()
		}
		list = append(list, item)
	}
	if err != nil && len(results) == 0 {
		amqpError(w, queueErr(q, err))
		return
	}
	a.audit(r, "dead letters redriven", "vhost", v.Name(), "queue", q.Name(), "moved", moved, "failed", failed)
	out := map[string]any{"moved": moved, "failed": failed, "results": list}
	if err != nil {
		out["error"] = err.Error()
	}
	writeJSON(w, http.StatusOK, out)
}
