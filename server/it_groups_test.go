package server_test

// Consumer groups over AMQP 0-9-1 (issue 14 point 3): basic.consume with
// x-stream-consumer-group on a super stream (or a plain stream). One active member per
// partition, balanced, cooperative rebalance on join and leave (nothing lost or delivered twice
// with prompt acks), x-stream-partition and x-stream-offset headers, resume from the committed
// offset, independent groups.

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// groupLog records what the members of a test's groups received.
type groupLog struct {
	t  *testing.T
	mu sync.Mutex
	// by body: deliveries (member names), and the partition and offset they came from
	got  map[string][]string
	part map[string]string
	// by member: the partitions it received from, in order of first delivery
	from map[string][]string
	// by partition: the member that delivered last, and the highest offset seen
	last map[string]string
}

func newGroupLog(t *testing.T) *groupLog {
	return &groupLog{t: t, got: map[string][]string{}, part: map[string]string{}, from: map[string][]string{}, last: map[string]string{}}
}

// groupMember is one consumer of a group, on its own connection, acking every delivery at once.
type groupMember struct {
	name string
	conn *itConn
	ch   *itChan
	tag  string
	done chan struct{}
}

func (l *groupLog) join(t *testing.T, url, stream, group, name string, args amqp.Table) *groupMember {
	t.Helper()
	c := mustDial(t, url)
	ch := mustChannel(t, c)
	if err := ch.Qos(10, 0, false); err != nil {
		t.Fatal(err)
	}
	a := amqp.Table{"x-stream-consumer-group": group}
	for k, v := range args {
		a[k] = v
	}
	tag := "member-" + name
	d, err := ch.Consume(stream, tag, false, false, false, false, a)
	if err != nil {
		t.Fatalf("member %s joins group %s of %s: %v", name, group, stream, err)
	}
	m := &groupMember{name: name, conn: c, ch: ch, tag: tag, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		for dl := range d {
			p, _ := dl.Headers["x-stream-partition"].(string)
			off, hasOff := dl.Headers["x-stream-offset"].(int64)
			l.mu.Lock()
			b := string(dl.Body)
			l.got[b] = append(l.got[b], name)
			l.part[b] = fmt.Sprintf("%s@%d", p, off)
			if !slices.Contains(l.from[name], p) {
				l.from[name] = append(l.from[name], p)
			}
			l.last[p] = name
			l.mu.Unlock()
			if p == "" || !hasOff {
				l.t.Errorf("delivery %q without x-stream-partition/x-stream-offset: %v", b, dl.Headers)
			}
			_ = dl.Ack(false)
		}
	}()
	return m
}

// leave cancels the member's consumer and waits until its delivery channel closed.
func (m *groupMember) leave(t *testing.T) {
	t.Helper()
	if err := m.ch.Cancel(m.tag, false); err != nil {
		t.Fatalf("cancel %s: %v", m.name, err)
	}
	select {
	case <-m.done:
	case <-time.After(waitFor):
		t.Fatalf("member %s: deliveries did not end after basic.cancel", m.name)
	}
}

// publishKeys publishes n messages "<prefix><i>" to super stream s with routing key "k<i%17>".
func publishKeys(t *testing.T, ch *itChan, s, prefix string, n int) []string {
	t.Helper()
	var bodies []string
	for i := range n {
		b := fmt.Sprintf("%s%d", prefix, i)
		publishConfirmed(t, ch, s, fmt.Sprintf("k%d", i%17), true, amqp.Publishing{Body: []byte(b)})
		bodies = append(bodies, b)
	}
	return bodies
}

// waitAll waits until every body was delivered, then checks none was delivered twice.
func (l *groupLog) waitAll(t *testing.T, bodies []string) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d messages delivered to the group", len(bodies)), func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, b := range bodies {
			if len(l.got[b]) == 0 {
				return false
			}
		}
		return true
	})
	time.Sleep(quiet)
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, b := range bodies {
		if n := len(l.got[b]); n != 1 {
			t.Fatalf("%q (%s) delivered %d times: to %v", b, l.part[b], n, l.got[b])
		}
	}
}

// partitionsOf returns the partitions member name received from since the log's last reset.
func (l *groupLog) partitionsOf(name string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := slices.Clone(l.from[name])
	slices.Sort(p)
	return p
}

// count is how many deliveries of bodies were made.
func (l *groupLog) count(bodies []string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, b := range bodies {
		n += len(l.got[b])
	}
	return n
}

func (l *groupLog) resetFrom() {
	l.mu.Lock()
	clear(l.from)
	l.mu.Unlock()
}

func TestITGroupBalancedAndRebalanced(t *testing.T) {
	skipWarrenOnly(t, "x-stream-consumer-group")
	url := startBroker(t)
	c := mustDial(t, url)
	admin := mustChannel(t, c)
	s := declareSuperStream(t, url, admin, "grp", 4, nil)
	pub := mustConfirmChannel(t, c)
	l := newGroupLog(t)

	// One member: every partition.
	a := l.join(t, url, s, "g", "a", nil)
	all := publishKeys(t, pub, s, "one-", 60)
	l.waitAll(t, all)
	if got := l.partitionsOf("a"); len(got) != 4 {
		t.Fatalf("the only member received from %v, want all 4 partitions", got)
	}

	// A second member joins: two partitions move to it; each partition has one owner.
	l.resetFrom()
	b := l.join(t, url, s, "g", "b", nil)
	eventually(t, "b owns 2 partitions", func() bool {
		bodies := publishKeys(t, pub, s, fmt.Sprintf("probe-%d-", time.Now().UnixNano()), 17)
		all = append(all, bodies...)
		l.waitAll(t, all)
		return len(l.partitionsOf("b")) == 2
	})
	l.resetFrom()
	more := publishKeys(t, pub, s, "two-", 68)
	all = append(all, more...)
	l.waitAll(t, all)
	pa, pb := l.partitionsOf("a"), l.partitionsOf("b")
	if len(pa) != 2 || len(pb) != 2 {
		t.Fatalf("after the join: a reads %v, b reads %v; want 2 and 2", pa, pb)
	}
	for _, p := range pa {
		if slices.Contains(pb, p) {
			t.Fatalf("partition %s read by both members (a %v, b %v)", p, pa, pb)
		}
	}

	// A third member: sizes 2, 1, 1; then a leaves: b and the third take everything.
	cm := l.join(t, url, s, "g", "c", nil)
	eventually(t, "c owns a partition", func() bool {
		bodies := publishKeys(t, pub, s, fmt.Sprintf("probe-%d-", time.Now().UnixNano()), 17)
		all = append(all, bodies...)
		l.waitAll(t, all)
		return len(l.partitionsOf("c")) >= 1
	})
	a.leave(t)
	l.resetFrom()
	eventually(t, "b and c own every partition", func() bool {
		bodies := publishKeys(t, pub, s, fmt.Sprintf("probe-%d-", time.Now().UnixNano()), 17)
		all = append(all, bodies...)
		l.waitAll(t, all)
		return len(l.partitionsOf("b"))+len(l.partitionsOf("c")) == 4
	})
	l.resetFrom()
	final := publishKeys(t, pub, s, "three-", 68)
	all = append(all, final...)
	l.waitAll(t, all)
	if pa := l.partitionsOf("a"); len(pa) != 0 {
		t.Fatalf("a received from %v after it left", pa)
	}
	if pb, pc := l.partitionsOf("b"), l.partitionsOf("c"); len(pb) != 2 || len(pc) != 2 {
		t.Fatalf("after a left: b reads %v, c reads %v; want 2 and 2", pb, pc)
	}
	_ = b
	_ = cm
}

// TestITGroupResumeAndIndependence: a member that joins in a new connection resumes each
// partition after the group's committed offset; another group reads everything on its own; a
// member's x-stream-offset applies where the group never committed.
func TestITGroupResumeAndIndependence(t *testing.T) {
	skipWarrenOnly(t, "x-stream-consumer-group")
	url := startBroker(t)
	c := mustDial(t, url)
	admin := mustChannel(t, c)
	s := declareSuperStream(t, url, admin, "resume", 2, nil)
	pub := mustConfirmChannel(t, c)
	early := publishKeys(t, pub, s, "early-", 20) // before any group existed

	l := newGroupLog(t)
	first := l.join(t, url, s, "g1", "first", nil) // x-stream-offset next (the default)
	batch1 := publishKeys(t, pub, s, "b1-", 30)
	l.waitAll(t, batch1)
	if n := l.count(early); n != 0 {
		t.Fatalf("%d messages published before the member joined were delivered (default offset is next)", n)
	}
	_ = first.conn.Close() // its acks were prompt: the group's offsets are committed
	<-first.done
	batch2 := publishKeys(t, pub, s, "b2-", 30)
	second := l.join(t, url, s, "g1", "second", amqp.Table{"x-stream-offset": "first"})
	l.waitAll(t, append(slices.Clone(batch1), batch2...)) // batch2 once, batch1 not again
	if n := l.count(early); n != 0 {
		t.Fatalf("%d messages the group committed past were delivered again", n)
	}
	_ = second

	// An independent group starting from first sees everything.
	l2 := newGroupLog(t)
	l2.join(t, url, s, "g2", "other", amqp.Table{"x-stream-offset": "first"})
	l2.waitAll(t, append(append(slices.Clone(early), batch1...), batch2...))
}

// TestITGroupOnPlainStream: x-stream-consumer-group on a plain stream is single active consumer:
// one member at a time; the next takes over at the committed offset.
func TestITGroupOnPlainStream(t *testing.T) {
	skipWarrenOnly(t, "x-stream-consumer-group")
	url := startBroker(t)
	c := mustDial(t, url)
	pub := mustConfirmChannel(t, c)
	s := declareStream(t, url, pub, "sac", nil)
	l := newGroupLog(t)
	a := l.join(t, url, s, "g", "a", nil)
	l.join(t, url, s, "g", "b", nil)
	var bodies []string
	for i := range 20 {
		b := fmt.Sprintf("m%d", i)
		publishConfirmed(t, pub, "", s, false, amqp.Publishing{Body: []byte(b)})
		bodies = append(bodies, b)
	}
	l.waitAll(t, bodies)
	if pb := l.partitionsOf("b"); len(pb) != 0 {
		t.Fatalf("the second member received from %v while the first was active", pb)
	}
	a.leave(t)
	for i := 20; i < 40; i++ {
		b := fmt.Sprintf("m%d", i)
		publishConfirmed(t, pub, "", s, false, amqp.Publishing{Body: []byte(b)})
		bodies = append(bodies, b)
	}
	l.waitAll(t, bodies)
	if pb := l.partitionsOf("b"); !slices.Equal(pb, []string{s}) {
		t.Fatalf("after the first member left the second received from %v", pb)
	}
}

func TestITGroupRefusals(t *testing.T) {
	skipWarrenOnly(t, "x-stream-consumer-group")
	url := startBroker(t)
	c := mustDial(t, url)
	ch := mustChannel(t, c)
	q := declareQueue(t, url, ch, "classic", nil)
	for _, name := range []string{uniq(t, "missing"), q} {
		ch := mustChannel(t, c)
		_ = ch.Qos(10, 0, false)
		_, err := ch.Consume(name, "", false, false, false, false, amqp.Table{"x-stream-consumer-group": "g"})
		checkAMQPError(t, err, amqp.NotFound, fmt.Sprintf("NOT_FOUND - no queue '%s' in vhost '/'", name))
	}
	pub := mustChannel(t, c)
	s := declareStream(t, url, pub, "s", nil)
	ch = mustChannel(t, c)
	_ = ch.Qos(10, 0, false)
	_, err := ch.Consume(s, "", false, false, false, false, amqp.Table{"x-stream-consumer-group": int32(5)})
	checkAMQPError(t, err, amqp.PreconditionFailed, "")
	ch = mustChannel(t, c)
	_, err = ch.Consume(s, "", false, false, false, false, amqp.Table{"x-stream-consumer-group": "g"})
	checkAMQPError(t, err, amqp.PreconditionFailed, fmt.Sprintf("PRECONDITION_FAILED - consumer prefetch count is not set for 'queue '%s' in vhost '/''", s))
}

// TestITGroupHandoverWaitsForAcks: a partition moves to a joining member only once its owner
// settled what it delivered from it: never two members holding unacked messages of one
// partition; the new owner starts right after the old owner's last ack.
func TestITGroupHandoverWaitsForAcks(t *testing.T) {
	skipWarrenOnly(t, "x-stream-consumer-group")
	url := startBroker(t)
	c := mustDial(t, url)
	admin := mustChannel(t, c)
	s := declareSuperStream(t, url, admin, "handover", 2, nil)
	pub := mustConfirmChannel(t, c)

	ac := mustDial(t, url)
	ach := mustChannel(t, ac)
	_ = ach.Qos(100, 0, false)
	ad, err := ach.Consume(s, "a", false, false, false, false, amqp.Table{"x-stream-consumer-group": "g"})
	if err != nil {
		t.Fatal(err)
	}
	publishKeys(t, pub, s, "held-", 34) // both partitions
	var held []amqp.Delivery
	for range 34 {
		held = append(held, recvWithin(t, ad, waitFor))
	}
	// b joins while a holds 34 unacked deliveries: nothing moves yet.
	l := newGroupLog(t)
	l.join(t, url, s, "g", "b", nil)
	whileHeld := publishKeys(t, pub, s, "while-held-", 34)
	time.Sleep(300 * time.Millisecond)
	if got := l.partitionsOf("b"); len(got) != 0 {
		t.Fatalf("b received from %v while a held unacked messages of every partition", got)
	}
	var more []amqp.Delivery // a still reads the partition it keeps (and the one moving, until paused)
	drain := func() {
		for {
			select {
			case d := <-ad:
				more = append(more, d)
			case <-time.After(quiet):
				return
			}
		}
	}
	drain()
	// a acks everything it holds: one partition moves to b, which starts after a's last ack.
	for _, d := range append(held, more...) {
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	aSeen := map[string]bool{}
	for _, d := range append(held, more...) {
		aSeen[string(d.Body)] = true
	}
	eventually(t, "b owns one partition", func() bool { return len(l.partitionsOf("b")) == 1 })
	eventually(t, "every message published while a held its deliveries delivered once", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, b := range whileHeld {
			if len(l.got[b]) == 0 && !aSeen[b] {
				return false
			}
		}
		return true
	})
	l.mu.Lock()
	for body, to := range l.got {
		if aSeen[body] || len(to) > 1 {
			t.Errorf("%q delivered to a (%v) and to b %d times", body, aSeen[body], len(to))
		}
	}
	l.mu.Unlock()
	go func() {
		for d := range ad {
			_ = d.Ack(false)
		}
	}()
}
