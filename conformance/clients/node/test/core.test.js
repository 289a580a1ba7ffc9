'use strict';
// Black-box conformance tests for amqplib's promise API against WARREN_URL: connect, declare,
// bind, publish, consume, ack/nack/reject, prefetch, confirms, mandatory returns.
// Everything here passes against RabbitMQ 3.10.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const amqp = require('amqplib');
const { URL, unique, sleep, waitUntil, connect, channel, get, readyCount, queue } = require('../support/helpers');

// connect

test('connect', async (t) => {
  const conn = await connect(t);
  assert.ok(conn.connection.serverProperties, 'server properties');
  const a = await conn.createChannel();
  const b = await conn.createChannel();
  assert.notEqual(a.ch, b.ch);
  await b.close();
  await a.assertQueue('', { exclusive: true }); // a still works
});

test('connect bad credentials', async () => {
  const url = URL.replace(/(\/\/[^:/@]+:)[^@]*@/, '$1wrong@');
  await assert.rejects(amqp.connect(url), /ACCESS_REFUSED|403|closed|Handshake terminated/);
});

// declare

test('declare exchanges', async (t) => {
  const { ch } = await channel(t);
  for (const kind of ['direct', 'fanout', 'topic', 'headers']) {
    const name = unique(kind);
    const ok = await ch.assertExchange(name, kind, { durable: false });
    assert.equal(ok.exchange, name);
    await ch.checkExchange(name);
    await ch.deleteExchange(name);
  }
});

test('declare queue', async (t) => {
  const { ch } = await channel(t);
  const name = unique('q');
  const ok = await ch.assertQueue(name, { exclusive: true });
  assert.deepEqual(ok, { queue: name, messageCount: 0, consumerCount: 0 });
  ch.sendToQueue(name, Buffer.from('1'));
  ch.sendToQueue(name, Buffer.from('2'));
  await waitUntil(async () => (await readyCount(ch, name)) === 2, 'messageCount 2');
});

test('declare server-named queue', async (t) => {
  const { ch } = await channel(t);
  const ok = await ch.assertQueue('', { exclusive: true });
  assert.match(ok.queue, /^amq\.gen-/);
});

test('check missing queue closes the channel with 404', async (t) => {
  const { conn, ch } = await channel(t);
  await assert.rejects(ch.checkQueue(unique('missing')), (err) => err.code === 404);
  // The connection survives.
  const other = await conn.createChannel();
  await other.assertQueue('', { exclusive: true });
});

test('redeclare with other arguments fails with 406', async (t) => {
  const { ch } = await channel(t);
  const name = unique('q');
  await ch.assertQueue(name, { exclusive: true, maxLength: 10 });
  await assert.rejects(ch.assertQueue(name, { exclusive: true, maxLength: 20 }), (err) => err.code === 406);
});

// bind and route

test('bind topic', async (t) => {
  const { ch } = await channel(t);
  const x = unique('topic');
  await ch.assertExchange(x, 'topic', { autoDelete: true });
  const q = await queue(ch);
  await ch.bindQueue(q, x, 'stock.*.nyse');
  await ch.bindQueue(q, x, 'audit.#');
  for (const key of ['stock.ibm.nyse', 'stock.ibm.lse', 'audit', 'audit.a.b', 'other']) {
    ch.publish(x, key, Buffer.from(key));
  }
  const got = [];
  while (got.length < 3) got.push((await get(ch, q, { noAck: true })).fields.routingKey);
  assert.deepEqual(got, ['stock.ibm.nyse', 'audit', 'audit.a.b']);
  assert.equal(await ch.get(q, { noAck: true }), false);
});

test('bind fanout and unbind', async (t) => {
  const { ch } = await channel(t);
  const x = unique('fanout');
  await ch.assertExchange(x, 'fanout', { autoDelete: true });
  const q1 = await queue(ch);
  const q2 = await queue(ch);
  await ch.bindQueue(q1, x, '');
  await ch.bindQueue(q2, x, '');
  ch.publish(x, '', Buffer.from('both'));
  assert.equal((await get(ch, q1, { noAck: true })).content.toString(), 'both');
  assert.equal((await get(ch, q2, { noAck: true })).content.toString(), 'both');
  await ch.unbindQueue(q2, x, '');
  ch.publish(x, '', Buffer.from('only-q1'));
  assert.equal((await get(ch, q1, { noAck: true })).content.toString(), 'only-q1');
  assert.equal(await readyCount(ch, q2), 0);
});

test('exchange to exchange binding', async (t) => {
  const { ch } = await channel(t);
  const src = unique('src');
  const dst = unique('dst');
  await ch.assertExchange(src, 'direct', { autoDelete: true });
  await ch.assertExchange(dst, 'fanout', { autoDelete: true });
  await ch.bindExchange(dst, src, 'k');
  const q = await queue(ch);
  await ch.bindQueue(q, dst, '');
  ch.publish(src, 'k', Buffer.from('via-e2e'));
  assert.equal((await get(ch, q, { noAck: true })).content.toString(), 'via-e2e');
});

// publish and consume

test('publish and consume with properties', async (t) => {
  const { ch } = await channel(t);
  const q = await queue(ch);
  const props = {
    contentType: 'application/json', contentEncoding: 'utf-8', persistent: true, priority: 3,
    correlationId: 'corr-1', replyTo: 'replies', messageId: 'm-1', timestamp: 1700000000,
    type: 'greeting', appId: 'conformance',
    headers: { str: 'v', int: 42, bool: true, nested: { k: 'v' }, list: [1, 'two'] },
  };
  ch.sendToQueue(q, Buffer.from('{"hello":"world"}'), props);
  const msg = await new Promise((resolve) => ch.consume(q, resolve, { noAck: true }));
  assert.equal(msg.content.toString(), '{"hello":"world"}');
  assert.equal(msg.fields.routingKey, q);
  assert.equal(msg.fields.exchange, '');
  assert.equal(msg.fields.redelivered, false);
  const p = msg.properties;
  assert.equal(p.contentType, 'application/json');
  assert.equal(p.contentEncoding, 'utf-8');
  assert.equal(p.deliveryMode, 2);
  assert.equal(p.priority, 3);
  assert.equal(p.correlationId, 'corr-1');
  assert.equal(p.replyTo, 'replies');
  assert.equal(p.messageId, 'm-1');
  assert.equal(p.timestamp, 1700000000);
  assert.equal(p.type, 'greeting');
  assert.equal(p.appId, 'conformance');
  assert.deepEqual(p.headers, props.headers);
});

test('consume in order', async (t) => {
  const { ch } = await channel(t);
  const q = await queue(ch);
  for (let i = 0; i < 200; i++) ch.sendToQueue(q, Buffer.from(String(i)));
  const bodies = [];
  await ch.consume(q, (msg) => bodies.push(msg.content.toString()), { noAck: true });
  await waitUntil(() => bodies.length === 200, '200 deliveries');
  assert.deepEqual(bodies, Array.from({ length: 200 }, (_, i) => String(i)));
});

test('large message', async (t) => {
  const { ch } = await channel(t);
  const q = await queue(ch);
  const body = Buffer.alloc(1 << 20);
  for (let i = 0; i < body.length; i++) body[i] = i % 251;
  ch.sendToQueue(q, body);
  assert.ok((await get(ch, q, { noAck: true })).content.equals(body));
});

test('cancel consumer', async (t) => {
  const { ch } = await channel(t);
  const q = await queue(ch);
  const got = [];
  const { consumerTag } = await ch.consume(q, (msg) => got.push(msg.content.toString()), { noAck: true });
  ch.sendToQueue(q, Buffer.from('first'));
  await waitUntil(() => got.length === 1, 'first delivery');
  await ch.cancel(consumerTag);
  ch.sendToQueue(q, Buffer.from('second'));
  await waitUntil(async () => (await readyCount(ch, q)) === 1, 'second message left in queue');
  assert.deepEqual(got, ['first']);
});

test('consumer cancel notification when queue is deleted', async (t) => {
  const { conn, ch } = await channel(t);
  const q = await queue(ch);
  const got = [];
  await ch.consume(q, (msg) => got.push(msg));
  const other = await conn.createChannel();
  await other.deleteQueue(q);
  // amqplib calls the consumer with null on basic.cancel from the broker.
  await waitUntil(() => got.length === 1, 'the cancel notification');
  assert.equal(got[0], null);
});

// ack, nack, reject

test('ack', async (t) => {
  const { conn, ch } = await channel(t);
  const q = await queue(ch);
  ch.sendToQueue(q, Buffer.from('m'));
  ch.ack(await get(ch, q));
  await ch.close(); // would requeue an unacked message
  const other = await conn.createChannel();
  assert.equal(await readyCount(other, q), 0);
});

test('unacked messages are requeued when the channel closes', async (t) => {
  const { conn, ch } = await channel(t);
  const q = await queue(ch);
  ch.sendToQueue(q, Buffer.from('m'));
  const other = await conn.createChannel();
  const msg = await get(other, q);
  assert.equal(msg.fields.redelivered, false);
  await other.close();
  const again = await get(ch, q, { noAck: true });
  assert.equal(again.fields.redelivered, true);
  assert.equal(again.content.toString(), 'm');
});

test('ack allUpTo', async (t) => {
  const { conn, ch } = await channel(t);
  const q = await queue(ch);
  for (let i = 0; i < 5; i++) ch.sendToQueue(q, Buffer.from(String(i)));
  const msgs = [];
  for (let i = 0; i < 5; i++) msgs.push(await get(ch, q));
  ch.ack(msgs[3], true);
  await ch.close();
  const other = await conn.createChannel();
  const back = await get(other, q, { noAck: true });
  assert.equal(back.content.toString(), '4');
  assert.equal(back.fields.redelivered, true);
  assert.equal(await readyCount(other, q), 0);
});

test('nack requeue', async (t) => {
  const { ch } = await channel(t);
  const q = await queue(ch);
  ch.sendToQueue(q, Buffer.from('m'));
  const first = await get(ch, q);
  assert.equal(first.fields.redelivered, false);
  ch.nack(first, false, true);
  const second = await get(ch, q);
  assert.equal(second.fields.redelivered, true);
  ch.ack(second);
});

test('nack no requeue', async (t) => {
  const { ch } = await channel(t);
  const q = await queue(ch);
  ch.sendToQueue(q, Buffer.from('m'));
  ch.nack(await get(ch, q), false, false);
  assert.equal(await readyCount(ch, q), 0);
});

test('nack allUpTo requeue', async (t) => {
  const { ch } = await channel(t);
  const q = await queue(ch);
  for (let i = 0; i < 3; i++) ch.sendToQueue(q, Buffer.from(String(i)));
  const msgs = [];
  for (let i = 0; i < 3; i++) msgs.push(await get(ch, q));
  ch.nack(msgs[2], true, true);
  const bodies = [];
  for (let i = 0; i < 3; i++) bodies.push((await get(ch, q, { noAck: true })).content.toString());
  assert.deepEqual(bodies, ['0', '1', '2']);
});

test('reject requeue', async (t) => {
  const { ch } = await channel(t);
  const q = await queue(ch);
  ch.sendToQueue(q, Buffer.from('m'));
  ch.reject(await get(ch, q), true);
  const again = await get(ch, q, { noAck: true });
  assert.equal(again.fields.redelivered, true);
});

test('reject no requeue', async (t) => {
  const { ch } = await channel(t);
  const q = await queue(ch);
  ch.sendToQueue(q, Buffer.from('m'));
  ch.reject(await get(ch, q), false);
  assert.equal(await readyCount(ch, q), 0);
});

test('ack of an unknown delivery tag closes the channel with 406', async (t) => {
  const { ch } = await channel(t);
  const q = await queue(ch);
  const closed = new Promise((resolve) => ch.once('error', resolve));
  ch.sendToQueue(q, Buffer.from('m'));
  const msg = await get(ch, q);
  ch.ack({ fields: { deliveryTag: msg.fields.deliveryTag + 100 } });
  const err = await closed;
  assert.equal(err.code, 406);
});

// prefetch

test('prefetch', async (t) => {
  const { ch } = await channel(t);
  const q = await queue(ch);
  for (let i = 0; i < 5; i++) ch.sendToQueue(q, Buffer.from(String(i)));
  await ch.prefetch(2);
  const got = [];
  await ch.consume(q, (msg) => got.push(msg));
  await waitUntil(() => got.length === 2, 'two deliveries');
  await sleep(300);
  assert.equal(got.length, 2, 'prefetch 2 must stop at 2 unacked deliveries');
  assert.equal(await readyCount(ch, q), 3);
  ch.ack(got[0]);
  await waitUntil(() => got.length === 3, 'a third delivery');
  await sleep(300);
  assert.equal(got.length, 3);
  ch.ack(got[2], true);
  await waitUntil(() => got.length === 5, 'all five');
  assert.deepEqual(got.map((m) => m.content.toString()), ['0', '1', '2', '3', '4']);
});

// publisher confirms

test('confirms', async (t) => {
  const { ch } = await channel(t, { confirm: true });
  const q = await queue(ch);
  const acks = [];
  for (let i = 0; i < 50; i++) {
    ch.sendToQueue(q, Buffer.from(String(i)), { persistent: true }, (err) => acks.push(err));
  }
  await ch.waitForConfirms();
  assert.equal(acks.length, 50);
  assert.ok(acks.every((err) => err === null || err === undefined));
  assert.equal(await readyCount(ch, q), 50);
});

test('confirms for unroutable messages', async (t) => {
  const { ch } = await channel(t, { confirm: true });
  const returned = [];
  ch.on('return', (msg) => returned.push(msg));
  const nowhere = unique('nowhere');
  const confirmed = new Promise((resolve, reject) => {
    ch.publish('', nowhere, Buffer.from('lost'), { mandatory: true }, (err) => (err ? reject(err) : resolve()));
  });
  await confirmed;
  // basic.return is sent before basic.ack.
  assert.equal(returned.length, 1);
  assert.equal(returned[0].fields.routingKey, nowhere);
});

test('closing a confirm channel with confirms pending', async (t) => {
  // No frame may follow channel.close-ok on that channel: amqplib treats a basic.ack for a
  // closed channel as a connection error ("Frame on unknown channel").
  const conn = await connect(t);
  const errors = [];
  conn.on('error', (err) => errors.push(err));
  for (let round = 0; round < 5; round++) {
    const ch = await conn.createConfirmChannel();
    for (let i = 0; i < 1000; i++) ch.publish('', '', Buffer.from('x'));
    await ch.close();
  }
  const ch = await conn.createChannel(); // the connection must still work
  await ch.assertQueue('', { exclusive: true });
  assert.deepEqual(errors, []);
});

// mandatory returns

test('mandatory return', async (t) => {
  const { ch } = await channel(t);
  const returned = [];
  ch.on('return', (msg) => returned.push(msg));
  const x = unique('direct');
  await ch.assertExchange(x, 'direct', { autoDelete: true });
  const q = await queue(ch);
  await ch.bindQueue(q, x, 'bound');
  ch.publish(x, 'unbound', Buffer.from('back'), { mandatory: true, messageId: 'r-1' });
  ch.publish(x, 'bound', Buffer.from('routed'), { mandatory: true });
  await waitUntil(() => returned.length === 1, 'basic.return');
  const { fields, properties, content } = returned[0];
  assert.equal(fields.replyCode, 312);
  assert.equal(fields.replyText, 'NO_ROUTE');
  assert.equal(fields.exchange, x);
  assert.equal(fields.routingKey, 'unbound');
  assert.equal(properties.messageId, 'r-1');
  assert.equal(content.toString(), 'back');
  assert.equal((await get(ch, q, { noAck: true })).content.toString(), 'routed');
  await sleep(200);
  assert.equal(returned.length, 1, 'a routed mandatory message must not come back');
});

test('publish to a missing exchange closes the channel with 404', async (t) => {
  const { ch } = await channel(t);
  const closed = new Promise((resolve) => ch.once('error', resolve));
  ch.publish(unique('missing'), 'k', Buffer.from('m'));
  const err = await closed;
  assert.equal(err.code, 404);
});
