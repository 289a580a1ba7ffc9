package core

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"

	"warren/server/auth"
	"warren/server/cluster"
	"warren/server/policy"
	"warren/server/queue"
	"warren/storage"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newTestBroker is a one-node core on a temporary data directory.
func newTestBroker(t testing.TB, defaultUser string) *Broker {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	db, err := storage.Open(storage.Options{Dir: dir, Logger: log, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	node, err := cluster.Start(cluster.Config{NodeID: "n", DB: db, DataDir: dir, Logger: log})
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	b, err := New(Options{DB: db, Node: node, Logger: log, Types: []queue.Type{queue.ClassicType{}, queue.QuorumType{}},
		DefaultUser: defaultUser, DefaultPass: "pw"})
	if err != nil {
		node.Close()
		db.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.Close()
		node.Close()
		db.Close()
	})
	return b
}

// memSink is a raft.SnapshotSink in memory.
type memSink struct{ bytes.Buffer }

func (s *memSink) ID() string    { return "test" }
func (s *memSink) Cancel() error { return nil }
func (s *memSink) Close() error  { return nil }

// TestSnapshotRestoresAccessRecords: a metadata snapshot carries vhosts, users, permissions,
// topic permissions, limits and policies; restoring it on another node makes that node's records
// the snapshot's, removing what the snapshot does not have.
func TestSnapshotRestoresAccessRecords(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a := newTestBroker(t, "admin")
	h, _ := auth.HashPassword(auth.DefaultAlgorithm, "app-pass")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(a.PutVHost(ctx, VHostInfo{Name: "v", Description: "d"}))
	must(a.PutUser(ctx, User{Name: "app", Hash: h, Tags: []string{"management"}}))
	must(a.SetPermission(ctx, PermissionInfo{User: "app", VHost: "v", Permission: auth.Permission{Configure: "^app", Write: ".*", Read: ".*"}}))
	must(a.SetTopicPermission(ctx, TopicPermissionInfo{User: "app", VHost: "v", TopicPermission: auth.TopicPermission{Exchange: "amq.topic", Write: "^a", Read: ".*"}}))
	must(a.SetVHostLimits(ctx, "v", map[string]int64{LimitMaxQueues: 5}))
	must(a.PutPolicy(ctx, policy.ComponentPolicy, policy.Policy{VHost: "v", Name: "p", Pattern: ".*", Definition: policy.Definition{"max-length": 3}}))

	snap, err := (&metaFSM{b: a}).Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var sink memSink
	must(snap.Persist(&sink))
	snap.Release()

	b := newTestBroker(t, "other")
	must(b.PutVHost(ctx, VHostInfo{Name: "gone"}))
	// The record is committed; wait until this node has applied it (the vhost is open), so the
	// restore below replaces a state that has it rather than racing its application.
	for deadline := time.Now().Add(5 * time.Second); b.VHost("gone") == nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("vhost gone not applied within 5s")
		}
	}
	must((&metaFSM{b: b}).Restore(io.NopCloser(&sink)))

	if _, ok := b.LookupVHost("v"); !ok || b.VHost("v") == nil {
		t.Fatal("vhost v not restored")
	}
	if _, ok := b.LookupVHost("gone"); ok || b.VHost("gone") != nil {
		t.Fatal("vhost gone survived a snapshot without it")
	}
	if _, ok := b.LookupUser("other"); ok {
		t.Fatal("user other survived a snapshot without it")
	}
	if _, err := b.Login("PLAIN", "app", "app-pass", nil, nil); err != nil {
		t.Fatalf("restored user cannot log in: %v", err)
	}
	if g := b.VHostGrant("app", "v"); g == nil || g.Permission().Configure != "^app" {
		t.Fatalf("permission not restored: %v", g)
	}
	if len(b.TopicGrants("app", "v")) != 1 {
		t.Fatal("topic permission not restored")
	}
	if b.VHostLimits("v")[LimitMaxQueues] != 5 {
		t.Fatal("limits not restored")
	}
	if b.LookupPolicy(policy.ComponentPolicy, "v", "p") == nil {
		t.Fatal("policy not restored")
	}
}
