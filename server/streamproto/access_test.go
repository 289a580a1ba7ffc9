package streamproto_test

// Per-stream permissions over the stream protocol, as RabbitMQ 4.x checks them
// (rabbit_stream_reader.erl): metadata needs read or write on each stream asked about; route
// needs write, partitions read or write, on the super stream and its partitions; the commands
// on one stream check the user's permission before they look the stream up, so a user learns
// nothing about the existence of a stream it may not use.

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"warren/server/auth"
	"warren/server/core"
	"warren/server/streamproto/wire"
)

// accessFixture is a broker with streams and super streams made by guest and a user "app" with
// permissions on some of them. Names start with prefix and a dot:
//
//	configure ^P\.cfg\.
//	write     ^P\.(rw|w|wghost|ssw|ssw-\d|ssmix|ssmix-0)$
//	read      ^P\.(rw|r|rghost|ssr|ssr-\d|ssmix)$
//
// Streams rw, r, w, none exist (r holds 5 messages); rghost, wghost, ghost and cfg.ghost do not.
// Super streams ssr, ssw and ssmix have 2 partitions each (-0, -1; routing keys "0", "1").
type accessFixture struct {
	b      broker
	prefix string
}

const appUser, appPass = "app", "app-secret"

func (f *accessFixture) n(s string) string { return f.prefix + "." + s }

func newAccessFixture(t *testing.T) *accessFixture {
	t.Helper()
	b := startBroker(t)
	if b.srv == nil {
		t.Skip("creates a user through the in-process broker's core")
	}
	f := &accessFixture{b: b, prefix: strings.ReplaceAll(streamName(t), "/", "_")}
	guest := env(t, b)
	for _, s := range []string{"rw", "r", "w", "none"} {
		if err := guest.DeclareStream(f.n(s), nil); err != nil {
			t.Fatalf("declare %s: %v", f.n(s), err)
		}
	}
	publish(t, guest, f.n("r"), "r", 5)
	for _, ss := range []string{"ssr", "ssw", "ssmix"} {
		if err := guest.DeclareSuperStream(f.n(ss), stream.NewPartitionsOptions(2)); err != nil {
			t.Fatalf("declare super stream %s: %v", f.n(ss), err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	h, err := auth.HashPassword(auth.DefaultAlgorithm, appPass)
	if err != nil {
		t.Fatal(err)
	}
	c := b.srv.Core()
	if err := c.PutUser(ctx, core.User{Name: appUser, Hash: h}); err != nil {
		t.Fatal(err)
	}
	p := regexp.QuoteMeta(f.prefix)
	perm := auth.Permission{
		Configure: `^` + p + `\.cfg\.`,
		Write:     `^` + p + `\.(rw|w|wghost|ssw|ssw-\d|ssmix|ssmix-0)$`,
		Read:      `^` + p + `\.(rw|r|rghost|ssr|ssr-\d|ssmix)$`,
	}
	if err := c.SetPermission(ctx, core.PermissionInfo{User: appUser, VHost: "/", Permission: perm}); err != nil {
		t.Fatal(err)
	}
	return f
}

// appURI is the stream URI of the broker for user app.
func (f *accessFixture) appURI() string {
	return strings.Replace(f.b.streamURI, "guest:guest@", appUser+":"+appPass+"@", 1)
}

// ask sends a request and returns the next frame that is not a heartbeat.
func (c *rawConn) ask(cmd wire.Command) wire.Command {
	c.t.Helper()
	c.send(cmd)
	return c.read()
}

// TestStreamPermissionsRaw checks each command's response code, frame by frame, for a user with
// permissions on some streams only.
func TestStreamPermissionsRaw(t *testing.T) {
	f := newAccessFixture(t)
	rc := dialRaw(t, f.b)
	rc.openAs(appUser, appPass, 0)
	const (
		ok        = wire.ResponseCodeOK
		refused   = wire.ResponseCodeAccessRefused
		missing   = wire.ResponseCodeStreamDoesNotExist
		noOffset  = wire.ResponseCodeNoOffset
		precondOK = wire.ResponseCodePreconditionFailed
	)
	var corr uint32 = 100
	next := func() uint32 { corr++; return corr }

	t.Run("metadata", func(t *testing.T) {
		names := []string{"rw", "r", "w", "none", "rghost", "ghost", "wghost"}
		want := []wire.ResponseCode{ok, ok, ok, refused, missing, refused, missing}
		var streams []string
		for _, s := range names {
			streams = append(streams, f.n(s))
		}
		r := readMetadata(t, rc, next(), streams...)
		if len(r.Streams) != len(names) {
			t.Fatalf("%d stream entries, want %d: %+v", len(r.Streams), len(names), r.Streams)
		}
		for i, sm := range r.Streams {
			if sm.Stream != streams[i] || sm.Code != want[i] {
				t.Errorf("%s: code %s, want %s", sm.Stream, sm.Code, want[i])
			}
			if sm.Code == ok && (sm.Leader == wire.NoLeader || endpointOf(r, sm.Leader) == "?") {
				t.Errorf("%s: no leader among the brokers %+v", sm.Stream, r.Brokers)
			}
			if sm.Code != ok && (sm.Leader != wire.NoLeader || len(sm.Replicas) != 0) {
				t.Errorf("%s: refused or missing entry with leader %d, replicas %v", sm.Stream, sm.Leader, sm.Replicas)
			}
		}
		if len(r.Brokers) != 1 {
			t.Errorf("brokers %+v, want this node once", r.Brokers)
		}
		// Asked only about streams it may not use, the user learns not even the node.
		r = readMetadata(t, rc, next(), f.n("none"), f.n("ghost"))
		if len(r.Brokers) != 0 || r.Streams[0].Code != refused || r.Streams[1].Code != refused {
			t.Errorf("metadata of refused streams: brokers %+v, streams %+v", r.Brokers, r.Streams)
		}
	})

	t.Run("stream stats", func(t *testing.T) {
		for s, want := range map[string]wire.ResponseCode{"rw": ok, "r": ok, "w": refused, "ghost": refused, "rghost": missing} {
			r, isResp := rc.ask(&wire.StreamStats{CorrelationID: next(), Stream: f.n(s)}).(*wire.StreamStatsResponse)
			if !isResp || r.Code != want {
				t.Errorf("%s: %+v, want code %s", s, r, want)
			}
		}
	})

	t.Run("query offset", func(t *testing.T) {
		for s, want := range map[string]wire.ResponseCode{"r": noOffset, "w": refused, "ghost": refused, "rghost": missing} {
			r, isResp := rc.ask(&wire.QueryOffset{CorrelationID: next(), Reference: "ref", Stream: f.n(s)}).(*wire.QueryOffsetResponse)
			if !isResp || r.Code != want {
				t.Errorf("%s: %+v, want code %s", s, r, want)
			}
		}
	})

	t.Run("query publisher sequence needs read", func(t *testing.T) {
		for s, want := range map[string]wire.ResponseCode{"r": ok, "rw": ok, "w": refused, "ghost": refused, "rghost": missing} {
			r, isResp := rc.ask(&wire.QueryPublisherSequence{CorrelationID: next(), Reference: "ref", Stream: f.n(s)}).(*wire.QueryPublisherSequenceResponse)
			if !isResp || r.Code != want {
				t.Errorf("%s: %+v, want code %s", s, r, want)
			}
		}
	})

	t.Run("resolve offset spec", func(t *testing.T) {
		for s, want := range map[string]wire.ResponseCode{"r": ok, "w": refused, "ghost": refused, "rghost": missing} {
			r, isResp := rc.ask(&wire.ResolveOffsetSpec{CorrelationID: next(), Stream: f.n(s),
				Offset: wire.OffsetSpec{Type: wire.OffsetTypeFirst}}).(*wire.ResolveOffsetSpecResponse)
			if !isResp || r.Code != want {
				t.Errorf("%s: %+v, want code %s", s, r, want)
			}
		}
	})

	t.Run("declare publisher", func(t *testing.T) {
		id := uint8(0)
		for _, tc := range []struct {
			s    string
			want wire.ResponseCode
		}{{"w", ok}, {"r", refused}, {"ghost", refused}, {"wghost", missing}} {
			id++
			r, isResp := rc.ask(&wire.DeclarePublisher{CorrelationID: next(), PublisherID: id, Stream: f.n(tc.s)}).(*wire.Response)
			if !isResp || r.Code != tc.want {
				t.Errorf("%s: %+v, want code %s", tc.s, r, tc.want)
			}
		}
		// The permission comes before the publisher id already in use.
		r := rc.ask(&wire.DeclarePublisher{CorrelationID: next(), PublisherID: 1, Stream: f.n("r")}).(*wire.Response)
		if r.Code != refused {
			t.Errorf("declare with a used id on a stream it may not write: %s, want %s", r.Code, refused)
		}
		r = rc.ask(&wire.DeclarePublisher{CorrelationID: next(), PublisherID: 1, Stream: f.n("w")}).(*wire.Response)
		if r.Code != precondOK {
			t.Errorf("declare with a used id: %s, want %s", r.Code, precondOK)
		}
	})

	t.Run("subscribe", func(t *testing.T) {
		id := uint8(0)
		for _, tc := range []struct {
			s    string
			want wire.ResponseCode
		}{{"w", refused}, {"ghost", refused}, {"rghost", missing}, {"r", ok}} {
			id++
			r, isResp := rc.ask(&wire.Subscribe{CorrelationID: next(), SubscriptionID: id, Stream: f.n(tc.s),
				Offset: wire.OffsetSpec{Type: wire.OffsetTypeNext}, Credit: 1}).(*wire.Response)
			if !isResp || r.Code != tc.want {
				t.Errorf("%s: %+v, want code %s", tc.s, r, tc.want)
			}
		}
	})

	t.Run("delete stream", func(t *testing.T) {
		for s, want := range map[string]wire.ResponseCode{"none": refused, "ghost": refused, "cfg.ghost": missing} {
			r, isResp := rc.ask(&wire.DeleteStream{CorrelationID: next(), Stream: f.n(s)}).(*wire.Response)
			if !isResp || r.Code != want {
				t.Errorf("%s: %+v, want code %s", s, r, want)
			}
		}
		if f.b.srv.Core().VHost("/").Queue(f.n("none")) == nil {
			t.Error("the refused delete deleted the stream")
		}
	})

	t.Run("partitions", func(t *testing.T) {
		for _, tc := range []struct {
			ss    string
			want  wire.ResponseCode
			parts []string
		}{
			{"ssr", ok, []string{f.n("ssr-0"), f.n("ssr-1")}}, // read on all
			{"ssw", ok, []string{f.n("ssw-0"), f.n("ssw-1")}}, // write on all
			{"ssmix", refused, nil},                           // partition 1: neither
			{"ghost", refused, nil},                           // no permission, does not exist
			{"rghost", missing, nil},                          // permitted name, not a super stream
		} {
			r, isResp := rc.ask(&wire.Partitions{CorrelationID: next(), SuperStream: f.n(tc.ss)}).(*wire.StreamsResponse)
			if !isResp || r.Code != tc.want || !slices.Equal(r.Streams, tc.parts) {
				t.Errorf("%s: %+v, want code %s and %v", tc.ss, r, tc.want, tc.parts)
			}
		}
	})

	t.Run("route needs write", func(t *testing.T) {
		for _, tc := range []struct {
			ss, key string
			want    wire.ResponseCode
			streams []string
		}{
			{"ssw", "1", ok, []string{f.n("ssw-1")}},
			{"ssw", "nokey", ok, nil},
			{"ssmix", "0", ok, []string{f.n("ssmix-0")}},
			{"ssmix", "1", refused, nil}, // the partition routed to is not writable
			{"ssr", "0", refused, nil},   // the exchange is not writable
			{"ghost", "0", refused, nil},
			{"wghost", "0", missing, nil},
		} {
			r, isResp := rc.ask(&wire.Route{CorrelationID: next(), SuperStream: f.n(tc.ss), RoutingKey: tc.key}).(*wire.StreamsResponse)
			if !isResp || r.Code != tc.want || !slices.Equal(r.Streams, tc.streams) {
				t.Errorf("%s key %q: %+v, want code %s and %v", tc.ss, tc.key, r, tc.want, tc.streams)
			}
		}
	})

	t.Run("a permission change reaches the open connection", func(t *testing.T) {
		// As RabbitMQ's stream reader, which asks the permission store at each command.
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		c := f.b.srv.Core()
		old := c.VHostGrant(appUser, "/").Permission()
		widened := old
		widened.Read = `^` + regexp.QuoteMeta(f.prefix) + `\.(none|rw)$`
		if err := c.SetPermission(ctx, core.PermissionInfo{User: appUser, VHost: "/", Permission: widened}); err != nil {
			t.Fatal(err)
		}
		r := readMetadata(t, rc, next(), f.n("none"), f.n("r"))
		if r.Streams[0].Code != ok || r.Streams[1].Code != refused {
			t.Errorf("after the change: %+v, want none ok and r refused", r.Streams)
		}
		if err := c.SetPermission(ctx, core.PermissionInfo{User: appUser, VHost: "/", Permission: old}); err != nil {
			t.Fatal(err)
		}
		r = readMetadata(t, rc, next(), f.n("none"), f.n("r"))
		if r.Streams[0].Code != refused || r.Streams[1].Code != ok {
			t.Errorf("after the change back: %+v, want none refused and r ok", r.Streams)
		}
	})

	t.Run("super stream management", func(t *testing.T) {
		// Configure alone is not enough: read on the exchange and write on the partitions too.
		r := rc.ask(&wire.CreateSuperStream{CorrelationID: next(), Name: f.n("cfg.ss"),
			Partitions: []string{f.n("cfg.ss-0")}, BindingKeys: []string{"0"}}).(*wire.Response)
		if r.Code != refused {
			t.Errorf("create super stream with configure only: %s, want %s", r.Code, refused)
		}
		if f.b.srv.Core().VHost("/").Queue(f.n("cfg.ss-0")) != nil {
			t.Error("the refused create made a partition")
		}
		for ss, want := range map[string]wire.ResponseCode{"ssr": refused, "ghost": refused, "cfg.ghost": missing} {
			r := rc.ask(&wire.DeleteSuperStream{CorrelationID: next(), Name: f.n(ss)}).(*wire.Response)
			if r.Code != want {
				t.Errorf("delete super stream %s: %s, want %s", ss, r.Code, want)
			}
		}
	})
}

// TestStreamPermissionsClient: rabbitmq-stream-go-client as a user with permissions on some
// streams publishes where it may write, consumes where it may read, and gets access refused
// (not "does not exist") for streams it may not use, existing or not.
func TestStreamPermissionsClient(t *testing.T) {
	f := newAccessFixture(t)
	e, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetUri(f.appURI()))
	if err != nil {
		t.Fatalf("connect as %s: %v", appUser, err)
	}
	t.Cleanup(func() { e.Close() })

	if md, err := e.StreamMetaData(f.n("w")); err != nil || md.Leader == nil {
		t.Fatalf("metadata of a writable stream: %+v, %v", md, err)
	}
	for _, s := range []string{"none", "ghost"} {
		if _, err := e.StreamMetaData(f.n(s)); !errors.Is(err, stream.CodeAccessRefused) {
			t.Errorf("metadata of %s: %v, want %v", s, err, stream.CodeAccessRefused)
		}
		if ok, err := e.StreamExists(f.n(s)); err != nil || ok {
			t.Errorf("StreamExists(%s) = %v, %v", s, ok, err)
		}
	}
	if _, err := e.StreamMetaData(f.n("rghost")); !errors.Is(err, stream.StreamDoesNotExist) {
		t.Errorf("metadata of a readable name that does not exist: %v, want %v", err, stream.StreamDoesNotExist)
	}

	// Publish where it may write, read where it may read.
	publish(t, e, f.n("w"), "w", 20)
	bodies, _ := consume(t, e, f.n("r"), stream.NewConsumerOptions().SetOffset(stream.OffsetSpecification{}.First()), 5)
	if bodies[0] != "r0" || bodies[4] != "r4" {
		t.Fatalf("consumed %v", bodies)
	}

	// Refused: a producer where it may only read, a consumer where it may only write, either on
	// a stream it may neither read nor write.
	if p, err := e.NewProducer(f.n("r"), nil); err == nil {
		_ = p.Close()
		t.Error("producer on a read-only stream")
	}
	if p, err := e.NewProducer(f.n("none"), nil); !errors.Is(err, stream.CodeAccessRefused) {
		if err == nil {
			_ = p.Close()
		}
		t.Errorf("producer on a stream without permissions: %v, want %v", err, stream.CodeAccessRefused)
	}
	noop := func(stream.ConsumerContext, *amqp.Message) {}
	if c, err := e.NewConsumer(f.n("w"), noop, nil); err == nil {
		_ = c.Close()
		t.Error("consumer on a write-only stream")
	}
	if _, err := e.StreamStats(f.n("w")); err == nil {
		t.Error("stream stats of a write-only stream")
	}
	if _, err := e.StreamStats(f.n("r")); err != nil {
		t.Errorf("stream stats of a readable stream: %v", err)
	}
	if _, err := e.QueryOffset("ref", f.n("ghost")); !errors.Is(err, stream.CodeAccessRefused) {
		t.Errorf("query offset on a stream it may not read: %v, want %v", err, stream.CodeAccessRefused)
	}
	if parts, err := e.QueryPartitions(f.n("ssr")); err != nil || len(parts) != 2 {
		t.Errorf("partitions of a readable super stream: %v, %v", parts, err)
	}
	if _, err := e.QueryPartitions(f.n("ssmix")); err == nil {
		t.Error("partitions of a super stream with a partition it may not use")
	}
	// The producer's connection (to the leader) also passed metadata: the stream's messages are
	// there for guest to read.
	guest := env(t, f.b)
	got, _ := consume(t, guest, f.n("w"), stream.NewConsumerOptions().SetOffset(stream.OffsetSpecification{}.First()), 20)
	if got[19] != "w19" {
		t.Fatalf("guest read %v", got)
	}
}
