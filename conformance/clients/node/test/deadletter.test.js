'use strict';
// Dead-lettering and TTL through amqplib's assertQueue options (deadLetterExchange,
// deadLetterRoutingKey, messageTtl) and the per-message expiration property.
// Everything here passes against RabbitMQ 3.10.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const { unique, channel, get, readyCount, queue, waitUntil } = require('../support/helpers');

// A fanout DLX with a queue bound to it, and a source queue dead-lettering to it.
async function deadLetterSetup(ch, options = {}) {
  const dlx = unique('dlx');
  await ch.assertExchange(dlx, 'fanout', { autoDelete: true });
  const dlq = await queue(ch, 'dlq');
  await ch.bindQueue(dlq, dlx, '');
  const src = await queue(ch, 'src', { deadLetterExchange: dlx, ...options });
  return { src, dlq };
}

function assertDeath(msg, queueName, reason, count = 1) {
  const h = msg.properties.headers;
  const deaths = h['x-death'];
  assert.equal(deaths.length, 1, JSON.stringify(deaths));
  assert.equal(deaths[0].queue, queueName);
  assert.equal(deaths[0].reason, reason);
  assert.equal(deaths[0].count, count);
  assert.equal(deaths[0].exchange, '');
  assert.deepEqual(deaths[0]['routing-keys'], [queueName]);
  assert.equal(h['x-first-death-queue'], queueName);
  assert.equal(h['x-first-death-reason'], reason);
}

test('dead letter on reject', async (t) => {
  const { ch } = await channel(t);
  const { src, dlq } = await deadLetterSetup(ch);
  ch.sendToQueue(src, Buffer.from('bad'), { headers: { keep: 'me' } });
  ch.reject(await get(ch, src), false);
  const msg = await get(ch, dlq, { noAck: true });
  assert.equal(msg.content.toString(), 'bad');
  assert.equal(msg.fields.routingKey, src);
  assert.equal(msg.properties.headers.keep, 'me');
  assertDeath(msg, src, 'rejected');
});

test('dead letter on nack', async (t) => {
  const { ch } = await channel(t);
  const { src, dlq } = await deadLetterSetup(ch);
  ch.sendToQueue(src, Buffer.from('bad'));
  ch.nack(await get(ch, src), false, false);
  assertDeath(await get(ch, dlq, { noAck: true }), src, 'rejected');
});

test('requeue does not dead letter', async (t) => {
  const { ch } = await channel(t);
  const { src, dlq } = await deadLetterSetup(ch);
  ch.sendToQueue(src, Buffer.from('m'));
  ch.nack(await get(ch, src), false, true);
  await get(ch, src, { noAck: true });
  assert.equal(await readyCount(ch, dlq), 0);
});

test('dead letter routing key', async (t) => {
  const { ch } = await channel(t);
  const dlx = unique('dlx');
  await ch.assertExchange(dlx, 'direct', { autoDelete: true });
  const dlq = await queue(ch, 'dlq');
  await ch.bindQueue(dlq, dlx, 'dead');
  const src = await queue(ch, 'src', { deadLetterExchange: dlx, deadLetterRoutingKey: 'dead' });
  ch.sendToQueue(src, Buffer.from('m'));
  ch.reject(await get(ch, src), false);
  const msg = await get(ch, dlq, { noAck: true });
  assert.equal(msg.fields.routingKey, 'dead');
  assertDeath(msg, src, 'rejected');
});

test('dead letter count increments', async (t) => {
  // The default exchange as DLX, routing back to the same queue.
  const { ch } = await channel(t);
  const name = unique('loop');
  await ch.assertQueue(name, { exclusive: true, deadLetterExchange: '', deadLetterRoutingKey: name });
  ch.sendToQueue(name, Buffer.from('m'));
  for (let n = 1; n <= 3; n++) {
    const msg = await get(ch, name);
    if (n > 1) assertDeath(msg, name, 'rejected', n - 1);
    ch.reject(msg, false);
  }
  assertDeath(await get(ch, name, { noAck: true }), name, 'rejected', 3);
});

test('queue TTL expiry dead letters', async (t) => {
  const { ch } = await channel(t);
  const { src, dlq } = await deadLetterSetup(ch, { messageTtl: 100 });
  ch.sendToQueue(src, Buffer.from('old'));
  const msg = await get(ch, dlq, { noAck: true });
  assert.equal(msg.content.toString(), 'old');
  assertDeath(msg, src, 'expired');
});

test('per-message TTL dead letters', async (t) => {
  const { ch } = await channel(t);
  const { src, dlq } = await deadLetterSetup(ch);
  ch.sendToQueue(src, Buffer.from('short'), { expiration: '100' });
  const msg = await get(ch, dlq, { noAck: true });
  assertDeath(msg, src, 'expired');
  assert.equal(msg.properties.headers['x-death'][0]['original-expiration'], '100');
  assert.equal(msg.properties.expiration, undefined, 'expiration is removed when dead-lettered');
});

test('queue TTL without DLX drops', async (t) => {
  const { ch } = await channel(t, { confirm: true });
  const q = await queue(ch, 'ttl', { messageTtl: 50 });
  ch.sendToQueue(q, Buffer.from('gone'));
  await ch.waitForConfirms(); // the broker has enqueued it
  await waitUntil(async () => (await readyCount(ch, q)) === 0, 'the expired message to leave');
  assert.equal(await ch.get(q, { noAck: true }), false);
});
