package conformance

// RabbitMQ's stream protocol on a 3-process cluster: rabbitmq-stream-go-client publishes through
// the stream's leader and reads from a replica, as metadata tells it; when the leader's process
// is SIGKILLed, the consumer on a replica gets metadata_update once another node leads, and the
// client recovers (a new producer on the new leader, a new consumer from where it stopped) with
// every confirmed message read back.

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"warren/server/netserve"
)

func streamEnvOn(t *testing.T, nd *clusterNode) *stream.Environment {
	t.Helper()
	var e *stream.Environment
	if !pollUntil(60*time.Second, func() bool {
		var err error
		e, err = stream.NewEnvironment(stream.NewEnvironmentOptions().SetUri("rabbitmq-stream://guest:guest@" + nd.StreamAddr + "/%2f"))
		return err == nil
	}) {
		t.Fatalf("no stream connection to %s", nd.ID)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// streamLeaderNode returns the node metadata names as the stream's leader (nil: none yet).
func streamLeaderNode(c *testCluster, e *stream.Environment, name string) (*clusterNode, int) {
	md, err := e.StreamMetaData(name)
	if err != nil || md == nil || md.Leader == nil {
		return nil, 0
	}
	for _, nd := range c.Nodes {
		if nd.StreamAddr == md.Leader.Host+":"+md.Leader.Port {
			return nd, len(md.Replicas)
		}
	}
	return nil, 0
}

func publishStream(t *testing.T, p *stream.Producer, prefix string, n int) {
	t.Helper()
	confirmed := make(chan bool, n)
	notes := p.NotifyPublishConfirmation()
	go func() {
		for batch := range notes {
			for _, c := range batch {
				confirmed <- c.IsConfirmed()
			}
		}
	}()
	for i := range n {
		if err := p.Send(amqp.NewMessage([]byte(prefix + strconv.Itoa(i)))); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	for i := range n {
		select {
		case ok := <-confirmed:
			if !ok {
				t.Fatalf("message %d nacked", i)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("%d of %d confirms", i, n)
		}
	}
}

func TestStreamProtocolClusterLeaderKill(t *testing.T) {
	c := newTestCluster(t, 3)
	ports, err := netserve.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	for i, nd := range c.Nodes {
		nd.StreamAddr = fmt.Sprintf("127.0.0.1:%d", ports[i])
	}
	c.startAll(60 * time.Second)
	setup := streamEnvOn(t, c.Nodes[0])
	name := fmt.Sprintf("stream-cluster-%d", time.Now().UnixNano())
	if !pollUntil(60*time.Second, func() bool {
		err := setup.DeclareStream(name, nil)
		return err == nil || errors.Is(err, stream.StreamAlreadyExists)
	}) {
		t.Fatal("cannot declare the stream")
	}
	var leader *clusterNode
	if !pollUntil(60*time.Second, func() bool {
		var replicas int
		leader, replicas = streamLeaderNode(c, setup, name)
		return leader != nil && replicas == 2
	}) {
		t.Fatal("metadata never named a leader and two replicas")
	}
	var follower *clusterNode
	for _, nd := range c.Nodes {
		if nd != leader {
			follower = nd
			break
		}
	}
	var mu sync.Mutex
	got := map[string]bool{}
	next := int64(0)
	handler := func(ctx stream.ConsumerContext, m *amqp.Message) {
		mu.Lock()
		got[string(m.GetData())] = true
		next = ctx.Consumer.GetOffset() + 1
		mu.Unlock()
	}
	// The follower may not have the new stream yet: a client retries.
	var c1 *stream.Consumer
	if !pollUntil(60*time.Second, func() bool {
		c1, err = streamEnvOn(t, follower).NewConsumer(name, handler, stream.NewConsumerOptions().SetOffset(stream.OffsetSpecification{}.First()))
		return err == nil
	}) {
		t.Fatalf("no consumer: %v", err)
	}
	closed := c1.NotifyClose()
	// The follower may not know the new stream's leader yet: a client retries.
	var p1 *stream.Producer
	if !pollUntil(60*time.Second, func() bool {
		p1, err = streamEnvOn(t, follower).NewProducer(name, nil)
		return err == nil
	}) {
		t.Fatalf("no producer: %v", err)
	}
	publishStream(t, p1, "before-", 100)

	leader.kill9()
	select {
	case ev := <-closed:
		if ev.Reason != stream.MetaDataUpdate {
			t.Fatalf("the consumer on a replica closed with reason %q, want %q", ev.Reason, stream.MetaDataUpdate)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the consumer on a replica got no metadata_update after the leader's SIGKILL")
	}
	check := streamEnvOn(t, follower)
	if !pollUntil(60*time.Second, func() bool {
		nl, replicas := streamLeaderNode(c, check, name)
		return nl != nil && nl != leader && replicas == 1
	}) {
		t.Fatal("metadata never named a new leader and the one replica left")
	}
	var p2 *stream.Producer
	if !pollUntil(60*time.Second, func() bool {
		p2, err = streamEnvOn(t, follower).NewProducer(name, nil)
		return err == nil
	}) {
		t.Fatalf("no producer after the failover: %v", err)
	}
	publishStream(t, p2, "after-", 100)
	mu.Lock()
	from := next
	mu.Unlock()
	c2, err := streamEnvOn(t, follower).NewConsumer(name, handler, stream.NewConsumerOptions().SetOffset(stream.OffsetSpecification{}.Offset(from)))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if !pollUntil(60*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for i := range 100 {
			if !got["before-"+strconv.Itoa(i)] || !got["after-"+strconv.Itoa(i)] {
				return false
			}
		}
		return true
	}) {
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("read %d of the 200 confirmed messages", len(got))
	}
}
