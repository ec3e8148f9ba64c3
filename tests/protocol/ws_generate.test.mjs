// ws_generate.test.mjs — the WebSocket protocol against the real server: session.created first,
// accepted/step/block/done with per-session contiguous seq, block texts = done text, several
// generations multiplexed on one connection (and batched in one decode step), cancel mid-stream,
// queue_full, round-robin fairness across callers (API keys; sessions of one caller share a turn).

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Client, TMP, checkGeneration, checkSeqContiguous, startServer, tinyModel } from './harness.mjs';

const SMALL = { gen_length: 16, block_length: 8, steps: 8 };

describe('ws generate', () => {
  let srv;
  before(async () => {
    srv = await startServer({ model: tinyModel('ws-generate'), extra: ['--max-batch', '8'] });
  });
  after(async () => {
    const r = await srv.stop();
    assert.equal(r.code, 0, `server exits 0 on SIGTERM, stderr: ${srv.stderr}`);
  });

  test('session.created is the first event, then a full generation from a text prompt', async () => {
    const c = new Client(srv.wsUrl);
    const s = await c.session();
    assert.equal(c.msgs[0], s);
    assert.equal(s.seq, 1);
    assert.match(s.session, /^[0-9a-f]{64}$/);
    assert.equal(s.model.ready, true);
    assert.equal(typeof s.defaults.gen_length, 'number');
    // one 16-position block decoded in 16 steps: the server may merge unsent step frames (a merged
    // frame carries the latest drafts), so drafts are checked per frame below; with one long block
    // at least one frame still has masked positions unless all 16 steps merged into the last one
    c.send({ type: 'generate', event_id: 'ev-1', id: 'a', prompt: 'The quick brown fox', gen_length: 16,
      block_length: 16, steps: 16, stream: { drafts: true } });
    const done = await c.done('a');
    const acc = c.msgs.find((m) => m.type === 'accepted');
    assert.equal(acc.id, 'a');
    assert.equal(acc.event_id, 'ev-1');
    assert.ok(acc.prompt_tokens > 0);
    assert.equal(acc.params.gen_length, 16);
    checkGeneration(assert, c.msgs, 'a');
    checkSeqContiguous(assert, c.msgs);
    const steps = c.of('a').filter((m) => m.type === 'step');
    // (how many frames arrive depends on load: a busy machine may merge all 16 steps into one)
    assert.ok(steps.length >= 1, 'step events');
    // every step frame carries drafts for exactly the block's still-masked positions
    const committed = new Set();
    for (const m of steps) {
      for (const x of m.commits) committed.add(x.index);
      const drafts = m.drafts ?? [];
      if (m.progress.block_masks_left > 0) assert.ok(Array.isArray(m.drafts), `step ${m.step} has a drafts array`);
      assert.equal(drafts.length, m.progress.block_masks_left, `step ${m.step}: one draft per masked position`);
      for (const d of drafts) assert.ok(!committed.has(d.index), `step ${m.step}: draft for committed ${d.index}`);
    }
    const unmerged = steps.filter((m) => m.progress.block_masks_left > 0);
    assert.ok(unmerged.length > 0 || steps.length === 1, 'frames before the end of the block were streamed');
    assert.ok(unmerged.length === 0 || unmerged.some((m) => m.drafts.length > 0), 'drafts were streamed');
    assert.equal(steps.reduce((n, m) => n + (m.merged ?? 1), 0), 16, 'merged frames account for all 16 steps');
    // every generated position was committed exactly once across the steps
    const idx = steps.flatMap((m) => m.commits.map((x) => x.index)).sort((x, y) => x - y);
    assert.deepEqual(idx, [...Array(16).keys()]);
    assert.ok(['stop', 'length'].includes(done.finish_reason));
    assert.equal(typeof done.timings.queue_ms, 'number');
    assert.equal(done.usage.prompt_tokens, acc.prompt_tokens);
    await c.close();
  });

  test('prompt_ids and messages requests', async () => {
    const c = new Client(srv.wsUrl);
    const s = await c.session();
    c.send({ type: 'generate', id: 'ids', prompt_ids: [5, 6, 7, 8], ...SMALL });
    if (s.model.chat_template) c.send({ type: 'generate', id: 'chat', messages: [{ role: 'user', content: 'hi' }], ...SMALL });
    await c.done('ids');
    checkGeneration(assert, c.msgs, 'ids');
    if (s.model.chat_template) {
      await c.done('chat');
      checkGeneration(assert, c.msgs, 'chat');
    }
    await c.close();
  });

  test('concurrent generations on one connection are multiplexed by id and batched together', async () => {
    const c = new Client(srv.wsUrl);
    await c.session();
    const ids = ['g1', 'g2', 'g3', 'g4'];
    // 128 steps each: g1 alone would still be running when the service thread reads g2's frame, even
    // when a loaded machine deschedules it for tens of ms (32 steps of the tiny model take ~10 ms)
    for (const id of ids) c.send({ type: 'generate', id, prompt_ids: [1, 2, 3], gen_length: 128, block_length: 32, steps: 128 });
    await Promise.all(ids.map((id) => c.done(id)));
    for (const id of ids) checkGeneration(assert, c.msgs, id);
    checkSeqContiguous(assert, c.msgs);
    // interleaved on the wire: g2 produced steps before g1 finished
    const firstDoneG1 = c.msgs.findIndex((m) => m.id === 'g1' && m.type === 'done');
    assert.ok(c.msgs.slice(0, firstDoneG1).some((m) => m.id === 'g2' && m.type === 'step'), 'g2 streams while g1 runs');
    const st = await srv.stats();
    assert.ok(st.scheduler.max_batch_seen >= 4, `one decode step served 4 sequences (max_batch_seen ${st.scheduler.max_batch_seen})`);
    await c.close();
  });

  test('ids: auto-assigned when absent, duplicates refused', async () => {
    const c = new Client(srv.wsUrl);
    await c.session();
    c.send({ type: 'generate', event_id: 'x1', prompt_ids: [1, 2], gen_length: 64, block_length: 64, steps: 64 });
    const acc = await c.wait((m) => m.type === 'accepted' && m.event_id === 'x1');
    assert.match(acc.id, /^gen_\d+$/);
    c.send({ type: 'generate', event_id: 'x2', id: acc.id, prompt_ids: [1, 2], ...SMALL });
    const err = await c.wait((m) => m.type === 'error' && m.event_id === 'x2');
    assert.equal(err.error.code, 'duplicate_id');
    c.send({ type: 'cancel', id: acc.id });
    await c.done(acc.id);
    await c.close();
  });

  test('cancel mid-stream stops the generation at the next step', async () => {
    const c = new Client(srv.wsUrl);
    await c.session();
    c.send({ type: 'generate', id: 'long', prompt_ids: [1, 2, 3], gen_length: 256, block_length: 256, steps: 256 });
    await c.wait((m) => m.type === 'step' && m.id === 'long' && m.step >= 2, 'a few steps');
    c.send({ type: 'cancel', event_id: 'c1', id: 'long' });
    const done = await c.done('long');
    assert.equal(done.finish_reason, 'cancelled');
    assert.ok(done.usage.steps < 256, `stopped early (${done.usage.steps} steps)`);
    checkGeneration(assert, c.msgs, 'long');
    // nothing for that id after done; unknown ids are an error that echoes the event_id
    c.send({ type: 'cancel', event_id: 'c2', id: 'long' });
    const err = await c.wait((m) => m.type === 'error' && m.event_id === 'c2');
    assert.equal(err.error.code, 'unknown_generation');
    assert.equal(c.msgs.filter((m) => m.id === 'long' && m.seq > done.seq && m.type !== 'error').length, 0);
    await c.close();
  });

  test('cancel of a queued generation answers done(cancelled) at once', async () => {
    const c = new Client(srv.wsUrl);
    await c.session();
    // fill the batch (8 slots) with long generations, then queue one more and cancel it
    const fill = [...Array(8).keys()].map((i) => `f${i}`);
    for (const id of fill) c.send({ type: 'generate', id, prompt_ids: [1], gen_length: 256, block_length: 256, steps: 256 });
    await Promise.all(fill.map((id) => c.wait((m) => m.type === 'step' && m.id === id, `${id} running`)));
    c.send({ type: 'generate', id: 'q', prompt_ids: [1], ...SMALL });
    const acc = await c.wait((m) => m.type === 'accepted' && m.id === 'q');
    assert.ok(acc.queue_position >= 1, `queued (position ${acc.queue_position})`);
    c.send({ type: 'cancel', id: 'q' });
    const done = await c.done('q');
    assert.equal(done.finish_reason, 'cancelled');
    assert.equal(done.usage.steps, 0);
    for (const id of fill) c.send({ type: 'cancel', id });
    await Promise.all(fill.map((id) => c.done(id)));
    await c.close();
  });
});

describe('admission', () => {
  let srv;
  before(async () => {
    srv = await startServer({ model: tinyModel('ws-generate'), extra: ['--max-batch', '1', '--max-queue', '1'], name: 'small-queue' });
  });
  after(async () => {
    await srv.stop();
  });

  test('queue full -> error queue_full, the others still finish', async () => {
    const c = new Client(srv.wsUrl);
    await c.session();
    // 'a' holds the one batch slot for 1000 steps (cancelled below), so it cannot finish before 'c'
    // is admitted however slowly the preparation worker runs on a loaded machine; 'b' fills the queue
    const long = { gen_length: 1000, block_length: 1000, steps: 1000 };
    for (const id of ['a', 'b', 'c'])
      c.send({ type: 'generate', id, event_id: `e-${id}`, prompt_ids: [1, 2], ...(id === 'a' ? long : { gen_length: 32, block_length: 32, steps: 32 }) });
    const err = await c.wait((m) => m.type === 'error' && m.id === 'c');
    assert.equal(err.error.code, 'queue_full');
    assert.equal(err.event_id, 'e-c');
    c.send({ type: 'cancel', id: 'a' });
    assert.equal((await c.done('a')).finish_reason, 'cancelled');
    assert.equal((await c.done('b')).finish_reason, 'length');
    checkGeneration(assert, c.msgs, 'a');
    checkGeneration(assert, c.msgs, 'b');
    await c.close();
  });
});

describe('fairness', () => {
  let srv;
  const keys = path.join(TMP, 'ws-generate-fair-keys.txt');
  before(async () => {
    fs.writeFileSync(keys, 'sk-caller-a\nsk-caller-b\n');
    srv = await startServer({ model: tinyModel('ws-generate'), extra: ['--max-batch', '1', '--max-queue', '100', '--api-keys', keys], name: 'fair' });
  });
  after(async () => {
    await srv.stop();
  });
  const as = (key) => new Client(srv.wsUrl, { headers: { authorization: `Bearer ${key}` } });
  // long enough that A's burst is still queued when B's request arrives (a few round trips later),
  // also on a loaded machine
  const req = { prompt_ids: [1, 2], gen_length: 128, block_length: 128, steps: 128 };

  test('caller B is admitted right after A’s current turn, not after A’s whole burst', async () => {
    const a = as('sk-caller-a');
    const b = as('sk-caller-b');
    await a.session();
    await b.session();
    const aIds = ['a1', 'a2', 'a3', 'a4', 'a5'];
    for (const id of aIds) a.send({ type: 'generate', id, ...req });
    await Promise.all(aIds.map((id) => a.wait((m) => m.type === 'accepted' && m.id === id)));
    b.send({ type: 'generate', id: 'b1', ...req });
    const b1acc = await b.wait((m) => m.type === 'accepted' && m.id === 'b1');
    assert.ok(b1acc.queue_position > 0, 'A\'s burst is still waiting when B arrives (the premise)');
    const b1 = await b.done('b1');
    const dones = await Promise.all(aIds.map((id) => a.done(id)));
    const a4 = dones[3];
    // admission order with round-robin: a1, a2, b1, a3, a4, a5 (FIFO would be a1..a5, b1):
    // b1 waited for ~2 generations, a4 (submitted earlier) for ~4.
    assert.ok(b1.timings.queue_ms < a4.timings.queue_ms,
      `b1 queued ${b1.timings.queue_ms.toFixed(1)} ms, a4 ${a4.timings.queue_ms.toFixed(1)} ms`);
    await a.close();
    await b.close();
  });

  test('two sessions of one caller share one turn (a new session does not jump the caller\'s queue)', async () => {
    const a1 = as('sk-caller-a');
    const a2 = as('sk-caller-a');
    const b = as('sk-caller-b');
    await Promise.all([a1.session(), a2.session(), b.session()]);
    const ids = ['x1', 'x2', 'x3', 'x4'];
    for (const id of ids) a1.send({ type: 'generate', id, ...req });
    await Promise.all(ids.map((id) => a1.wait((m) => m.type === 'accepted' && m.id === id)));
    a2.send({ type: 'generate', id: 'y1', ...req }); // same caller: queued behind x1..x4
    b.send({ type: 'generate', id: 'z1', ...req }); // another caller: next turn
    const [y1, z1] = await Promise.all([a2.done('y1'), b.done('z1')]);
    await Promise.all(ids.map((id) => a1.done(id)));
    assert.ok(z1.timings.queue_ms < y1.timings.queue_ms,
      `the other caller's z1 queued ${z1.timings.queue_ms.toFixed(1)} ms, the same caller's y1 ${y1.timings.queue_ms.toFixed(1)} ms`);
    const st = JSON.parse((await srv.get('/stats')).body);
    assert.equal(st.error?.code, 'missing_api_key', '/stats needs a key when keys are on');
    await Promise.all([a1.close(), a2.close(), b.close()]);
  });
});

describe('graceful stop', () => {
  test('SIGTERM: running WebSocket generations finish and are delivered, new ones are refused, exit 0', async () => {
    const srv = await startServer({ model: tinyModel('ws-generate'), extra: ['--shutdown-grace', '60'], name: 'drain' });
    try {
      const c = new Client(srv.wsUrl);
      await c.session();
      c.send({ type: 'generate', id: 'run', prompt_ids: [1, 2], gen_length: 512, block_length: 64, steps: 512 });
      await c.wait((m) => m.type === 'step' && m.id === 'run');
      srv.proc.kill('SIGTERM');
      // the server keeps serving: a new request is refused with a clear code (the signal is handled
      // by the service thread before it can read this message) ...
      c.send({ type: 'generate', event_id: 'late', id: 'late', prompt_ids: [1], gen_length: 8, block_length: 8 });
      const late = await c.wait((m) => m.id === 'late' && (m.type === 'error' || m.type === 'accepted'));
      assert.equal(late.type, 'error');
      assert.equal(late.error.code, 'shutting_down');
      // ... the running one completes and every event reaches the client before the exit
      const done = await c.done('run');
      assert.equal(done.finish_reason, 'length');
      checkGeneration(assert, c.msgs, 'run');
      checkSeqContiguous(assert, c.msgs);
      assert.equal((await c.closedP).code, 1001, 'closed as "going away"');
      const r = await srv.exited;
      assert.equal(r.code, 0, srv.stderr);
    } finally {
      await srv.stop();
    }
  });
});
