"""Black-box conformance tests for kombu (py-amqp transport), run against WARREN_URL.

Written the way kombu applications are: Exchange and Queue entities bound to a channel, a
Producer and Consumer with callbacks, Connection.drain_events, SimpleQueue. Everything here
passes against RabbitMQ 3.10.
"""

import re
import socket
import time
import unittest

import amqp.exceptions
from kombu import Connection, Consumer, Exchange, Producer, Queue

from support import WAIT, as_str, broker_url, unique, wait_until


class KombuTest(unittest.TestCase):
    def setUp(self):
        self.conn = Connection(broker_url(), connect_timeout=WAIT)
        self.conn.connect()
        self.addCleanup(self.conn.release)
        self.ch = self.conn.channel()

    # helpers

    def queue(self, prefix="q", **kwargs):
        """An exclusive queue declared on self.ch (kwargs go to kombu.Queue)."""
        q = Queue(unique(prefix), exclusive=True, **kwargs)(self.ch)
        q.declare()
        return q

    def producer(self, exchange=None, **kwargs):
        return Producer(self.ch, exchange=exchange, serializer="json", **kwargs)

    def get(self, queue, no_ack=False, timeout=WAIT):
        """basic.get polled until a message arrives."""
        got = []

        def poll():
            message = queue.get(no_ack=no_ack, accept=["json", "text/plain", "application/data"])
            if message is not None:
                got.append(message)
                return True
            return False

        wait_until(poll, timeout, what="a message on %s" % queue.name)
        return got[0]

    def ready_count(self, queue):
        return queue.queue_declare(passive=True).message_count

    def drain(self, received, count, timeout=WAIT):
        """drain_events until `received` holds `count` items."""
        deadline = time.monotonic() + timeout
        while len(received) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.fail("got %d messages, want %d" % (len(received), count))
            try:
                self.conn.drain_events(timeout=min(remaining, 0.2))
            except socket.timeout:
                pass

    def drain_quietly(self, seconds):
        """Processes whatever arrives during `seconds`."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                self.conn.drain_events(timeout=max(0.01, deadline - time.monotonic()))
            except socket.timeout:
                pass

    # connect

    def test_connect(self):
        self.assertTrue(self.conn.connected)
        self.assertIsNotNone(self.conn.connection.server_properties)
        other = self.conn.channel()
        self.assertNotEqual(other.channel_id, self.ch.channel_id)
        other.close()

    def test_connect_bad_credentials(self):
        url = re.sub(r"(//[^:/@]+:)[^@]*@", r"\1wrong@", broker_url())
        conn = Connection(url, connect_timeout=WAIT)
        with self.assertRaises(amqp.exceptions.AccessRefused):
            conn.connect()
        conn.release()

    def test_ensure_connection(self):
        conn = Connection(broker_url())
        conn.ensure_connection(max_retries=2)
        self.assertTrue(conn.connected)
        conn.release()

    # declare

    def test_declare_exchanges(self):
        for kind in ("direct", "fanout", "topic", "headers"):
            ex = Exchange(unique(kind), type=kind, auto_delete=False)(self.ch)
            ex.declare()
            ex.declare(passive=True)
            ex.delete()

    def test_declare_queue(self):
        q = self.queue()
        name, count, consumers = q.queue_declare(passive=True)
        self.assertEqual((name, count, consumers), (q.name, 0, 0))

    def test_passive_declare_missing_exchange(self):
        ex = Exchange(unique("missing"), type="direct")(self.ch)
        with self.assertRaises(amqp.exceptions.NotFound):
            ex.declare(passive=True)
        # Only the channel was closed: the connection serves a new one.
        self.ch = self.conn.channel()
        self.queue()

    def test_redeclare_with_other_arguments_fails(self):
        name = unique("q")
        Queue(name, exclusive=True, max_length=10)(self.ch).declare()
        with self.assertRaises(amqp.exceptions.PreconditionFailed):
            Queue(name, exclusive=True, max_length=20)(self.ch).declare()

    # bind and route

    def test_bind_topic(self):
        ex = Exchange(unique("topic"), type="topic", auto_delete=True)
        q = self.queue(exchange=ex, routing_key="stock.*.nyse")
        q.bind_to(ex, routing_key="audit.#")
        producer = self.producer(ex)
        for key in ("stock.ibm.nyse", "stock.ibm.lse", "audit", "audit.a.b", "other"):
            producer.publish({"key": key}, routing_key=key)
        got = [self.get(q, no_ack=True).payload["key"] for _ in range(3)]
        self.assertEqual(got, ["stock.ibm.nyse", "audit", "audit.a.b"])
        self.assertIsNone(q.get(no_ack=True))

    def test_bind_fanout_and_unbind(self):
        ex = Exchange(unique("fanout"), type="fanout", auto_delete=True)
        q1 = self.queue(exchange=ex)
        q2 = self.queue(exchange=ex)
        producer = self.producer(ex)
        producer.publish("both")
        self.assertEqual(self.get(q1, no_ack=True).payload, "both")
        self.assertEqual(self.get(q2, no_ack=True).payload, "both")
        q2.unbind_from(ex)
        producer.publish("only-q1")
        self.assertEqual(self.get(q1, no_ack=True).payload, "only-q1")
        self.assertEqual(self.ready_count(q2), 0)

    def test_bind_headers(self):
        ex = Exchange(unique("headers"), type="headers", auto_delete=True)
        q = self.queue(exchange=ex, binding_arguments={"x-match": "any", "a": "1", "b": "2"})
        producer = self.producer(ex)
        producer.publish("no", headers={"c": "3"})
        producer.publish("yes", headers={"b": "2"})
        self.assertEqual(self.get(q, no_ack=True).payload, "yes")
        self.assertIsNone(q.get(no_ack=True))

    # publish and consume

    def test_publish_consume(self):
        ex = Exchange(unique("direct"), type="direct", auto_delete=True)
        q = self.queue(exchange=ex, routing_key="work")
        producer = self.producer(ex)
        for i in range(50):
            producer.publish({"n": i}, routing_key="work", headers={"i": i},
                             correlation_id="c-%d" % i, priority=1)
        received = []

        def on_message(body, message):
            received.append((body, message))
            message.ack()

        with Consumer(self.ch, queues=[q], callbacks=[on_message], accept=["json"]):
            self.drain(received, 50)
        self.assertEqual([b["n"] for b, _ in received], list(range(50)))
        body, message = received[7]
        self.assertEqual(message.headers["i"], 7)
        self.assertEqual(message.properties["correlation_id"], "c-7")
        self.assertEqual(message.content_type, "application/json")
        self.assertEqual(message.delivery_info["routing_key"], "work")
        self.assertEqual(message.delivery_info["exchange"], ex.name)
        self.assertFalse(message.delivery_info["redelivered"])

    def test_simple_queue(self):
        name = unique("simple")
        with self.conn.SimpleQueue(name, queue_opts={"auto_delete": True}) as sq:
            sq.put({"hello": "world"})
            message = sq.get(block=True, timeout=WAIT)
            self.assertEqual(message.payload, {"hello": "world"})
            message.ack()
            self.assertEqual(sq.qsize(), 0)

    def test_consumer_cancel(self):
        # kombu makes exclusive queues auto-delete, so this one is neither, and removed at the end.
        q = Queue(unique("cancel"), auto_delete=False)(self.ch)
        q.declare()
        self.addCleanup(lambda: q(self.conn.channel()).delete())
        received = []
        consumer = Consumer(self.ch, queues=[q], accept=["json"],
                            callbacks=[lambda body, m: (received.append(body), m.ack())])
        consumer.consume()
        producer = self.producer()
        producer.publish("first", routing_key=q.name)
        self.drain(received, 1)
        consumer.cancel()
        producer.publish("second", routing_key=q.name)
        wait_until(lambda: self.ready_count(q) == 1, what="second message left in queue")
        self.assertEqual(received, ["first"])

    def test_auto_delete_queue_goes_with_last_consumer(self):
        q = Queue(unique("autodel"), auto_delete=True)(self.ch)
        q.declare()
        consumer = Consumer(self.ch, queues=[q], accept=["json"])
        consumer.consume()
        consumer.cancel()
        with self.assertRaises(amqp.exceptions.NotFound):
            q.queue_declare(passive=True)

    # ack and reject (py-amqp, kombu's transport, has no basic.nack)

    def test_ack(self):
        q = self.queue()
        self.producer().publish("m", routing_key=q.name)
        message = self.get(q)
        message.ack()
        self.assertTrue(message.acknowledged)
        self.ch.close()
        self.ch = self.conn.channel()
        self.assertEqual(self.ready_count(q(self.ch)), 0)

    def test_unacked_requeued_on_channel_close(self):
        q = self.queue()
        self.producer().publish("m", routing_key=q.name)
        other = self.conn.channel()
        message = self.get(q(other))
        self.assertFalse(message.delivery_info["redelivered"])
        other.close()
        message = self.get(q, no_ack=True)
        self.assertTrue(message.delivery_info["redelivered"])

    def test_requeue(self):
        q = self.queue()
        self.producer().publish("m", routing_key=q.name)
        self.get(q).requeue()
        message = self.get(q)
        self.assertTrue(message.delivery_info["redelivered"])
        self.assertEqual(message.payload, "m")
        message.ack()

    def test_reject_no_requeue(self):
        q = self.queue()
        self.producer().publish("m", routing_key=q.name)
        self.get(q).reject(requeue=False)
        self.assertEqual(self.ready_count(q), 0)

    # prefetch

    def test_prefetch(self):
        q = self.queue()
        producer = self.producer()
        for i in range(5):
            producer.publish(i, routing_key=q.name)
        received = []
        consumer = Consumer(self.ch, queues=[q], accept=["json"],
                            callbacks=[lambda body, m: received.append(m)])
        consumer.qos(prefetch_count=2)
        consumer.consume()
        self.drain(received, 2)
        self.drain_quietly(0.3)
        self.assertEqual(len(received), 2, "prefetch 2 must stop at 2 unacked messages")
        received[0].ack()
        self.drain(received, 3)
        self.drain_quietly(0.3)
        self.assertEqual(len(received), 3)
        received[2].ack(multiple=True)
        self.drain(received, 5)
        self.assertEqual([m.payload for m in received], [0, 1, 2, 3, 4])
        consumer.cancel()

    # publisher confirms

    def test_confirms(self):
        conn = Connection(broker_url(), transport_options={"confirm_publish": True})
        self.addCleanup(conn.release)
        ch = conn.channel()
        q = Queue(unique("confirm"), exclusive=True)(ch)
        q.declare()
        producer = Producer(ch, serializer="json")
        for i in range(20):
            # basic_publish_confirm returns only after the broker's basic.ack.
            producer.publish({"n": i}, routing_key=q.name, delivery_mode=2)
        self.assertEqual(q.queue_declare(passive=True).message_count, 20)

    # mandatory returns

    def test_mandatory_return(self):
        returned = []

        def on_return(exc, exchange, routing_key, message):
            returned.append((exc, exchange, routing_key, message))

        ex = Exchange(unique("direct"), type="direct", auto_delete=True)
        q = self.queue(exchange=ex, routing_key="bound")
        producer = self.producer(ex, on_return=on_return)
        producer.publish("back", routing_key="unbound", mandatory=True)
        producer.publish("routed", routing_key="bound", mandatory=True)
        self.drain(returned, 1)
        exc, exchange, routing_key, message = returned[0]
        self.assertEqual(exc.reply_code, 312)
        self.assertIn("NO_ROUTE", str(exc))
        self.assertEqual(exchange, ex.name)
        self.assertEqual(routing_key, "unbound")
        self.assertEqual(as_str(message.body), "\"back\"")
        self.assertEqual(self.get(q, no_ack=True).payload, "routed")
        self.drain_quietly(0.2)
        self.assertEqual(len(returned), 1)

    def test_mandatory_return_with_confirms(self):
        returned = []
        conn = Connection(broker_url(), transport_options={"confirm_publish": True})
        self.addCleanup(conn.release)
        producer = Producer(conn.channel(), serializer="json",
                            on_return=lambda exc, ex, key, msg: returned.append(key))
        nowhere = unique("nowhere")
        # The return arrives before the confirm, while publish waits for the confirm.
        producer.publish("lost", routing_key=nowhere, mandatory=True)
        self.assertEqual(returned, [nowhere])

    # dead-lettering and TTL

    def dead_letter_setup(self, **queue_kwargs):
        dlx = Exchange(unique("dlx"), type="fanout", auto_delete=True)
        dlq = self.queue("dlq", exchange=dlx)
        arguments = queue_kwargs.pop("queue_arguments", {})
        arguments["x-dead-letter-exchange"] = dlx.name
        return self.queue("src", queue_arguments=arguments, **queue_kwargs), dlq

    def assert_death(self, message, queue, reason, count=1):
        deaths = message.headers["x-death"]
        self.assertEqual(len(deaths), 1, deaths)
        death = deaths[0]
        self.assertEqual(as_str(death["queue"]), queue)
        self.assertEqual(as_str(death["reason"]), reason)
        self.assertEqual(death["count"], count)
        self.assertEqual(as_str(message.headers["x-first-death-reason"]), reason)
        self.assertEqual(as_str(message.headers["x-first-death-queue"]), queue)

    def test_dead_letter_on_reject(self):
        q, dlq = self.dead_letter_setup()
        self.producer().publish({"job": 1}, routing_key=q.name)
        self.get(q).reject(requeue=False)
        message = self.get(dlq, no_ack=True)
        self.assertEqual(message.payload, {"job": 1})
        self.assertEqual(message.delivery_info["routing_key"], q.name)
        self.assert_death(message, q.name, "rejected")

    def test_dead_letter_routing_key(self):
        dlx = Exchange(unique("dlx"), type="direct", auto_delete=True)
        dlq = self.queue("dlq", exchange=dlx, routing_key="parking")
        q = self.queue("src", queue_arguments={
            "x-dead-letter-exchange": dlx.name, "x-dead-letter-routing-key": "parking"})
        self.producer().publish("m", routing_key=q.name)
        self.get(q).reject(requeue=False)
        message = self.get(dlq, no_ack=True)
        self.assertEqual(message.delivery_info["routing_key"], "parking")
        self.assert_death(message, q.name, "rejected")

    def test_queue_ttl_expiry_dead_letters(self):
        # kombu's message_ttl is in seconds; it declares x-message-ttl in milliseconds.
        q, dlq = self.dead_letter_setup(message_ttl=0.1)
        self.producer().publish("old", routing_key=q.name)
        message = self.get(dlq, no_ack=True)
        self.assertEqual(message.payload, "old")
        self.assert_death(message, q.name, "expired")

    def test_per_message_ttl_dead_letters(self):
        q, dlq = self.dead_letter_setup()
        self.producer().publish("short", routing_key=q.name, expiration=0.1)
        message = self.get(dlq, no_ack=True)
        self.assert_death(message, q.name, "expired")
        self.assertEqual(as_str(message.headers["x-death"][0]["original-expiration"]), "100")
        self.assertNotIn("expiration", message.properties)

    # streams: x-queue-type stream, durable, read with a prefetch count, manual acks and the
    # x-stream-offset consumer argument (kombu's Queue(consumer_arguments=...)); every delivery
    # carries its offset in the x-stream-offset header.

    STREAM_N = 10

    def stream(self, count=STREAM_N):
        """Declares a durable stream (deleted at cleanup) and publishes the numbers 0..count-1
        with publisher confirms; returns its name."""
        name = unique("stream")
        Queue(name, durable=True, queue_arguments={"x-queue-type": "stream"})(self.ch).declare()
        self.addCleanup(self._delete_queue, name)
        self.stream_publish(name, range(count))
        return name

    def stream_publish(self, name, numbers):
        conn = Connection(broker_url(), transport_options={"confirm_publish": True})
        try:
            producer = Producer(conn.channel(), serializer="json")
            # basic_publish_confirm returns only after the broker's basic.ack, so each message
            # is a chunk of its own. That matters: RabbitMQ credits stream consumers a whole
            # chunk at a time, so a prefetch is exact only with one message per chunk.
            for i in numbers:
                producer.publish(i, routing_key=name, delivery_mode=2)
        finally:
            conn.release()

    @staticmethod
    def _delete_queue(name):
        # A connection of its own: the test's connection may have been closed by the broker.
        conn = Connection(broker_url(), connect_timeout=WAIT)
        try:
            Queue(name)(conn.channel()).delete()
        finally:
            conn.release()

    def stream_consumer(self, name, offset=None, prefetch=3, ack=True):
        """A Consumer on a channel of its own, reading stream `name` from `offset` (None: no
        x-stream-offset, RabbitMQ's default "next") with basic.qos prefetch. Returns it and a
        list that fills with (payload, x-stream-offset header, message); acks each when ack."""
        arguments = {} if offset is None else {"x-stream-offset": offset}
        q = Queue(name, durable=True, queue_arguments={"x-queue-type": "stream"},
                  consumer_arguments=arguments)
        got = []

        def on_message(body, message):
            got.append((body, message.headers.get("x-stream-offset"), message))
            if ack:
                message.ack()

        consumer = Consumer(self.conn.channel(), queues=[q], callbacks=[on_message], accept=["json"])
        consumer.qos(prefetch_count=prefetch)
        consumer.consume()
        return consumer, got

    def assert_stream(self, got, numbers):
        """The deliveries are exactly the numbers `numbers`, in order, each with its offset
        (number i was published at offset i)."""
        want = list(numbers)
        self.assertEqual([body for body, _, _ in got], want)
        self.assertEqual([offset for _, offset, _ in got], want)

    def test_stream_consume_from_first(self):
        name = self.stream()
        # prefetch 3 < 10: only acks (credit) let the rest through.
        _, got = self.stream_consumer(name, "first", prefetch=3)
        self.drain(got, self.STREAM_N)
        self.drain_quietly(0.2)
        self.assert_stream(got, range(self.STREAM_N))

    def test_stream_consume_from_offset(self):
        name = self.stream()
        _, got = self.stream_consumer(name, 3)
        self.drain(got, self.STREAM_N - 3)
        self.drain_quietly(0.2)
        self.assert_stream(got, range(3, self.STREAM_N))

    def test_stream_consume_next_and_default(self):
        name = self.stream()
        _, explicit = self.stream_consumer(name, "next")
        _, default = self.stream_consumer(name)
        self.drain_quietly(0.3)
        self.assertEqual(explicit, [], "next must not replay what is already in the stream")
        self.assertEqual(default, [], "the default offset is next")
        new = range(self.STREAM_N, self.STREAM_N + 3)
        self.stream_publish(name, new)
        self.drain(explicit, 3)
        self.drain(default, 3)
        self.drain_quietly(0.2)
        self.assert_stream(explicit, new)
        self.assert_stream(default, new)

    def test_stream_consumers_replay_independently(self):
        name = self.stream()
        _, slow = self.stream_consumer(name, "first", prefetch=2, ack=False)
        _, fast = self.stream_consumer(name, "first", prefetch=3)
        self.drain(fast, self.STREAM_N)
        self.drain_quietly(0.2)
        self.assertEqual(len(slow), 2, "a consumer that does not ack stops at its prefetch")
        self.assert_stream(fast, range(self.STREAM_N))
        while len(slow) < self.STREAM_N:
            have = len(slow)
            slow[-1][2].ack(multiple=True)
            self.drain(slow, min(have + 2, self.STREAM_N))
        self.assert_stream(slow, range(self.STREAM_N))
        # Reading deletes nothing: a new consumer replays it all again.
        _, again = self.stream_consumer(name, "first")
        self.drain(again, self.STREAM_N)
        self.assert_stream(again, range(self.STREAM_N))

    def test_stream_basic_get_refused(self):
        name = self.stream(1)
        q = Queue(name, durable=True, queue_arguments={"x-queue-type": "stream"})(self.ch)
        # 540 NOT_IMPLEMENTED is a connection error: the whole connection is closed.
        with self.assertRaises(amqp.exceptions.AMQPNotImplementedError) as cm:
            q.get()
        self.assertEqual(cm.exception.reply_code, 540)
        self.assertIn("basic.get", cm.exception.reply_text)

    def test_stream_consume_without_prefetch_refused(self):
        name = self.stream(1)
        q = Queue(name, durable=True, queue_arguments={"x-queue-type": "stream"},
                  consumer_arguments={"x-stream-offset": "first"})
        consumer = Consumer(self.conn.channel(), queues=[q], accept=["json"])
        with self.assertRaises(amqp.exceptions.PreconditionFailed) as cm:
            consumer.consume()
        self.assertEqual(cm.exception.reply_code, 406)


    # quorum queues: x-queue-type quorum, durable only. RabbitMQ 3.10 puts a requeued message at
    # the tail of a quorum queue, so the requeue tests use one message each. Redeliveries carry
    # x-delivery-count; past x-delivery-limit a message is dead-lettered with reason
    # delivery_limit (limit 1: delivered twice, dead-lettered on the second return). py-amqp has
    # no basic.nack, so requeueing is Message.requeue() (basic.reject requeue=True).

    def quorum(self, **arguments):
        """Declares a durable quorum queue (deleted at cleanup) with the given x-arguments;
        returns its kombu Queue, unbound."""
        arguments["x-queue-type"] = "quorum"
        q = Queue(unique("quorum"), durable=True, queue_arguments=arguments)
        name, count, consumers = q(self.ch).queue_declare()
        self.assertEqual((name, count, consumers), (q.name, 0, 0))
        self.addCleanup(self._delete_queue, q.name)
        return q

    def quorum_publish(self, name, payloads, **kwargs):
        """Publishes persistent messages with publisher confirms (each publish waits for its
        basic.ack)."""
        conn = Connection(broker_url(), transport_options={"confirm_publish": True})
        try:
            producer = Producer(conn.channel(), serializer="json")
            for payload in payloads:
                producer.publish(payload, routing_key=name, delivery_mode=2, **kwargs)
        finally:
            conn.release()

    def quorum_consumer(self, q, prefetch):
        """A Consumer with basic.qos prefetch and manual acks on a channel of its own; returns it
        and a list that fills with the messages."""
        got = []
        consumer = Consumer(self.conn.channel(), queues=[q], accept=["json"],
                            callbacks=[lambda body, message: got.append(message)])
        consumer.qos(prefetch_count=prefetch)
        consumer.consume()
        return consumer, got

    def test_quorum_confirms_prefetch_ack(self):
        q = self.quorum()
        self.quorum_publish(q.name, range(5))
        self.assertEqual(self.ready_count(q(self.ch)), 5)
        consumer, got = self.quorum_consumer(q, 2)
        self.drain(got, 2)
        self.drain_quietly(0.3)
        self.assertEqual(len(got), 2, "prefetch 2 must stop at 2 unacked messages")
        got[1].ack(multiple=True)
        self.drain(got, 4)
        self.drain_quietly(0.3)
        self.assertEqual(len(got), 4)
        got[3].ack(multiple=True)
        self.drain(got, 5)
        got[4].ack()
        self.assertEqual([m.payload for m in got], [0, 1, 2, 3, 4])
        self.assertFalse(any(m.delivery_info["redelivered"] for m in got))
        # Closing the channel would requeue anything unacked: the acks emptied the queue.
        consumer.channel.close()
        self.assertEqual(self.ready_count(q(self.ch)), 0)

    def test_quorum_redelivery_count(self):
        q = self.quorum()
        self.quorum_publish(q.name, ["m"])
        consumer, got = self.quorum_consumer(q, 1)
        self.drain(got, 1)
        self.assertFalse(got[0].delivery_info["redelivered"])
        got[0].requeue()
        self.drain(got, 2)
        self.assertTrue(got[1].delivery_info["redelivered"])
        self.assertEqual(got[1].payload, "m")
        self.assertEqual(got[1].headers["x-delivery-count"], 1)
        got[1].requeue()
        self.drain(got, 3)
        self.assertTrue(got[2].delivery_info["redelivered"])
        self.assertEqual(got[2].headers["x-delivery-count"], 2)
        got[2].ack()
        consumer.channel.close()
        self.assertEqual(self.ready_count(q(self.ch)), 0)

    def test_quorum_delivery_limit_dead_letters(self):
        # The default exchange as DLX, with x-dead-letter-routing-key naming the DLQ.
        dlq = self.queue("dlq")
        q = self.quorum(**{"x-delivery-limit": 1, "x-dead-letter-exchange": "",
                           "x-dead-letter-routing-key": dlq.name})
        self.quorum_publish(q.name, [{"job": "poison"}], headers={"keep": "me"})
        consumer, got = self.quorum_consumer(q, 1)
        self.drain(got, 1)
        got[0].requeue()
        self.drain(got, 2)
        self.assertEqual(got[1].headers["x-delivery-count"], 1)
        got[1].requeue()
        message = self.get(dlq, no_ack=True)
        self.assertEqual(message.payload, {"job": "poison"})
        self.assertEqual(message.delivery_info["routing_key"], dlq.name)
        self.assertEqual(as_str(message.headers["keep"]), "me")
        self.assert_death(message, q.name, "delivery_limit")
        death = message.headers["x-death"][0]
        self.assertEqual(as_str(death["exchange"]), "")
        self.assertEqual([as_str(k) for k in death["routing-keys"]], [q.name])
        self.assertNotIn("x-delivery-count", message.headers)
        self.drain_quietly(0.2)
        self.assertEqual(len(got), 2, "a dead-lettered message is not delivered again")
        consumer.channel.close()
        self.assertEqual(self.ready_count(q(self.ch)), 0)

    def test_quorum_non_durable_refused(self):
        q = Queue(unique("quorum"), durable=False, queue_arguments={"x-queue-type": "quorum"})
        with self.assertRaises(amqp.exceptions.PreconditionFailed) as cm:
            q(self.ch).declare()
        self.assertEqual(cm.exception.reply_code, 406)
        self.assertTrue(cm.exception.reply_text.startswith(
            "PRECONDITION_FAILED - invalid property 'non-durable' for queue '%s'" % q.name),
            cm.exception.reply_text)
        with self.assertRaises(amqp.exceptions.NotFound):
            q(self.conn.channel()).queue_declare(passive=True)

    def test_quorum_exclusive_auto_delete_server_named_refused(self):
        name = unique("quorum")
        arguments = {"x-queue-type": "quorum"}
        # kombu makes an exclusive Queue auto-delete too, and RabbitMQ names auto-delete first.
        for kwargs in (dict(auto_delete=True), dict(exclusive=True)):
            q = Queue(name, durable=True, queue_arguments=arguments, **kwargs)
            with self.assertRaises(amqp.exceptions.PreconditionFailed) as cm:
                q(self.conn.channel()).declare()
            self.assertTrue(cm.exception.reply_text.startswith(
                "PRECONDITION_FAILED - invalid property 'auto-delete'"), cm.exception.reply_text)
        # Exclusive alone, through py-amqp's channel (whose auto_delete defaults to True).
        with self.assertRaises(amqp.exceptions.PreconditionFailed) as cm:
            self.conn.channel().queue_declare(name, durable=True, exclusive=True,
                                              auto_delete=False, arguments=arguments)
        self.assertTrue(cm.exception.reply_text.startswith(
            "PRECONDITION_FAILED - invalid property 'exclusive-owner'"), cm.exception.reply_text)
        with self.assertRaises(amqp.exceptions.PreconditionFailed) as cm:
            self.conn.channel().queue_declare("", durable=True, arguments=arguments)
        self.assertEqual(cm.exception.reply_code, 406)


if __name__ == "__main__":
    unittest.main()
