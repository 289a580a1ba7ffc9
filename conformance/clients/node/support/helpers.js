'use strict';
// Helpers shared by the amqplib conformance tests. The broker comes from WARREN_URL.
const crypto = require('node:crypto');
const amqp = require('amqplib');

const URL = process.env.WARREN_URL || 'amqp://guest:guest@127.0.0.1:5672/';
// How long a test waits for something the broker should do promptly, in ms.
const WAIT = 5000;

function unique(prefix) {
  return `conf-${prefix}-${crypto.randomBytes(5).toString('hex')}`;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Polls fn (which may be async) until it returns a truthy value, which is returned.
async function waitUntil(fn, what = 'condition', timeout = WAIT) {
  const deadline = Date.now() + timeout;
  for (;;) {
    const value = await fn();
    if (value) return value;
    if (Date.now() >= deadline) throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
    await sleep(20);
  }
}

// Opens a connection for one test and registers its close with t.after.
async function connect(t) {
  const conn = await amqp.connect(URL);
  conn.on('error', () => {}); // errors are asserted through the promises that fail
  t.after(() => conn.close().catch(() => {}));
  return conn;
}

async function channel(t, { confirm = false } = {}) {
  const conn = await connect(t);
  const ch = confirm ? await conn.createConfirmChannel() : await conn.createChannel();
  ch.on('error', () => {}); // a channel closed by the broker also rejects the pending call
  return { conn, ch };
}

// basic.get polled until a message arrives.
function get(ch, queue, options = { noAck: false }) {
  return waitUntil(() => ch.get(queue, options), `a message on ${queue}`);
}

async function readyCount(ch, queue) {
  return (await ch.checkQueue(queue)).messageCount;
}

// An exclusive queue with the given options.
async function queue(ch, prefix = 'q', options = {}) {
  const ok = await ch.assertQueue(unique(prefix), { exclusive: true, ...options });
  return ok.queue;
}

module.exports = { URL, WAIT, unique, sleep, waitUntil, connect, channel, get, readyCount, queue };
