package core

import (
	"context"
	"fmt"
	"strconv"

	"warren/amqp"
	"warren/exchange"
	"warren/storage"
)

// Super streams, with RabbitMQ's topology (rabbit_stream_manager.erl): an exchange S bound to
// partition streams S-0 .. S-{N-1} with routing keys "0" .. "N-1" and, on each binding, the
// argument x-stream-partition-order i, which orders the partitions. Warren declares one with
// exchange.declare(S, "x-super-stream", args {"x-partitions": N, stream arguments...}); the
// exchange routes a publish to the partition its routing key hashes to (stream/partition, as
// RabbitMQ's stream clients do). The exchange, its partitions and the bindings are one metadata
// command, applied at once on every node: a declaration that fails creates nothing.

// SuperStreamType is the exchange type of super streams.
const SuperStreamType = "x-super-stream"

// MaxPartitions bounds x-partitions.
const MaxPartitions = 1000

// superStreamArgs are the exchange arguments that apply to each partition.
var superStreamArgs = [...]string{"x-max-age", "x-max-length-bytes", "x-initial-cluster-size",
	"x-stream-max-segment-size-bytes", "x-stream-filter-size-bytes"}

// partitionName is partition i of super stream s.
func partitionName(s string, i int) string { return s + "-" + strconv.Itoa(i) }

// parsePartitions reads x-partitions with RabbitMQ's style of 406 texts.
func (v *VHost) parsePartitions(name string, args amqp.Table) (int, *amqp.Error) {
	bad := func(format string, a ...any) *amqp.Error {
		return amqp.Errorf(amqp.PreconditionFailed, "invalid arg 'x-partitions' for exchange '%s' in vhost '%s': %s",
			name, v.name, fmt.Sprintf(format, a...))
	}
	raw, ok := args["x-partitions"]
	if !ok {
		return 0, bad("a super stream needs the number of its partitions")
	}
	n, isInt := amqp.AsInt64(raw)
	if !isInt {
		return 0, bad("must be an integer, got %s", amqp.TypeName(raw))
	}
	if n < 1 || n > MaxPartitions {
		return 0, bad("%d is not between 1 and %d", n, MaxPartitions)
	}
	return int(n), nil
}

// partitionArgs are the queue arguments of a super stream's partitions.
func partitionArgs(args amqp.Table) amqp.Table {
	out := amqp.Table{"x-queue-type": "stream"}
	for _, k := range superStreamArgs {
		if x, ok := args[k]; ok {
			out[k] = x
		}
	}
	return out
}

// declareSuperStream declares (or checks) super stream d.Name.
func (v *VHost) declareSuperStream(ctx context.Context, d ExchangeDecl) *amqp.Error {
	if !d.Durable {
		return amqp.Errorf(amqp.PreconditionFailed, "invalid property 'non-durable' for exchange '%s' in vhost '%s': super streams are durable", d.Name, v.name)
	}
	if x, ok := v.ex.Get(d.Name); ok && x.Kind == exchange.SuperStream {
		return v.checkSuperStream(x, d)
	}
	n, err := v.parsePartitions(d.Name, d.Args)
	if err != nil {
		return err
	}
	names, keys := d.Partitions, d.BindingKeys
	if names == nil {
		for i := range n {
			names, keys = append(names, partitionName(d.Name, i)), append(keys, strconv.Itoa(i))
		}
	}
	if len(names) != n || len(keys) != n {
		return amqp.Errorf(amqp.PreconditionFailed, "invalid arg 'x-partitions' for exchange '%s' in vhost '%s': %d partitions and %d binding keys for %d",
			d.Name, v.name, len(names), len(keys), n)
	}
	qargs := partitionArgs(d.Args)
	if _, err := parseQueueArgs(names[0], v.name, qargs, v.b.hasType); err != nil {
		// The stream arguments' texts name the first partition: RabbitMQ would refuse it so.
		return err
	}
	// Type, flags and the name (the default exchange, amq.*) as any exchange declaration.
	x, err := v.ex.Check(d.Name, d.Type, d.Durable, d.AutoDelete, d.Internal, false, d.Args)
	if err != nil {
		return err
	}
	if x != nil {
		return v.checkSuperStream(x, d)
	}
	for i := range n {
		if q := v.Queue(names[i]); q != nil {
			return amqp.Errorf(amqp.PreconditionFailed, "cannot declare super stream '%s' in vhost '%s': queue '%s' already exists",
				d.Name, v.name, q.Name())
		}
	}
	st, _ := parseQueueArgs(names[0], v.name, qargs, v.b.hasType)
	ex := ExchangeRecord{VHost: v.name, Name: d.Name, Type: SuperStreamType, AutoDelete: d.AutoDelete, Internal: d.Internal, Args: d.Args}
	parts := amqp.Table{"exchange": ex.encode()}
	var queues, bindings []any
	for i := range n {
		voters, nonvoters, merr := v.b.quorumMembersFrom(st.groupSize, i)
		if merr != nil {
			return amqp.Errorf(amqp.InternalError, "cannot declare super stream '%s' in vhost '%s': %v", d.Name, v.name, merr)
		}
		qr := QueueRecord{VHost: v.name, Name: names[i], ID: newQueueID(), Kind: "stream", Args: qargs,
			Voters: voters, Nonvoters: nonvoters}
		queues = append(queues, qr.encode())
		br := BindingRecord{VHost: v.name, Binding: exchange.Binding{Source: d.Name, Dest: qr.Name, DestKind: exchange.ToQueue,
			Key: keys[i], Args: amqp.Table{exchange.PartitionOrderArg: int64(i)}}}
		bindings = append(bindings, br.encode())
	}
	parts["queues"], parts["bindings"] = queues, bindings
	if aerr := v.b.propose(ctx, opPutSuperStream, encodeRecord(parts)); aerr != nil {
		return aerr
	}
	x, ok := v.ex.Get(d.Name)
	if !ok {
		return amqp.Errorf(amqp.InternalError, "cannot create super stream '%s' in vhost '%s'", d.Name, v.name)
	}
	return v.checkSuperStream(x, d)
}

// checkSuperStream answers a redeclaration: same type and flags, same partitions and stream
// arguments, else 406 "inequivalent arg".
func (v *VHost) checkSuperStream(x *exchange.Exchange, d ExchangeDecl) *amqp.Error {
	if _, err := v.ex.Check(d.Name, d.Type, d.Durable, d.AutoDelete, d.Internal, false, d.Args); err != nil {
		return err
	}
	for _, k := range append([]string{"x-partitions"}, superStreamArgs[:]...) {
		cur, hasCur := x.Args[k]
		req, hasReq := d.Args[k]
		if hasCur != hasReq || hasCur && !equalArg(cur, req) {
			return amqp.Errorf(amqp.PreconditionFailed, "inequivalent arg '%s' for exchange '%s' in vhost '%s': received %s but current is %s",
				k, d.Name, v.name, describe(req, hasReq), describe(cur, hasCur))
		}
	}
	return nil
}

func equalArg(a, b any) bool {
	if x, ok := amqp.AsInt64(a); ok {
		y, ok := amqp.AsInt64(b)
		return ok && x == y
	}
	as, aok := stringValue(a)
	bs, bok := stringValue(b)
	return aok && bok && as == bs
}

func stringValue(v any) (string, bool) {
	switch s := v.(type) {
	case string:
		return s, true
	case []byte:
		return string(s), true
	}
	return "", false
}

func describe(v any, present bool) string {
	if !present {
		return "none"
	}
	if s, ok := stringValue(v); ok {
		return "'" + s + "'"
	}
	return fmt.Sprintf("'%v'", v)
}

// deleteSuperStream deletes super stream name and its partitions (the streams bound to it).
func (v *VHost) deleteSuperStream(ctx context.Context, name string) *amqp.Error {
	parts := v.ex.Partitions(name)
	var queues []any
	for _, p := range parts {
		if q := v.Queue(p); q != nil && q.kind == "stream" {
			queues = append(queues, (&QueueRecord{VHost: v.name, Name: q.name, ID: q.id}).encode())
		}
	}
	ex := ExchangeRecord{VHost: v.name, Name: name}
	return v.b.propose(ctx, opDeleteSuperStream, encodeRecord(amqp.Table{"exchange": ex.encode(), "queues": queues}))
}

// applySuperStream applies a super stream's declaration (put) or deletion on this node.
func (v *VHost) applySuperStream(rec amqp.Table, put bool, batch *storage.Batch) {
	exb, _ := rec["exchange"].([]byte)
	ex, err := decodeExchange(exb)
	if err != nil {
		v.b.log.Error("malformed super stream command", "err", err)
		return
	}
	list := func(k string) [][]byte {
		arr, _ := rec[k].([]any)
		out := make([][]byte, 0, len(arr))
		for _, a := range arr {
			if b, ok := a.([]byte); ok {
				out = append(out, b)
			}
		}
		return out
	}
	if !put {
		for _, qb := range list("queues") {
			if qr, err := decodeQueue(qb); err == nil {
				v.applyDeleteQueue(qr, batch)
			}
		}
		v.applyDeleteExchange(ex, batch)
		v.b.dropGroupsOf(v.name, ex.Name, batch)
		v.b.log.Info("super stream deleted", "vhost", v.name, "super_stream", ex.Name)
		return
	}
	if x, ok := v.ex.Get(ex.Name); ok {
		v.b.log.Warn("super stream declaration not applied: the exchange exists", "vhost", v.name, "exchange", x.Name)
		return
	}
	v.applyPutExchange(ex, batch)
	for _, qb := range list("queues") {
		if qr, err := decodeQueue(qb); err == nil {
			v.applyPutQueue(qr, batch)
		}
	}
	for _, bb := range list("bindings") {
		if br, err := decodeBinding(bb); err == nil {
			if aerr := v.applyBinding(br.Binding, true, batch); aerr != nil {
				v.b.log.Error("super stream binding not applied", "vhost", v.name, "super_stream", ex.Name, "partition", br.Dest, "err", aerr.Text)
			}
		}
	}
	v.b.log.Debug("super stream declared", "vhost", v.name, "super_stream", ex.Name)
}
