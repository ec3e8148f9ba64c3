// ws_limits.test.mjs — a WebSocket `generate` is held to the same server limits as the HTTP APIs
// (--max-gen-length, --max-prompt-tokens), with the same messages and codes; and a request's
// preparation (tokenizing a ~1 MB prompt) runs off the service thread: a ping sent right after it
// on the same connection is answered before the big request's reply, a cancel during preparation
// gives `accepted` then `done` "cancelled", and a session closed meanwhile leaves the server healthy.

import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, describe, test } from 'node:test';
import { Client, checkGeneration, checkSeqContiguous, startServer, tinyModel } from './harness.mjs';

function post(base, path, body) {
  return new Promise((resolve, reject) => {
    const data = JSON.stringify(body);
    const req = http.request(`${base}${path}`, {
      method: 'POST', agent: false,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) },
    }, (res) => {
      let b = '';
      res.setEncoding('utf8');
      res.on('data', (d) => (b += d));
      res.on('end', () => resolve({ status: res.statusCode, body: JSON.parse(b) }));
    });
    req.on('error', reject);
    req.end(data);
  });
}

describe('WebSocket generate: server limits', () => {
  let srv;
  before(async () => {
    srv = await startServer({ model: tinyModel('ws-limits'), extra: ['--max-gen-length', '64', '--max-prompt-tokens', '200'] });
  });
  after(async () => {
    assert.equal((await srv.get('/health')).status, 200);
    const r = await srv.stop();
    assert.equal(r.code, 0, `clean exit; stderr: ${srv.stderr}`);
  });

  async function reply(c, body) {
    const ev = `e${c.msgs.length}`;
    c.send({ type: 'generate', event_id: ev, ...body });
    return c.wait((m) => m.event_id === ev && (m.type === 'error' || m.type === 'accepted'), `reply to ${ev}`);
  }

  test('gen_length over --max-gen-length: same message as the HTTP APIs, the field as spelled', async () => {
    const c = new Client(srv.wsUrl);
    await c.session();
    for (const [body, param] of [
      [{ prompt_ids: [1, 2], gen_length: 100 }, 'gen_length'],
      [{ prompt_ids: [1, 2], max_tokens: 65 }, 'max_tokens'],
      [{ prompt_ids: [1, 2], max_new_tokens: 1000 }, 'max_new_tokens'],
      [{ prompt_ids: [1, 2], params: { gen_length: 100 } }, 'params.gen_length'],
    ]) {
      const e = await reply(c, { id: 'g', ...body });
      assert.equal(e.type, 'error', JSON.stringify(body));
      assert.equal(e.id, 'g');
      assert.equal(e.error.code, 'invalid_request');
      assert.equal(e.error.param, param);
      const v = body.params ? body.params.gen_length : body[param];
      assert.equal(e.error.message, `${param} must be between 1 and 64, got ${v}`);
    }
    // the HTTP API says the same about the same field
    const h = await post(srv.base, '/v1/completions', { prompt: 'hi', max_tokens: 65 });
    assert.equal(h.status, 400);
    assert.equal(h.body.error.message, 'max_tokens must be between 1 and 64, got 65');
    // at the limit it runs; without a length the default is clamped to the limit
    const ok = await reply(c, { id: 'at', prompt_ids: [1, 2], gen_length: 64, block_length: 32, steps: 8 });
    assert.equal(ok.type, 'accepted');
    const dflt = await reply(c, { id: 'dflt', prompt_ids: [1, 2], steps: 8 });
    assert.equal(dflt.type, 'accepted');
    assert.equal(dflt.params.gen_length, 64);
    await c.done('at');
    await c.done('dflt');
    checkGeneration(assert, c.msgs, 'at');
    checkGeneration(assert, c.msgs, 'dflt');
    checkSeqContiguous(assert, c.msgs);
    await c.close();
  });

  test('prompt over --max-prompt-tokens: context_length_exceeded, as over HTTP', async () => {
    const c = new Client(srv.wsUrl);
    await c.session();
    const ids = await reply(c, { id: 'p1', prompt_ids: Array.from({ length: 201 }, (_, i) => 1 + (i % 50)), gen_length: 8 });
    assert.equal(ids.type, 'error');
    assert.equal(ids.error.code, 'context_length_exceeded');
    assert.equal(ids.error.param, 'prompt_ids');
    assert.equal(ids.error.message, "the prompt has 201 tokens, more than this server's limit of 200");
    const text = 'hello world '.repeat(400);
    const t = await reply(c, { id: 'p2', prompt: text, gen_length: 8 });
    assert.equal(t.type, 'error');
    assert.equal(t.error.code, 'context_length_exceeded');
    assert.equal(t.error.param, 'prompt');
    const h = await post(srv.base, '/v1/completions', { prompt: text, max_tokens: 8 });
    assert.equal(h.status, 400);
    assert.equal(h.body.error.code, 'context_length_exceeded');
    assert.equal(h.body.error.message, t.error.message);
    const msgs = await reply(c, { id: 'p3', messages: [{ role: 'user', content: text }], gen_length: 8 });
    assert.equal(msgs.error.code, 'context_length_exceeded');
    assert.equal(msgs.error.param, 'messages');
    // 200 ids is fine
    const ok = await reply(c, { id: 'p4', prompt_ids: Array.from({ length: 200 }, (_, i) => 1 + (i % 50)), gen_length: 8, block_length: 8, steps: 8 });
    assert.equal(ok.type, 'accepted');
    assert.equal(ok.prompt_tokens, 200);
    await c.done('p4');
    checkSeqContiguous(assert, c.msgs);
    await c.close();
  });
});

describe('WebSocket generate: preparation off the service thread', () => {
  let srv;
  before(async () => {
    srv = await startServer({ model: tinyModel('ws-prep') });
  });
  after(async () => {
    assert.equal((await srv.get('/health')).status, 200);
    const r = await srv.stop();
    assert.equal(r.code, 0, `clean exit; stderr: ${srv.stderr}`);
  });

  // ~1 MB of text: tens of ms of tokenization (and more tokens than the tiny model's context).
  const big = 'The quick brown fox jumps over the lazy dog. '.repeat(22000);

  test('a ~1 MB prompt stalls no other connection; its own connection\'s replies keep message order', async () => {
    const c = new Client(srv.wsUrl);
    const other = new Client(srv.wsUrl);
    await c.session();
    await other.session();
    const order = []; // arrival order over both connections
    for (const [who, cl] of [['c', c], ['other', other]]) cl.ws.on('message', (d) => order.push(`${who}:${JSON.parse(String(d)).type}`));
    c.send({ type: 'generate', id: 'big', event_id: 'big', prompt: big, gen_length: 8 });
    c.send({ type: 'ping', event_id: 'p' });
    other.send({ type: 'ping', event_id: 'o' });
    const reply = await c.wait((m) => m.id === 'big', 'the big request\'s reply');
    const pong = await c.wait((m) => m.type === 'pong' && m.event_id === 'p', 'pong');
    await other.wait((m) => m.type === 'pong' && m.event_id === 'o', 'the other connection\'s pong');
    // the other connection is answered while the big prompt is tokenized
    assert.ok(order.indexOf('other:pong') < order.indexOf('c:error'), order.join(' '));
    // this connection's ping was sent after the generate: its pong follows the generate's reply
    assert.ok(reply.seq < pong.seq, `the big request's ${reply.type} (seq ${reply.seq}) before the pong (seq ${pong.seq})`);
    // over the model's context: refused after tokenization, with the count
    assert.equal(reply.type, 'error');
    assert.equal(reply.error.code, 'context_length_exceeded');
    assert.equal(reply.event_id, 'big');
    checkSeqContiguous(assert, c.msgs);
    await c.close();
    await other.close();
  });

  test('cancel while being prepared: accepted, then done "cancelled"', async () => {
    const c = new Client(srv.wsUrl);
    await c.session();
    c.send({ type: 'generate', id: 'x', prompt: 'Hello there', gen_length: 64, block_length: 16, steps: 64 });
    c.send({ type: 'cancel', id: 'x', event_id: 'cx' });
    const done = await c.done('x');
    assert.equal(done.finish_reason, 'cancelled');
    const ev = c.of('x');
    assert.equal(ev[0].type, 'accepted');
    assert.equal(ev.filter((m) => m.type === 'error').length, 0, JSON.stringify(ev));
    checkGeneration(assert, c.msgs, 'x');
    // the id is free again
    c.send({ type: 'generate', id: 'x', prompt_ids: [1, 2], gen_length: 8, block_length: 8, steps: 8 });
    await c.wait((m) => m.type === 'done' && m.id === 'x' && m !== done, 'second x');
    checkSeqContiguous(assert, c.msgs);
    await c.close();
  });

  test('a session closed while its request is prepared: dropped, others unaffected', async () => {
    const a = new Client(srv.wsUrl);
    await a.session();
    a.send({ type: 'generate', id: 'gone', prompt: big, gen_length: 8 });
    a.send({ type: 'generate', id: 'gone2', prompt: big, gen_length: 8 });
    await a.close(); // 1000: the session ends at once
    const b = new Client(srv.wsUrl);
    await b.session();
    b.send({ type: 'generate', id: 'b', prompt: 'Hello', gen_length: 16, block_length: 16, steps: 8 });
    await b.done('b');
    checkGeneration(assert, b.msgs, 'b');
    await b.close();
  });
});

describe('WebSocket replies keep the order of the messages', () => {
  let srv;
  before(async () => {
    // one generate per second per caller: the second of two back-to-back generates is rate limited
    srv = await startServer({ model: tinyModel('ws-order'), extra: ['--rate-limit', '1', '--rate-burst', '1'] });
  });
  after(async () => {
    const r = await srv.stop();
    assert.equal(r.code, 0, `clean exit; stderr: ${srv.stderr}`);
  });

  test('a message refused at once waits for the reply to the generate before it', async () => {
    const c = new Client(srv.wsUrl);
    await c.session();
    // the first is tokenized on a worker (a long prompt); the second is refused by the rate limit
    // as soon as it is read; the ping and the bad message need no work at all
    const prompt = 'The quick brown fox jumps over the lazy dog. '.repeat(2000);
    c.send({ type: 'generate', id: 'first', event_id: 'e1', prompt, gen_length: 8 });
    c.send({ type: 'generate', id: 'second', event_id: 'e2', prompt_ids: [1, 2], gen_length: 8 });
    c.send({ type: 'ping', event_id: 'e3' });
    c.send('not json');
    c.send({ type: 'generate', id: 'third', event_id: 'e4', prompt_ids: [1, 2], gen_length: 8 });
    c.send({ type: 'ping', event_id: 'e5' });
    await c.wait((m) => m.type === 'pong' && m.event_id === 'e5', 'the last pong');
    const replies = c.msgs.filter((m) => m.event_id || m.error?.code === 'invalid_json');
    assert.deepEqual(replies.map((m) => m.event_id ?? 'invalid_json'), ['e1', 'e2', 'e3', 'invalid_json', 'e4', 'e5'],
      replies.map((m) => `${m.type}:${m.error?.code ?? ''}`).join(' '));
    assert.equal(replies[1].error?.code, 'rate_limited');
    assert.equal(replies[4].error?.code, 'rate_limited');
    checkSeqContiguous(assert, c.msgs);
    await c.close();
  });
});

describe('WebSocket memory: every session together is bounded (--sessions-max-bytes)', () => {
  let srv;
  const BUDGET = 1 << 20;
  before(async () => {
    srv = await startServer({ model: tinyModel('ws-limits'), extra: ['--sessions-max-bytes', String(BUDGET), '--ping-interval', '600'], name: 'budget' });
  });
  after(async () => {
    await srv.stop();
  });

  test('clients that stop reading cannot make the server hold more than the budget; everyone is still served', async () => {
    // chatty generations: drafts of a 600-wide block on every step (tens of KB per frame). Unsent
    // step frames merge, so what piles up is written-but-unacknowledged history: without the
    // budget each session keeps up to --session-max-bytes (8 MB) of it, 24 MB for three.
    const readers = [];
    for (let i = 0; i < 3; i++) {
      const c = new Client(srv.wsUrl);
      await c.session();
      c.send({ type: 'generate', id: `g${i}`, prompt_ids: [1, 2], gen_length: 600, block_length: 600, steps: 200, stream: { drafts: true } });
      await c.wait((m) => m.type === 'step' && m.id === `g${i}`);
      c.ws._socket.pause(); // stop reading
      readers.push(c);
    }
    let max = 0;
    for (;;) {
      const st = await srv.stats();
      max = Math.max(max, st.connections.session_bytes);
      if (st.scheduler.active === 0 && st.scheduler.queued === 0) break;
      const h = await srv.get('/health'); // the server keeps serving meanwhile
      assert.equal(h.status, 200);
    }
    assert.ok(max > BUDGET / 2, `the generations filled the budget (peak ${max})`);
    assert.ok(max <= BUDGET + 256 * 1024, `session bytes peaked at ${max} (budget ${BUDGET})`);
    // the readers come back: every generation completes (the oldest sent history was released)
    for (const c of readers) c.ws._socket.resume();
    for (let i = 0; i < 3; i++) {
      const done = await readers[i].done(`g${i}`);
      assert.ok(['stop', 'length'].includes(done.finish_reason), `g${i}: ${done.finish_reason}`);
    }
    const st = await srv.stats();
    assert.ok(st.connections.session_bytes <= BUDGET, `within the budget: ${st.connections.session_bytes}`);
    for (const c of readers) await c.close();
  });
});
