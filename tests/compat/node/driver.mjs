// Drives the official RocketMQ 5 Node.js client (rocketmq-client-nodejs, pinned in package.json) against a
// popgate proxy. Run by tests/compat/test_node_client.py in its own process.
//
// Usage: node driver.mjs SCENARIO ENDPOINT TOPIC GROUP
// ENDPOINT is "host:port" (the client takes no scheme). Exit 0 = the scenario held; any failure throws (exit 1,
// the error on stderr). The last line on stdout is one JSON object of observations. The client's own warnings
// and errors go to stderr; its INFO log to $HOME/logs/rocketmq/ (set HOME to a scratch directory).
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import os from 'node:os';
import { format } from 'node:util';
import { ConsumeResult, Producer, PushConsumer, SimpleConsumer } from 'rocketmq-client-nodejs';

const AWAIT_MS = 3000; // SimpleConsumer long-polling time
const REQUEST_TIMEOUT_MS = 5000;
const STARTUP_MS = 30000; // the client waits for the first Settings reply with no deadline of its own
const ACKED_INVISIBLE_MS = 5000; // short enough that an ack which did nothing shows within the scenario

/** The client's warnings and errors on stderr, counted; its INFO lines dropped. */
class StderrLogger {
  constructor() {
    this.problems = [];
  }
  info() {}
  debug() {}
  warn(...args) {
    this.#record('WARN', args);
  }
  error(...args) {
    this.#record('ERROR', args);
  }
  close() {}
  #record(level, args) {
    const line = `${level} ${format(...args.map(a => (a instanceof Error ? a.stack : a)))}`;
    this.problems.push(line);
    process.stderr.write(`[client] ${line}\n`);
  }
}

const logger = new StderrLogger();

function options(endpoint, extra) {
  return { endpoints: endpoint, namespace: '', requestTimeout: REQUEST_TIMEOUT_MS, logger, ...extra };
}

/** `promise`, or an error naming `what` (a string, or a function giving one then) after `ms`. */
async function within(ms, what, promise) {
  let timer;
  const expired = new Promise((_, reject) => {
    const name = () => (typeof what === 'function' ? what() : what);
    timer = setTimeout(() => reject(new Error(`${name()}: no result within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([ promise, expired ]);
  } finally {
    clearTimeout(timer);
  }
}

async function startedProducer(endpoint, topic) {
  const producer = new Producer(options(endpoint, { topic }));
  await within(STARTUP_MS, 'producer startup', producer.startup());
  return producer;
}

async function startedSimpleConsumer(endpoint, topic, group) {
  const consumer = new SimpleConsumer(options(endpoint, {
    consumerGroup: group,
    subscriptions: new Map([[ topic, '*' ]]),
    awaitDuration: AWAIT_MS,
  }));
  await within(STARTUP_MS, 'simple consumer startup', consumer.startup());
  return consumer;
}

/** Long polls until `done(got)` holds or `limitMs` has passed; every message is stamped with when it came. */
async function receiveUntil(consumer, done, { invisibleMs = 20000, limitMs = 40000, batch = 32, ack = false } = {}) {
  const got = [];
  const end = Date.now() + limitMs;
  while (Date.now() < end && !done(got)) {
    const messages = await consumer.receive(batch, invisibleMs);
    const at = Date.now();
    got.push(...messages.map(view => ({ view, at })));
    if (ack) await Promise.all(messages.map(m => consumer.ack(m))); // side by side: well within the invisible time
  }
  assert.ok(done(got), `gave up after ${limitMs} ms with ${got.length} messages`);
  return got;
}

/** Nothing comes for `quietMs` of long polls (a message acked, or not yet due, stays away). */
async function nothingFor(consumer, quietMs) {
  const extra = [];
  const end = Date.now() + quietMs;
  while (Date.now() < end) extra.push(...await consumer.receive(32, 20000));
  assert.deepEqual(extra.map(m => m.messageId), [], 'unexpected (re)delivery');
}

function plain(props) {
  return Object.fromEntries([ ...(props ?? new Map()).entries() ].sort());
}

/** Every field the client shows compared with what was sent (`sent`: the options given to send). */
function assertSame(view, sent, topic, window) {
  const id = view.messageId;
  assert.equal(view.topic, topic, id);
  assert.ok(Buffer.compare(view.body, sent.body) === 0, `${id}: body differs`);
  assert.ok(!view.corrupted, `${id}: the client says the body is corrupted (its digest check failed)`);
  assert.equal(view.tag || undefined, sent.tag, id);
  assert.deepEqual(view.keys, sent.keys ?? [], id);
  assert.deepEqual(plain(view.properties), plain(sent.properties), id);
  assert.equal(view.messageGroup || undefined, sent.messageGroup, id);
  assert.equal(view.deliveryTimestamp?.getTime(), sent.deliveryTimestamp?.getTime(), `${id}: delivery timestamp`);
  assert.equal(view.bornHost, os.hostname(), id);
  const born = view.bornTimestamp.getTime();
  assert.ok(born >= window.from && born <= window.to, `${id}: born ${born} outside ${window.from}..${window.to}`);
  assert.equal(view.deliveryAttempt, 1, id);
  assert.ok(view.receiptHandle, `${id}: no receipt handle`);
  assert.equal(typeof view.offset, 'number', `${id}: no queue offset`);
}

/** Producer with tags, keys, properties, a delivery timestamp and a message group; SimpleConsumer gets each
 * message once, every field as sent, acks it, and nothing comes back after the (short) invisible time. */
async function produceConsume(endpoint, topic, group) {
  const producer = await startedProducer(endpoint, topic);
  const consumer = await startedSimpleConsumer(endpoint, topic, group);
  try {
    const sent = new Map();
    const from = Date.now();
    const send = async msg => sent.set((await producer.send({ topic, ...msg })).messageId, msg);
    for (let i = 0; i < 20; i++) {
      await send({
        body: Buffer.from(`body-${i}`),
        tag: `tag${i % 3}`,
        keys: [ `k${i}`, `k${i}-b` ],
        properties: new Map([[ 'n', String(i) ], [ 'lang', 'node' ]]),
      });
    }
    await send({ body: randomBytes(64 * 1024), tag: 'big' }); // a digest over more than one block
    await send({ body: Buffer.from([ 0, 255, 0x80, 10, 13 ]) }); // bytes, not text; no tag, keys or properties
    const due = new Date(Date.now() + 3000);
    await send({ body: Buffer.from('later'), tag: 'delay', deliveryTimestamp: due });
    const fifo = [];
    for (let i = 0; i < 5; i++) {
      const body = Buffer.from(`fifo-${i}`);
      fifo.push(body.toString());
      await send({ body, messageGroup: 'node-group-1', keys: [ `f${i}` ] });
    }
    const window = { from, to: Date.now() };

    const got = await receiveUntil(consumer, g => g.length >= sent.size, { invisibleMs: ACKED_INVISIBLE_MS, ack: true });
    const lastReceived = Math.max(...got.map(g => g.at));
    assert.deepEqual(got.map(g => g.view.messageId).sort(), [ ...sent.keys() ].sort(), 'received ids differ from sent');
    for (const { view } of got) assertSame(view, sent.get(view.messageId), topic, window);
    const delayed = got.find(g => g.view.tag === 'delay');
    assert.ok(delayed.at >= due.getTime() - 200, `delayed message came ${due.getTime() - delayed.at} ms early`);
    const order = got.filter(g => g.view.messageGroup === 'node-group-1').map(g => g.view.body.toString());
    assert.deepEqual(order, fifo, 'a message group out of order');

    // Acked: nothing comes back, polled until well past the time an un-acked one would have returned
    await nothingFor(consumer, lastReceived + ACKED_INVISIBLE_MS + 1500 - Date.now());
    return { sent: sent.size, received: got.length, delayed_after_due_ms: delayed.at - due.getTime() };
  } finally {
    await consumer.shutdown();
    await producer.shutdown();
  }
}

/** changeInvisibleDuration: a shorter time brings a message back with attempt 2; the client keeps the new
 * receipt handle, which acks it, while the handle it was received with is stale. */
async function invisibility(endpoint, topic, group) {
  const producer = await startedProducer(endpoint, topic);
  const consumer = await startedSimpleConsumer(endpoint, topic, group);
  const out = {};
  try {
    const backId = (await producer.send({ topic, body: Buffer.from('come-back') })).messageId;
    const [ first ] = await receiveUntil(consumer, g => g.length >= 1);
    assert.equal(first.view.messageId, backId);
    const changedAt = Date.now();
    await consumer.changeInvisibleDuration(first.view, 1000);
    // Back after about 1 s, not after the 20 s it was received with: given up at 10 s
    const again = await receiveUntil(consumer, g => g.some(m => m.view.messageId === backId), { limitMs: 10000 });
    const back = again.find(m => m.view.messageId === backId).view;
    assert.equal(back.deliveryAttempt, 2);
    assert.equal(back.body.toString(), 'come-back');
    await consumer.ack(back);
    out.changed_back_after_ms = Date.now() - changedAt;

    const ackedId = (await producer.send({ topic, body: Buffer.from('ack-after-change') })).messageId;
    const [ held ] = await receiveUntil(consumer, g => g.length >= 1);
    assert.equal(held.view.messageId, ackedId);
    const receivedHandle = held.view.receiptHandle;
    const changed = Date.now();
    await consumer.changeInvisibleDuration(held.view, 5000);
    assert.notEqual(held.view.receiptHandle, receivedHandle, 'the client kept the old receipt handle');
    await consumer.ack(held.view); // with the handle the change returned
    const stale = { ...held.view, receiptHandle: receivedHandle, endpoints: held.view.endpoints };
    try {
      await consumer.ack(stale);
      out.stale_ack = 'accepted';
    } catch (err) {
      out.stale_ack = err.code;
    }
    await nothingFor(consumer, changed + 5000 + 1500 - Date.now()); // acked: not back after the 5 s
    return out;
  } finally {
    await consumer.shutdown();
    await producer.shutdown();
  }
}

/** A PushConsumer consumes 100 messages, each once, every field as sent, and acks them all: once it has shut
 * down, a SimpleConsumer of its group gets nothing (the proxy gives back what a terminated client held within
 * 1 s, so an unacked message would come). */
async function push(endpoint, topic, group) {
  const expected = 100;
  const producer = await startedProducer(endpoint, topic);
  const deliveries = [];
  let allConsumed;
  const consumedAll = new Promise(resolve => { allConsumed = resolve; });
  const seen = new Set();
  const consumer = new PushConsumer(options(endpoint, {
    consumerGroup: group,
    subscriptions: new Map([[ topic, '*' ]]),
    messageListener: {
      consume(view) {
        deliveries.push(view);
        seen.add(view.messageId);
        if (seen.size >= expected) allConsumed();
        return ConsumeResult.SUCCESS;
      },
    },
  }));
  let sent;
  try {
    await within(STARTUP_MS, 'push consumer startup', consumer.startup());
    sent = new Map();
    const from = Date.now();
    for (let i = 0; i < expected; i++) {
      const msg = {
        body: Buffer.from(`push-${i}`),
        tag: 'p',
        keys: [ `p${i}` ],
        properties: new Map([[ 'i', String(i) ]]),
      };
      sent.set((await producer.send({ topic, ...msg })).messageId, msg);
    }
    const window = { from, to: Date.now() };
    await within(60000, () => `push consumer (${seen.size} of ${expected} consumed)`, consumedAll);
    assert.deepEqual([ ...seen ].sort(), [ ...sent.keys() ].sort(), 'consumed ids differ from sent');
    for (const view of deliveries) assertSame(view, sent.get(view.messageId), topic, window);
  } finally {
    await within(30000, 'push consumer shutdown', consumer.shutdown());
    await producer.shutdown();
  }
  assert.equal(deliveries.length, expected, 'a message was consumed more than once');
  const check = await startedSimpleConsumer(endpoint, topic, group);
  try {
    await nothingFor(check, 2 * AWAIT_MS);
  } finally {
    await check.shutdown();
  }
  return { consumed: seen.size, deliveries: deliveries.length };
}

/** A PushConsumer whose listener fails each message's first delivery: the client nacks it (ChangeInvisible-
 * Duration with its retry policy's delay) and the message comes back with attempt 2, consumed then. */
async function pushRetry(endpoint, topic, group) {
  const expected = 10;
  const producer = await startedProducer(endpoint, topic);
  const attempts = new Map(); // message id -> [attempt, at] of each delivery
  let allDone;
  const done = new Promise(resolve => { allDone = resolve; });
  let succeeded = 0;
  const consumer = new PushConsumer(options(endpoint, {
    consumerGroup: group,
    subscriptions: new Map([[ topic, '*' ]]),
    messageListener: {
      consume(view) {
        const seen = attempts.get(view.messageId) ?? [];
        seen.push([ view.deliveryAttempt, Date.now() ]);
        attempts.set(view.messageId, seen);
        if (seen.length === 1) return ConsumeResult.FAILURE;
        if (++succeeded >= expected) allDone();
        return ConsumeResult.SUCCESS;
      },
    },
  }));
  try {
    await within(STARTUP_MS, 'push consumer startup', consumer.startup());
    for (let i = 0; i < expected; i++) await producer.send({ topic, body: Buffer.from(`retry-${i}`) });
    await within(60000, () => `push consumer (${succeeded} of ${expected} consumed after a failure)`, done);
  } finally {
    await within(30000, 'push consumer shutdown', consumer.shutdown());
    await producer.shutdown();
  }
  const runs = [ ...attempts.values() ];
  assert.equal(runs.length, expected);
  for (const run of runs) assert.deepEqual(run.map(([ attempt ]) => attempt), [ 1, 2 ], 'attempts of one message');
  return { retried: runs.length, longest_retry_ms: Math.max(...runs.map(([ a, b ]) => b[1] - a[1])) };
}

const SCENARIOS = { produce_consume: produceConsume, invisibility, push, push_retry: pushRetry };

const [ scenario, endpoint, topic, group ] = process.argv.slice(2);
try {
  assert.ok(SCENARIOS[scenario], `unknown scenario ${scenario}; one of ${Object.keys(SCENARIOS)}`);
  const result = await SCENARIOS[scenario](endpoint, topic, group);
  result.client_problems = logger.problems.length;
  process.stdout.write(`${JSON.stringify(result)}\n`);
  process.exit(0); // the client leaves timers behind (its own loggers' among them)
} catch (err) {
  process.stderr.write(`${err.stack ?? err}\n`);
  process.exit(1);
}
