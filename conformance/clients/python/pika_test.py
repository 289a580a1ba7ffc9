"""Black-box conformance tests for the pika client (BlockingConnection), run against WARREN_URL.

Each test opens its own connection, uses uniquely named, exclusive or auto-delete entities, and
checks what a pika user observes. Everything here passes against RabbitMQ 3.10.
"""

import time
import unittest

import pika
import pika.exceptions

from support import WAIT, as_str, broker_url, unique, wait_until


class PikaTest(unittest.TestCase):
    def setUp(self):
        self.conn = pika.BlockingConnection(pika.URLParameters(broker_url()))
        self.addCleanup(self._close)
        self.ch = self.conn.channel()

    def _close(self):
        if self.conn.is_open:
            self.conn.close()

    # helpers

    def queue(self, prefix="q", **arguments):
        """Declares an exclusive queue with the given x-arguments; returns its name."""
        ok = self.ch.queue_declare(unique(prefix), exclusive=True, arguments=arguments or None)
        return ok.method.queue

    def publish(self, routing_key, body, exchange="", properties=None, mandatory=False):
        self.ch.basic_publish(exchange, routing_key, body, properties, mandatory)

    def get(self, queue, auto_ack=False, timeout=WAIT):
        """basic.get polled until a message arrives: (method, properties, body)."""
        result = []

        def poll():
            method, props, body = self.ch.basic_get(queue, auto_ack=auto_ack)
            if method is not None:
                result.append((method, props, body))
                return True
            return False

        wait_until(poll, timeout, what="a message on %s" % queue)
        return result[0]

    def ready_count(self, queue):
        return self.ch.queue_declare(queue, passive=True).method.message_count

    def drain(self, deliveries, count, timeout=WAIT):
        """Runs the connection's I/O until `deliveries` holds `count` items."""
        deadline = time.monotonic() + timeout
        while len(deliveries) < count:
            if time.monotonic() >= deadline:
                self.fail("got %d deliveries, want %d" % (len(deliveries), count))
            self.conn.process_data_events(time_limit=0.05)

    # connect

    def test_connect(self):
        self.assertTrue(self.conn.is_open)
        self.assertTrue(self.ch.is_open)
        second = self.conn.channel()
        self.assertNotEqual(second.channel_number, self.ch.channel_number)
        second.close()
        self.assertTrue(second.is_closed)
        self.assertTrue(self.ch.is_open)

    def test_connect_bad_credentials(self):
        params = pika.URLParameters(broker_url())
        params.credentials = pika.PlainCredentials(params.credentials.username, "not-the-password")
        with self.assertRaises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(params)

    # declare

    def test_declare_exchanges(self):
        for kind in ("direct", "fanout", "topic", "headers"):
            name = unique("x-" + kind)
            self.ch.exchange_declare(name, exchange_type=kind, auto_delete=False)
            # Redeclaring with the same type, and a passive declare, both succeed.
            self.ch.exchange_declare(name, exchange_type=kind)
            self.ch.exchange_declare(name, passive=True)
            self.ch.exchange_delete(name)

    def test_declare_queue(self):
        name = unique("q")
        ok = self.ch.queue_declare(name, exclusive=True)
        self.assertEqual(ok.method.queue, name)
        self.assertEqual(ok.method.message_count, 0)
        self.assertEqual(ok.method.consumer_count, 0)
        self.publish(name, b"one")
        self.publish(name, b"two")
        wait_until(lambda: self.ready_count(name) == 2, what="message_count 2")

    def test_declare_server_named_queue(self):
        ok = self.ch.queue_declare("", exclusive=True)
        self.assertTrue(ok.method.queue.startswith("amq.gen-"), ok.method.queue)

    def test_passive_declare_missing_queue(self):
        with self.assertRaises(pika.exceptions.ChannelClosedByBroker) as cm:
            self.ch.queue_declare(unique("missing"), passive=True)
        self.assertEqual(cm.exception.reply_code, 404)
        self.assertIn("NOT_FOUND", cm.exception.reply_text)
        # Only the channel is closed: the connection still serves a new one.
        self.assertTrue(self.conn.is_open)
        self.conn.channel().queue_declare("", exclusive=True)

    def test_redeclare_with_other_arguments_fails(self):
        name = unique("q")
        self.ch.queue_declare(name, exclusive=True, arguments={"x-max-length": 10})
        with self.assertRaises(pika.exceptions.ChannelClosedByBroker) as cm:
            self.ch.queue_declare(name, exclusive=True, arguments={"x-max-length": 20})
        self.assertEqual(cm.exception.reply_code, 406)

    # bind and route

    def test_bind_topic(self):
        x = unique("topic")
        self.ch.exchange_declare(x, exchange_type="topic", auto_delete=True)
        q = self.queue()
        self.ch.queue_bind(q, x, routing_key="stock.*.nyse")
        self.ch.queue_bind(q, x, routing_key="audit.#")
        for key in ("stock.ibm.nyse", "stock.ibm.lse", "audit", "audit.a.b", "other"):
            self.publish(key, key.encode(), exchange=x)
        got = []
        while len(got) < 3:
            got.append(self.get(q, auto_ack=True)[0].routing_key)
        self.assertEqual(got, ["stock.ibm.nyse", "audit", "audit.a.b"])
        self.assertEqual(self.ready_count(q), 0)

    def test_bind_fanout_and_unbind(self):
        x = unique("fanout")
        self.ch.exchange_declare(x, exchange_type="fanout", auto_delete=True)
        q1, q2 = self.queue(), self.queue()
        self.ch.queue_bind(q1, x)
        self.ch.queue_bind(q2, x)
        self.publish("ignored", b"both", exchange=x)
        self.assertEqual(self.get(q1, auto_ack=True)[2], b"both")
        self.assertEqual(self.get(q2, auto_ack=True)[2], b"both")
        self.ch.queue_unbind(q2, x)
        self.publish("ignored", b"only-q1", exchange=x)
        self.assertEqual(self.get(q1, auto_ack=True)[2], b"only-q1")
        self.assertEqual(self.ready_count(q2), 0)

    def test_bind_headers(self):
        x = unique("headers")
        self.ch.exchange_declare(x, exchange_type="headers", auto_delete=True)
        q = self.queue()
        self.ch.queue_bind(q, x, arguments={"x-match": "all", "format": "pdf", "type": "report"})
        self.publish("", b"no", exchange=x, properties=pika.BasicProperties(headers={"format": "pdf"}))
        self.publish("", b"yes", exchange=x,
                     properties=pika.BasicProperties(headers={"format": "pdf", "type": "report"}))
        self.assertEqual(self.get(q, auto_ack=True)[2], b"yes")
        self.assertEqual(self.ready_count(q), 0)

    # publish and consume

    def test_publish_consume_properties(self):
        q = self.queue()
        props = pika.BasicProperties(
            content_type="application/json", content_encoding="utf-8", delivery_mode=2,
            priority=3, correlation_id="corr-1", reply_to="replies", message_id="m-1",
            timestamp=1700000000, type="greeting", app_id="conformance",
            headers={"str": "v", "int": 42, "bool": True, "nested": {"k": "v"}, "list": [1, "two"]},
        )
        self.publish(q, b'{"hello": "world"}', properties=props)
        for method, got, body in self.ch.consume(q, auto_ack=True, inactivity_timeout=WAIT):
            self.assertIsNotNone(method, "no delivery")
            break
        self.ch.cancel()
        self.assertEqual(body, b'{"hello": "world"}')
        self.assertEqual(method.routing_key, q)
        self.assertEqual(method.exchange, "")
        self.assertFalse(method.redelivered)
        for field in ("content_type", "content_encoding", "delivery_mode", "priority",
                      "correlation_id", "reply_to", "message_id", "timestamp", "type", "app_id"):
            self.assertEqual(getattr(got, field), getattr(props, field), field)
        self.assertEqual(as_str(got.headers["str"]), "v")
        self.assertEqual(got.headers["int"], 42)
        self.assertIs(got.headers["bool"], True)
        self.assertEqual(as_str(got.headers["nested"]["k"]), "v")
        self.assertEqual([as_str(v) for v in got.headers["list"]], [1, "two"])

    def test_consume_in_order(self):
        q = self.queue()
        for i in range(100):
            self.publish(q, str(i).encode())
        bodies = []
        self.ch.basic_consume(q, lambda ch, m, p, b: bodies.append(b), auto_ack=True)
        self.drain(bodies, 100)
        self.assertEqual(bodies, [str(i).encode() for i in range(100)])

    def test_large_message(self):
        q = self.queue()
        body = bytes(range(256)) * 4096  # 1 MiB, many frames
        self.publish(q, body)
        self.assertEqual(self.get(q, auto_ack=True)[2], body)

    def test_cancel_consumer(self):
        q = self.queue()
        got = []
        tag = self.ch.basic_consume(q, lambda ch, m, p, b: got.append(b), auto_ack=True)
        self.publish(q, b"first")
        self.drain(got, 1)
        self.ch.basic_cancel(tag)
        self.publish(q, b"second")
        wait_until(lambda: self.ready_count(q) == 1, what="second message left in queue")
        self.assertEqual(got, [b"first"])

    # ack, nack, reject

    def test_ack(self):
        q = self.queue()
        self.publish(q, b"m")
        method, _, _ = self.get(q)
        self.ch.basic_ack(method.delivery_tag)
        # Closing the channel requeues only unacked messages: an acked one is gone.
        self.ch.close()
        self.ch = self.conn.channel()
        self.assertEqual(self.ready_count(q), 0)

    def test_unacked_requeued_on_channel_close(self):
        q = self.queue()
        self.publish(q, b"m")
        other = self.conn.channel()
        method, _, _ = other.basic_get(q)
        self.assertIsNotNone(method)
        self.assertEqual(self.ready_count(q), 0)
        other.close()
        method, _, body = self.get(q, auto_ack=True)
        self.assertTrue(method.redelivered)
        self.assertEqual(body, b"m")

    def test_ack_multiple(self):
        q = self.queue()
        for i in range(5):
            self.publish(q, str(i).encode())
        tags = [self.get(q)[0].delivery_tag for _ in range(5)]
        self.ch.basic_ack(tags[3], multiple=True)
        self.ch.close()
        self.ch = self.conn.channel()
        # Only the fifth was unacked, so it alone comes back.
        method, _, body = self.get(q, auto_ack=True)
        self.assertEqual(body, b"4")
        self.assertTrue(method.redelivered)
        self.assertEqual(self.ready_count(q), 0)

    def test_nack_requeue(self):
        q = self.queue()
        self.publish(q, b"m")
        method, _, _ = self.get(q)
        self.assertFalse(method.redelivered)
        self.ch.basic_nack(method.delivery_tag, requeue=True)
        method, _, body = self.get(q)
        self.assertTrue(method.redelivered)
        self.assertEqual(body, b"m")
        self.ch.basic_ack(method.delivery_tag)

    def test_nack_no_requeue(self):
        q = self.queue()
        self.publish(q, b"m")
        method, _, _ = self.get(q)
        self.ch.basic_nack(method.delivery_tag, requeue=False)
        self.assertEqual(self.ready_count(q), 0)

    def test_nack_multiple(self):
        q = self.queue()
        for i in range(3):
            self.publish(q, str(i).encode())
        tags = [self.get(q)[0].delivery_tag for _ in range(3)]
        self.ch.basic_nack(tags[-1], multiple=True, requeue=True)
        bodies = [self.get(q, auto_ack=True)[2] for _ in range(3)]
        self.assertEqual(bodies, [b"0", b"1", b"2"])

    def test_reject_requeue(self):
        q = self.queue()
        self.publish(q, b"m")
        method, _, _ = self.get(q)
        self.ch.basic_reject(method.delivery_tag, requeue=True)
        method, _, body = self.get(q, auto_ack=True)
        self.assertTrue(method.redelivered)
        self.assertEqual(body, b"m")

    def test_reject_no_requeue(self):
        q = self.queue()
        self.publish(q, b"m")
        method, _, _ = self.get(q)
        self.ch.basic_reject(method.delivery_tag, requeue=False)
        self.assertEqual(self.ready_count(q), 0)

    def test_ack_unknown_tag_closes_channel(self):
        q = self.queue()
        self.publish(q, b"m")
        method, _, _ = self.get(q)
        self.ch.basic_ack(method.delivery_tag + 100)
        with self.assertRaises(pika.exceptions.ChannelClosedByBroker) as cm:
            self.ch.queue_declare(q, passive=True)  # any round trip sees the close
        self.assertEqual(cm.exception.reply_code, 406)

    # prefetch

    def test_prefetch(self):
        q = self.queue()
        for i in range(5):
            self.publish(q, str(i).encode())
        self.ch.basic_qos(prefetch_count=2)
        deliveries = []
        self.ch.basic_consume(q, lambda ch, m, p, b: deliveries.append(m))
        self.drain(deliveries, 2)
        self.conn.process_data_events(time_limit=0.3)
        self.assertEqual(len(deliveries), 2, "prefetch 2 must stop at 2 unacked deliveries")
        self.assertEqual(self.ready_count(q), 3)
        self.ch.basic_ack(deliveries[0].delivery_tag)
        self.drain(deliveries, 3)
        self.conn.process_data_events(time_limit=0.3)
        self.assertEqual(len(deliveries), 3)
        self.ch.basic_ack(deliveries[2].delivery_tag, multiple=True)
        self.drain(deliveries, 5)

    # publisher confirms

    def test_confirms(self):
        q = self.queue()
        self.ch.confirm_delivery()
        for i in range(20):
            # With confirms on, BlockingChannel.basic_publish waits for the broker's basic.ack.
            self.publish(q, str(i).encode(), properties=pika.BasicProperties(delivery_mode=2))
        self.assertEqual(self.ready_count(q), 20)

    def test_confirms_unroutable_mandatory(self):
        self.ch.confirm_delivery()
        with self.assertRaises(pika.exceptions.UnroutableError) as cm:
            self.publish(unique("nowhere"), b"lost", mandatory=True)
        returned = cm.exception.messages[0]
        self.assertEqual(returned.method.reply_code, 312)
        self.assertEqual(returned.method.reply_text, "NO_ROUTE")
        self.assertEqual(returned.body, b"lost")
        # An unroutable message without mandatory is simply confirmed.
        self.publish(unique("nowhere"), b"dropped")

    # mandatory returns

    def test_mandatory_return(self):
        returned = []
        self.ch.add_on_return_callback(lambda ch, m, p, b: returned.append((m, p, b)))
        x = unique("direct")
        self.ch.exchange_declare(x, exchange_type="direct", auto_delete=True)
        q = self.queue()
        self.ch.queue_bind(q, x, routing_key="bound")
        self.publish("unbound", b"back", exchange=x, mandatory=True,
                     properties=pika.BasicProperties(message_id="r-1"))
        self.publish("bound", b"routed", exchange=x, mandatory=True)
        self.drain(returned, 1)
        method, props, body = returned[0]
        self.assertEqual(method.reply_code, 312)
        self.assertEqual(method.reply_text, "NO_ROUTE")
        self.assertEqual(method.exchange, x)
        self.assertEqual(method.routing_key, "unbound")
        self.assertEqual(props.message_id, "r-1")
        self.assertEqual(body, b"back")
        self.assertEqual(self.get(q, auto_ack=True)[2], b"routed")
        self.conn.process_data_events(time_limit=0.2)
        self.assertEqual(len(returned), 1, "a routed mandatory message must not come back")

    def test_publish_to_missing_exchange(self):
        self.ch.confirm_delivery()
        with self.assertRaises(pika.exceptions.ChannelClosedByBroker) as cm:
            self.publish("k", b"m", exchange=unique("missing"))
        self.assertEqual(cm.exception.reply_code, 404)

    # dead-lettering and TTL

    def dead_letter_setup(self, **arguments):
        """A fanout DLX with a queue bound to it, and a source queue dead-lettering to it."""
        dlx = unique("dlx")
        self.ch.exchange_declare(dlx, exchange_type="fanout", auto_delete=True)
        dlq = self.queue("dlq")
        self.ch.queue_bind(dlq, dlx)
        arguments["x-dead-letter-exchange"] = dlx
        return self.queue("src", **arguments), dlq

    def assert_death(self, props, queue, reason, count=1):
        deaths = props.headers["x-death"]
        self.assertEqual(len(deaths), 1, deaths)
        death = deaths[0]
        self.assertEqual(as_str(death["queue"]), queue)
        self.assertEqual(as_str(death["reason"]), reason)
        self.assertEqual(death["count"], count)
        self.assertEqual(as_str(death["exchange"]), "")
        self.assertEqual([as_str(k) for k in death["routing-keys"]], [queue])
        self.assertEqual(as_str(props.headers["x-first-death-queue"]), queue)
        self.assertEqual(as_str(props.headers["x-first-death-reason"]), reason)

    def test_dead_letter_on_reject(self):
        q, dlq = self.dead_letter_setup()
        self.publish(q, b"bad", properties=pika.BasicProperties(headers={"keep": "me"}))
        method, _, _ = self.get(q)
        self.ch.basic_reject(method.delivery_tag, requeue=False)
        method, props, body = self.get(dlq, auto_ack=True)
        self.assertEqual(body, b"bad")
        self.assertEqual(method.routing_key, q)  # the original routing key is kept
        self.assertEqual(as_str(props.headers["keep"]), "me")
        self.assert_death(props, q, "rejected")

    def test_dead_letter_on_nack(self):
        q, dlq = self.dead_letter_setup()
        self.publish(q, b"bad")
        method, _, _ = self.get(q)
        self.ch.basic_nack(method.delivery_tag, requeue=False)
        _, props, _ = self.get(dlq, auto_ack=True)
        self.assert_death(props, q, "rejected")

    def test_dead_letter_requeue_does_not_dead_letter(self):
        q, dlq = self.dead_letter_setup()
        self.publish(q, b"m")
        method, _, _ = self.get(q)
        self.ch.basic_reject(method.delivery_tag, requeue=True)
        self.get(q, auto_ack=True)
        self.assertEqual(self.ready_count(dlq), 0)

    def test_dead_letter_routing_key(self):
        dlx = unique("dlx")
        self.ch.exchange_declare(dlx, exchange_type="direct", auto_delete=True)
        dlq = self.queue("dlq")
        self.ch.queue_bind(dlq, dlx, routing_key="dead")
        q = self.queue("src", **{"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "dead"})
        self.publish(q, b"m")
        method, _, _ = self.get(q)
        self.ch.basic_reject(method.delivery_tag, requeue=False)
        method, props, _ = self.get(dlq, auto_ack=True)
        self.assertEqual(method.routing_key, "dead")
        self.assert_death(props, q, "rejected")

    def test_dead_letter_count_increments(self):
        # The default exchange as DLX, routing back to the same queue: each rejection adds one
        # to the count of the single {queue, reason} x-death entry.
        name = unique("loop")
        self.ch.queue_declare(name, exclusive=True, arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": name})
        self.publish(name, b"m")
        for want in (1, 2, 3):
            method, props, _ = self.get(name)
            if want > 1:
                self.assert_death(props, name, "rejected", count=want - 1)
            self.ch.basic_reject(method.delivery_tag, requeue=False)
        method, props, _ = self.get(name, auto_ack=True)
        self.assert_death(props, name, "rejected", count=3)

    def test_queue_ttl_expiry_dead_letters(self):
        q, dlq = self.dead_letter_setup(**{"x-message-ttl": 100})
        self.publish(q, b"old", properties=pika.BasicProperties(headers={"n": 1}))
        _, props, body = self.get(dlq, auto_ack=True)
        self.assertEqual(body, b"old")
        self.assert_death(props, q, "expired")
        self.assertEqual(self.ready_count(q), 0)

    def test_per_message_ttl_dead_letters(self):
        q, dlq = self.dead_letter_setup()
        self.publish(q, b"short", properties=pika.BasicProperties(expiration="100"))
        _, props, body = self.get(dlq, auto_ack=True)
        self.assertEqual(body, b"short")
        self.assert_death(props, q, "expired")
        self.assertEqual(as_str(props.headers["x-death"][0]["original-expiration"]), "100")
        self.assertIsNone(props.expiration, "expiration is removed when dead-lettered")

    def test_queue_ttl_without_dlx_drops(self):
        q = self.queue(**{"x-message-ttl": 50})
        self.ch.confirm_delivery()
        self.publish(q, b"gone")  # returns once the broker has enqueued it
        wait_until(lambda: self.ready_count(q) == 0, what="the expired message to leave")
        method, _, _ = self.ch.basic_get(q, auto_ack=True)
        self.assertIsNone(method)

    def test_ttl_zero_expires_unless_consumer(self):
        # x-message-ttl 0 with no consumer: the message expires at once, to the DLX.
        q, dlq = self.dead_letter_setup(**{"x-message-ttl": 0})
        self.publish(q, b"now")
        _, props, _ = self.get(dlq, auto_ack=True)
        self.assert_death(props, q, "expired")

    # streams: x-queue-type stream, durable, read with a prefetch count, manual acks and the
    # x-stream-offset consumer argument; every delivery carries its offset in x-stream-offset.

    STREAM_N = 10

    def stream(self, count=STREAM_N):
        """Declares a durable stream (deleted at cleanup) and publishes count messages "0", "1",
        ... with publisher confirms; returns its name."""
        name = unique("stream")
        ok = self.ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
        self.assertEqual(ok.method.queue, name)
        self.addCleanup(self._delete_queue, name)
        self.ch.confirm_delivery()
        self.stream_publish(name, range(count))
        return name

    def stream_publish(self, queue, numbers):
        # With confirms on, BlockingChannel.basic_publish waits for the broker's basic.ack, so
        # each message is a chunk of its own. That matters: RabbitMQ credits stream consumers a
        # whole chunk at a time, so a prefetch is exact only with one message per chunk.
        for i in numbers:
            self.publish(queue, str(i).encode(), properties=pika.BasicProperties(delivery_mode=2))

    @staticmethod
    def _delete_queue(name):
        # A connection of its own: the test's channel may have been closed by the broker.
        conn = pika.BlockingConnection(pika.URLParameters(broker_url()))
        try:
            conn.channel().queue_delete(name)
        finally:
            conn.close()

    def stream_consume(self, queue, offset=None, prefetch=3, ack=True):
        """Consumes queue on a channel of its own with basic.qos prefetch; returns the channel and
        a list that fills with (body, x-stream-offset header, method). Acks each delivery when
        ack is set. offset None sends no x-stream-offset (RabbitMQ's default is "next")."""
        ch = self.conn.channel()
        ch.basic_qos(prefetch_count=prefetch)
        got = []

        def on_message(channel, method, props, body):
            got.append((body.decode(), (props.headers or {}).get("x-stream-offset"), method))
            if ack:
                channel.basic_ack(method.delivery_tag)

        arguments = {} if offset is None else {"x-stream-offset": offset}
        ch.basic_consume(queue, on_message, arguments=arguments)
        return ch, got

    def assert_stream(self, got, numbers):
        """The deliveries are exactly the messages numbered `numbers`, in order, each with its
        offset (message i was published at offset i)."""
        want = list(numbers)
        self.assertEqual([body for body, _, _ in got], [str(i) for i in want])
        self.assertEqual([offset for _, offset, _ in got], want)

    def test_stream_consume_from_first(self):
        q = self.stream()
        # prefetch 3 < 10: only acks (credit) let the rest through.
        _, got = self.stream_consume(q, "first", prefetch=3)
        self.drain(got, self.STREAM_N)
        self.conn.process_data_events(time_limit=0.2)
        self.assert_stream(got, range(self.STREAM_N))

    def test_stream_consume_from_offset(self):
        q = self.stream()
        _, got = self.stream_consume(q, 3)
        self.drain(got, self.STREAM_N - 3)
        self.conn.process_data_events(time_limit=0.2)
        self.assert_stream(got, range(3, self.STREAM_N))

    def test_stream_consume_next_and_default(self):
        q = self.stream()
        _, explicit = self.stream_consume(q, "next")
        _, default = self.stream_consume(q)
        self.conn.process_data_events(time_limit=0.3)
        self.assertEqual(explicit, [], "next must not replay what is already in the stream")
        self.assertEqual(default, [], "the default offset is next")
        self.stream_publish(q, range(self.STREAM_N, self.STREAM_N + 3))
        self.drain(explicit, 3)
        self.drain(default, 3)
        self.conn.process_data_events(time_limit=0.2)
        self.assert_stream(explicit, range(self.STREAM_N, self.STREAM_N + 3))
        self.assert_stream(default, range(self.STREAM_N, self.STREAM_N + 3))

    def test_stream_consumers_replay_independently(self):
        q = self.stream()
        slow_ch, slow = self.stream_consume(q, "first", prefetch=2, ack=False)
        _, fast = self.stream_consume(q, "first", prefetch=3)
        self.drain(fast, self.STREAM_N)
        self.conn.process_data_events(time_limit=0.2)
        self.assertEqual(len(slow), 2, "a consumer that does not ack stops at its prefetch")
        self.assert_stream(fast, range(self.STREAM_N))
        while len(slow) < self.STREAM_N:
            have = len(slow)
            slow_ch.basic_ack(slow[-1][2].delivery_tag, multiple=True)
            self.drain(slow, min(have + 2, self.STREAM_N))
        self.assert_stream(slow, range(self.STREAM_N))
        # Reading deletes nothing: a new consumer replays it all again.
        _, again = self.stream_consume(q, "first")
        self.drain(again, self.STREAM_N)
        self.assert_stream(again, range(self.STREAM_N))

    def test_stream_basic_get_refused(self):
        q = self.stream(1)
        # 540 NOT_IMPLEMENTED is a connection error: the whole connection is closed.
        with self.assertRaises(pika.exceptions.ConnectionClosedByBroker) as cm:
            self.ch.basic_get(q)
        self.assertEqual(cm.exception.reply_code, 540)
        self.assertIn("NOT_IMPLEMENTED", cm.exception.reply_text)
        self.assertFalse(self.conn.is_open)

    def test_stream_consume_without_prefetch_refused(self):
        q = self.stream(1)
        ch = self.conn.channel()
        with self.assertRaises(pika.exceptions.ChannelClosedByBroker) as cm:
            ch.basic_consume(q, lambda *args: None, arguments={"x-stream-offset": "first"})
        self.assertEqual(cm.exception.reply_code, 406)
        self.assertIn("PRECONDITION_FAILED", cm.exception.reply_text)


    # quorum queues: x-queue-type quorum, durable only. RabbitMQ 3.10 puts a requeued message at
    # the tail of a quorum queue, so the requeue tests use one message each. Redeliveries carry
    # x-delivery-count; past x-delivery-limit a message is dead-lettered with reason
    # delivery_limit (limit 1: delivered twice, dead-lettered on the second return).

    def quorum(self, **arguments):
        """Declares a durable quorum queue (deleted at cleanup) with the given x-arguments."""
        name = unique("quorum")
        arguments["x-queue-type"] = "quorum"
        ok = self.ch.queue_declare(name, durable=True, arguments=arguments)
        self.assertEqual(ok.method.queue, name)
        self.addCleanup(self._delete_queue, name)
        return name

    def quorum_consume(self, queue, prefetch):
        """Consumes queue with manual acks and basic.qos prefetch on a channel of its own;
        returns the channel and a list that fills with (method, properties, body)."""
        ch = self.conn.channel()
        ch.basic_qos(prefetch_count=prefetch)
        got = []
        ch.basic_consume(queue, lambda channel, m, p, b: got.append((m, p, b)))
        return ch, got

    def test_quorum_confirms_prefetch_ack(self):
        q = self.quorum()
        self.ch.confirm_delivery()
        for i in range(5):
            self.publish(q, str(i).encode(), properties=pika.BasicProperties(delivery_mode=2))
        self.assertEqual(self.ready_count(q), 5)
        ch, got = self.quorum_consume(q, 2)
        self.drain(got, 2)
        self.conn.process_data_events(time_limit=0.3)
        self.assertEqual(len(got), 2, "prefetch 2 must stop at 2 unacked deliveries")
        ch.basic_ack(got[1][0].delivery_tag, multiple=True)
        self.drain(got, 4)
        self.conn.process_data_events(time_limit=0.3)
        self.assertEqual(len(got), 4)
        ch.basic_ack(got[3][0].delivery_tag, multiple=True)
        self.drain(got, 5)
        ch.basic_ack(got[4][0].delivery_tag)
        self.assertEqual([b for _, _, b in got], [str(i).encode() for i in range(5)])
        self.assertFalse(any(m.redelivered for m, _, _ in got))
        # Closing the channel would requeue anything unacked: the acks emptied the queue.
        ch.close()
        self.assertEqual(self.ready_count(q), 0)

    def test_quorum_redelivery_count(self):
        q = self.quorum()
        self.ch.confirm_delivery()
        self.publish(q, b"m", properties=pika.BasicProperties(delivery_mode=2))
        ch, got = self.quorum_consume(q, 1)
        self.drain(got, 1)
        self.assertFalse(got[0][0].redelivered)
        ch.basic_nack(got[0][0].delivery_tag, requeue=True)
        self.drain(got, 2)
        method, props, body = got[1]
        self.assertTrue(method.redelivered)
        self.assertEqual(body, b"m")
        self.assertEqual(props.headers["x-delivery-count"], 1)
        ch.basic_reject(method.delivery_tag, requeue=True)
        self.drain(got, 3)
        method, props, body = got[2]
        self.assertTrue(method.redelivered)
        self.assertEqual(props.headers["x-delivery-count"], 2)
        ch.basic_ack(method.delivery_tag)
        ch.close()
        self.assertEqual(self.ready_count(q), 0)

    def test_quorum_delivery_limit_dead_letters(self):
        dlx = unique("dlx")
        self.ch.exchange_declare(dlx, exchange_type="fanout", auto_delete=True)
        dlq = self.queue("dlq")
        self.ch.queue_bind(dlq, dlx)
        q = self.quorum(**{"x-delivery-limit": 1, "x-dead-letter-exchange": dlx})
        self.ch.confirm_delivery()
        self.publish(q, b"poison", properties=pika.BasicProperties(
            delivery_mode=2, headers={"keep": "me"}))
        ch, got = self.quorum_consume(q, 1)
        self.drain(got, 1)
        ch.basic_nack(got[0][0].delivery_tag, requeue=True)
        self.drain(got, 2)
        self.assertEqual(got[1][1].headers["x-delivery-count"], 1)
        ch.basic_nack(got[1][0].delivery_tag, requeue=True)
        method, props, body = self.get(dlq, auto_ack=True)
        self.assertEqual(body, b"poison")
        self.assertEqual(method.routing_key, q)
        self.assertEqual(as_str(props.headers["keep"]), "me")
        self.assert_death(props, q, "delivery_limit")
        self.assertNotIn("x-delivery-count", props.headers)
        self.conn.process_data_events(time_limit=0.2)
        self.assertEqual(len(got), 2, "a dead-lettered message is not delivered again")
        ch.close()
        self.assertEqual(self.ready_count(q), 0)

    def test_quorum_non_durable_refused(self):
        name = unique("quorum")
        with self.assertRaises(pika.exceptions.ChannelClosedByBroker) as cm:
            self.ch.queue_declare(name, durable=False, arguments={"x-queue-type": "quorum"})
        self.assertEqual(cm.exception.reply_code, 406)
        self.assertTrue(cm.exception.reply_text.startswith(
            "PRECONDITION_FAILED - invalid property 'non-durable' for queue '%s'" % name),
            cm.exception.reply_text)
        with self.assertRaises(pika.exceptions.ChannelClosedByBroker) as cm:
            self.conn.channel().queue_declare(name, passive=True)
        self.assertEqual(cm.exception.reply_code, 404)

    def test_quorum_exclusive_auto_delete_server_named_refused(self):
        name = unique("quorum")
        for kwargs, prefix in (
                (dict(exclusive=True), "PRECONDITION_FAILED - invalid property 'exclusive-owner'"),
                (dict(auto_delete=True), "PRECONDITION_FAILED - invalid property 'auto-delete'")):
            with self.assertRaises(pika.exceptions.ChannelClosedByBroker) as cm:
                self.conn.channel().queue_declare(
                    name, durable=True, arguments={"x-queue-type": "quorum"}, **kwargs)
            self.assertEqual(cm.exception.reply_code, 406)
            self.assertTrue(cm.exception.reply_text.startswith(prefix), cm.exception.reply_text)
        with self.assertRaises(pika.exceptions.ChannelClosedByBroker) as cm:
            self.conn.channel().queue_declare("", durable=True, arguments={"x-queue-type": "quorum"})
        self.assertEqual(cm.exception.reply_code, 406)
        self.assertTrue(cm.exception.reply_text.startswith("PRECONDITION_FAILED"),
                        cm.exception.reply_text)


if __name__ == "__main__":
    unittest.main()
