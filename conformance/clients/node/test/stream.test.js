'use strict';
// Stream queues through amqplib: assertQueue with x-queue-type stream (durable), consumers with
// ch.prefetch, manual acks and the x-stream-offset consumer argument; every delivery carries its
// offset in the x-stream-offset header. Everything here passes against RabbitMQ 3.10.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const amqp = require('amqplib');
const { URL, unique, sleep, waitUntil, connect } = require('../support/helpers');

const N = 10;
const STREAM = { durable: true, arguments: { 'x-queue-type': 'stream' } };

// Publishes the numbers in `numbers` as message bodies on a confirm channel, each after the
// previous one was confirmed. RabbitMQ writes a stream in chunks and credits its consumers a
// whole chunk at a time, so a prefetch is exact only when each message is a chunk of its own.
async function publish(conn, queue, numbers) {
  const ch = await conn.createConfirmChannel();
  for (const i of numbers) {
    await new Promise((resolve, reject) => {
      ch.sendToQueue(queue, Buffer.from(String(i)), { persistent: true }, (err) => (err ? reject(err) : resolve()));
    });
  }
  await ch.close();
}

// Declares a durable stream (deleted when the test ends, over a connection of its own) and
// publishes count messages "0", "1", ... with confirms. Returns the connection and the name.
async function stream(t, count = N) {
  const conn = await connect(t);
  const name = unique('stream');
  t.after(async () => {
    const c = await amqp.connect(URL);
    try {
      await (await c.createChannel()).deleteQueue(name);
    } finally {
      await c.close();
    }
  });
  const ch = await conn.createChannel();
  const ok = await ch.assertQueue(name, STREAM);
  assert.equal(ok.queue, name);
  await ch.close();
  await publish(conn, name, Array.from({ length: count }, (_, i) => i));
  return { conn, name };
}

// Consumes the stream on a channel of its own with prefetch; `offset` undefined sends no
// x-stream-offset (RabbitMQ's default is "next"). Returns the channel and an array that fills
// with { body, offset, msg }; acks each delivery when ack is set.
async function consume(conn, queue, { offset, prefetch = 3, ack = true } = {}) {
  const ch = await conn.createChannel();
  await ch.prefetch(prefetch);
  const got = [];
  const args = offset === undefined ? {} : { 'x-stream-offset': offset };
  await ch.consume(queue, (msg) => {
    got.push({ body: msg.content.toString(), offset: msg.properties.headers['x-stream-offset'], msg });
    if (ack) ch.ack(msg);
  }, { noAck: false, arguments: args });
  return { ch, got };
}

// The deliveries are exactly the messages numbered `from` .. `to`-1, in order, each with its
// offset (message i was published at offset i).
function assertStream(got, from, to) {
  const want = Array.from({ length: to - from }, (_, i) => from + i);
  assert.deepEqual(got.map((d) => d.body), want.map(String));
  assert.deepEqual(got.map((d) => d.offset), want);
}

test('stream consume from first', async (t) => {
  const { conn, name } = await stream(t);
  // prefetch 3 < 10: only acks (credit) let the rest through.
  const { got } = await consume(conn, name, { offset: 'first', prefetch: 3 });
  await waitUntil(() => got.length === N, `${N} deliveries`);
  await sleep(200);
  assertStream(got, 0, N);
});

test('stream consume from a numeric offset', async (t) => {
  const { conn, name } = await stream(t);
  const { got } = await consume(conn, name, { offset: 3 });
  await waitUntil(() => got.length === N - 3, `${N - 3} deliveries`);
  await sleep(200);
  assertStream(got, 3, N);
});

test('stream consume from next and by default', async (t) => {
  const { conn, name } = await stream(t);
  const explicit = (await consume(conn, name, { offset: 'next' })).got;
  const byDefault = (await consume(conn, name)).got;
  await sleep(300);
  assert.deepEqual(explicit, [], 'next must not replay what is already in the stream');
  assert.deepEqual(byDefault, [], 'the default offset is next');
  await publish(conn, name, [N, N + 1, N + 2]);
  await waitUntil(() => explicit.length === 3 && byDefault.length === 3, 'the 3 new messages on both');
  await sleep(200);
  assertStream(explicit, N, N + 3);
  assertStream(byDefault, N, N + 3);
});

test('stream consumers replay independently', async (t) => {
  const { conn, name } = await stream(t);
  const slow = await consume(conn, name, { offset: 'first', prefetch: 2, ack: false });
  const fast = await consume(conn, name, { offset: 'first', prefetch: 3 });
  await waitUntil(() => fast.got.length === N, `${N} deliveries to the fast consumer`);
  await sleep(200);
  assert.equal(slow.got.length, 2, 'a consumer that does not ack stops at its prefetch');
  assertStream(fast.got, 0, N);
  while (slow.got.length < N) {
    const have = slow.got.length;
    slow.ch.ack(slow.got[have - 1].msg, true);
    await waitUntil(() => slow.got.length === Math.min(have + 2, N), 'more deliveries after an ack');
  }
  assertStream(slow.got, 0, N);
  // Reading deletes nothing: a new consumer replays it all again.
  const again = await consume(conn, name, { offset: 'first' });
  await waitUntil(() => again.got.length === N, `${N} deliveries on replay`);
  assertStream(again.got, 0, N);
});

test('stream basic.get closes the connection with 540', async (t) => {
  const { conn, name } = await stream(t, 1);
  const closed = new Promise((resolve) => conn.once('error', resolve));
  const ch = await conn.createChannel();
  ch.on('error', () => {});
  await assert.rejects(ch.get(name, { noAck: false }));
  const err = await closed;
  assert.equal(err.code, 540);
  assert.match(err.message, /NOT.IMPLEMENTED/);
});

test('stream consume without prefetch fails with 406', async (t) => {
  const { conn, name } = await stream(t, 1);
  const ch = await conn.createChannel();
  ch.on('error', () => {});
  await assert.rejects(
    ch.consume(name, () => {}, { noAck: false, arguments: { 'x-stream-offset': 'first' } }),
    (err) => err.code === 406,
  );
});
