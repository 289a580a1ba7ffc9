package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"warren/server/auth"
	"warren/server/core"
	"warren/server/policy"
)

// TestClusterAccessAndPoliciesReplicate: a vhost, a user and its permission made on one node
// work on every node; a policy set on one node applies to a queue declared on another; deleting
// the user on a third node closes its connection on the second.
func TestClusterAccessAndPoliciesReplicate(t *testing.T) {
	tc := newTestCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b1 := tc.srvs[0].Core()
	if err := b1.PutVHost(ctx, core.VHostInfo{Name: "team"}); err != nil {
		t.Fatal(err)
	}
	h, err := auth.HashPassword(auth.DefaultAlgorithm, "team-pass")
	if err != nil {
		t.Fatal(err)
	}
	if err := b1.PutUser(ctx, core.User{Name: "alice", Hash: h}); err != nil {
		t.Fatal(err)
	}
	if err := b1.SetPermission(ctx, core.PermissionInfo{User: "alice", VHost: "team", Permission: auth.FullAccess}); err != nil {
		t.Fatal(err)
	}
	if err := b1.PutPolicy(ctx, policy.ComponentPolicy, policy.Policy{VHost: "team", Name: "cap", Pattern: "^capped$",
		Definition: policy.Definition{"max-length": 1}}); err != nil {
		t.Fatal(err)
	}
	url2 := fmt.Sprintf("amqp://alice:team-pass@%s/team", tc.srvs[1].Addr())
	pollUntil(t, "n2 has the user, vhost, permission and policy", clusterWait, func() bool {
		return tc.applied(1, "metadata") >= tc.applied(0, "metadata")
	})
	c := mustDial(t, url2)
	ch := mustConfirmChannel(t, c)
	if _, err := ch.QueueDeclare("capped", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"1", "2", "3"} {
		publishConfirmed(t, ch, "", "capped", false, amqp.Publishing{Body: []byte(b)})
	}
	if n, _ := queueCounts(t, ch, "capped"); n != 1 {
		t.Fatalf("queue on n2 holds %d messages, want 1 (policy set on n1)", n)
	}
	if err := tc.srvs[2].Core().DeleteUser(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	expectConnClosed(t, c, amqp.ConnectionForced, "CONNECTION_FORCED - user 'alice' is deleted")
}

// TestClusterVHostConnectionLimit: max-connections counts the connections of every node.
func TestClusterVHostConnectionLimit(t *testing.T) {
	tc := newTestCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b1 := tc.srvs[0].Core()
	if err := b1.PutVHost(ctx, core.VHostInfo{Name: "lim"}); err != nil {
		t.Fatal(err)
	}
	if err := b1.SetPermission(ctx, core.PermissionInfo{User: "guest", VHost: "lim", Permission: auth.FullAccess}); err != nil {
		t.Fatal(err)
	}
	if err := b1.SetVHostLimits(ctx, "lim", map[string]int64{core.LimitMaxConnections: 1}); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, "n2 has the limit", clusterWait, func() bool { return tc.applied(1, "metadata") >= tc.applied(0, "metadata") })
	mustDial(t, tc.urls[0]+"lim")
	if c, err := amqp.Dial(tc.urls[1] + "lim"); err == nil {
		c.Close()
		t.Fatal("a second connection to a vhost with max-connections 1 was accepted by another node")
	} else {
		checkAMQPError(t, err, amqp.NotAllowed, "NOT_ALLOWED - access to vhost 'lim' refused for user 'guest': connection limit (1) is reached")
	}
}
