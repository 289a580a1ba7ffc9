package streamproto

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"time"

	"warren/amqp"
	"warren/server/auth"
	"warren/server/core"
	"warren/server/streamproto/wire"
)

// opTimeout bounds a create or delete (a metadata proposal in a cluster).
const opTimeout = 30 * time.Second

// metadataTimeout bounds asking the other nodes for their endpoints during a metadata request.
const metadataTimeout = 2 * time.Second

// codeOf maps the core's AMQP errors to stream response codes.
func codeOf(err *amqp.Error) wire.ResponseCode {
	switch err.Code {
	case amqp.AccessRefused:
		return wire.ResponseCodeAccessRefused
	case amqp.PreconditionFailed, amqp.NotImplemented:
		return wire.ResponseCodePreconditionFailed
	case amqp.NotFound:
		return wire.ResponseCodeStreamDoesNotExist
	}
	return wire.ResponseCodeInternalError
}

// streamArgs are the create-stream arguments RabbitMQ accepts (rabbit_stream_utils), as queue
// arguments; numeric ones are sent as strings and must parse.
var streamArgs = map[string]bool{
	"max-length-bytes": true, "max-age": false, "stream-max-segment-size-bytes": true,
	"initial-cluster-size": true, "queue-leader-locator": false, "stream-filter-size-bytes": true,
}

// queueArgs turns create-stream arguments into x-arguments (ok false: a bad value).
func queueArgs(props []wire.Property) (amqp.Table, bool) {
	args := amqp.Table{"x-queue-type": "stream"}
	for _, p := range props {
		numeric, known := streamArgs[p.Key]
		if !known {
			continue // RabbitMQ ignores unknown arguments
		}
		if numeric {
			n, err := strconv.ParseInt(p.Value, 10, 64)
			if err != nil {
				return nil, false
			}
			args["x-"+p.Key] = n
		} else {
			args["x-"+p.Key] = p.Value
		}
	}
	return args, true
}

func (c *conn) createStream(frame []byte) error {
	var m wire.CreateStream
	if err := m.Decode(frame); err != nil {
		return err
	}
	c.respond(wire.CommandCreateStream, m.CorrelationID, c.createStreamCode(m.Stream, m.Arguments))
	return nil
}

func (c *conn) createStreamCode(name string, props []wire.Property) wire.ResponseCode {
	if name == "" {
		return wire.ResponseCodePreconditionFailed
	}
	if !c.allowed(auth.Configure, name) {
		return wire.ResponseCodeAccessRefused
	}
	args, ok := queueArgs(props)
	if !ok {
		return wire.ResponseCodePreconditionFailed
	}
	existed := c.vhost.Queue(name)
	if existed != nil && existed.Kind() != "stream" {
		return wire.ResponseCodePreconditionFailed
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	// A redeclaration with other arguments is refused as in AMQP (406: precondition_failed);
	// with the same ones the answer is stream_already_exists, as RabbitMQ's.
	q, err := c.vhost.DeclareQueue(c.actor(ctx), core.QueueDecl{Name: name, Durable: true, Args: args}, nil)
	if err != nil {
		return codeOf(err)
	}
	if q.Kind() != "stream" {
		return wire.ResponseCodePreconditionFailed
	}
	if existed != nil {
		return wire.ResponseCodeStreamAlreadyExists
	}
	c.vhost.WaitStreamLeader(ctx, name)
	return wire.ResponseCodeOK
}

func (c *conn) deleteStream(frame []byte) error {
	var m wire.DeleteStream
	if err := m.Decode(frame); err != nil {
		return err
	}
	// Configure permission first, as RabbitMQ: a refused user learns nothing of the stream.
	code := wire.ResponseCodeOK
	q := c.vhost.Queue(m.Stream)
	switch {
	case !c.allowed(auth.Configure, m.Stream):
		code = wire.ResponseCodeAccessRefused
	case q == nil || q.Kind() != "stream":
		code = wire.ResponseCodeStreamDoesNotExist
	default:
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		_, err := c.vhost.DeleteQueue(c.actor(ctx), q, false, false, nil)
		cancel()
		if err != nil {
			code = codeOf(err)
		}
	}
	c.respond(wire.CommandDeleteStream, m.CorrelationID, code)
	if code == wire.ResponseCodeOK {
		c.s.notifyStreamGone(c.vhost.Name(), m.Stream)
	}
	return nil
}

// metadata answers where each stream lives: its leader (clients publish there) and the other
// nodes holding a replica that are up (clients consume there), each with the host and port it
// advertises (asked of the node over the cluster port and cached, as RabbitMQ's stream plugin
// asks each node). A node that does not answer is left out; a stream without a leader has
// leader reference 0xFFFF, which clients take as "not ready yet".
//
// Each stream needs read or write permission, as in RabbitMQ 4.x (since 4.2.9 and 4.3.3: both
// producers and consumers ask): one the user may neither read nor write is answered
// access_refused, whether it exists or not, and its nodes are not listed among the brokers.
func (c *conn) metadata(frame []byte) error {
	var m wire.Metadata
	if err := m.Decode(frame); err != nil {
		return err
	}
	resp := &wire.MetadataResponse{CorrelationID: m.CorrelationID}
	tops := make([]core.StreamTopology, len(m.Streams))
	codes := make([]wire.ResponseCode, len(m.Streams))
	var nodes []string
	for i, name := range m.Streams {
		codes[i] = wire.ResponseCodeStreamDoesNotExist
		if !c.readsOrWrites(name) {
			codes[i] = wire.ResponseCodeAccessRefused
			continue
		}
		if _, ok := c.streamQueue(name); !ok {
			continue
		}
		t, found := c.vhost.StreamTopology(name)
		if !found {
			continue
		}
		tops[i], codes[i] = t, wire.ResponseCodeOK
		if t.Leader != "" {
			nodes = append(nodes, t.Leader)
		}
		nodes = append(nodes, t.Replicas...)
	}
	slices.Sort(nodes)
	nodes = slices.Compact(nodes)
	refs := c.brokerRefs(nodes, resp)
	for i, name := range m.Streams {
		sm := wire.StreamMetadata{Stream: name, Code: codes[i], Leader: wire.NoLeader}
		if codes[i] != wire.ResponseCodeOK {
			resp.Streams = append(resp.Streams, sm)
			continue
		}
		if ref, ok := refs[tops[i].Leader]; ok {
			sm.Leader = ref
		}
		for _, n := range tops[i].Replicas {
			if ref, ok := refs[n]; ok {
				sm.Replicas = append(sm.Replicas, ref)
			}
		}
		resp.Streams = append(resp.Streams, sm)
	}
	c.write(resp)
	return nil
}

// brokerRefs puts the advertised endpoint of each node into resp's brokers (asking the nodes
// at once) and returns each listed node's reference.
func (c *conn) brokerRefs(nodes []string, resp *wire.MetadataResponse) map[string]uint16 {
	eps := make([]core.Endpoints, len(nodes))
	oks := make([]bool, len(nodes))
	ctx, cancel := context.WithTimeout(context.Background(), metadataTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			eps[i], oks[i] = c.s.core.NodeEndpoints(ctx, n)
		}()
	}
	wg.Wait()
	overTLS := c.tc != nil
	refs := make(map[string]uint16, len(nodes))
	for i, n := range nodes {
		host, port := eps[i].StreamHost, eps[i].StreamPort
		if overTLS {
			port = eps[i].StreamTLSPort
		}
		if n == c.s.core.Node().ID() {
			host, port = c.s.advertised(overTLS)
		}
		if !oks[i] || host == "" || port == 0 {
			continue
		}
		ref := uint16(len(resp.Brokers))
		resp.Brokers = append(resp.Brokers, wire.Broker{Reference: ref, Host: host, Port: uint32(port)})
		refs[n] = ref
	}
	return refs
}

func (c *conn) streamStats(frame []byte) error {
	var m wire.StreamStats
	if err := m.Decode(frame); err != nil {
		return err
	}
	resp := &wire.StreamStatsResponse{CorrelationID: m.CorrelationID, Code: wire.ResponseCodeOK}
	sq, code := c.readableStream(m.Stream)
	if code != wire.ResponseCodeOK {
		resp.Code = code
	} else {
		l := sq.Replica().Log()
		first, committed, last := int64(-1), int64(-1), int64(-1)
		if next := l.Next(); next > l.First() {
			first = int64(l.First())
			committed = int64(l.LastChunk())
			last = committed
		}
		resp.Stats = []wire.Stat{{Name: "committed_chunk_id", Value: committed}, {Name: "first_chunk_id", Value: first},
			{Name: "last_chunk_id", Value: last}}
	}
	c.write(resp)
	return nil
}

func (c *conn) exchangeCommandVersions(frame []byte) error {
	var m wire.ExchangeCommandVersions
	if err := m.Decode(frame); err != nil {
		return err
	}
	for _, cv := range m.Commands {
		if cv.Key == wire.CommandDeliver && cv.MaxVersion >= wire.Version2 {
			c.deliverV2 = true
		}
	}
	c.write(&wire.ExchangeCommandVersionsResponse{CorrelationID: m.CorrelationID, Code: wire.ResponseCodeOK,
		Commands: wire.ServerCommandVersions})
	return nil
}

// partitions lists a super stream's partitions. As in RabbitMQ 4.x, the user needs read or
// write permission on the super stream's exchange (checked before it is looked up) and on every
// partition; otherwise the answer is access_refused with no partitions.
func (c *conn) partitions(frame []byte) error {
	var m wire.Partitions
	if err := m.Decode(frame); err != nil {
		return err
	}
	resp := &wire.StreamsResponse{Command: wire.CommandPartitions, CorrelationID: m.CorrelationID, Code: wire.ResponseCodeOK}
	resp.Code, resp.Streams = c.superStreamStreams(m.SuperStream, c.readsOrWrites, func() ([]string, bool) {
		return c.vhost.SuperStreamPartitions(m.SuperStream)
	})
	c.write(resp)
	return nil
}

// route lists the partitions a routing key is bound to (a producer's key routing). As in
// RabbitMQ 4.x, the user needs write permission on the super stream's exchange (checked before
// it is looked up) and on every partition routed to; otherwise the answer is access_refused
// with no streams.
func (c *conn) route(frame []byte) error {
	var m wire.Route
	if err := m.Decode(frame); err != nil {
		return err
	}
	resp := &wire.StreamsResponse{Command: wire.CommandRoute, CorrelationID: m.CorrelationID, Code: wire.ResponseCodeOK}
	writes := func(name string) bool { return c.allowed(auth.Write, name) }
	resp.Code, resp.Streams = c.superStreamStreams(m.SuperStream, writes, func() ([]string, bool) {
		return c.vhost.SuperStreamRoute(m.SuperStream, m.RoutingKey)
	})
	c.write(resp)
	return nil
}

// superStreamStreams answers partitions and route: access_refused unless allowed(superStream),
// stream_does_not_exist unless lookup finds the super stream, access_refused unless allowed
// for every stream found, else the streams.
func (c *conn) superStreamStreams(superStream string, allowed func(string) bool,
	lookup func() ([]string, bool)) (wire.ResponseCode, []string) {
	if !allowed(superStream) {
		return wire.ResponseCodeAccessRefused, nil
	}
	streams, ok := lookup()
	if !ok {
		return wire.ResponseCodeStreamDoesNotExist, nil
	}
	for _, s := range streams {
		if !allowed(s) {
			return wire.ResponseCodeAccessRefused, nil
		}
	}
	return wire.ResponseCodeOK, streams
}

func (c *conn) createSuperStream(frame []byte) error {
	var m wire.CreateSuperStream
	if err := m.Decode(frame); err != nil {
		return err
	}
	c.respond(wire.CommandCreateSuperStream, m.CorrelationID, c.createSuperStreamCode(&m))
	return nil
}

func (c *conn) createSuperStreamCode(m *wire.CreateSuperStream) wire.ResponseCode {
	if m.Name == "" {
		return wire.ResponseCodePreconditionFailed
	}
	if !c.managesSuperStream(m.Name, m.Partitions) {
		return wire.ResponseCodeAccessRefused
	}
	n := len(m.Partitions)
	if n == 0 || len(m.BindingKeys) != n {
		return wire.ResponseCodePreconditionFailed
	}
	if _, ok := c.vhost.SuperStreamPartitions(m.Name); ok {
		return wire.ResponseCodeStreamAlreadyExists
	}
	for _, p := range m.Partitions {
		if c.vhost.Queue(p) != nil {
			return wire.ResponseCodeStreamAlreadyExists
		}
	}
	qargs, ok := queueArgs(m.Arguments)
	if !ok {
		return wire.ResponseCodePreconditionFailed
	}
	delete(qargs, "x-queue-type")
	qargs["x-partitions"] = int64(n)
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	d := core.ExchangeDecl{Name: m.Name, Type: core.SuperStreamType, Durable: true, Args: qargs,
		Partitions: m.Partitions, BindingKeys: m.BindingKeys}
	if err := c.vhost.DeclareExchange(c.actor(ctx), d); err != nil {
		return codeOf(err)
	}
	for _, p := range m.Partitions {
		c.vhost.WaitStreamLeader(ctx, p)
	}
	return wire.ResponseCodeOK
}

func (c *conn) deleteSuperStream(frame []byte) error {
	var m wire.DeleteSuperStream
	if err := m.Decode(frame); err != nil {
		return err
	}
	// RabbitMQ's order: configure on the exchange (a refused user learns nothing of the super
	// stream), then the super stream, then what creating it needs, on the partitions it has now.
	code := wire.ResponseCodeOK
	parts, ok := c.vhost.SuperStreamPartitions(m.Name)
	switch {
	case !c.allowed(auth.Configure, m.Name):
		code = wire.ResponseCodeAccessRefused
	case !ok:
		code = wire.ResponseCodeStreamDoesNotExist
	case !c.managesSuperStream(m.Name, parts):
		code = wire.ResponseCodeAccessRefused
	default:
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		err := c.vhost.DeleteExchange(c.actor(ctx), m.Name, false)
		cancel()
		if err != nil {
			code = codeOf(err)
		}
	}
	c.respond(wire.CommandDeleteSuperStream, m.CorrelationID, code)
	if code == wire.ResponseCodeOK {
		for _, p := range parts {
			c.s.notifyStreamGone(c.vhost.Name(), p)
		}
	}
	return nil
}

// managesSuperStream reports whether the user may create (or delete) super stream name with
// partitions, by RabbitMQ's rule (rabbit_stream_utils:check_super_stream_management_permitted):
// configure on the exchange and on every partition, read on the exchange and write on every
// partition (the bindings from the one to the others).
func (c *conn) managesSuperStream(name string, partitions []string) bool {
	if !c.allowed(auth.Configure, name) || !c.allowed(auth.Read, name) {
		return false
	}
	for _, p := range partitions {
		if !c.allowed(auth.Configure, p) || !c.allowed(auth.Write, p) {
			return false
		}
	}
	return true
}
