package httpapi

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"warren/amqp"
	"warren/exchange"
	"warren/server"
	"warren/server/auth"
	"warren/server/core"
	"warren/server/definitions"
	"warren/server/queue"
	"warren/server/stats"
)

// This file is the management API of messaging objects: declaring and deleting exchanges,
// queues and bindings, publishing, getting and purging messages, channels and consumers, and
// message_stats with rates, with RabbitMQ's paths, bodies and status codes. Changes check the
// user's permissions in the vhost as the same operation over AMQP would.

func manageRoutes() []route {
	const (
		vh      = auth.HTTPVhost
		mon     = auth.HTTPMonitor
		any     = auth.HTTPAny
		admin   = auth.HTTPAdministrator
		noVhost = -1
	)
	return []route{
		{"PUT", []string{"exchanges", "*", "*"}, vh, 0, (*api).putExchange},
		{"DELETE", []string{"exchanges", "*", "*"}, vh, 0, (*api).deleteExchange},
		{"POST", []string{"exchanges", "*", "*", "publish"}, vh, 0, (*api).publish},
		{"GET", []string{"exchanges", "*", "*", "bindings", "source"}, vh, 0, (*api).exchangeBindingsSource},
		{"GET", []string{"exchanges", "*", "*", "bindings", "destination"}, vh, 0, (*api).exchangeBindingsDestination},
		{"PUT", []string{"queues", "*", "*"}, vh, 0, (*api).putQueue},
		{"DELETE", []string{"queues", "*", "*"}, vh, 0, (*api).deleteQueue},
		{"DELETE", []string{"queues", "*", "*", "contents"}, vh, 0, (*api).purgeQueue},
		{"POST", []string{"queues", "*", "*", "get"}, vh, 0, (*api).getMessages},
		{"GET", []string{"queues", "*", "*", "bindings"}, vh, 0, (*api).queueBindings},
		{"GET", []string{"bindings"}, vh, noVhost, (*api).bindings},
		{"GET", []string{"bindings", "*"}, vh, 0, (*api).bindings},
		{"GET", []string{"bindings", "*", "e", "*", "*", "*"}, vh, 0, (*api).bindingsBetween},
		{"POST", []string{"bindings", "*", "e", "*", "*", "*"}, vh, 0, (*api).postBinding},
		{"GET", []string{"bindings", "*", "e", "*", "*", "*", "*"}, vh, 0, (*api).binding},
		{"DELETE", []string{"bindings", "*", "e", "*", "*", "*", "*"}, vh, 0, (*api).deleteBinding},
		{"GET", []string{"channels"}, any, noVhost, (*api).channels},
		{"GET", []string{"channels", "*"}, any, noVhost, (*api).channel},
		{"GET", []string{"vhosts", "*", "channels"}, vh, 0, (*api).channels},
		{"GET", []string{"connections", "*", "channels"}, any, noVhost, (*api).connectionChannels},
		{"GET", []string{"vhosts", "*", "connections"}, vh, 0, (*api).vhostConnections},
		{"GET", []string{"consumers"}, any, noVhost, (*api).consumers},
		{"GET", []string{"consumers", "*"}, vh, 0, (*api).consumers},
		{"GET", []string{"parameters"}, pol(), noVhost, (*api).emptyList},
		{"GET", []string{"parameters", "*"}, pol(), noVhost, (*api).emptyList},
		{"GET", []string{"parameters", "*", "*"}, pol(), noVhost, (*api).emptyList},
		{"GET", []string{"parameters", "*", "*", "*"}, pol(), noVhost, (*api).noParameter},
		{"GET", []string{"global-parameters"}, admin, noVhost, (*api).globalParameters},
		{"GET", []string{"extensions"}, any, noVhost, (*api).emptyList},
		{"GET", []string{"health", "checks", "local-alarms"}, any, noVhost, (*api).alarms},
		{"GET", []string{"health", "checks", "virtual-hosts"}, any, noVhost, (*api).checkVHosts},
		{"GET", []string{"health", "checks", "port-listener", "*"}, any, noVhost, (*api).checkPort},
		{"GET", []string{"health", "checks", "protocol-listener", "*"}, any, noVhost, (*api).checkProtocol},
		{"GET", []string{"health", "checks", "node-is-quorum-critical"}, any, noVhost, (*api).checkQuorumCritical},
		{"GET", []string{"health", "checks", "node-is-mirror-sync-critical"}, any, noVhost, (*api).ok},
		{"GET", []string{"health", "checks", "certificate-expiration", "*", "*"}, any, noVhost, (*api).checkCertificates},
		{"GET", []string{"aliveness-test", "*"}, vh, 0, (*api).aliveness},
		{"GET", []string{"cluster-name"}, any, noVhost, (*api).clusterName},
		{"GET", []string{"vhosts", "*", "definitions"}, admin, 0, (*api).exportDefinitions},
		{"GET", []string{"queues", "*", "*", "stats"}, mon, 0, (*api).queue},
	}
}

// pol is the access rule of runtime parameters: policymaker or administrator, as RabbitMQ's.
func pol() auth.HTTPAccess { return auth.HTTPPolicies }

// --- errors and helpers --------------------------------------------------------------------

// amqpError answers an operation the broker refused, as RabbitMQ's management API reports the
// channel error of the same operation: 404 for NOT_FOUND, 401 for ACCESS_REFUSED, otherwise 400
// with the code and text.
func amqpError(w http.ResponseWriter, err error) {
	var ae *amqp.Error
	if !errors.As(err, &ae) {
		if errors.Is(err, core.ErrNoExchange) {
			notFound(w)
			return
		}
		changeError(w, err)
		return
	}
	switch ae.Code {
	case amqp.NotFound:
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "not_found", "reason": ae.Text})
	case amqp.AccessRefused:
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "not_authorised", "reason": ae.Text})
	default:
		badRequest(w, fmt.Sprintf("%d %s", ae.Code, ae.Text))
	}
}

// acl is the user's permission checker in vhost, as a channel opened now would have it.
func (a *api) acl(r *http.Request, vhost string) *auth.Channel {
	p := principal(r)
	return auth.NewChannel(p.Name, vhost, p.Tags, a.c.VHostGrant(p.Name, vhost), a.c.TopicGrants(p.Name, vhost))
}

// aclError answers a refused permission check (401, RabbitMQ's ACCESS_REFUSED text).
func aclError(w http.ResponseWriter, err error) {
	var ae *amqp.Error
	if errors.As(err, &ae) {
		amqpError(w, ae)
		return
	}
	writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "not_authorised", "reason": err.Error()})
}

// boolField reads a flag sent as JSON true/false or as the strings rabbitmqadmin sends.
func boolField(m map[string]any, k string, def bool) (bool, bool) {
	switch v := m[k].(type) {
	case nil:
		return def, true
	case bool:
		return v, true
	case string:
		switch v {
		case "true":
			return true, true
		case "false":
			return false, true
		}
	}
	return false, false
}

// argsField reads "arguments" as a JSON object.
func argsField(m map[string]any) (amqp.Table, bool) {
	switch v := m["arguments"].(type) {
	case nil:
		return nil, true
	case map[string]any:
		if len(v) == 0 {
			return nil, true
		}
		return definitions.Table(v), true
	case string:
		if v == "" {
			return nil, true
		}
	}
	return nil, false
}

func (a *api) vhostOr404(w http.ResponseWriter, name string) *core.VHost {
	v := a.c.VHost(name)
	if v == nil || v.Deleted() {
		notFound(w)
		return nil
	}
	return v
}

// --- exchanges -----------------------------------------------------------------------------

func (a *api) putExchange(w http.ResponseWriter, r *http.Request, args []string) {
	v := a.vhostOr404(w, args[0])
	if v == nil {
		return
	}
	m, _, ok := readBody(w, r)
	if !ok {
		return
	}
	name := args[1]
	typ, _ := strField(m, "type")
	if typ == "" {
		badRequest(w, "[{key_missing,type}]")
		return
	}
	durable, ok1 := boolField(m, "durable", true)
	autoDelete, ok2 := boolField(m, "auto_delete", false)
	internal, ok3 := boolField(m, "internal", false)
	xargs, ok4 := argsField(m)
	if !ok1 || !ok2 || !ok3 || !ok4 {
		badRequest(w, "durable, auto_delete and internal must be booleans and arguments an object")
		return
	}
	acl := a.acl(r, v.Name())
	if err := acl.ExchangeDeclare(name); err != nil {
		aclError(w, err)
		return
	}
	if ae, ok := xargs["alternate-exchange"].(string); ok {
		if err := acl.AlternateExchange(name, ae); err != nil {
			aclError(w, err)
			return
		}
	}
	_, existed := v.Exchange(name)
	if err := v.DeclareExchange(r.Context(), core.ExchangeDecl{Name: name, Type: typ, Durable: durable,
		AutoDelete: autoDelete, Internal: internal, Args: xargs}); err != nil {
		amqpError(w, err)
		return
	}
	putStatus(w, existed)
}

func (a *api) deleteExchange(w http.ResponseWriter, r *http.Request, args []string) {
	v := a.vhostOr404(w, args[0])
	if v == nil {
		return
	}
	name := args[1]
	if err := a.acl(r, v.Name()).ExchangeDelete(name); err != nil {
		aclError(w, err)
		return
	}
	if err := v.DeleteExchange(r.Context(), name, r.URL.Query().Get("if-unused") == "true"); err != nil {
		amqpError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// publish is POST /api/exchanges/{vhost}/{name}/publish: {"routing_key", "payload",
// "payload_encoding": "string"|"base64", "properties"} -> {"routed": bool}.
func (a *api) publish(w http.ResponseWriter, r *http.Request, args []string) {
	v := a.vhostOr404(w, args[0])
	if v == nil {
		return
	}
	m, _, ok := readBody(w, r)
	if !ok {
		return
	}
	if reason := keysMissing(m, "routing_key", "payload", "payload_encoding", "properties"); reason != "" {
		badRequest(w, reason)
		return
	}
	exName := args[1]
	if exName == "amq.default" {
		exName = ""
	}
	key, _ := strField(m, "routing_key")
	payload, _ := strField(m, "payload")
	var body []byte
	switch enc, _ := strField(m, "payload_encoding"); enc {
	case "string":
		body = []byte(payload)
	case "base64":
		b, err := base64.StdEncoding.DecodeString(payload)
		if err != nil {
			badRequest(w, "not_base64")
			return
		}
		body = b
	default:
		badRequest(w, "payload_encoding must be string or base64")
		return
	}
	pm, _ := m["properties"].(map[string]any)
	props, err := propertiesFromJSON(pm)
	if err != nil {
		badRequest(w, err.Error())
		return
	}
	acl := a.acl(r, v.Name())
	if err := acl.Publish(exName); err != nil {
		aclError(w, err)
		return
	}
	if err := acl.UserID(props.UserID, props.UserID != ""); err != nil {
		aclError(w, err)
		return
	}
	msg := &queue.Message{Exchange: exName, RoutingKey: key, Body: body, Persistent: props.DeliveryMode == 2,
		Priority: props.Priority}
	if props.Expiration != "" {
		ms, err := strconv.ParseInt(props.Expiration, 10, 64)
		if err != nil || ms < 0 {
			badRequest(w, "invalid expiration "+props.Expiration)
			return
		}
		msg.ExpiresAt = max(time.Now().UnixMilli()+ms, 1)
	}
	msg.Props = props.Append(nil)
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	routed, perr := v.Publish(ctx, msg, pm2headers(pm))
	if perr != nil {
		amqpError(w, perr)
		return
	}
	writeJSON(w, http.StatusOK, map[string]bool{"routed": routed})
}

// pm2headers is the headers of the request's properties for routing (CC and BCC included).
func pm2headers(pm map[string]any) amqp.Table {
	h, _ := pm["headers"].(map[string]any)
	if len(h) == 0 {
		return nil
	}
	return definitions.Table(h)
}

// propertiesFromJSON reads the management API's message properties.
func propertiesFromJSON(pm map[string]any) (amqp.Properties, error) {
	var p amqp.Properties
	str := func(k string) (string, error) {
		switch v := pm[k].(type) {
		case nil:
			return "", nil
		case string:
			return v, nil
		case json.Number:
			return v.String(), nil
		}
		return "", fmt.Errorf("property %s must be a string", k)
	}
	num := func(k string) (int64, error) {
		switch v := pm[k].(type) {
		case nil:
			return 0, nil
		case json.Number:
			return v.Int64()
		case string:
			return strconv.ParseInt(v, 10, 64)
		}
		return 0, fmt.Errorf("property %s must be a number", k)
	}
	var err error
	for _, f := range []struct {
		k string
		p *string
	}{{"content_type", &p.ContentType}, {"content_encoding", &p.ContentEncoding}, {"correlation_id", &p.CorrelationID},
		{"reply_to", &p.ReplyTo}, {"expiration", &p.Expiration}, {"message_id", &p.MessageID}, {"type", &p.Type},
		{"user_id", &p.UserID}, {"app_id", &p.AppID}, {"cluster_id", &p.ClusterID}} {
		if *f.p, err = str(f.k); err != nil {
			return p, err
		}
	}
	dm, err := num("delivery_mode")
	if err != nil || dm < 0 || dm > 2 {
		return p, fmt.Errorf("delivery_mode must be 1 or 2")
	}
	p.DeliveryMode = uint8(dm)
	pr, err := num("priority")
	if err != nil || pr < 0 || pr > 255 {
		return p, fmt.Errorf("priority must be 0 to 255")
	}
	p.Priority = uint8(pr)
	ts, err := num("timestamp")
	if err != nil {
		return p, err
	}
	if ts > 0 {
		p.Timestamp = time.Unix(ts, 0)
	}
	if h, ok := pm["headers"].(map[string]any); ok && len(h) > 0 {
		p.Headers = definitions.Table(h)
		delete(p.Headers, "BCC")
	}
	return p, nil
}

// propertiesJSON renders a message's properties as RabbitMQ's API does.
func propertiesJSON(raw []byte) map[string]any {
	out := map[string]any{}
	p, err := amqp.DecodeProperties(raw)
	if err != nil {
		return out
	}
	for k, v := range map[string]string{"content_type": p.ContentType, "content_encoding": p.ContentEncoding,
		"correlation_id": p.CorrelationID, "reply_to": p.ReplyTo, "expiration": p.Expiration,
		"message_id": p.MessageID, "type": p.Type, "user_id": p.UserID, "app_id": p.AppID, "cluster_id": p.ClusterID} {
		if v != "" {
			out[k] = v
		}
	}
	if p.DeliveryMode != 0 {
		out["delivery_mode"] = p.DeliveryMode
	}
	if p.Priority != 0 {
		out["priority"] = p.Priority
	}
	if !p.Timestamp.IsZero() {
		out["timestamp"] = p.Timestamp.Unix()
	}
	if len(p.Headers) > 0 {
		out["headers"] = tableJSON(p.Headers)
	}
	return out
}

// --- queues --------------------------------------------------------------------------------

func (a *api) putQueue(w http.ResponseWriter, r *http.Request, args []string) {
	v := a.vhostOr404(w, args[0])
	if v == nil {
		return
	}
	m, _, ok := readBody(w, r)
	if !ok {
		return
	}
	name := args[1]
	durable, ok1 := boolField(m, "durable", true)
	autoDelete, ok2 := boolField(m, "auto_delete", false)
	qargs, ok3 := argsField(m)
	if !ok1 || !ok2 || !ok3 {
		badRequest(w, "durable and auto_delete must be booleans and arguments an object")
		return
	}
	if ex, _ := boolField(m, "exclusive", false); ex {
		badRequest(w, "exclusive queues cannot be declared through the HTTP API")
		return
	}
	if name == "" {
		badRequest(w, "queue name must not be empty")
		return
	}
	if t, ok := strField(m, "queue_type"); ok && t != "" {
		if qargs == nil {
			qargs = amqp.Table{}
		}
		qargs["x-queue-type"] = t
	}
	acl := a.acl(r, v.Name())
	if err := acl.QueueDeclare(name); err != nil {
		aclError(w, err)
		return
	}
	if dlx, ok := qargs["x-dead-letter-exchange"].(string); ok {
		if err := acl.DeadLetterExchange(name, dlx); err != nil {
			aclError(w, err)
			return
		}
	}
	existed := v.Queue(name) != nil
	if _, err := v.DeclareQueue(r.Context(), core.QueueDecl{Name: name, Durable: durable, AutoDelete: autoDelete, Args: qargs}, nil); err != nil {
		amqpError(w, err)
		return
	}
	putStatus(w, existed)
}

func (a *api) lookupQueue(w http.ResponseWriter, vhost, name string) (*core.VHost, *core.Queue) {
	v := a.vhostOr404(w, vhost)
	if v == nil {
		return nil, nil
	}
	q := v.Queue(name)
	if q == nil {
		notFound(w)
		return nil, nil
	}
	return v, q
}

func (a *api) deleteQueue(w http.ResponseWriter, r *http.Request, args []string) {
	v, q := a.lookupQueue(w, args[0], args[1])
	if q == nil {
		return
	}
	if err := a.acl(r, v.Name()).QueueDelete(q.Name()); err != nil {
		aclError(w, err)
		return
	}
	qs := r.URL.Query()
	if _, err := v.DeleteQueue(r.Context(), q, qs.Get("if-unused") == "true", qs.Get("if-empty") == "true", q.Owner()); err != nil {
		amqpError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *api) purgeQueue(w http.ResponseWriter, r *http.Request, args []string) {
	v, q := a.lookupQueue(w, args[0], args[1])
	if q == nil {
		return
	}
	if err := a.acl(r, v.Name()).QueuePurge(q.Name()); err != nil {
		aclError(w, err)
		return
	}
	if _, err := q.Purge(); err != nil {
		amqpError(w, queueErr(q, err))
		return
	}
	a.audit(r, "queue purged", "vhost", v.Name(), "queue", q.Name())
	w.WriteHeader(http.StatusNoContent)
}

// queueErr turns a queue type's error into the channel error RabbitMQ reports for it.
func queueErr(q *core.Queue, err error) error {
	var ae *amqp.Error
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, queue.ErrGone):
		return amqp.Errorf(amqp.NotFound, "no queue '%s' in vhost '%s'", q.Name(), q.VHost().Name())
	}
	return amqp.Errorf(amqp.InternalError, "queue '%s': %v", q.Name(), err)
}

// getMessages is POST /api/queues/{vhost}/{name}/get: {"count", "ackmode", "encoding",
// "truncate"}.
func (a *api) getMessages(w http.ResponseWriter, r *http.Request, args []string) {
	v, q := a.lookupQueue(w, args[0], args[1])
	if q == nil {
		return
	}
	m, _, ok := readBody(w, r)
	if !ok {
		return
	}
	if reason := keysMissing(m, "count", "ackmode", "encoding"); reason != "" {
		badRequest(w, reason)
		return
	}
	count, err := intField(m, "count")
	if err != nil || count < 1 {
		badRequest(w, "count must be a positive integer")
		return
	}
	var mode core.GetMode
	switch am, _ := strField(m, "ackmode"); am {
	case "ack_requeue_true", "reject_requeue_true":
		mode = core.GetRequeue
	case "ack_requeue_false":
		mode = core.GetAck
	case "reject_requeue_false":
		mode = core.GetRejectDiscard
	default:
		badRequest(w, "ackmode must be ack_requeue_true, ack_requeue_false, reject_requeue_true or reject_requeue_false")
		return
	}
	enc, _ := strField(m, "encoding")
	if enc != "auto" && enc != "base64" {
		badRequest(w, "encoding must be auto or base64")
		return
	}
	truncate := -1
	if _, has := m["truncate"]; has {
		if truncate, err = intField(m, "truncate"); err != nil || truncate < 0 {
			badRequest(w, "truncate must be a non-negative integer")
			return
		}
	}
	if err := a.acl(r, v.Name()).Get(q.Name()); err != nil {
		aclError(w, err)
		return
	}
	got, remaining, gerr := q.GetMessages(count, mode)
	if gerr != nil {
		amqpError(w, queueErr(q, gerr))
		return
	}
	out := make([]map[string]any, 0, len(got))
	for i, d := range got {
		body := d.Msg.Body
		size := len(body)
		if truncate >= 0 && len(body) > truncate {
			body = body[:truncate]
		}
		payload, penc := string(body), "string"
		if enc == "base64" || !utf8.Valid(body) {
			payload, penc = base64.StdEncoding.EncodeToString(body), "base64"
		}
		out = append(out, map[string]any{
			"payload_bytes": size, "redelivered": d.Redelivered, "exchange": d.Msg.Exchange,
			"routing_key": d.Msg.RoutingKey, "message_count": remaining[i], "properties": propertiesJSON(d.Msg.Props),
			"payload": payload, "payload_encoding": penc,
		})
	}
	writeJSON(w, http.StatusOK, out)
}

func intField(m map[string]any, k string) (int, error) {
	switch v := m[k].(type) {
	case json.Number:
		n, err := v.Int64()
		return int(n), err
	case string:
		return strconv.Atoi(v)
	}
	return 0, fmt.Errorf("%s: not a number", k)
}

// --- bindings ------------------------------------------------------------------------------

// bindingView is a binding as the API lists it; the default exchange's implicit binding to every
// queue is listed too, as in RabbitMQ.
type bindingView struct {
	vhost string
	b     exchange.Binding
}

func (a *api) allBindings(vhost string) []bindingView {
	var out []bindingView
	for _, v := range a.c.VHosts() {
		if vhost != "" && v.Name() != vhost {
			continue
		}
		for _, q := range v.Queues() {
			out = append(out, bindingView{v.Name(), exchange.Binding{Source: "", Dest: q.Name(), DestKind: exchange.ToQueue, Key: q.Name()}})
		}
		bs := v.Bindings()
		sort.SliceStable(bs, func(i, j int) bool {
			if bs[i].Source != bs[j].Source {
				return bs[i].Source < bs[j].Source
			}
			if bs[i].Dest != bs[j].Dest {
				return bs[i].Dest < bs[j].Dest
			}
			return bs[i].Key < bs[j].Key
		})
		for _, b := range bs {
			out = append(out, bindingView{v.Name(), b})
		}
	}
	return out
}

// propertiesKey is RabbitMQ's name of a binding within its source and destination: the routing
// key (URL-quoted), with "~" and a hash of the arguments when it has some; "~" for an empty key
// without arguments.
func propertiesKey(b exchange.Binding) string {
	if len(b.Args) == 0 {
		if b.Key == "" {
			return "~"
		}
		return url.PathEscape(b.Key)
	}
	h := fnv.New32a()
	enc, _ := json.Marshal(tableJSON(b.Args)) // map keys are sorted: a stable rendering
	h.Write(enc)
	return url.PathEscape(b.Key) + "~" + base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

func bindingJSON(bv bindingView) map[string]any {
	dt := "queue"
	if bv.b.DestKind == exchange.ToExchange {
		dt = "exchange"
	}
	return map[string]any{"source": bv.b.Source, "vhost": bv.vhost, "destination": bv.b.Dest, "destination_type": dt,
		"routing_key": bv.b.Key, "arguments": tableJSON(bv.b.Args), "properties_key": propertiesKey(bv.b)}
}

func (a *api) listBindings(w http.ResponseWriter, r *http.Request, vhost string, keep func(exchange.Binding) bool) {
	p := principal(r)
	out := []map[string]any{}
	for _, bv := range a.allBindings(vhost) {
		if keep(bv.b) && auth.ListsVhostObjects(p.Tags, a.c.VHostGrant(p.Name, bv.vhost) != nil) {
			out = append(out, bindingJSON(bv))
		}
	}
	writeList(w, r, out)
}

func (a *api) bindings(w http.ResponseWriter, r *http.Request, args []string) {
	vhost := ""
	if len(args) > 0 {
		if a.vhostOr404(w, args[0]) == nil {
			return
		}
		vhost = args[0]
	}
	a.listBindings(w, r, vhost, func(exchange.Binding) bool { return true })
}

func (a *api) queueBindings(w http.ResponseWriter, r *http.Request, args []string) {
	if _, q := a.lookupQueue(w, args[0], args[1]); q == nil {
		return
	}
	a.listBindings(w, r, args[0], func(b exchange.Binding) bool { return b.DestKind == exchange.ToQueue && b.Dest == args[1] })
}

func exchangeName(s string) string {
	if s == "amq.default" {
		return ""
	}
	return s
}

func (a *api) exchangeBindingsSource(w http.ResponseWriter, r *http.Request, args []string) {
	a.exchangeBindings(w, r, args, func(b exchange.Binding, x string) bool { return b.Source == x })
}

func (a *api) exchangeBindingsDestination(w http.ResponseWriter, r *http.Request, args []string) {
	a.exchangeBindings(w, r, args, func(b exchange.Binding, x string) bool {
		return b.DestKind == exchange.ToExchange && b.Dest == x
	})
}

func (a *api) exchangeBindings(w http.ResponseWriter, r *http.Request, args []string, keep func(exchange.Binding, string) bool) {
	v := a.vhostOr404(w, args[0])
	if v == nil {
		return
	}
	x := exchangeName(args[1])
	if _, ok := v.Exchange(x); !ok {
		notFound(w)
		return
	}
	a.listBindings(w, r, args[0], func(b exchange.Binding) bool { return keep(b, x) })
}

// bindingEnds reads /bindings/{vhost}/e/{source}/{q|e}/{destination}; it answers 404 itself.
func (a *api) bindingEnds(w http.ResponseWriter, args []string) (*core.VHost, exchange.Binding, bool) {
	v := a.vhostOr404(w, args[0])
	if v == nil {
		return nil, exchange.Binding{}, false
	}
	b := exchange.Binding{Source: exchangeName(args[1]), Dest: args[3]}
	switch args[2] {
	case "q":
		b.DestKind = exchange.ToQueue
		if v.Queue(b.Dest) == nil {
			notFound(w)
			return nil, b, false
		}
	case "e":
		b.DestKind = exchange.ToExchange
		if _, ok := v.Exchange(b.Dest); !ok {
			notFound(w)
			return nil, b, false
		}
	default:
		notFound(w)
		return nil, b, false
	}
	if _, ok := v.Exchange(b.Source); !ok {
		notFound(w)
		return nil, b, false
	}
	return v, b, true
}

func (a *api) bindingsBetween(w http.ResponseWriter, r *http.Request, args []string) {
	_, want, ok := a.bindingEnds(w, args)
	if !ok {
		return
	}
	a.listBindings(w, r, args[0], func(b exchange.Binding) bool {
		return b.Source == want.Source && b.Dest == want.Dest && b.DestKind == want.DestKind
	})
}

func (a *api) findBinding(vhost string, want exchange.Binding, key string) (bindingView, bool) {
	// The path's segment arrives unescaped; the key may have been sent escaped or not.
	for _, bv := range a.allBindings(vhost) {
		b := bv.b
		if b.Source != want.Source || b.Dest != want.Dest || b.DestKind != want.DestKind {
			continue
		}
		if pk := propertiesKey(b); pk == key || pk == url.PathEscape(key) {
			return bv, true
		}
	}
	return bindingView{}, false
}

func (a *api) binding(w http.ResponseWriter, r *http.Request, args []string) {
	_, want, ok := a.bindingEnds(w, args)
	if !ok {
		return
	}
	bv, found := a.findBinding(args[0], want, args[4])
	if !found {
		notFound(w)
		return
	}
	writeJSON(w, http.StatusOK, bindingJSON(bv))
}

func (a *api) checkBind(r *http.Request, v *core.VHost, b exchange.Binding) error {
	acl := a.acl(r, v.Name())
	var err error
	if b.DestKind == exchange.ToQueue {
		err = acl.QueueBind(b.Dest, b.Source)
	} else {
		err = acl.ExchangeBind(b.Dest, b.Source)
	}
	if err == nil {
		err = acl.BindTopic(b.Source, b.Key)
	}
	return err
}

func (a *api) postBinding(w http.ResponseWriter, r *http.Request, args []string) {
	v, b, ok := a.bindingEnds(w, args)
	if !ok {
		return
	}
	m, _, ok := readBody(w, r)
	if !ok {
		return
	}
	b.Key, _ = strField(m, "routing_key")
	bargs, ok := argsField(m)
	if !ok {
		badRequest(w, "arguments must be an object")
		return
	}
	b.Args = bargs
	if b.Source == "" {
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "not_authorised",
			"reason": fmt.Sprintf("ACCESS_REFUSED - operation not permitted on the default exchange")})
		return
	}
	if err := a.checkBind(r, v, b); err != nil {
		aclError(w, err)
		return
	}
	if err := v.Bind(r.Context(), b, nil); err != nil {
		amqpError(w, err)
		return
	}
	a.audit(r, "binding added", "vhost", v.Name(), "source", b.Source, "destination", b.Dest, "routing_key", b.Key)
	w.Header().Set("Location", propertiesKey(b))
	w.WriteHeader(http.StatusCreated)
}

func (a *api) deleteBinding(w http.ResponseWriter, r *http.Request, args []string) {
	v, want, ok := a.bindingEnds(w, args)
	if !ok {
		return
	}
	bv, found := a.findBinding(args[0], want, args[4])
	if !found {
		notFound(w)
		return
	}
	if bv.b.Source == "" {
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "not_authorised",
			"reason": "ACCESS_REFUSED - operation not permitted on the default exchange"})
		return
	}
	if err := a.checkBind(r, v, bv.b); err != nil {
		aclError(w, err)
		return
	}
	if err := v.Unbind(r.Context(), bv.b, nil); err != nil {
		amqpError(w, err)
		return
	}
	a.audit(r, "binding removed", "vhost", v.Name(), "source", bv.b.Source, "destination", bv.b.Dest, "routing_key", bv.b.Key)
	w.WriteHeader(http.StatusNoContent)
}

// --- channels and consumers ----------------------------------------------------------------

func (a *api) visibleChannels(r *http.Request, vhost string) []core.ChannelInfo {
	p := principal(r)
	var out []core.ChannelInfo
	for _, ch := range a.c.Channels() {
		if vhost != "" && ch.VHost != vhost {
			continue
		}
		if ch.User == p.Name || auth.SeesOthersConnections(p.Tags) {
			out = append(out, ch)
		}
	}
	return out
}

func (a *api) channelJSON(ch core.ChannelInfo) map[string]any {
	peerHost, peerPort := "", 0
	if i := strings.Index(ch.Connection, " -> "); i >= 0 {
		peerHost, peerPort = splitAddr(ch.Connection[:i])
	}
	return map[string]any{
		"name": ch.Name(), "number": ch.Number, "node": a.b.NodeName(), "user": ch.User, "vhost": ch.VHost,
		"user_who_performed_action": ch.User,
		"state":                     "running", "confirm": ch.Confirm, "transactional": ch.Tx,
		"prefetch_count": ch.Prefetch, "global_prefetch_count": ch.GlobalPrefetch,
		"consumer_count": len(ch.Consumers), "messages_unacknowledged": ch.Unacked,
		"messages_unconfirmed": 0, "messages_uncommitted": 0, "acks_uncommitted": 0,
		"connection_details": map[string]any{"name": ch.Connection, "peer_host": peerHost, "peer_port": peerPort},
		"message_stats":      channelStats(ch.Counters),
	}
}

func (a *api) channels(w http.ResponseWriter, r *http.Request, args []string) {
	vhost := ""
	if len(args) > 0 {
		if a.vhostOr404(w, args[0]) == nil {
			return
		}
		vhost = args[0]
	}
	out := []map[string]any{}
	for _, ch := range a.visibleChannels(r, vhost) {
		out = append(out, a.channelJSON(ch))
	}
	writeList(w, r, out)
}

func (a *api) channel(w http.ResponseWriter, r *http.Request, args []string) {
	for _, ch := range a.visibleChannels(r, "") {
		if ch.Name() == args[0] {
			writeJSON(w, http.StatusOK, a.channelJSON(ch))
			return
		}
	}
	notFound(w)
}

func (a *api) connectionChannels(w http.ResponseWriter, r *http.Request, args []string) {
	out := []map[string]any{}
	for _, ch := range a.visibleChannels(r, "") {
		if ch.Connection == args[0] {
			out = append(out, a.channelJSON(ch))
		}
	}
	writeList(w, r, out)
}

func (a *api) vhostConnections(w http.ResponseWriter, r *http.Request, args []string) {
	if a.vhostOr404(w, args[0]) == nil {
		return
	}
	p := principal(r)
	out := []map[string]any{}
	for _, c := range a.b.Connections() {
		if c.VHost == args[0] && (c.User == p.Name || auth.SeesOthersConnections(p.Tags)) {
			out = append(out, a.connectionJSON(c))
		}
	}
	writeList(w, r, out)
}

func (a *api) consumers(w http.ResponseWriter, r *http.Request, args []string) {
	vhost := ""
	if len(args) > 0 {
		if a.vhostOr404(w, args[0]) == nil {
			return
		}
		vhost = args[0]
	}
	out := []map[string]any{}
	for _, ch := range a.visibleChannels(r, vhost) {
		peerHost, peerPort := "", 0
		if i := strings.Index(ch.Connection, " -> "); i >= 0 {
			peerHost, peerPort = splitAddr(ch.Connection[:i])
		}
		for _, cs := range ch.Consumers {
			out = append(out, map[string]any{
				"consumer_tag": cs.Tag, "queue": map[string]any{"name": cs.Queue, "vhost": ch.VHost},
				"channel_details": map[string]any{"name": ch.Name(), "number": ch.Number, "connection_name": ch.Connection,
					"peer_host": peerHost, "peer_port": peerPort, "user": ch.User, "node": a.b.NodeName()},
				"ack_required": cs.AckRequired, "exclusive": cs.Exclusive, "prefetch_count": cs.Prefetch,
				"arguments": tableJSON(cs.Args), "active": true, "activity_status": "up",
			})
		}
	}
	writeList(w, r, out)
}

// --- runtime parameters (none: Warren has no shovels or federation) ------------------------

func (a *api) emptyList(w http.ResponseWriter, r *http.Request, args []string) {
	writeList(w, r, []map[string]any{})
}

func (a *api) noParameter(w http.ResponseWriter, r *http.Request, args []string) { notFound(w) }

func (a *api) globalParameters(w http.ResponseWriter, r *http.Request, args []string) {
	writeList(w, r, []map[string]any{{"name": "cluster_name", "value": a.b.NodeName()}})
}

func (a *api) clusterName(w http.ResponseWriter, r *http.Request, args []string) {
	writeJSON(w, http.StatusOK, map[string]string{"name": a.b.NodeName()})
}

// --- message_stats -------------------------------------------------------------------------

// rate is RabbitMQ's {"rate": r} detail object.
func rate(r float64) map[string]any { return map[string]any{"rate": r} }

// putStat sets name and name_details from counters.
func putStat(out map[string]any, name string, total uint64, r float64) {
	out[name] = total
	out[name+"_details"] = rate(r)
}

// trafficFields are the message_stats fields common to channels, queues and the overview: each
// the sum of its counters.
var trafficFields = []struct {
	name, details string
	kinds         []stats.Kind
}{ // by name, so that an object of them is in key order
	{"ack", "ack_details", []stats.Kind{stats.Acknowledged}},
	{"deliver", "deliver_details", []stats.Kind{stats.DeliveredAck}},
	{"deliver_get", "deliver_get_details", []stats.Kind{stats.DeliveredAck, stats.DeliveredNoAck, stats.GetAck, stats.GetNoAck}},
	{"deliver_no_ack", "deliver_no_ack_details", []stats.Kind{stats.DeliveredNoAck}},
	{"get", "get_details", []stats.Kind{stats.GetAck}},
	{"get_empty", "get_empty_details", []stats.Kind{stats.GetEmpty}},
	{"get_no_ack", "get_no_ack_details", []stats.Kind{stats.GetNoAck}},
	{"publish", "publish_details", []stats.Kind{stats.Published}},
	{"redeliver", "redeliver_details", []stats.Kind{stats.Redelivered}},
}

// sumOf is the total and rate of kinds in s.
func sumOf(s *stats.Snapshot, kinds []stats.Kind) (uint64, float64) {
	var t uint64
	var r float64
	for _, k := range kinds {
		t += s.Totals[k]
		r += s.Rates[k]
	}
	return t, r
}

// trafficStats are the trafficFields of s as a map, for the objects that add to them.
func trafficStats(s stats.Snapshot) map[string]any {
	out := make(map[string]any, 2*len(trafficFields))
	for _, f := range trafficFields {
		t, r := sumOf(&s, f.kinds)
		out[f.name], out[f.details] = t, rate(r)
	}
	return out
}

// trafficObject are the trafficFields of s as an object (a queue's message_stats).
func trafficObject(s stats.Snapshot) object {
	out := make(object, 0, 2*len(trafficFields))
	for _, f := range trafficFields {
		t, r := sumOf(&s, f.kinds)
		out = append(out, field{f.name, t}, field{f.details, rateDetail(r)})
	}
	return out.sorted()
}

// channelStats adds what only publishers' channels count.
func channelStats(o *stats.Object) map[string]any {
	if o == nil {
		return map[string]any{}
	}
	s := o.Snapshot()
	out := trafficStats(s)
	addPublisherStats(out, s)
	return out
}

func addPublisherStats(out map[string]any, s stats.Snapshot) {
	t, rt := s.Totals, s.Rates
	putStat(out, "confirm", t[stats.Confirmed], rt[stats.Confirmed])
	putStat(out, "return_unroutable", t[stats.UnroutableReturned], rt[stats.UnroutableReturned])
	putStat(out, "drop_unroutable", t[stats.UnroutableDropped], rt[stats.UnroutableDropped])
}

// overviewStats are the node's message_stats and churn_rates.
func overviewStats(s stats.Snapshot) (map[string]any, map[string]any) {
	ms := trafficStats(s)
	addPublisherStats(ms, s)
	t, rt := s.Totals, s.Rates
	churn := map[string]any{}
	putStat(churn, "connection_created", t[stats.ConnectionsOpened], rt[stats.ConnectionsOpened])
	putStat(churn, "connection_closed", t[stats.ConnectionsClosed], rt[stats.ConnectionsClosed])
	putStat(churn, "channel_created", t[stats.ChannelsOpened], rt[stats.ChannelsOpened])
	putStat(churn, "channel_closed", t[stats.ChannelsClosed], rt[stats.ChannelsClosed])
	putStat(churn, "queue_declared", t[stats.QueuesDeclared], rt[stats.QueuesDeclared])
	putStat(churn, "queue_created", t[stats.QueuesCreated], rt[stats.QueuesCreated])
	putStat(churn, "queue_deleted", t[stats.QueuesDeleted], rt[stats.QueuesDeleted])
	return ms, churn
}

// --- health checks -------------------------------------------------------------------------

func (a *api) ok(w http.ResponseWriter, r *http.Request, args []string) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (a *api) checkVHosts(w http.ResponseWriter, r *http.Request, args []string) {
	var down []string
	for _, v := range a.c.VHostInfos() {
		if vh := a.c.VHost(v.Name); vh == nil || vh.Deleted() {
			down = append(down, v.Name)
		}
	}
	if len(down) > 0 {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "failed", "reason": "Some virtual hosts are down", "virtual-hosts": down})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// listener is one of the node's listeners as the overview and the listener checks show it.
type listener struct {
	Protocol string
	Addr     string
}

func (a *api) listeners() []listener {
	var out []listener
	if ad := a.b.Addr(); ad != nil {
		out = append(out, listener{"amqp", ad.String()})
	}
	if ad := a.b.TLSAddr(); ad != nil {
		out = append(out, listener{"amqp/ssl", ad.String()})
	}
	if ad := a.b.ClusterAddr(); ad != "" {
		out = append(out, listener{"clustering", ad})
	}
	if a.self != nil {
		out = append(out, *a.self)
	}
	return out
}

func listenerJSON(node string, l listener) map[string]any {
	host, port := splitAddr(l.Addr)
	return map[string]any{"node": node, "protocol": l.Protocol, "ip_address": host, "port": port}
}

func (a *api) checkPort(w http.ResponseWriter, r *http.Request, args []string) {
	port, err := strconv.Atoi(args[0])
	if err != nil {
		badRequest(w, "port must be a number")
		return
	}
	var ports []int
	for _, l := range a.listeners() {
		_, p := splitAddr(l.Addr)
		if p == port {
			writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "port": port})
			return
		}
		ports = append(ports, p)
	}
	writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "failed", "reason": "No active listener", "missing": port, "ports": ports})
}

func (a *api) checkProtocol(w http.ResponseWriter, r *http.Request, args []string) {
	want := strings.ToLower(args[0])
	var protocols []string
	for _, l := range a.listeners() {
		if l.Protocol == want || want == "amqp091" && l.Protocol == "amqp" || want == "amqp0-9-1" && l.Protocol == "amqp" {
			writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "protocol": want})
			return
		}
		protocols = append(protocols, l.Protocol)
	}
	writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "failed", "reason": "No active listener", "missing": want, "protocols": protocols})
}

// checkQuorumCritical fails when stopping this node would leave a quorum queue without a
// majority of its voters up.
func (a *api) checkQuorumCritical(w http.ResponseWriter, r *http.Request, args []string) {
	st := a.b.ClusterStatus()
	up := map[string]bool{a.b.NodeName(): true}
	for _, m := range st.Members {
		if m.Up {
			up[m.ID] = true
		}
	}
	var critical []map[string]any
	for _, q := range a.b.Queues() {
		if q.Type != "quorum" {
			continue
		}
		for _, g := range st.Groups {
			if q.GroupID == 0 || g.ID != q.GroupID {
				continue
			}
			member, alive := false, 0
			for _, v := range g.Voters {
				if v == a.b.NodeName() {
					member = true
				}
				if up[v] {
					alive++
				}
			}
			if member && len(g.Voters) > 1 && alive-1 < len(g.Voters)/2+1 {
				critical = append(critical, map[string]any{"name": q.Name, "virtual_host": q.VHost, "type": "quorum"})
			}
		}
	}
	if len(critical) > 0 {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "failed",
			"reason": "There are quorum queues that would lose their quorum if the target node is shut down", "queues": critical})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (a *api) checkCertificates(w http.ResponseWriter, r *http.Request, args []string) {
	n, err := strconv.Atoi(args[0])
	if err != nil || n < 0 {
		badRequest(w, "within must be a non-negative integer")
		return
	}
	var within time.Duration
	switch args[1] {
	case "days":
		within = time.Duration(n) * 24 * time.Hour
	case "weeks":
		within = time.Duration(n) * 7 * 24 * time.Hour
	case "months":
		within = time.Duration(n) * 30 * 24 * time.Hour
	case "years":
		within = time.Duration(n) * 365 * 24 * time.Hour
	default:
		badRequest(w, "unit must be days, weeks, months or years")
		return
	}
	deadline := time.Now().Add(within)
	var expiring []map[string]any
	for _, c := range a.certificates() {
		if c.cert.NotAfter.Before(deadline) {
			host, port := splitAddr(c.addr)
			expiring = append(expiring, map[string]any{"node": a.b.NodeName(), "protocol": c.protocol, "interface": host,
				"port": port, "certfile": c.cert.Subject.String(), "expires": c.cert.NotAfter.UTC().Format(time.RFC3339)})
		}
	}
	if len(expiring) > 0 {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "failed", "reason": "Certificates expiring", "expired": expiring})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// aliveness is RabbitMQ's aliveness test: declare the queue aliveness-test in the vhost, publish
// a message to it and get it back.
func (a *api) aliveness(w http.ResponseWriter, r *http.Request, args []string) {
	v := a.vhostOr404(w, args[0])
	if v == nil {
		return
	}
	fail := func(reason string) {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "failed", "reason": reason})
	}
	q, err := v.DeclareQueue(r.Context(), core.QueueDecl{Name: "aliveness-test"}, nil)
	if err != nil {
		fail(err.Text)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	msg := &queue.Message{Exchange: "", RoutingKey: "aliveness-test", Body: []byte("test_message"), Props: (&amqp.Properties{}).Append(nil)}
	if _, perr := v.Publish(ctx, msg, nil); perr != nil {
		fail(perr.Error())
		return
	}
	got, _, gerr := q.GetMessages(1, core.GetAck)
	if gerr != nil || len(got) != 1 || string(got[0].Msg.Body) != "test_message" {
		fail("aliveness test failed: the message did not come back")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// --- lists: columns, sort, pagination ------------------------------------------------------

// maxPageSize is RabbitMQ's limit on page_size.
const maxPageSize = 500

// writeList answers a list request with RabbitMQ's query parameters: sort (a dotted field) and
// sort_reverse, page with page_size, name and use_regex (with pagination only, as RabbitMQ),
// and columns (dotted fields, the rest dropped). With page it answers RabbitMQ's pagination
// object, otherwise the plain list. Items are maps or, for the long lists, objects.
func writeList[T map[string]any | object](w http.ResponseWriter, r *http.Request, items []T) {
	q := r.URL.Query()
	if key := q.Get("sort"); key != "" {
		path := strings.Split(key, ".")
		// Each item's key is looked up once, not at every comparison.
		keys := make([]any, len(items))
		for i, it := range items {
			keys[i] = lookupPath(it, path)
		}
		order := make([]int, len(items))
		for i := range order {
			order[i] = i
		}
		sort.SliceStable(order, func(i, j int) bool { return lessValue(keys[order[i]], keys[order[j]]) })
		sorted := make([]T, len(items))
		for i, k := range order {
			sorted[i] = items[k]
		}
		items = sorted
	}
	if q.Get("sort_reverse") == "true" {
		for i, j := 0, len(items)-1; i < j; i, j = i+1, j-1 {
			items[i], items[j] = items[j], items[i]
		}
	}
	var page map[string]any
	if ps := q.Get("page"); ps != "" {
		pageN, err := strconv.Atoi(ps)
		if err != nil || pageN < 1 {
			badRequest(w, "page must be a positive integer")
			return
		}
		size := 100
		if s := q.Get("page_size"); s != "" {
			if size, err = strconv.Atoi(s); err != nil || size < 1 || size > maxPageSize {
				badRequest(w, fmt.Sprintf("page_size must be between 1 and %d", maxPageSize))
				return
			}
		}
		total := len(items)
		if name := q.Get("name"); name != "" {
			match, err := nameFilter(name, q.Get("use_regex") == "true")
			if err != nil {
				badRequest(w, err.Error())
				return
			}
			kept := items[:0:0]
			for _, it := range items {
				if s, _ := member(any(it), "name"); match(asString(s)) {
					kept = append(kept, it)
				}
			}
			items = kept
		}
		filtered := len(items)
		pages := (filtered + size - 1) / size
		if pageN > max(pages, 1) {
			badRequest(w, "page_out_of_range")
			return
		}
		start := min((pageN-1)*size, filtered)
		items = items[start:min(start+size, filtered)]
		page = map[string]any{"filtered_count": filtered, "item_count": len(items), "page": pageN,
			"page_count": pages, "page_size": size, "total_count": total}
	}
	var out any = items
	if cols := q.Get("columns"); cols != "" {
		var paths [][]string
		for _, c := range strings.Split(cols, ",") {
			if c = strings.TrimSpace(c); c != "" {
				paths = append(paths, strings.Split(c, "."))
			}
		}
		picked := make([]map[string]any, len(items))
		for i, it := range items {
			picked[i] = pickColumns(it, paths)
		}
		out = picked
	}
	if page != nil {
		page["items"] = out
		writeJSON(w, http.StatusOK, page)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// asString is v if it is a string, else "".
func asString(v any) string {
	s, _ := v.(string)
	return s
}

func nameFilter(name string, regex bool) (func(string) bool, error) {
	if !regex {
		lower := strings.ToLower(name)
		return func(s string) bool { return strings.Contains(strings.ToLower(s), lower) }, nil
	}
	re, err := compileRegex(name)
	if err != nil {
		return nil, err
	}
	return re.MatchString, nil
}

func lookupPath(m any, path []string) any {
	cur := m
	for _, p := range path {
		cur, _ = member(cur, p)
	}
	return cur
}

// lessValue orders numbers numerically, strings lexically, and absent values first.
func lessValue(a, b any) bool {
	fa, aNum := number(a)
	fb, bNum := number(b)
	switch {
	case aNum && bNum:
		return fa < fb
	case a == nil:
		return b != nil
	case b == nil:
		return false
	}
	return fmt.Sprint(a) < fmt.Sprint(b)
}

func number(v any) (float64, bool) {
	switch v := v.(type) {
	case int:
		return float64(v), true
	case int64:
		return float64(v), true
	case uint64:
		return float64(v), true
	case uint32:
		return float64(v), true
	case uint16:
		return float64(v), true
	case uint8:
		return float64(v), true
	case float64:
		return v, true
	case json.Number:
		f, err := v.Float64()
		return f, err == nil
	}
	return 0, false
}

// pickColumns keeps the dotted paths of m (nested objects rebuilt with only those fields).
func pickColumns(m any, paths [][]string) map[string]any {
	out := map[string]any{}
	for _, p := range paths {
		v := lookupPath(m, p)
		if v == nil {
			if _, has := member(m, p[0]); !has || len(p) > 1 {
				continue
			}
		}
		dst := out
		for _, k := range p[:len(p)-1] {
			next, ok := dst[k].(map[string]any)
			if !ok {
				next = map[string]any{}
				dst[k] = next
			}
			dst = next
		}
		dst[p[len(p)-1]] = v
	}
	return out
}

// queueMessageCount is messages as the API shows it: ready plus unacked, or a stream's records.
func queueMessageCount(q server.QueueInfo) int {
	if q.Type == "stream" {
		return int(q.Stats.Messages)
	}
	return q.Ready + q.Unacked
}

// compileRegex compiles a name filter's regular expression (use_regex=true).
func compileRegex(s string) (*regexp.Regexp, error) {
	re, err := regexp.Compile(s)
	if err != nil {
		return nil, fmt.Errorf("invalid regular expression %q: %w", s, err)
	}
	return re, nil
}

// served is a certificate a listener of the node presents.
type served struct {
	protocol, addr string
	cert           *x509.Certificate
}

func (a *api) certificates() []served {
	var out []served
	if c := a.b.TLSCertificate(); c != nil && a.b.TLSAddr() != nil {
		out = append(out, served{"amqp/ssl", a.b.TLSAddr().String(), c})
	}
	if a.opt.TLS != nil && a.self != nil {
		if c := a.opt.TLS.Certificate(); c != nil {
			out = append(out, served{"https", a.self.Addr, c})
		}
	}
	return out
}
