'use strict';
// rabbitmq-stream-js-client (npm, pinned by package-lock.json) against the broker's stream port
// (WARREN_STREAM_URL, e.g. rabbitmq-stream://guest:guest@127.0.0.1:5552/%2f), with amqplib on its
// AMQP 0-9-1 port (WARREN_URL) for interop: the client's own idiom, unmodified.
const test = require('node:test');
const assert = require('node:assert/strict');
const amqp = require('amqplib');
const rabbit = require('rabbitmq-stream-js-client');
const { URL: AMQP_URL, WAIT, unique, waitUntil } = require('../support/helpers');

const STREAM_URL = new globalThis.URL(process.env.WARREN_STREAM_URL || 'rabbitmq-stream://guest:guest@127.0.0.1:5552/%2f');
const N = 300;

// connect opens a stream client for one test and closes it with the test.
async function connect(t) {
  const client = await rabbit.connect({
    hostname: STREAM_URL.hostname,
    port: Number(STREAM_URL.port || 5552),
    username: decodeURIComponent(STREAM_URL.username),
    password: decodeURIComponent(STREAM_URL.password),
    vhost: decodeURIComponent(STREAM_URL.pathname.slice(1)) || '/',
    heartbeat: 0,
  });
  t.after(() => client.close().catch(() => {}));
  return client;
}

// stream creates a stream deleted after the test (by a client that outlives the test's own).
async function stream(t, client) {
  const name = unique('stream-js');
  await client.createStream({ stream: name, arguments: {} });
  t.after(async () => {
    const c = await rabbit.connect({
      hostname: STREAM_URL.hostname,
      port: Number(STREAM_URL.port || 5552),
      username: decodeURIComponent(STREAM_URL.username),
      password: decodeURIComponent(STREAM_URL.password),
      vhost: decodeURIComponent(STREAM_URL.pathname.slice(1)) || '/',
    });
    await c.deleteStream({ stream: name }).catch(() => {});
    await c.close().catch(() => {});
  });
  return name;
}

// publishConfirmed sends N messages "m<i>" with properties and application properties through
// one publisher and waits for every publishing id to be confirmed.
async function publishConfirmed(client, name, n = N) {
  const publisher = await client.declarePublisher({ stream: name });
  const confirmed = new Set();
  const errors = [];
  publisher.on('publish_confirm', (err, ids) => {
    if (err) errors.push(err);
    else for (const id of ids) confirmed.add(id);
  });
  const ids = [];
  for (let i = 0; i < n; i++) {
    const res = await publisher.send(Buffer.from(`m${i}`), {
      messageProperties: { messageId: `id-${i}`, contentType: 'text/plain', correlationId: `corr-${i}` },
      applicationProperties: { colour: i % 2 ? 'odd' : 'even', seq: i + 1 },
    });
    ids.push(res.publishingId);
  }
  await publisher.flush();
  await waitUntil(() => errors.length > 0 || ids.every((id) => confirmed.has(id)), `${n} publish confirms`);
  assert.deepEqual(errors, [], 'publish errors');
  await publisher.close();
  return ids;
}

test('metadata names the broker the client connected to', async (t) => {
  const client = await connect(t);
  const name = await stream(t, client);
  const [md] = await client.queryMetadata({ streams: [name] });
  assert.equal(md.streamName, name);
  assert.equal(md.responseCode, 1);
  assert.ok(md.leader, 'a leader');
  assert.equal(md.leader.port, Number(STREAM_URL.port || 5552));
  const [missing] = await client.queryMetadata({ streams: [unique('missing')] });
  assert.equal(missing.responseCode, 2, 'stream_does_not_exist');
});

test('publish with confirms over the stream protocol, consume over AMQP 0-9-1', async (t) => {
  const client = await connect(t);
  const name = await stream(t, client);
  const ids = await publishConfirmed(client, name);
  assert.equal(new Set(ids).size, N, 'distinct publishing ids');

  const conn = await amqp.connect(AMQP_URL);
  t.after(() => conn.close().catch(() => {}));
  const ch = await conn.createChannel();
  await ch.prefetch(100);
  const got = [];
  let cancelled = false;
  await ch.consume(name, (msg) => {
    if (msg === null) {
      cancelled = true; // basic.cancel from the broker
      return;
    }
    got.push(msg);
    ch.ack(msg);
  }, { arguments: { 'x-stream-offset': 'first' } });
  await waitUntil(() => cancelled || got.length >= N, `${N} deliveries over AMQP 0-9-1`, 4 * WAIT);
  assert.equal(cancelled, false, 'the broker cancelled the AMQP 0-9-1 consumer');
  for (let i = 0; i < N; i++) {
    const m = got[i];
    assert.equal(m.content.toString(), `m${i}`);
    assert.equal(m.properties.messageId, `id-${i}`);
    assert.equal(m.properties.correlationId, `corr-${i}`);
    assert.equal(m.properties.contentType, 'text/plain');
    assert.equal(m.properties.headers.colour, i % 2 ? 'odd' : 'even');
    assert.equal(Number(m.properties.headers.seq), i + 1);
    assert.equal(Number(m.properties.headers['x-stream-offset']), i);
  }
});

test('subscribe from offset first: stream-protocol and AMQP 0-9-1 publishes', async (t) => {
  const client = await connect(t);
  const name = await stream(t, client);
  await publishConfirmed(client, name);
  // Five more through AMQP 0-9-1 with headers: the client reads them as application properties.
  // The number is sent as a 32-bit int: amqplib would send a small one as a byte, which the broker
  // stores as an AMQP 1.0 byte (as RabbitMQ 4.x does), a type this client's decoder rejects.
  const conn = await amqp.connect(AMQP_URL);
  t.after(() => conn.close().catch(() => {}));
  const ch = await conn.createConfirmChannel();
  for (let i = 0; i < 5; i++) {
    ch.publish('', name, Buffer.from(`a${i}`), { headers: { origin: 'amqp091', n: { '!': 'int', value: i + 1 } }, messageId: `amqp-${i}` });
  }
  await ch.waitForConfirms();

  const got = [];
  const consumer = await client.declareConsumer({ stream: name, offset: rabbit.Offset.first() }, (msg) => {
    got.push(msg);
  });
  t.after(() => consumer.close().catch(() => {}));
  await waitUntil(() => got.length >= N + 5, `${N + 5} deliveries to the JS consumer`, 4 * WAIT);
  assert.equal(got.length, N + 5, 'no extra deliveries');
  for (let i = 0; i < N; i++) {
    const m = got[i];
    assert.equal(m.content.toString(), `m${i}`);
    assert.equal(m.offset, BigInt(i));
    assert.equal(m.messageProperties.messageId, `id-${i}`);
    assert.equal(m.messageProperties.contentType, 'text/plain');
    assert.deepEqual({ ...m.applicationProperties }, { colour: i % 2 ? 'odd' : 'even', seq: i + 1 });
  }
  for (let i = 0; i < 5; i++) {
    const m = got[N + i];
    assert.equal(m.content.toString(), `a${i}`);
    assert.equal(m.offset, BigInt(N + i));
    assert.equal(m.messageProperties.messageId, `amqp-${i}`);
    assert.equal(m.applicationProperties.origin, 'amqp091');
    assert.equal(Number(m.applicationProperties.n), i + 1);
  }
});

test('store and query a consumer offset', async (t) => {
  const client = await connect(t);
  const name = await stream(t, client);
  await publishConfirmed(client, name);
  const ref = unique('ref');
  await assert.rejects(client.queryOffset({ reference: ref, stream: name }), 'no offset stored yet');

  const got = [];
  const consumer = await client.declareConsumer({ stream: name, offset: rabbit.Offset.first(), consumerRef: ref }, (msg) => {
    got.push(msg);
  });
  await waitUntil(() => got.length >= N, `${N} deliveries`, 4 * WAIT);
  await consumer.storeOffset(149n);
  // store_offset has no response: poll the query.
  await waitUntil(async () => (await consumer.queryOffset().catch(() => -1n)) === 149n, 'the stored offset');
  assert.equal(await client.queryOffset({ reference: ref, stream: name }), 149n);
  await consumer.close();

  // A consumer resuming after the stored offset gets the rest, from 150.
  const stored = await client.queryOffset({ reference: ref, stream: name });
  const rest = [];
  const resumed = await client.declareConsumer({ stream: name, offset: rabbit.Offset.offset(stored + 1n), consumerRef: ref }, (msg) => {
    rest.push(msg);
  });
  t.after(() => resumed.close().catch(() => {}));
  await waitUntil(() => rest.length >= N - 150, `${N - 150} deliveries after the stored offset`);
  assert.equal(rest[0].offset, 150n);
  assert.equal(rest[0].content.toString(), 'm150');
  assert.equal(rest[rest.length - 1].offset, BigInt(N - 1));
});
