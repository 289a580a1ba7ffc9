package cluster

import (
	"reflect"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

var testHeader = raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("n1"), Addr: []byte("127.0.0.1:7001")}

// Every raft message survives its encoding.
func TestRPCWireRoundTrip(t *testing.T) {
	entries := []*raft.Log{
		{Index: 5, Term: 2, Type: raft.LogCommand, Data: []byte("hello"), AppendedAt: time.Unix(1_700_000_000, 123)},
		{Index: 6, Term: 2, Type: raft.LogConfiguration, Data: []byte{1, 2, 3}, Extensions: []byte("x")},
		{Index: 7, Term: 3, Type: raft.LogNoop},
	}
	tests := []struct {
		name   string
		encode func([]byte) []byte
		decode func(*decoder) (any, error)
		want   any
	}{
		{"append", func(b []byte) []byte {
			return appendAppendReq(b, &raft.AppendEntriesRequest{RPCHeader: testHeader, Term: 3, Leader: []byte("l"),
				PrevLogEntry: 4, PrevLogTerm: 2, Entries: entries, LeaderCommitIndex: 4})
		}, func(d *decoder) (any, error) { return decodeAppendReq(d) },
			&raft.AppendEntriesRequest{RPCHeader: testHeader, Term: 3, Leader: []byte("l"), PrevLogEntry: 4, PrevLogTerm: 2,
				Entries: entries, LeaderCommitIndex: 4}},
		{"append empty", func(b []byte) []byte {
			return appendAppendReq(b, &raft.AppendEntriesRequest{RPCHeader: testHeader, Term: 1})
		}, func(d *decoder) (any, error) { return decodeAppendReq(d) },
			&raft.AppendEntriesRequest{RPCHeader: testHeader, Term: 1}},
		{"append response", func(b []byte) []byte {
			return appendAppendResp(b, &raft.AppendEntriesResponse{RPCHeader: testHeader, Term: 9, LastLog: 77, Success: true, NoRetryBackoff: true})
		}, func(d *decoder) (any, error) {
			var r raft.AppendEntriesResponse
			return &r, decodeAppendResp(d, &r)
		}, &raft.AppendEntriesResponse{RPCHeader: testHeader, Term: 9, LastLog: 77, Success: true, NoRetryBackoff: true}},
		{"vote", func(b []byte) []byte {
			return appendVoteReq(b, &raft.RequestVoteRequest{RPCHeader: testHeader, Term: 4, Candidate: []byte("c"), LastLogIndex: 10, LastLogTerm: 3, LeadershipTransfer: true})
		}, func(d *decoder) (any, error) { return decodeVoteReq(d) },
			&raft.RequestVoteRequest{RPCHeader: testHeader, Term: 4, Candidate: []byte("c"), LastLogIndex: 10, LastLogTerm: 3, LeadershipTransfer: true}},
		{"vote response", func(b []byte) []byte {
			return appendVoteResp(b, &raft.RequestVoteResponse{RPCHeader: testHeader, Term: 4, Peers: []byte("p"), Granted: true})
		}, func(d *decoder) (any, error) {
			var r raft.RequestVoteResponse
			return &r, decodeVoteResp(d, &r)
		}, &raft.RequestVoteResponse{RPCHeader: testHeader, Term: 4, Peers: []byte("p"), Granted: true}},
		{"pre-vote", func(b []byte) []byte {
			return appendPreVoteReq(b, &raft.RequestPreVoteRequest{RPCHeader: testHeader, Term: 5, LastLogIndex: 8, LastLogTerm: 2})
		}, func(d *decoder) (any, error) { return decodePreVoteReq(d) },
			&raft.RequestPreVoteRequest{RPCHeader: testHeader, Term: 5, LastLogIndex: 8, LastLogTerm: 2}},
		{"pre-vote response", func(b []byte) []byte {
			return appendPreVoteResp(b, &raft.RequestPreVoteResponse{RPCHeader: testHeader, Term: 5, Granted: true})
		}, func(d *decoder) (any, error) {
			var r raft.RequestPreVoteResponse
			return &r, decodePreVoteResp(d, &r)
		}, &raft.RequestPreVoteResponse{RPCHeader: testHeader, Term: 5, Granted: true}},
		{"timeout now", func(b []byte) []byte {
			return appendTimeoutNowReq(b, &raft.TimeoutNowRequest{RPCHeader: testHeader})
		}, func(d *decoder) (any, error) { return decodeTimeoutNowReq(d) },
			&raft.TimeoutNowRequest{RPCHeader: testHeader}},
		{"snapshot", func(b []byte) []byte {
			return appendSnapshotReq(b, &raft.InstallSnapshotRequest{RPCHeader: testHeader, SnapshotVersion: 1, Term: 6, Leader: []byte("l"),
				LastLogIndex: 100, LastLogTerm: 5, Peers: []byte("p"), Configuration: []byte("conf"), ConfigurationIndex: 90, Size: 12345})
		}, func(d *decoder) (any, error) { return decodeSnapshotReq(d) },
			&raft.InstallSnapshotRequest{RPCHeader: testHeader, SnapshotVersion: 1, Term: 6, Leader: []byte("l"),
				LastLogIndex: 100, LastLogTerm: 5, Peers: []byte("p"), Configuration: []byte("conf"), ConfigurationIndex: 90, Size: 12345}},
		{"snapshot response", func(b []byte) []byte {
			return appendSnapshotResp(b, &raft.InstallSnapshotResponse{RPCHeader: testHeader, Term: 6, Success: true})
		}, func(d *decoder) (any, error) {
			var r raft.InstallSnapshotResponse
			return &r, decodeSnapshotResp(d, &r)
		}, &raft.InstallSnapshotResponse{RPCHeader: testHeader, Term: 6, Success: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.encode(nil)
			got, err := tc.decode(&decoder{b: b})
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("round trip:\n got %#v\nwant %#v", got, tc.want)
			}
			// Any truncation is an error, never a panic or a wrong message.
			for n := range len(b) {
				if _, err := tc.decode(&decoder{b: b[:n]}); err == nil {
					t.Fatalf("decoding the first %d of %d bytes succeeded", n, len(b))
				}
			}
		})
	}
}

func TestHeartbeatBatchRoundTrip(t *testing.T) {
	entries := []hbEntry{{id: 1, group: 7, term: 3}, {id: 2, group: 1 << 40, term: 1}}
	b := appendHeartbeats(nil, testHeader, entries)
	if b[0] != kindHeartbeats {
		t.Fatalf("kind %d", b[0])
	}
	h, got, err := decodeHeartbeats(&decoder{b: b[1:]})
	if err != nil || !reflect.DeepEqual(h, testHeader) || !reflect.DeepEqual(got, entries) {
		t.Fatalf("decodeHeartbeats = %+v, %+v, %v", h, got, err)
	}
	answers := []hbAnswer{
		{id: 1, epoch: 99, resp: raft.AppendEntriesResponse{RPCHeader: testHeader, Term: 3, LastLog: 12, Success: true}},
		{id: 2, err: "group 1099511627776 is not running on node n2"},
	}
	b = appendHeartbeatAnswers(nil, testHeader, answers)
	if b[0] != kindHeartbeats|respFlag {
		t.Fatalf("kind %d", b[0])
	}
	gotA, err := decodeHeartbeatAnswers(&decoder{b: b[1:]})
	if err != nil || !reflect.DeepEqual(gotA, answers) {
		t.Fatalf("decodeHeartbeatAnswers = %+v, %v", gotA, err)
	}
}

func TestIsHeartbeat(t *testing.T) {
	hb := &raft.AppendEntriesRequest{RPCHeader: testHeader, Term: 2, Leader: []byte("l")}
	for _, tc := range []struct {
		name string
		req  *raft.AppendEntriesRequest
		want bool
	}{
		{"heartbeat", hb, true},
		{"no term", &raft.AppendEntriesRequest{RPCHeader: testHeader}, false},
		{"previous entry", &raft.AppendEntriesRequest{RPCHeader: testHeader, Term: 2, PrevLogEntry: 3}, false},
		{"commit index", &raft.AppendEntriesRequest{RPCHeader: testHeader, Term: 2, LeaderCommitIndex: 3}, false},
		{"entries", &raft.AppendEntriesRequest{RPCHeader: testHeader, Term: 2, Entries: []*raft.Log{{Index: 1}}}, false},
		{"no leader", &raft.AppendEntriesRequest{Term: 2}, false},
	} {
		if got := isHeartbeat(tc.req); got != tc.want {
			t.Errorf("%s: isHeartbeat = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The decoders never panic and never accept a frame with bytes left over.
func FuzzDecodeRaftFrame(f *testing.F) {
	f.Add(appendAppendReq(nil, &raft.AppendEntriesRequest{RPCHeader: testHeader, Term: 3, Entries: []*raft.Log{{Index: 1, Term: 1, Data: []byte("x")}}}))
	f.Add(appendVoteReq(nil, &raft.RequestVoteRequest{RPCHeader: testHeader, Term: 4}))
	f.Add(appendHeartbeats(nil, testHeader, []hbEntry{{1, 2, 3}})[1:])
	f.Add(appendHeartbeatAnswers(nil, testHeader, []hbAnswer{{id: 1, err: "x"}})[1:])
	f.Add(appendSnapshotReq(nil, &raft.InstallSnapshotRequest{RPCHeader: testHeader, Size: 3}))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = decodeAppendReq(&decoder{b: b})
		_, _ = decodeVoteReq(&decoder{b: b})
		_, _ = decodePreVoteReq(&decoder{b: b})
		_, _ = decodeTimeoutNowReq(&decoder{b: b})
		_, _ = decodeSnapshotReq(&decoder{b: b})
		_, _, _ = decodeHeartbeats(&decoder{b: b})
		_, _ = decodeHeartbeatAnswers(&decoder{b: b})
		var a raft.AppendEntriesResponse
		_ = decodeAppendResp(&decoder{b: b}, &a)
		if r, err := decodeAppendReq(&decoder{b: b}); err == nil {
			// A frame that decodes encodes back to a frame that decodes to the same message.
			again, err := decodeAppendReq(&decoder{b: appendAppendReq(nil, r)})
			if err != nil || len(again.Entries) != len(r.Entries) || again.Term != r.Term {
				t.Fatalf("re-encoded frame: %+v, %v (was %+v)", again, err, r)
			}
		}
	})
}

// The elision rule of peerLink, case by case.
func TestPeerLinkElide(t *testing.T) {
	ok := &raft.AppendEntriesResponse{RPCHeader: testHeader, Term: 3, LastLog: 10, Success: true}
	base := func() *peerLink {
		l := &peerLink{}
		l.appended(&raft.AppendEntriesRequest{Term: 3, PrevLogEntry: 8, PrevLogTerm: 3, LeaderCommitIndex: 9,
			Entries: []*raft.Log{{Index: 9, Term: 3}, {Index: 10, Term: 3}}}, ok, 42)
		l.heartbeat(3, &raft.AppendEntriesResponse{Term: 3, Success: true}, 42)
		return l
	}
	idle := &raft.AppendEntriesRequest{Term: 3, PrevLogEntry: 10, PrevLogTerm: 3, LeaderCommitIndex: 9}
	// The follower's node began answering pings on a new connection after its last heartbeat answer:
	// it may have restarted, so nothing is answered for it.
	if l, resp := base(), (raft.AppendEntriesResponse{}); l.elide(idle, &resp, time.Now().Add(time.Second)) {
		t.Error("elided an append for a follower whose node reconnected after its last heartbeat answer")
	} else if !l.elide(idle, &resp, time.Time{}) {
		t.Error("did not elide the same append for a follower whose node has not reconnected")
	}
	if l, resp := base(), (raft.AppendEntriesResponse{}); l.answerHeartbeat(3, &resp, time.Now().Add(time.Second)) {
		t.Error("answered a heartbeat for a follower whose node reconnected after its last heartbeat answer")
	} else if !l.answerHeartbeat(3, &resp, time.Time{}) {
		t.Error("did not answer the same heartbeat for a follower whose node has not reconnected")
	}
	for _, tc := range []struct {
		name string
		link func() *peerLink
		req  *raft.AppendEntriesRequest
		want bool
	}{
		{"idle after an acknowledged append", base, idle, true},
		{"entries", base, &raft.AppendEntriesRequest{Term: 3, PrevLogEntry: 10, PrevLogTerm: 3, LeaderCommitIndex: 9,
			Entries: []*raft.Log{{Index: 11, Term: 3}}}, false},
		{"new commit index", base, &raft.AppendEntriesRequest{Term: 3, PrevLogEntry: 10, PrevLogTerm: 3, LeaderCommitIndex: 10}, false},
		{"other previous entry", base, &raft.AppendEntriesRequest{Term: 3, PrevLogEntry: 9, PrevLogTerm: 3, LeaderCommitIndex: 9}, false},
		{"newer term", base, &raft.AppendEntriesRequest{Term: 4, PrevLogEntry: 10, PrevLogTerm: 3, LeaderCommitIndex: 9}, false},
		{"failed heartbeat", func() *peerLink { l := base(); l.heartbeat(3, nil, 0); return l }, idle, false},
		{"heartbeat rejected (newer term)", func() *peerLink {
			l := base()
			l.heartbeat(3, &raft.AppendEntriesResponse{Term: 4}, 42)
			return l
		}, idle, false},
		{"follower restarted", func() *peerLink {
			l := base()
			l.heartbeat(3, &raft.AppendEntriesResponse{Term: 3, Success: true}, 43)
			return l
		}, idle, false},
		{"stale heartbeat", func() *peerLink { l := base(); l.hbAt = time.Now().Add(-hbFresh); return l }, idle, false},
		{"append failed", func() *peerLink { l := base(); l.appended(idle, nil, 0); return l }, idle, false},
		{"append rejected", func() *peerLink {
			l := base()
			l.appended(idle, &raft.AppendEntriesResponse{Term: 3, LastLog: 7}, 42)
			return l
		}, idle, false},
		{"commit pushed", func() *peerLink {
			l := base()
			l.pushed(&raft.AppendEntriesRequest{Term: 3, PrevLogEntry: 10, PrevLogTerm: 3, LeaderCommitIndex: 10}, ok, 42)
			return l
		}, &raft.AppendEntriesRequest{Term: 3, PrevLogEntry: 10, PrevLogTerm: 3, LeaderCommitIndex: 10}, true},
	} {
		var resp raft.AppendEntriesResponse
		got := tc.link().elide(tc.req, &resp, time.Time{})
		if got != tc.want {
			t.Errorf("%s: elide = %v, want %v", tc.name, got, tc.want)
			continue
		}
		if got {
			want := raft.AppendEntriesResponse{RPCHeader: testHeader, Term: tc.req.Term, LastLog: tc.req.PrevLogEntry, Success: true}
			if !reflect.DeepEqual(resp, want) {
				t.Errorf("%s: answer %+v, want %+v", tc.name, resp, want)
			}
		}
	}
}

// A commit push goes out only for what the follower acknowledged in the leader's term, once, and
// never past the follower's acknowledged last entry.
func TestPeerLinkPushFor(t *testing.T) {
	l := &peerLink{}
	if l.pushFor(5, 3) != nil {
		t.Fatal("push before any acknowledgement")
	}
	req := &raft.AppendEntriesRequest{RPCHeader: testHeader, Term: 3, PrevLogEntry: 8, PrevLogTerm: 3, LeaderCommitIndex: 7,
		Entries: []*raft.Log{{Index: 9, Term: 3}, {Index: 10, Term: 3}}}
	l.sent(req)
	l.appended(req, &raft.AppendEntriesResponse{RPCHeader: testHeader, Term: 3, LastLog: 10, Success: true}, 1)
	if l.pushFor(7, 3) != nil {
		t.Error("push of a commit index already sent")
	}
	if l.pushFor(12, 4) != nil {
		t.Error("push in another term than the acknowledgement's")
	}
	p := l.pushFor(12, 3)
	if p == nil || p.LeaderCommitIndex != 10 || p.PrevLogEntry != 10 || p.PrevLogTerm != 3 || p.Term != 3 ||
		len(p.Entries) != 0 || string(p.Addr) != string(testHeader.Addr) {
		t.Fatalf("push = %+v; want commit 10 (capped at the acknowledged entry) after entry 10 of term 3", p)
	}
	if l.pushFor(12, 3) != nil {
		t.Error("the same push twice")
	}
}
