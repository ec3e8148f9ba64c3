// params.test.mjs — one decode-parameter path for every transport: the WebSocket `generate`, the
// OpenAI / SGLang / llama.cpp HTTP routes and `unmask generate` accept the same names (and the
// APIs' aliases), settle an unset block length to a short generation's length, apply the same
// ranges with the same messages, and report the first invalid parameter. Also: the effective
// settings are what the responses report (/infill generation_settings, SGLang streaming
// meta_info.diffusion_steps from the first chunk, block events' block_steps).

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { parseSSE, post } from '../http/server.mjs';
import { BIN, Client, TMP, checkGeneration, startServer, tinyModel } from './harness.mjs';

describe('decode parameters: one path for every transport', () => {
  let srv;
  let model;
  let c;
  before(async () => {
    model = tinyModel('params');
    srv = await startServer({ model });
    c = new Client(srv.wsUrl);
    await c.session();
  });
  after(async () => {
    if (c) await c.close();
    if (srv) await srv.stop();
  });

  // the error each transport gives for the same decode fields (message + the field it names)
  async function wsError(fields) {
    const ev = `e${Math.random().toString(36).slice(2)}`;
    c.send({ type: 'generate', event_id: ev, prompt: 'a', ...fields });
    const m = await c.wait((x) => x.event_id === ev && (x.type === 'error' || x.type === 'accepted'), `answer to ${ev}`);
    assert.equal(m.type, 'error', `WebSocket accepted ${JSON.stringify(fields)}`);
    return { message: m.error.message, param: m.error.param };
  }
  async function httpError(route, body) {
    const r = await post(`${srv.base}${route}`, body);
    assert.equal(r.status, 400, `${route} ${JSON.stringify(body)}: ${r.text}`);
    const e = r.json().error;
    return { message: e.message, param: e.param };
  }
  function cliError(flags) {
    const r = spawnSync(BIN, ['generate', '--model', model, '--prompt', 'a', '--threads', '1', ...flags], { encoding: 'utf8' });
    assert.equal(r.status, 2, `CLI ${flags.join(' ')}: ${r.stderr}`);
    return r.stderr.trim().replace(/^error: /, '');
  }

  test('a short generation without block_length is one block of its length, everywhere', async () => {
    c.send({ type: 'generate', id: 'short', prompt: 'a', max_tokens: 10 });
    const acc = await c.wait((m) => m.id === 'short' && (m.type === 'accepted' || m.type === 'error'), 'short accepted');
    assert.equal(acc.type, 'accepted', JSON.stringify(acc));
    assert.equal(acc.params.gen_length, 10);
    assert.equal(acc.params.block_length, 10);
    await c.done('short');
    const blocks = c.of('short').filter((m) => m.type === 'block');
    assert.deepEqual(blocks.map((b) => [b.start, b.end]), [[0, 10]]);
    checkGeneration(assert, c.msgs, 'short');
    // an explicit block length is still checked, not settled
    const e = await wsError({ gen_length: 8, block_length: 9 });
    assert.equal(e.param, 'block_length');
    assert.match(e.message, /^block_length must be between 1 and 8 \(gen_length\), got 9$/);
    // /infill reports the block length it used
    const inf = await post(`${srv.base}/infill`, { input_prefix: 'a', input_suffix: 'b', n_predict: 16 });
    assert.equal(inf.status, 200, inf.text);
    assert.equal(inf.json().generation_settings.block_length, 16);
    assert.equal(inf.json().generation_settings.gen_length, 16);
    // the CLI
    const r = spawnSync(BIN, ['generate', '--model', model, '--prompt', 'a', '--gen-length', '12', '--json', '--threads', '1'],
      { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    const cliBlocks = r.stdout.trim().split('\n').map((l) => JSON.parse(l)).filter((m) => m.type === 'block');
    assert.deepEqual(cliBlocks.map((b) => [b.start, b.end]), [[0, 12]]);
  });

  test('the same range and message for temperature on every transport', async () => {
    const want = 'temperature must be between 0 and 2, got 3';
    assert.deepEqual(await wsError({ temperature: 3 }), { message: want, param: 'temperature' });
    assert.deepEqual(await httpError('/v1/completions', { prompt: 'a', max_tokens: 8, temperature: 3 }),
      { message: want, param: 'temperature' });
    assert.deepEqual(await httpError('/v1/chat/completions', { messages: [{ role: 'user', content: 'a' }], temperature: 3 }),
      { message: want, param: 'temperature' });
    assert.deepEqual(await httpError('/generate', { text: 'a', sampling_params: { temperature: 3 } }),
      { message: want, param: 'sampling_params.temperature' });
    assert.deepEqual(await httpError('/infill', { input_prefix: 'a', temperature: 3 }), { message: want, param: 'temperature' });
    assert.equal(cliError(['--temperature', '3']), want);
    // inside the range: accepted by the WebSocket and HTTP alike
    c.send({ type: 'generate', id: 'warm', prompt: 'a', max_tokens: 4, temperature: 1.5, seed: 3 });
    const acc = await c.wait((m) => m.id === 'warm' && (m.type === 'accepted' || m.type === 'error'), 'warm accepted');
    assert.equal(acc.type, 'accepted', JSON.stringify(acc));
    await c.done('warm');
    const ok = await post(`${srv.base}/v1/completions`, { prompt: 'a', max_tokens: 4, temperature: 1.5, seed: 3 });
    assert.equal(ok.status, 200, ok.text);
  });

  test('lengths, steps and model-free ranges: the CLI gives the servers\' message', async () => {
    // request limits (defaults: a length 1 ... 8192, steps 0 ... 1024) before the model's context,
    // then the model-free ranges, in the same order and words on every transport
    const cases = [
      [{ gen_length: 0 }, ['--gen-length', '0']],
      [{ gen_length: 9000 }, ['--gen-length', '9000']],
      [{ gen_length: 8, steps: 2000 }, ['--gen-length', '8', '--steps', '2000']],
      [{ gen_length: 8, block_length: 0 }, ['--gen-length', '8', '--block-length', '0']],
      [{ gen_length: 8, top_k: -2 }, ['--gen-length', '8', '--top-k', '-2']],
    ];
    for (const [body, flags] of cases) {
      const ws = await wsError(body);
      const http = await httpError('/v1/completions', { prompt: 'a', ...body });
      assert.deepEqual(http, ws, `${JSON.stringify(body)}: HTTP = WebSocket`);
      assert.equal(cliError(flags), ws.message, `${flags.join(' ')}: CLI = servers`);
    }
  });

  test('the first invalid parameter is the one reported', async () => {
    const want = 'temperature must be between 0 and 2, got -1';
    assert.deepEqual(await wsError({ gen_length: 8, temperature: -1 }), { message: want, param: 'temperature' });
    assert.deepEqual(await httpError('/v1/completions', { prompt: 'a', max_tokens: 8, temperature: -1 }),
      { message: want, param: 'temperature' });
    assert.equal(cliError(['--gen-length', '8', '--temperature', '-1']), want);
  });

  test("the APIs' aliases work on the WebSocket, and errors use the name the client sent", async () => {
    c.send({ type: 'generate', id: 'alias', prompt: 'a', max_completion_tokens: 8, block_size: 4, diffusion_steps: 4,
      decoder: 'low_confidence', top_k: -1, stop_at_eos: false });
    const acc = await c.wait((m) => m.id === 'alias' && (m.type === 'accepted' || m.type === 'error'), 'alias accepted');
    assert.equal(acc.type, 'accepted', JSON.stringify(acc));
    assert.equal(acc.params.gen_length, 8);
    assert.equal(acc.params.block_length, 4);
    assert.equal(acc.params.steps, 4);
    assert.equal(acc.params.top_k, 0);
    assert.deepEqual(acc.ignored_fields ?? [], []);
    await c.done('alias');
    // block events: steps is cumulative, block_steps this block's own
    const blocks = c.of('alias').filter((m) => m.type === 'block');
    assert.deepEqual(blocks.map((b) => b.block_steps), [2, 2]);
    assert.deepEqual(blocks.map((b) => b.steps), [2, 4]);
    const e = await wsError({ max_tokens: 8, block_size: 4, diffusion_steps: 1 });
    assert.equal(e.param, 'diffusion_steps');
    assert.match(e.message, /^diffusion_steps must be between 2 \(one per block: max_tokens 8 \/ block_size 4\)/);
    const h = await httpError('/v1/completions', { prompt: 'a', max_tokens: 8, block_size: 4, diffusion_steps: 1 });
    assert.deepEqual(h, e);
  });

  test('SGLang streaming reports the steps so far from the first chunk', async () => {
    const r = await post(`${srv.base}/generate`, { text: 'a', stream: true, sampling_params: { max_new_tokens: 16, block_size: 4 } });
    assert.equal(r.status, 200, r.text);
    const chunks = parseSSE(r.text).map((x) => x.data).filter((d) => d !== '[DONE]').map((d) => JSON.parse(d));
    assert.ok(chunks.length >= 2, `several chunks: ${chunks.length}`);
    const steps = chunks.map((ch) => ch.meta_info.diffusion_steps);
    assert.ok(steps[0] >= 1, `first chunk reports its steps: ${steps}`);
    for (let i = 1; i < steps.length; i++) assert.ok(steps[i] >= steps[i - 1], `non-decreasing: ${steps}`);
  });
});

describe('GET /v1/generations/{id}/trace', () => {
  let srv;
  const KEY_A = 'sk-trace-a';
  const KEY_B = 'sk-trace-b';
  before(async () => {
    const keys = path.join(TMP, 'params-trace-keys.txt');
    fs.writeFileSync(keys, `${KEY_A}\n${KEY_B}\n`);
    srv = await startServer({ model: tinyModel('params'), extra: ['--api-keys', keys, '--session-retention', '0'] });
  });
  after(async () => {
    if (srv) await srv.stop();
  });
  const get = (p, key) => fetch(`${srv.base}${p}`, { headers: key ? { authorization: `Bearer ${key}` } : {} });

  test('the trace of a WebSocket generation equals the events the client received, for its caller only', async () => {
    const c = new Client(srv.wsUrl, { headers: { authorization: `Bearer ${KEY_A}` } });
    await c.session();
    c.send({ type: 'generate', id: 'tr', prompt: 'def f(x):', gen_length: 12, block_length: 4, steps: 12, stop_at_eos: false,
      drafts: true });
    const acc = await c.wait((m) => m.id === 'tr' && (m.type === 'accepted' || m.type === 'error'), 'accepted');
    assert.equal(acc.type, 'accepted', JSON.stringify(acc));
    assert.match(acc.trace_id, /^gen_[0-9a-f]{24}$/);
    await c.done('tr');
    const got = c.of('tr').filter((m) => ['step', 'block', 'done'].includes(m.type));
    const url = `/v1/generations/${acc.trace_id}/trace`;
    const res = await get(url, KEY_A);
    assert.equal(res.status, 200);
    const tr = await res.json();
    assert.equal(tr.object, 'generation.trace');
    assert.equal(tr.id, acc.trace_id);
    assert.equal(tr.generation, 'tr');
    assert.equal(tr.complete, true);
    assert.deepEqual(tr.params, acc.params);
    // every step once, in order, then the blocks and done: the client's events (frames a slow reader
    // gets merged are one event on the wire; the trace keeps each step)
    assert.deepEqual(tr.events.filter((e) => e.type === 'step').map((e) => e.step), [...Array(12).keys()]);
    const strip = ({ seq, merged, ...rest }) => rest;
    if (!got.some((m) => m.merged)) assert.deepEqual(tr.events.map(strip), got.map(strip));
    assert.deepEqual(tr.events.filter((e) => e.type !== 'step').map(strip), got.filter((e) => e.type !== 'step').map(strip));
    // another caller, no key, unknown ids, malformed paths: not found / unauthorized
    assert.equal((await get(url, KEY_B)).status, 404);
    assert.equal((await get(url)).status, 401);
    for (const p of ['/v1/generations/gen_000000000000000000000000/trace', `/v1/generations/${acc.trace_id}`,
      `${url}/x`]) assert.equal((await get(p, KEY_A)).status, 404, p);
    // the trace goes with its session (retention 0: as soon as the connection is gone)
    await c.close();
    const t0 = Date.now();
    while ((await get(url, KEY_A)).status !== 404) {
      assert.ok(Date.now() - t0 < 30000, 'trace still there 30 s after its session ended');
      await new Promise((r) => setTimeout(r, 50));
    }
  });
});
