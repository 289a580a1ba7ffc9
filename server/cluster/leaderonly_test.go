package cluster

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// ProposeAsLeader applies on the leader and fails on a follower instead of being forwarded.
func TestProposeAsLeaderIsNeverForwarded(t *testing.T) {
	c := newCluster(t, 3, false)
	c.startGroup(0)
	ld := c.leader(0, 10*time.Second)
	fo := c.follower(0, ld)
	propose := func(g *Group, cmd string) (Result, error) {
		type out struct {
			r   Result
			err error
		}
		ch := make(chan out, 1)
		g.ProposeAsLeader([]byte(cmd), 5*time.Second, func(r Result, err error) { ch <- out{r, err} })
		select {
		case o := <-ch:
			return o.r, o.err
		case <-time.After(10 * time.Second):
			t.Fatal("ProposeAsLeader gave no answer within 10 s")
			return Result{}, nil
		}
	}
	if _, err := propose(fo.node.Group(0), "from-follower"); !errors.Is(err, raft.ErrNotLeader) {
		t.Fatalf("ProposeAsLeader on a follower: %v, want ErrNotLeader", err)
	}
	res, err := propose(ld.node.Group(0), "from-leader")
	if err != nil || res.Index == 0 {
		t.Fatalf("ProposeAsLeader on the leader: %+v, %v", res, err)
	}
	if got := ld.fsms[0].items(); !slices.Equal(got, []string{"from-leader"}) {
		t.Fatalf("leader FSM = %v, want only the leader's command", got)
	}
}
