'use strict';
// Quorum queues through amqplib: assertQueue with x-queue-type quorum (durable only), confirm
// channels, ch.prefetch, nack/reject with requeue (x-delivery-count on redeliveries) and
// x-delivery-limit dead-lettering with reason delivery_limit. RabbitMQ 3.10 puts a requeued
// message at the tail of a quorum queue, so the requeue tests use one message each.
// Everything here passes against RabbitMQ 3.10.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const amqp = require('amqplib');
const { URL, unique, sleep, waitUntil, connect, channel, get, readyCount, queue } = require('../support/helpers');

// Declares a durable quorum queue (deleted when the test ends, over a connection of its own)
// with the given extra arguments. Returns the connection and the name.
async function quorum(t, args = {}) {
  const conn = await connect(t);
  const name = unique('quorum');
  t.after(async () => {
    const c = await amqp.connect(URL);
    try {
      await (await c.createChannel()).deleteQueue(name);
    } finally {
      await c.close();
    }
  });
  const ch = await conn.createChannel();
  const ok = await ch.assertQueue(name, { durable: true, arguments: { 'x-queue-type': 'quorum', ...args } });
  assert.deepEqual(ok, { queue: name, messageCount: 0, consumerCount: 0 });
  await ch.close();
  return { conn, name };
}

// Publishes persistent messages with the given bodies on a confirm channel and waits for
// every confirm.
async function publish(conn, name, bodies, options = {}) {
  const ch = await conn.createConfirmChannel();
  for (const body of bodies) ch.sendToQueue(name, Buffer.from(body), { persistent: true, ...options });
  await ch.waitForConfirms();
  await ch.close();
}

// Consumes the queue with manual acks and prefetch on a channel of its own. Returns the
// channel and an array that fills with the deliveries.
async function consume(conn, name, prefetch) {
  const ch = await conn.createChannel();
  await ch.prefetch(prefetch);
  const got = [];
  await ch.consume(name, (msg) => got.push(msg), { noAck: false });
  return { ch, got };
}

test('quorum confirms, prefetch and ack', async (t) => {
  const { conn, name } = await quorum(t);
  await publish(conn, name, ['0', '1', '2', '3', '4']);
  const check = await conn.createChannel();
  assert.equal(await readyCount(check, name), 5);
  const { ch, got } = await consume(conn, name, 2);
  await waitUntil(() => got.length === 2, '2 deliveries');
  await sleep(300);
  assert.equal(got.length, 2, 'prefetch 2 must stop at 2 unacked deliveries');
  ch.ack(got[1], true);
  await waitUntil(() => got.length === 4, '4 deliveries');
  await sleep(300);
  assert.equal(got.length, 4);
  ch.ack(got[3], true);
  await waitUntil(() => got.length === 5, '5 deliveries');
  ch.ack(got[4]);
  assert.deepEqual(got.map((m) => m.content.toString()), ['0', '1', '2', '3', '4']);
  assert.ok(got.every((m) => !m.fields.redelivered));
  // Closing the channel would requeue anything unacked: the acks emptied the queue.
  await ch.close();
  assert.equal(await readyCount(check, name), 0);
});

test('quorum redelivery carries x-delivery-count', async (t) => {
  const { conn, name } = await quorum(t);
  await publish(conn, name, ['m']);
  const { ch, got } = await consume(conn, name, 1);
  await waitUntil(() => got.length === 1, 'the delivery');
  assert.equal(got[0].fields.redelivered, false);
  ch.nack(got[0], false, true);
  await waitUntil(() => got.length === 2, 'the redelivery after nack');
  assert.equal(got[1].fields.redelivered, true);
  assert.equal(got[1].content.toString(), 'm');
  assert.equal(got[1].properties.headers['x-delivery-count'], 1);
  ch.reject(got[1], true);
  await waitUntil(() => got.length === 3, 'the redelivery after reject');
  assert.equal(got[2].fields.redelivered, true);
  assert.equal(got[2].properties.headers['x-delivery-count'], 2);
  ch.ack(got[2]);
  await ch.close();
  const check = await conn.createChannel();
  assert.equal(await readyCount(check, name), 0);
});

test('quorum delivery limit dead letters', async (t) => {
  const { ch: setup } = await channel(t);
  const dlx = unique('dlx');
  await setup.assertExchange(dlx, 'fanout', { autoDelete: true });
  const dlq = await queue(setup, 'dlq');
  await setup.bindQueue(dlq, dlx, '');
  const { conn, name } = await quorum(t, { 'x-delivery-limit': 1, 'x-dead-letter-exchange': dlx });
  await publish(conn, name, ['poison'], { headers: { keep: 'me' } });
  const { ch, got } = await consume(conn, name, 1);
  await waitUntil(() => got.length === 1, 'the delivery');
  ch.nack(got[0], false, true);
  await waitUntil(() => got.length === 2, 'the redelivery');
  assert.equal(got[1].properties.headers['x-delivery-count'], 1);
  // Limit 1: the second return goes over it, and the message is dead-lettered.
  ch.nack(got[1], false, true);
  const msg = await get(setup, dlq, { noAck: true });
  assert.equal(msg.content.toString(), 'poison');
  assert.equal(msg.fields.routingKey, name);
  const h = msg.properties.headers;
  assert.equal(h.keep, 'me');
  assert.equal(h['x-death'].length, 1, JSON.stringify(h['x-death']));
  const death = h['x-death'][0];
  assert.equal(death.queue, name);
  assert.equal(death.reason, 'delivery_limit');
  assert.equal(death.count, 1);
  assert.equal(death.exchange, '');
  assert.deepEqual(death['routing-keys'], [name]);
  assert.equal(h['x-first-death-queue'], name);
  assert.equal(h['x-first-death-reason'], 'delivery_limit');
  assert.equal(h['x-delivery-count'], undefined);
  await sleep(200);
  assert.equal(got.length, 2, 'a dead-lettered message is not delivered again');
  await ch.close();
  assert.equal(await readyCount(setup, name), 0);
});

test('quorum non-durable declare fails with 406', async (t) => {
  const { conn, ch } = await channel(t);
  const name = unique('quorum');
  let closed;
  await assert.rejects(
    ch.assertQueue(name, { durable: false, arguments: { 'x-queue-type': 'quorum' } }),
    (err) => {
      closed = err;
      return err.code === 406;
    },
  );
  assert.ok(
    closed.message.includes(`PRECONDITION_FAILED - invalid property 'non-durable' for queue '${name}'`),
    closed.message,
  );
  const other = await conn.createChannel();
  other.on('error', () => {});
  await assert.rejects(other.checkQueue(name), (err) => err.code === 404);
});

test('quorum exclusive, auto-delete and server-named declares fail with 406', async (t) => {
  const conn = await connect(t);
  const name = unique('quorum');
  const cases = [
    [name, { exclusive: true }, `PRECONDITION_FAILED - invalid property 'exclusive-owner' for queue '${name}'`],
    [name, { autoDelete: true }, `PRECONDITION_FAILED - invalid property 'auto-delete' for queue '${name}'`],
    ['', {}, 'PRECONDITION_FAILED'],
  ];
  for (const [queueName, options, text] of cases) {
    const ch = await conn.createChannel();
    ch.on('error', () => {});
    await assert.rejects(
      ch.assertQueue(queueName, { durable: true, ...options, arguments: { 'x-queue-type': 'quorum' } }),
      (err) => err.code === 406 && err.message.includes(text),
    );
  }
});
