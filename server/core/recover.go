package core

import (
	"encoding/binary"
	"fmt"
	"strings"

	"warren/amqp"
	"warren/exchange"
	"warren/server/policy"
	"warren/server/queue"
	"warren/storage"
)

// recover loads the node's metadata records once: exchanges, then queues (each queue type
// recovers its own stored messages when it is opened), then bindings. A data directory written
// with format-1 records is migrated first.
func (b *Broker) recover() error {
	b.recovering = true
	defer func() { b.recovering = false }()
	if err := b.migrate(); err != nil {
		return err
	}
	type queueRec struct {
		rec   QueueRecord
		store recStore
	}
	type bindingRec struct {
		rec BindingRecord
		key []byte
	}
	var exs []ExchangeRecord
	var qs []queueRec
	var bs []bindingRec
	var access []accessRec
	err := b.db.Scan([]byte{storage.PrefixMeta}, false, func(k, val []byte) error {
		if len(k) < 2 {
			return nil
		}
		var err error
		switch k[1] {
		case kindInit, kindVHost, kindUser, kindPermission, kindTopicPerm, kindLimits, kindPolicy, kindOperatorPolicy:
			access = append(access, accessRec{kind: k[1], val: append([]byte(nil), val...)})
		case kindApplied:
			if len(val) == 8 {
				b.applied.Store(binary.BigEndian.Uint64(val))
			}
		case kindExchange:
			var r ExchangeRecord
			if r, err = decodeExchange(val); err == nil {
				exs = append(exs, r)
			}
		case kindQueue, kindLocalQueue:
			var r QueueRecord
			if r, err = decodeQueue(val); err == nil {
				st := storeReplicated
				if k[1] == kindLocalQueue {
					st = storeLocal
				}
				qs = append(qs, queueRec{r, st})
			}
		case kindGroup:
			err = b.loadGroup(val)
		case kindBinding, kindLocalBinding:
			var r BindingRecord
			if r, err = decodeBinding(val); err == nil {
				bs = append(bs, bindingRec{r, append([]byte(nil), k...)})
			}
		}
		if err != nil {
			return fmt.Errorf("metadata record %x: %w", k, err)
		}
		return nil
	})
	if err != nil {
		return wrap("read metadata", err)
	}
	if err := b.recoverAccess(access); err != nil {
		return err
	}
	for _, r := range exs {
		v := b.vhostFor(r.VHost)
		if v == nil {
			continue
		}
		if _, _, aerr := v.ex.Declare(r.Name, r.Type, true, r.AutoDelete, r.Internal, false, r.Args); aerr != nil {
			b.log.Warn("cannot restore exchange", "vhost", r.VHost, "exchange", r.Name, "err", aerr.Text)
			continue
		}
		v.matchExchange(r.Name)
	}
	for _, qr := range qs {
		v := b.vhostFor(qr.rec.VHost)
		if v == nil {
			continue
		}
		q, err := v.openQueue(qr.rec, true, nil, qr.store, true)
		if err != nil {
			return fmt.Errorf("open queue '%s' in vhost '%s': %w", qr.rec.Name, qr.rec.VHost, err)
		}
		v.queues[qr.rec.Name] = q
	}
	var cleanup storage.Batch
	for _, br := range bs {
		v := b.vhostFor(br.rec.VHost)
		if v == nil {
			continue
		}
		if br.rec.DestKind == exchange.ToQueue && v.queues[br.rec.Dest] == nil {
			cleanup.Delete(br.key) // its queue was deleted
			continue
		}
		if aerr := v.ex.Bind(br.rec.Binding); aerr != nil {
			b.log.Warn("cannot restore binding; record dropped", "vhost", br.rec.VHost, "source", br.rec.Source,
				"destination", br.rec.Dest, "err", aerr.Text)
			cleanup.Delete(br.key)
		}
	}
	if cleanup.Len() > 0 {
		if err := b.db.CommitSync(&cleanup); err != nil {
			return wrap("drop dangling binding records", err)
		}
	}
	// Paged-out transient messages never survive a restart.
	if _, err := b.db.DeleteRange([]byte{queue.PrefixTransient}); err != nil {
		return wrap("delete transient pages", err)
	}
	if len(qs) > 0 || len(exs) > 0 {
		b.log.Info("recovered durable state", "exchanges", len(exs), "queues", len(qs), "bindings", len(bs))
	}
	return nil
}

// accessRec is a stored access-control or policy record, applied by recoverAccess.
type accessRec struct {
	kind byte
	val  []byte
}

// recoverAccess loads the vhosts, users, permissions, limits and policies, in that order. Before
// the first bootstrap's record is applied (a new data directory, or one written before vhosts
// were records) the vhost "/" exists in memory, so that what the node stored under it is served;
// the bootstrap then writes its record. A node that joins a cluster waits for the cluster's.
func (b *Broker) recoverAccess(recs []accessRec) error {
	var discard storage.Batch // the records are already stored
	order := [...]byte{kindInit, kindVHost, kindUser, kindPermission, kindTopicPerm, kindLimits, kindPolicy, kindOperatorPolicy}
	for _, kind := range order {
		for _, r := range recs {
			if r.kind != kind {
				continue
			}
			var err error
			switch kind {
			case kindInit:
				b.restoreInit(&discard)
			case kindVHost:
				var v *VHostInfo
				if v, err = decodeVHost(r.val); err == nil {
					b.applyPutVHost(v, &discard)
				}
			case kindUser:
				var u *User
				if u, err = decodeUser(r.val); err == nil {
					b.applyPutUser(u, &discard)
				}
			case kindPermission:
				var p PermissionInfo
				if p, err = decodePerm(r.val); err == nil {
					b.applyPutPermission(p, &discard)
				}
			case kindTopicPerm:
				var p TopicPermissionInfo
				if p, err = decodeTopic(r.val); err == nil {
					b.applyPutTopic(p, &discard)
				}
			case kindLimits:
				var vhost string
				var l map[string]int64
				if vhost, l, err = decodeLimits(r.val); err == nil {
					b.applyPutLimits(vhost, l, &discard)
				}
			case kindPolicy, kindOperatorPolicy:
				var pr policyRecord
				if pr, err = decodePolicyRecord(r.val); err == nil {
					if cp, cerr := policy.Compile(pr.Component, pr.Policy); cerr == nil {
						b.policies.Store(b.policySet().With(cp))
					} else {
						b.log.Warn("stored policy no longer valid; ignored", "vhost", pr.VHost, "policy", pr.Name, "err", cerr)
					}
				}
			}
			if err != nil {
				return fmt.Errorf("metadata record of kind %q: %w", kind, err)
			}
		}
	}
	b.access.mu.RLock()
	initialized := b.access.initialized
	b.access.mu.RUnlock()
	if !initialized && !b.opts.Join && b.VHost("/") == nil {
		b.mu.Lock()
		b.vhosts["/"] = newVHost(b, "/")
		b.mu.Unlock()
	}
	return nil
}

// Format-1 record kinds: one vhost ("/"), names in the key, AMQP tables as values.
const (
	v1Exchange byte = 'e'
	v1Queue    byte = 'q'
	v1Binding  byte = 'b'
	v1Applied  byte = 'i'
)

// migrate converts format-1 metadata records to this layout once, in one batch, and writes the
// format record; a newer format is refused.
func (b *Broker) migrate() error {
	fk := []byte{storage.PrefixMeta, kindFormat}
	if val, err := b.db.Get(fk); err == nil {
		if len(val) != 1 || val[0] > metaFormat {
			return fmt.Errorf("the metadata in this data directory has format %v, newer than this Warren's (%d): use the Warren release that wrote it", val, metaFormat)
		}
		return nil
	}
	var batch storage.Batch
	var old [][2][]byte
	err := b.db.Scan([]byte{storage.PrefixMeta}, false, func(k, val []byte) error {
		if len(k) >= 2 && strings.IndexByte("eqbi", k[1]) >= 0 {
			old = append(old, [2][]byte{append([]byte(nil), k...), append([]byte(nil), val...)})
		}
		return nil
	})
	if err != nil {
		return wrap("read metadata", err)
	}
	replicatedQueue := make(map[string]bool)
	for _, kv := range old {
		if kv[0][1] == v1Queue {
			if t, _, err := amqp.DecodeTable(kv[1]); err == nil {
				g, _ := amqp.AsInt64(t["group"])
				replicatedQueue[string(kv[0][2:])] = g != 0
			}
		}
	}
	counts := map[byte]int{}
	for _, kv := range old {
		k, val := kv[0], kv[1]
		batch.Delete(k)
		nk, nv, err := migrateV1Record(k, val, replicatedQueue)
		if err != nil {
			b.log.Warn("format-1 metadata record not migrated", "key", fmt.Sprintf("%x", k), "err", err)
			continue
		}
		if nk != nil {
			batch.Set(nk, nv)
			counts[nk[1]]++
		}
	}
	batch.Set(fk, []byte{metaFormat})
	if err := b.db.CommitSync(&batch); err != nil {
		return wrap("write migrated metadata", err)
	}
	if len(old) > 0 {
		b.log.Info("metadata migrated from format 1 to format 2 (one record per object)",
			"exchanges", counts[kindExchange], "queues", counts[kindQueue]+counts[kindLocalQueue],
			"bindings", counts[kindBinding]+counts[kindLocalBinding])
	}
	return nil
}

// migrateV1Record turns one format-1 record into this layout (nil key: nothing to keep).
// replicatedQueue says, by name, which queues had a raft group.
func migrateV1Record(k, val []byte, replicatedQueue map[string]bool) ([]byte, []byte, error) {
	if k[1] == v1Applied {
		if len(val) != 8 {
			return nil, nil, errBadRecord
		}
		return appliedKey(), val, nil
	}
	t, _, err := amqp.DecodeTable(val)
	if err != nil {
		return nil, nil, err
	}
	name := string(k[2:])
	switch k[1] {
	case v1Exchange:
		r := ExchangeRecord{VHost: "/", Name: name, Type: str(t, "type"), AutoDelete: boolean(t, "auto_delete"),
			Internal: boolean(t, "internal"), Args: table(t, "arguments")}
		return r.key(), r.encode(), nil
	case v1Queue:
		id, _ := amqp.AsInt64(t["id"])
		g, _ := amqp.AsInt64(t["group"])
		args := table(t, "arguments")
		r := QueueRecord{VHost: "/", Name: name, ID: uint64(id), Kind: kindOfArgs(args), AutoDelete: boolean(t, "auto_delete"), Args: args}
		key := r.key()
		if g != 0 {
			r.ID, r.Voters, r.Nonvoters = uint64(g), stringList(t["voters"]), stringList(t["nonvoters"])
		} else {
			key[1] = kindLocalQueue
		}
		return key, r.encode(), nil
	case v1Binding:
		r := BindingRecord{VHost: "/"}
		r.Source, r.Dest, r.Key, r.Args = str(t, "source"), str(t, "destination"), str(t, "routing_key"), table(t, "arguments")
		r.DestKind = exchange.ToQueue
		if str(t, "destination_type") == "exchange" {
			r.DestKind = exchange.ToExchange
		}
		key := r.key()
		if r.DestKind == exchange.ToQueue && !replicatedQueue[r.Dest] {
			key[1] = kindLocalBinding
		}
		return key, r.encode(), nil
	}
	return nil, nil, nil
}

// kindOfArgs is the queue type x-queue-type names ("classic" when absent).
func kindOfArgs(args amqp.Table) string {
	switch t := args["x-queue-type"].(type) {
	case string:
		if t != "" {
			return t
		}
	case []byte:
		if len(t) > 0 {
			return string(t)
		}
	}
	return "classic"
}

// decodeV1Cmd translates a format-1 metadata command (an AMQP table with an "op") still in the
// raft log of a node that ran the earlier release.
func decodeV1Cmd(data []byte) (metaOp, []byte, error) {
	t, _, err := amqp.DecodeTable(data)
	if err != nil {
		return 0, nil, err
	}
	vhost := str(t, "vhost")
	if vhost == "" {
		vhost = "/"
	}
	args := table(t, "arguments")
	switch str(t, "op") {
	case "exchange.declare":
		r := ExchangeRecord{VHost: vhost, Name: str(t, "name"), Type: str(t, "type"), AutoDelete: boolean(t, "auto_delete"),
			Internal: boolean(t, "internal"), Args: args}
		return opPutExchange, r.encode(), nil
	case "exchange.delete":
		r := ExchangeRecord{VHost: vhost, Name: str(t, "name")}
		return opDeleteExchange, r.encode(), nil
	case "bind", "unbind":
		r := BindingRecord{VHost: vhost}
		r.Source, r.Dest, r.Key, r.Args = str(t, "source"), str(t, "destination"), str(t, "routing_key"), args
		r.DestKind = exchange.ToQueue
		if str(t, "destination_type") == "exchange" {
			r.DestKind = exchange.ToExchange
		}
		if str(t, "op") == "bind" {
			return opBind, r.encode(), nil
		}
		return opUnbind, r.encode(), nil
	case "queue.declare":
		g, _ := amqp.AsInt64(t["group"])
		r := QueueRecord{VHost: vhost, Name: str(t, "name"), ID: uint64(g), Kind: kindOfArgs(args), Args: args,
			Voters: stringList(t["voters"]), Nonvoters: stringList(t["nonvoters"])}
		return opPutQueue, r.encode(), nil
	case "queue.delete":
		g, _ := amqp.AsInt64(t["group"])
		r := QueueRecord{VHost: vhost, Name: str(t, "name"), ID: uint64(g)}
		return opDeleteQueue, r.encode(), nil
	}
	return 0, nil, fmt.Errorf("unknown format-1 metadata command %q", str(t, "op"))
}

// decodeV1Snapshot reads a format-1 metadata snapshot (an AMQP table of the records as the
// earlier release kept them) into records of this layout.
func decodeV1Snapshot(data []byte) (uint64, map[string][]byte, error) {
	t, _, err := amqp.DecodeTable(data)
	if err != nil {
		return 0, nil, err
	}
	applied, _ := amqp.AsInt64(t["applied"])
	list, _ := t["records"].([]any)
	type kv struct{ k, v []byte }
	var recs []kv
	replicatedQueue := make(map[string]bool)
	for _, x := range list {
		r, _ := x.(amqp.Table)
		k, _ := r["key"].([]byte)
		val, _ := r["value"].([]byte)
		if len(k) < 2 {
			continue
		}
		recs = append(recs, kv{k, val})
		if k[1] == v1Queue {
			replicatedQueue[string(k[2:])] = true // format 1 replicated only queues with a group
		}
	}
	want := make(map[string][]byte)
	for _, r := range recs {
		nk, nv, err := migrateV1Record(r.k, r.v, replicatedQueue)
		if err == nil && nk != nil {
			want[string(nk)] = nv
		}
	}
	return uint64(applied), want, nil
}
