// ws_cache.test.mjs — KV caches over the WebSocket protocol against the real server: the session's
// defaults (serve default: dual), each mode accepted and echoed in accepted.params, a cached request
// really holding cache memory (GET /stats kv_cache) while a `none` one holds none, a cancel mid-block
// giving the memory back at once (slots and bytes 0 once done(cancelled) arrived), sequences with
// different modes, prompt lengths and block positions batched together with texts equal to the same
// requests run one at a time, and bad cache values refused with invalid_request naming the field.
// The batching comparison samples (temperature 1, random decoder): the CPU GEMMs round a row
// differently depending on how many rows share the call (OpenBLAS picks kernels by size), and the
// untrained tiny model gives many masked positions near-equal confidences, so a confidence-ordered
// comparison would test that rounding, not the batching.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Client, checkGeneration, startServer, tinyModel, untilStats } from './harness.mjs';

describe('ws KV caches', () => {
  let srv;
  before(async () => {
    srv = await startServer({ model: tinyModel('ws-cache'), extra: ['--max-batch', '8'] });
  });
  after(async () => {
    const r = await srv.stop();
    assert.equal(r.code, 0, `server exits 0 on SIGTERM, stderr: ${srv.stderr}`);
  });

  test('session defaults: dual cache; every mode accepted and echoed', async () => {
    const c = new Client(srv.wsUrl);
    const s = await c.session();
    assert.equal(s.defaults.cache, 'dual');
    assert.deepEqual([s.defaults.cache_refresh, s.defaults.prefix_look, s.defaults.after_look, s.defaults.warmup_steps],
      [0, 0, 0, 0]);
    const modes = [
      { cache: 'none' }, { cache: 'prefix', cache_refresh: 2 }, { cache: 'dual' },
      { cache: 'vicinity', prefix_look: 3, after_look: 4, warmup_steps: 1 },
    ];
    for (const [i, m] of modes.entries()) {
      c.send({ type: 'generate', id: `m${i}`, prompt_ids: [5, 6, 7], gen_length: 16, block_length: 8, steps: 8, ...m });
      const acc = await c.wait((x) => x.type === 'accepted' && x.id === `m${i}`);
      for (const [k, v] of Object.entries(m)) assert.equal(acc.params[k], v, `m${i}: ${k}`);
      assert.equal(acc.ignored, undefined, `m${i}: no field ignored`);
      const done = await c.done(`m${i}`);
      assert.equal(done.finish_reason, 'length');
      checkGeneration(assert, c.msgs, `m${i}`);
    }
    await c.close();
  });

  test('a cached request holds cache memory, none does not; cancel mid-block frees it at once', async () => {
    const base = await untilStats(srv, (st) => st.scheduler.active === 0, 'idle');
    assert.equal(base.kv_cache.slots, 0);
    assert.equal(base.kv_cache.bytes, 0);
    const c = new Client(srv.wsUrl);
    await c.session();
    // none: no slot opened
    c.send({ type: 'generate', id: 'n', prompt_ids: [1, 2, 3], gen_length: 16, block_length: 8, steps: 8, cache: 'none' });
    await c.done('n');
    let st = await srv.stats();
    assert.equal(st.kv_cache.opened, base.kv_cache.opened, 'cache none opens no slot');
    // a long dual generation: wait until it has run a few steps inside its first block
    c.send({ type: 'generate', id: 'long', prompt_ids: [1, 2, 3], gen_length: 256, block_length: 256, steps: 256,
      cache: 'dual', cfg_scale: 1 });
    await c.wait((m) => m.type === 'step' && m.id === 'long' && m.step >= 3, 'a few steps');
    st = await srv.stats();
    assert.equal(st.kv_cache.slots, 2, 'CFG: the canvas and the unconditional canvas each hold a cache');
    assert.ok(st.kv_cache.bytes > 0, 'the cache holds memory while it runs');
    c.send({ type: 'cancel', id: 'long' });
    const done = await c.done('long');
    assert.equal(done.finish_reason, 'cancelled');
    assert.ok(done.usage.steps < 256);
    // the engine closed the slots before it emitted done(cancelled): no polling needed
    st = await srv.stats();
    assert.equal(st.kv_cache.slots, 0, 'no slot left after the cancel');
    assert.equal(st.kv_cache.bytes, 0, 'no cache memory left after the cancel');
    assert.equal(st.kv_cache.freed, st.kv_cache.opened);
    assert.ok(st.kv_cache.peak_bytes > 0);
    await c.close();
  });

  test('different modes, prompts and block positions batched together == each alone', async () => {
    const S = { decoder: 'random', temperature: 1 };
    const reqs = [
      { prompt_ids: [3, 4], gen_length: 24, block_length: 8, steps: 12, cache: 'dual', seed: 1 },
      { prompt_ids: [9, 8, 7, 6, 5, 4, 3], gen_length: 16, block_length: 4, steps: 8, cache: 'prefix', cfg_scale: 1.5,
        seed: 2 },
      { prompt_ids: [11, 12, 13, 14], gen_length: 20, block_length: 8, steps: 10, cache: 'vicinity', prefix_look: 2,
        after_look: 5, warmup_steps: 2, seed: 3 },
      { prompt_ids: [2], gen_length: 16, block_length: 8, steps: 16, cache: 'none', seed: 4 },
      { prompt_ids: [20, 21, 22], gen_length: 16, block_length: 8, steps: 8, cache: 'dual', cache_refresh: 3, seed: 5 },
    ].map((r) => ({ ...S, ...r }));
    const c = new Client(srv.wsUrl);
    await c.session();
    const alone = [];
    for (const [i, r] of reqs.entries()) {
      c.send({ type: 'generate', id: `a${i}`, ...r });
      alone.push(await c.done(`a${i}`));
    }
    const before = await srv.stats();
    for (const [i, r] of reqs.entries()) c.send({ type: 'generate', id: `b${i}`, ...r });
    const batched = [];
    for (let i = 0; i < reqs.length; i++) batched.push(await c.done(`b${i}`));
    const st = await srv.stats();
    assert.ok(st.scheduler.max_batch_seen >= 2, 'requests were batched');
    assert.ok(st.scheduler.step_seqs - before.scheduler.step_seqs > st.scheduler.steps - before.scheduler.steps,
      'some steps advanced several sequences');
    for (let i = 0; i < reqs.length; i++) {
      const ca = c.of(`a${i}`).filter((m) => m.type === 'step').map((m) => m.commits.map((x) => [x.pos, x.id]));
      const cb = c.of(`b${i}`).filter((m) => m.type === 'step').map((m) => m.commits.map((x) => [x.pos, x.id]));
      assert.deepEqual(cb.flat(), ca.flat(), `request ${i}: the same commits batched as alone`);
      assert.equal(batched[i].text, alone[i].text, `request ${i}: text`);
      assert.equal(batched[i].usage.steps, alone[i].usage.steps, `request ${i}: steps`);
    }
    assert.equal(st.kv_cache.slots, 0);
    await c.close();
  });

  test('bad cache values: invalid_request naming the field, the connection stays usable', async () => {
    const c = new Client(srv.wsUrl);
    await c.session();
    const bad = [
      [{ cache: 'quad' }, 'cache', /none, prefix, dual, vicinity/],
      [{ cache: 7 }, 'cache', /none, prefix, dual, vicinity/],
      [{ prefix_look: -1 }, 'prefix_look', /between 0 and \d+.*got -1/],
      [{ after_look: -5, cache: 'vicinity' }, 'after_look', /got -5/],
      [{ cache_refresh: -1 }, 'cache_refresh', /got -1/],
      [{ warmup_steps: 'x' }, 'warmup_steps', /integer/],
      [{ params: { cache: 'sometimes' } }, 'params.cache', /none, prefix, dual, vicinity/],
    ];
    for (const [i, [body, param, msg]] of bad.entries()) {
      c.send({ type: 'generate', event_id: `e${i}`, prompt_ids: [1, 2], gen_length: 8, block_length: 8, ...body });
      const e = await c.wait((m) => m.type === 'error' && m.event_id === `e${i}`, `error for ${JSON.stringify(body)}`);
      assert.equal(e.error.code, 'invalid_request', JSON.stringify(body));
      assert.equal(e.error.param, param, JSON.stringify(body));
      assert.match(e.error.message, msg);
    }
    c.send({ type: 'generate', id: 'ok', prompt_ids: [1, 2], gen_length: 8, block_length: 8, cache: 'prefix' });
    assert.equal((await c.done('ok')).finish_reason, 'length');
    await c.close();
  });
});
