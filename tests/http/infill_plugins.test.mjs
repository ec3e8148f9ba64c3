// infill_plugins.test.mjs — the llama.cpp /infill fields llama.vim and llama.vscode send or read,
// on the bundled trained code model (models/unmask-code-13m, greedy unless said):
//   - t_max_predict_ms: past the deadline the block in progress is finished in ONE last step and the
//     generation ends there: fewer steps than without it, the active block complete (every position
//     a real token), stop_type "limit" (or "eos"), time_limited: true; a request batched beside it is
//     not affected; the same through /v1/completions (time_limit_ms) and streamed.
//   - n_cmpl: an array of that many completions (index 0..n-1), completion c the one a single request
//     with seed + c gives; bad values are a 400 naming n_cmpl.
//   - generation_settings.n_ctx (the context one request may fill: the model's, or --max-seq when
//     smaller) and tokens_cached / timings.cache_n (0: no cache across requests), as JSON integers.
// A 1 ms budget is always spent by the first step (a forward pass of the model), so which steps run
// does not depend on the machine's speed; nothing here asserts a duration.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startServer, post, parseSSE } from './server.mjs';
import { Client, checkGeneration } from '../protocol/harness.mjs';

const MODEL = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', '..', 'models', 'unmask-code-13m');
const CTX = JSON.parse(fs.readFileSync(path.join(MODEL, 'config.json'), 'utf8')).max_sequence_length;
const MAX_SEQ = 600;
let srv;
before(async () => {
  srv = await startServer(['--max-seq', String(MAX_SEQ)], { model: MODEL });
});
after(async () => {
  await srv?.stop();
});

// 3 blocks of 32; block_length stated so the test does not lean on the checkpoint's default
const BODY = {
  input_prefix: 'def fibonacci(n):\n    ',
  input_suffix: '\n\nfor i in range(10):\n    print(fibonacci(i))\n',
  n_predict: 96,
  block_length: 32,
  temperature: 0,
};

test('t_max_predict_ms: the block in progress is finished in one last step, and the stop is reported', async () => {
  const full = (await post(`${srv.url}/infill`, BODY)).json();
  assert.equal(full.time_limited, false);
  assert.ok(full.diffusion_steps > 2, `the unlimited run takes more than two steps (${full.diffusion_steps})`);
  const r = await post(`${srv.url}/infill`, { ...BODY, t_max_predict_ms: 1 });
  assert.equal(r.status, 200);
  const lim = r.json();
  assert.equal(lim.time_limited, true, 'the response says the time limit ended it');
  assert.ok(lim.diffusion_steps <= 2 && lim.diffusion_steps < full.diffusion_steps,
    `the first step, then at most one last step: ${lim.diffusion_steps} vs ${full.diffusion_steps}`);
  assert.equal(lim.generation_settings.time_limit_ms, 1);
  if (lim.stop_type === 'limit') {
    // no EOS: every position of the finished block is a real token (a position still masked is no token)
    assert.equal(lim.tokens_predicted, 32, 'one whole block, fully committed');
    assert.equal(lim.timings.predicted_n, 32);
  } else {
    assert.equal(lim.stop_type, 'eos', 'an EOS committed in that block ends it as a stop');
    assert.ok(lim.tokens_predicted < 32);
  }
  assert.ok(lim.content.length > 0 && !lim.content.includes('<|'), `committed text only: ${JSON.stringify(lim.content)}`);
  // a request batched beside a time-limited one decodes exactly as alone
  const [a, b] = await Promise.all([
    post(`${srv.url}/infill`, { ...BODY, t_max_predict_ms: 1 }),
    post(`${srv.url}/infill`, BODY),
  ]);
  assert.equal(b.json().content, full.content, 'the batch-mate without a limit is not affected');
  assert.equal(b.json().time_limited, false);
  assert.equal(a.json().content, lim.content, 'the limited run ends the same way');
  // streamed: the deltas add up to the same text, the final object says so
  const s = await post(`${srv.url}/infill`, { ...BODY, t_max_predict_ms: 1, stream: true });
  const recs = parseSSE(s.text).map((x) => JSON.parse(x.data));
  assert.equal(recs.at(-1).time_limited, true);
  assert.equal(recs.at(-1).stop_type, lim.stop_type);
  assert.equal(recs.slice(0, -1).map((x) => x.content).join(''), lim.content);
  // llama.cpp's "off" values, and out of range
  for (const off of [0, -1]) assert.equal((await post(`${srv.url}/infill`, { ...BODY, t_max_predict_ms: off })).json().content, full.content);
  const bad = await post(`${srv.url}/infill`, { ...BODY, t_max_predict_ms: 1e9 });
  assert.equal(bad.status, 400);
  assert.equal(bad.json().error.param, 't_max_predict_ms');
  assert.match(bad.json().error.message, /t_max_predict_ms must be between 0 \(off\) and 86400000/);
});

test('time_limit_ms is a decode parameter of every endpoint: /v1/completions with a suffix', async () => {
  const body = { prompt: BODY.input_prefix, suffix: BODY.input_suffix, max_tokens: 96, block_length: 32, temperature: 0 };
  const full = (await post(`${srv.url}/v1/completions`, body)).json();
  const lim = (await post(`${srv.url}/v1/completions`, { ...body, time_limit_ms: 1 })).json();
  assert.ok(lim.usage.diffusion_steps <= 2 && lim.usage.diffusion_steps < full.usage.diffusion_steps,
    `${lim.usage.diffusion_steps} vs ${full.usage.diffusion_steps} steps`);
  assert.ok(['length', 'stop'].includes(lim.choices[0].finish_reason));
  if (lim.choices[0].finish_reason === 'length') assert.equal(lim.usage.completion_tokens, 32);
});

test('time_limit_ms on the WebSocket: the done event says time_limited, the last block is whole', async () => {
  const c = new Client(`${srv.url.replace(/^http/, 'ws')}/ws`);
  await c.session();
  const gen = { type: 'generate', prompt: BODY.input_prefix, max_tokens: 96, block_length: 32, temperature: 0 };
  c.send({ ...gen, id: 'full' });
  c.send({ ...gen, id: 'lim', time_limit_ms: 1 });
  const full = await c.done('full');
  const lim = await c.done('lim');
  checkGeneration(assert, c.msgs, 'lim');
  assert.equal(full.time_limited, false);
  assert.equal(lim.time_limited, true);
  assert.ok(lim.usage.steps <= 2 && lim.usage.steps < full.usage.steps, `${lim.usage.steps} vs ${full.usage.steps} steps`);
  const blocks = c.of('lim').filter((m) => m.type === 'block');
  assert.deepEqual(blocks.map((b) => [b.start, b.end]), [[0, 32]], 'one block, finished');
  assert.equal(lim.usage.committed, 32, 'every position of it committed');
  assert.ok(['length', 'stop'].includes(lim.finish_reason));
  await c.close();
});

test('n_cmpl: an array of completions, completion c is the one seed + c gives', async () => {
  const body = { ...BODY, n_predict: 32, temperature: 0.9, seed: 7 };
  const r = await post(`${srv.url}/infill`, { ...body, n_cmpl: 3 });
  assert.equal(r.status, 200);
  const arr = r.json();
  assert.ok(Array.isArray(arr) && arr.length === 3, 'three results, as llama.cpp answers n_cmpl > 1');
  for (const [c, o] of arr.entries()) {
    assert.equal(o.index, c);
    assert.equal(o.stop, true);
    const one = (await post(`${srv.url}/infill`, { ...body, seed: 7 + c })).json();
    assert.ok(!Array.isArray(one), 'n_cmpl 1 (the default) answers one object');
    assert.equal(o.content, one.content, `completion ${c} = the single request with seed ${7 + c}`);
  }
  assert.ok(new Set(arr.map((o) => o.content)).size > 1, 'sampled alternatives differ');
  // llama.cpp's fallback name, and streaming: each completion's final object carries its index
  const s = await post(`${srv.url}/infill`, { ...body, n: 2, stream: true });
  const finals = parseSSE(s.text).map((x) => JSON.parse(x.data)).filter((o) => o.stop);
  assert.deepEqual(finals.map((o) => o.index).sort(), [0, 1]);
  for (const bad of [0, 17, 1.5, 'x']) {
    const e = await post(`${srv.url}/infill`, { ...body, n_cmpl: bad });
    assert.equal(e.status, 400, `n_cmpl ${JSON.stringify(bad)}`);
    assert.equal(e.json().error.param, 'n_cmpl');
  }
});

test('generation_settings.n_ctx and tokens_cached are integers llama.cpp clients can show', async () => {
  const SHORT = { ...BODY, n_predict: 16, block_length: 16 };
  const r = await post(`${srv.url}/infill`, SHORT);
  assert.equal(r.status, 200);
  const o = r.json();
  assert.equal(o.generation_settings.n_ctx, Math.min(CTX, MAX_SEQ), 'the context one request may fill here');
  assert.equal(o.tokens_cached, 0, 'no cache reused across requests (docs/http-api.md)');
  assert.equal(o.timings.cache_n, 0);
  assert.equal(o.diffusion_steps > 0, true);
  for (const k of ['n_ctx', 'tokens_cached', 'cache_n', 'diffusion_steps'])
    for (const m of r.text.matchAll(new RegExp(`"${k}":\\s*([^,}\\s]+)`, 'g'))) assert.match(m[1], /^\d+$/, `${k} is an integer: ${m[1]}`);
  // llama.vim asks for flattened fields
  const f = (await post(`${srv.url}/infill`, { ...SHORT, response_fields: ['generation_settings/n_ctx', 'tokens_cached'] })).json();
  assert.deepEqual(f, { 'generation_settings/n_ctx': Math.min(CTX, MAX_SEQ), tokens_cached: 0 });
  // the warm-up answers them too
  const w = (await post(`${srv.url}/infill`, { ...SHORT, n_predict: 0 })).json();
  assert.equal(w.generation_settings.n_ctx, Math.min(CTX, MAX_SEQ));
  assert.equal(w.tokens_cached, 0);
});
