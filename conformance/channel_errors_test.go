package conformance

// Raw-socket tests of channel errors: their code and text, and the failing method they name,
// which clients use to find the call that failed (the Node rabbitmq-client library matches a
// channel.close naming basic.publish to its pending publish).

import (
	"fmt"
	"testing"
)

// TestPublishErrorNamesThePublish: a channel error raised by a publish, in normal and in tx mode,
// closes the channel naming basic.publish (60/40), with RabbitMQ's code and text.
func TestPublishErrorNamesThePublish(t *testing.T) {
	b := sharedBroker(t)
	const internal = "warren-conformance-internal"
	publish := func(exchange string, header []byte) [][]byte {
		return [][]byte{methodFrame(1, classBasic, 40, basicPublishArgs(exchange, "k")), header, frameBytes(frameBody, 1, []byte("x"))}
	}
	shortstr := func(s string) []byte { var e enc; e.shortstr(s); return e.b }
	for _, tx := range []bool{false, true} {
		for _, tc := range []struct {
			name         string
			frames       [][]byte
			code         uint16
			text         string
			warrenOnly   string // why RabbitMQ is not asked, if it is not
			needInternal bool
		}{
			{name: "unknown exchange", frames: publish("warren-conformance-no-such-exchange", contentHeaderFrame(1, 1)),
				code: 404, text: "NOT_FOUND - no exchange 'warren-conformance-no-such-exchange' in vhost '/'"},
			{name: "internal exchange", frames: publish(internal, contentHeaderFrame(1, 1)), needInternal: true,
				code: 403, text: "ACCESS_REFUSED - cannot publish to internal exchange '" + internal + "' in vhost '/'"},
			{name: "bad expiration", frames: publish("", contentHeaderFrameProps(1, 1, propExpiration, shortstr("soon"))),
				code: 406, text: "PRECONDITION_FAILED - invalid expiration 'soon': no_integer"},
			{name: "direct reply-to without a reply consumer", frames: publish("", contentHeaderFrameProps(1, 1, propReplyTo, shortstr("amq.rabbitmq.reply-to"))),
				code: 406, text: "PRECONDITION_FAILED - fast reply consumer does not exist"},
			{name: "message over the size limit", frames: [][]byte{methodFrame(1, classBasic, 40, basicPublishArgs("", "k")), contentHeaderFrame(1, 16<<20+1)},
				code: 406, text: "PRECONDITION_FAILED - message size 16777217 is larger than configured max size 16777216",
				warrenOnly: "RabbitMQ 3.10's limit is 128 MiB and it checks the body it received, not the declared size"},
		} {
			name := tc.name
			if tx {
				name = "tx: " + name
			}
			t.Run(name, func(t *testing.T) {
				c := openRaw(t, b.Addr)
				if tc.warrenOnly != "" && c.isRabbitMQ() {
					t.Skip(tc.warrenOnly)
				}
				c.openChannel(1)
				if tc.needInternal {
					var e enc
					e.short(0)
					e.shortstr(internal)
					e.shortstr("direct")
					e.bits(false, false, true, true, false) // passive, durable, auto-delete, internal, no-wait
					e.table(nil)
					c.send(1, classExchange, 10, e.b)
					c.expect(1, classExchange, 11)
				}
				if tx {
					c.send(1, 90, 10, nil) // tx.select
					c.expect(1, 90, 11)
				}
				c.write(tc.frames...)
				if tx {
					c.send(1, 90, 20, nil) // tx.commit: the error must come from the publish, before it
				}
				f := c.expect(1, classChannel, 40)
				ci := parseClose(f)
				if ci.code != tc.code || ci.text != tc.text || ci.class != classBasic || ci.method != 40 {
					t.Errorf("channel.close %d %q for %d.%d; want %d %q for 60.40 (basic.publish)", ci.code, ci.text, ci.class, ci.method, tc.code, tc.text)
				}
				c.send(1, classChannel, 41, nil)
				c.openChannel(1) // the connection is still there
				if tc.needInternal {
					var e enc
					e.short(0)
					e.shortstr(internal)
					e.bits(false, false)
					c.send(1, classExchange, 20, e.b)
					c.expect(1, classExchange, 21)
				}
			})
		}
	}
}

// TestQuorumQueueRefusesOtherTypesArguments: a quorum queue declared with an argument of another
// queue type (x-queue-mode, x-max-priority, ...) is 406 with RabbitMQ's text (rabbit_amqqueue's
// check against rabbit_quorum_queue's list of arguments), whatever its value.
func TestQuorumQueueRefusesOtherTypesArguments(t *testing.T) {
	b := sharedBroker(t)
	const name = "warren-conformance-qq-args"
	for _, arg := range []field{
		{"x-queue-mode", "lazy"}, {"x-queue-mode", "default"}, {"x-queue-mode", int32(1)},
		{"x-max-priority", int32(5)}, {"x-queue-version", int32(2)}, {"x-queue-master-locator", "min-masters"},
		{"x-max-age", "1D"}, {"x-stream-max-segment-size-bytes", int32(1000)}, {"x-initial-cluster-size", int32(1)},
	} {
		t.Run(fmt.Sprintf("%s=%v", arg.key, arg.value), func(t *testing.T) {
			c := openRaw(t, b.Addr)
			c.openChannel(1)
			var e enc
			e.short(0)
			e.shortstr(name)
			e.bits(false, true, false, false, false) // durable
			e.table([]field{{"x-queue-type", "quorum"}, arg})
			c.send(1, classQueue, 10, e.b)
			f := c.next()
			if f.is(classQueue, 11) {
				var del enc
				del.short(0)
				del.shortstr(name)
				del.bits(false, false, false)
				c.send(1, classQueue, 40, del.b)
				t.Fatalf("quorum queue declared with %s; want 406", arg.key)
			}
			if !f.is(classChannel, 40) || f.channel != 1 {
				t.Fatalf("got %v; want channel.close 406", f)
			}
			ci := parseClose(f)
			want := fmt.Sprintf("PRECONDITION_FAILED - invalid arg '%s' for queue '%s' in vhost '/' of queue type rabbit_quorum_queue", arg.key, name)
			if ci.code != 406 || ci.text != want || ci.class != classQueue || ci.method != 10 {
				t.Errorf("channel.close %d %q for %d.%d; want 406 %q for 50.10", ci.code, ci.text, ci.class, ci.method, want)
			}
		})
	}
}
