package server

import (
	"encoding/binary"
	"fmt"
	"strings"

	"warren/amqp"
	"warren/exchange"
	"warren/server/queue"
	"warren/storage"
)

// Metadata record kinds under storage.PrefixMeta.
const (
	metaExchange byte = 'e'
	metaQueue    byte = 'q'
	metaBinding  byte = 'b'
	metaIndex    byte = 'i' // the metadata group's last applied index (key "i" alone)
)

// builtinExchange reports the exchanges every vhost creates by itself; they are never stored.
func builtinExchange(name string) bool {
	switch name {
	case "", "amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match":
		return true
	}
	return false
}

func mustTable(t amqp.Table) []byte {
	b, err := amqp.AppendTable(nil, t)
	if err != nil {
		// Tables here come from decoded client input or from our own fields, so every value has a
		// wire type; reaching this is a bug.
		panic(fmt.Sprintf("encode metadata: %v", err))
	}
	return b
}

// bindingKey identifies a binding: its fields and its encoded arguments.
func bindingKey(b exchange.Binding) string {
	var sb strings.Builder
	sb.WriteString(b.Source)
	sb.WriteByte(0)
	sb.WriteByte(byte(b.DestKind))
	sb.WriteString(b.Dest)
	sb.WriteByte(0)
	sb.WriteString(b.Key)
	sb.WriteByte(0)
	sb.Write(mustTable(b.Args))
	return sb.String()
}

// desiredMeta computes every durable metadata record the vhost should have on disk now.
func (v *vhost) desiredMeta() map[string][]byte {
	want := make(map[string][]byte)
	durableEx := make(map[string]bool)
	for _, ex := range v.exchanges.Exchanges() {
		durableEx[ex.Name] = ex.Durable
		if !ex.Durable || builtinExchange(ex.Name) {
			continue
		}
		want[string(storage.MetaKey(metaExchange, ex.Name))] = mustTable(amqp.Table{
			"type": ex.Kind.String(), "auto_delete": ex.AutoDelete, "internal": ex.Internal, "arguments": ex.Args,
		})
	}
	v.mu.RLock()
	durableQ := make(map[string]bool, len(v.queues))
	for name, e := range v.queues {
		d := e.durable && e.owner == nil
		durableQ[name] = d
		if !d {
			continue
		}
		rec := amqp.Table{"id": int64(e.id), "auto_delete": e.autoDel, "arguments": e.args}
		if e.group != 0 {
			rec["group"], rec["voters"], rec["nonvoters"] = int64(e.group), anys(e.voters), anys(e.nonvoters)
		}
		want[string(storage.MetaKey(metaQueue, name))] = mustTable(rec)
	}
	v.mu.RUnlock()
	if i := v.metaApplied.Load(); i != 0 {
		want[string(storage.MetaKey(metaIndex, ""))] = binary.BigEndian.AppendUint64(nil, i)
	}
	for _, b := range v.exchanges.Bindings() {
		if !durableEx[b.Source] {
			continue
		}
		if b.DestKind == exchange.ToQueue && !durableQ[b.Dest] || b.DestKind == exchange.ToExchange && !durableEx[b.Dest] {
			continue
		}
		kind := "queue"
		if b.DestKind == exchange.ToExchange {
			kind = "exchange"
		}
		want[string(storage.MetaKey(metaBinding, bindingKey(b)))] = mustTable(amqp.Table{
			"source": b.Source, "destination": b.Dest, "destination_type": kind, "routing_key": b.Key, "arguments": b.Args,
		})
	}
	return want
}

// syncMeta writes the difference between the durable metadata in memory and what is on disk, and
// waits for it to be durable. Every declare, delete, bind and unbind calls it before replying.
func (v *vhost) syncMeta() error {
	if v.db == nil {
		return nil
	}
	v.metaMu.Lock()
	defer v.metaMu.Unlock()
	want := v.desiredMeta()
	var b storage.Batch
	for k, val := range want {
		if old, ok := v.persisted[k]; !ok || string(old) != string(val) {
			b.Set([]byte(k), val)
		}
	}
	for k := range v.persisted {
		if _, ok := want[k]; !ok {
			b.Delete([]byte(k))
		}
	}
	if b.Len() == 0 {
		return nil
	}
	b.UseReserve() // declares and deletes are small and must work while a full disk is drained
	if err := v.db.CommitSync(&b); err != nil {
		return fmt.Errorf("store metadata: %w", err)
	}
	v.persisted = want
	return nil
}

// recover loads the vhost's durable exchanges, queues and bindings, then the queues' messages.
func (v *vhost) recover(s *Server) error {
	persisted := make(map[string][]byte)
	var bindings []amqp.Table
	var queues []struct {
		name string
		t    amqp.Table
	}
	err := v.db.Scan([]byte{storage.PrefixMeta}, false, func(key, val []byte) error {
		persisted[string(key)] = append([]byte(nil), val...)
		if len(key) < 2 {
			return nil
		}
		if key[1] == metaIndex {
			if len(val) == 8 {
				v.metaApplied.Store(binary.BigEndian.Uint64(val))
			}
			return nil
		}
		t, _, err := amqp.DecodeTable(val)
		if err != nil {
			return fmt.Errorf("metadata record %q: %w", key, err)
		}
		name := string(key[2:])
		switch key[1] {
		case metaExchange:
			typ, _ := t["type"].(string)
			ad, _ := t["auto_delete"].(bool)
			internal, _ := t["internal"].(bool)
			args, _ := t["arguments"].(amqp.Table)
			if _, _, aerr := v.exchanges.Declare(name, typ, true, ad, internal, false, args); aerr != nil {
				s.log.Warn("cannot restore exchange", "exchange", name, "err", aerr.Text)
			}
		case metaQueue:
			queues = append(queues, struct {
				name string
				t    amqp.Table
			}{name, t})
		case metaBinding:
			bindings = append(bindings, t)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("read metadata: %w", err)
	}
	byID := make(map[uint64]*queueEntry)
	for _, qr := range queues {
		id, _ := amqp.AsInt64(qr.t["id"])
		ad, _ := qr.t["auto_delete"].(bool)
		args, _ := qr.t["arguments"].(amqp.Table)
		st, aerr := parseQueueArgs(qr.name, v.name, args)
		if aerr != nil {
			s.log.Warn("stored queue arguments no longer valid; using defaults", "queue", qr.name, "err", aerr.Text)
			st, _ = parseQueueArgs(qr.name, v.name, nil)
		}
		if gid, _ := amqp.AsInt64(qr.t["group"]); gid != 0 {
			if _, err := s.openQuorum(v, qr.name, args, st, uint64(gid), stringList(qr.t["voters"]), stringList(qr.t["nonvoters"])); err != nil {
				return fmt.Errorf("open quorum queue %s: %w", qr.name, err)
			}
			continue
		}
		opts, hooks := s.newQueueOptions(v, qr.name, true, false, ad, st, uint64(id))
		e := &queueEntry{args: args, v: v, settings: st, hooks: hooks, name: qr.name, durable: true, autoDel: ad, id: uint64(id)}
		if st.stream {
			sq, err := s.openStream(v, qr.name, uint64(id), st)
			if err != nil {
				return fmt.Errorf("open stream %s: %w", qr.name, err)
			}
			e.stream = sq
		} else {
			e.q = queue.New(opts)
		}
		hooks.e.Store(e)
		v.queues[qr.name] = e
		byID[uint64(id)] = e
		if uint64(id) >= s.nextQueueID.Load() {
			s.nextQueueID.Store(uint64(id))
		}
	}
	for _, t := range bindings {
		src, _ := t["source"].(string)
		dst, _ := t["destination"].(string)
		kind, _ := t["destination_type"].(string)
		key, _ := t["routing_key"].(string)
		args, _ := t["arguments"].(amqp.Table)
		dk := exchange.ToQueue
		if kind == "exchange" {
			dk = exchange.ToExchange
		}
		if aerr := v.exchanges.Bind(exchange.Binding{Source: src, Dest: dst, DestKind: dk, Key: key, Args: args}); aerr != nil {
			s.log.Warn("cannot restore binding", "source", src, "destination", dst, "err", aerr.Text)
		}
	}
	v.persisted = persisted

	// Side records: deadlines, priorities and delivery counts of stored messages.
	metas := make(map[uint64]map[uint64]queue.RestoredMeta)
	for qid := range byID {
		err := v.db.Scan(queue.MetaPrefix(qid), false, func(key, val []byte) error {
			if id, m, ok := queue.ParseMeta(key, val); ok {
				if metas[qid] == nil {
					metas[qid] = make(map[uint64]queue.RestoredMeta)
				}
				metas[qid][id] = m
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("read message metadata: %w", err)
		}
	}
	// Messages: keys only, so a long backlog costs an index entry per message, not its body.
	orphans := make(map[uint64]int)
	total := 0
	err = v.db.Scan([]byte{storage.PrefixMessage}, true, func(key, _ []byte) error {
		qid, mid, ok := storage.ParseMessageKey(key)
		if !ok {
			return nil
		}
		if e := byID[qid]; e != nil && e.q != nil {
			meta, hasMeta := metas[qid][mid]
			e.q.Restore(mid, meta, hasMeta)
			total++
		} else {
			orphans[qid]++
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("read messages: %w", err)
	}
	for qid := range orphans {
		if _, err := v.db.DeleteRange(storage.MessagePrefix(qid)); err != nil {
			return fmt.Errorf("delete messages of deleted queue %d: %w", qid, err)
		}
	}
	// Paged-out transient messages never survive a restart.
	if _, err := v.db.DeleteRange([]byte{queue.PrefixTransient}); err != nil {
		return fmt.Errorf("delete transient pages: %w", err)
	}
	if len(queues) > 0 || total > 0 {
		s.log.Info("recovered durable state", "vhost", v.name, "queues", len(queues), "messages", total,
			"bindings", len(bindings))
	}
	return nil
}
