// tp_serve.test.mjs — `unmask serve --tp N` (tensor parallel on CPU threads, docs/parallel.md)
// answers real clients (ws, openai) with the same tokens as --tp 1 at temperature 0 (also as 2
// replicas of TP 2: --engines 2 --tp 2), and --max-seq
// refuses requests over it on HTTP and WebSocket with context_length_exceeded.
//
// Why token equality is a sound assertion here: TP sums the attention-out / MLP-down partial
// products in a different order, so logits differ from --tp 1 by float rounding (~1e-7 relative).
// The requests decode each block in ONE step (steps = number of blocks), so every forward's canvas
// is known from the answer alone: prompt + the tokens of earlier blocks + masks. For each of those
// canvases the test runs `unmask logits` with --tp 1, 2 and 4 and asserts (a) the server's tokens
// are the argmax of the --tp 1 logits (the reconstruction is right), (b) |logits(tp) - logits(tp1)|
// is tiny, and (c) every chosen token wins by a top-1/top-2 gap over 100x that difference — so
// identical answers follow from the numerics, not from luck. Everything runs on the fp32 CPU kernels
// (--cpu-kernels fp32): with bf16 activations a rounding difference in one partial sum can move a
// later bf16 cast by a whole bf16 step, which is legitimate but not the ~1e-7 this test is about.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import OpenAI from 'openai';
import { BIN, Client, TMP, checkGeneration, readNpy, startServer, tinyModel } from '../protocol/harness.mjs';

const MODEL = tinyModel('tp-serve');
const CFG = JSON.parse(fs.readFileSync(path.join(MODEL, 'config.json'), 'utf8'));
const V = CFG.embedding_size;
const MASK = CFG.mask_token_id;
const PROMPT = [17, 230, 45, 99, 512, 7, 1000, 64];
const GEN = 16;
const BLOCK = 8;
const PARAMS = {
  gen_length: GEN, block_length: BLOCK, steps: GEN / BLOCK, temperature: 0, decoder: 'low_confidence',
  stop_at_eos: false, logits_eos_inf: false, confidence_eos_eot_inf: false,
};

function logits(tokens, positions, tp) {
  const out = path.join(TMP, `tp-serve-logits-${tp}-${process.pid}.npy`);
  const r = spawnSync(BIN, ['logits', '--model', MODEL, '--tokens', tokens.join(','), '--positions', positions.join(','),
    '--out', out, '--threads', '2', '--tp', String(tp), '--cpu-kernels', 'fp32'], { encoding: 'utf8' });
  assert.equal(r.status, 0, `logits --tp ${tp}: ${r.stderr}`);
  return readNpy(out).data;
}

function post(base, p, body) {
  return new Promise((resolve, reject) => {
    const data = JSON.stringify(body);
    const req = http.request(`${base}${p}`, {
      method: 'POST', agent: false,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) },
    }, (res) => {
      let t = '';
      res.setEncoding('utf8');
      res.on('data', (d) => (t += d));
      res.on('end', () => resolve({ status: res.statusCode, body: JSON.parse(t) }));
    });
    req.on('error', reject);
    req.end(data);
  });
}

async function wsGenerate(srv, id, body) {
  const c = new Client(srv.wsUrl);
  await c.session();
  c.send({ type: 'generate', event_id: `e-${id}`, id, ...body });
  const first = await c.wait((m) => m.event_id === `e-${id}` && (m.type === 'accepted' || m.type === 'error'), `reply to ${id}`);
  if (first.type === 'error') {
    await c.close();
    return { error: first.error };
  }
  await c.done(id);
  const done = checkGeneration(assert, c.msgs, id);
  // the generated ids in canvas order, from the step commits
  const ids = new Array(GEN).fill(-1);
  for (const m of c.of(id)) if (m.type === 'step') for (const k of m.commits) ids[k.index] = k.id;
  await c.close();
  return { done, ids };
}

describe('serve --tp: same answers as --tp 1', () => {
  const servers = {};
  before(async () => {
    for (const tp of [1, 2, 4]) servers[tp] = await startServer({ model: MODEL, name: `tp${tp}`, extra: ['--tp', String(tp), '--cpu-kernels', 'fp32'] });
    // 2 data-parallel replicas of TP 2 on the CPU
    servers.r2 = await startServer({ model: MODEL, name: 'r2tp2', extra: ['--engines', '2', '--tp', '2', '--cpu-kernels', 'fp32'] });
  });
  after(async () => {
    for (const srv of Object.values(servers)) {
      const r = await srv.stop();
      assert.equal(r.code, 0, `clean exit; stderr: ${srv.stderr}`);
    }
  });

  test('/stats shows the topology', async () => {
    for (const tp of [1, 2, 4]) {
      const st = await servers[tp].stats();
      assert.deepEqual(st.topology, { devices: 'cpu', replicas: 1, tp, nnodes: 1, max_seq: CFG.max_sequence_length });
    }
    const r2 = await servers.r2.stats();
    assert.deepEqual(r2.topology, { devices: 'cpu', replicas: 2, tp: 2, nnodes: 1, max_seq: CFG.max_sequence_length });
    assert.equal(r2.scheduler.engines, 2);
    // CPU engines (tensor-parallel or not) never run the device-resident loop: /stats must not
    // claim it is on, even though --device-loop defaults to on
    for (const srv of Object.values(servers)) {
      assert.deepEqual((await srv.stats()).device_loop,
        { enabled: false, steps: 0, rebuilds: 0, graph_captures: 0, graph_replays: 0 });
    }
  });

  test('WebSocket and OpenAI answers are identical across --tp 1/2/4, with margins that make it so', async () => {
    const res = {};
    for (const tp of [1, 2, 4, 'r2']) res[tp] = await wsGenerate(servers[tp], `g${tp}`, { prompt_ids: PROMPT, ...PARAMS });
    for (const tp of [1, 2, 4]) {
      assert.ok(!res[tp].error, `tp ${tp}: ${JSON.stringify(res[tp].error)}`);
      assert.ok(res[tp].ids.every((t) => t >= 0), `tp ${tp}: every position committed`);
    }
    // margins: one forward per block, canvases rebuilt from the answer
    const ref = res[1].ids;
    let maxDiff = 0, minGap = Infinity, maxAbs = 0;
    const n = PROMPT.length + GEN;
    for (let b = 0; b < GEN / BLOCK; b++) {
      const canvas = [...PROMPT, ...ref.slice(0, b * BLOCK), ...new Array(GEN - b * BLOCK).fill(MASK)];
      assert.equal(canvas.length, n);
      const rows = Array.from({ length: BLOCK }, (_, j) => PROMPT.length + b * BLOCK + j);
      const l1 = logits(canvas, rows, 1);
      for (const tp of [2, 4]) {
        const lt = logits(canvas, rows, tp);
        for (let i = 0; i < l1.length; i++) maxDiff = Math.max(maxDiff, Math.abs(lt[i] - l1[i]));
      }
      for (let j = 0; j < BLOCK; j++) {
        const row = l1.subarray(j * V, (j + 1) * V);
        let top = 0;
        for (let v = 1; v < V; v++) if (row[v] > row[top]) top = v;
        let second = -Infinity;
        for (let v = 0; v < V; v++) if (v !== top) second = Math.max(second, row[v]);
        for (let v = 0; v < V; v++) maxAbs = Math.max(maxAbs, Math.abs(row[v]));
        assert.equal(ref[b * BLOCK + j], top, `block ${b} position ${j}: the --tp 1 server chose the argmax of the forward`);
        minGap = Math.min(minGap, row[top] - second);
      }
    }
    console.log(`tp logits: max |diff| ${maxDiff.toExponential(2)} (max |logit| ${maxAbs.toFixed(2)}), smallest top-1/top-2 gap ${minGap.toExponential(2)}`);
    assert.ok(maxDiff <= 1e-5 * maxAbs, `TP logits within 1e-5 of --tp 1 (max diff ${maxDiff})`);
    assert.ok(minGap > 100 * maxDiff && minGap > 1e-3, `no near-tie: gap ${minGap} vs diff ${maxDiff}`);
    for (const tp of [2, 4, 'r2']) {
      assert.deepEqual(res[tp].ids, ref, `tp ${tp}: same tokens as tp 1`);
      assert.equal(res[tp].done.text, res[1].done.text, `tp ${tp}: same text as tp 1`);
    }
    // the OpenAI client on the same canvas (prompt as token ids) gets the same text from every server
    for (const tp of [1, 2, 4]) {
      const client = new OpenAI({ baseURL: `${servers[tp].base}/v1`, apiKey: 'unused', maxRetries: 0 });
      const r = await client.completions.create({
        model: 'tiny', prompt: PROMPT, max_tokens: GEN, temperature: 0,
        // unmask's extra decode fields (docs/http-api.md)
        block_length: BLOCK, steps: GEN / BLOCK, stop_at_eos: false,
      });
      assert.equal(r.choices[0].text, res[1].done.text, `openai on tp ${tp}: same text as the WebSocket answer`);
    }
  });

  test('concurrent requests of different lengths on one TP server all finish', async () => {
    const srv = servers[2];
    const jobs = [4, 8, 24].map((g, i) => wsGenerate(srv, `c${i}`, { prompt_ids: PROMPT.slice(0, 3 + i), gen_length: g, block_length: 4, steps: g, temperature: 0.7, seed: i }));
    for (const r of await Promise.all(jobs)) assert.ok(!r.error && r.done.finish_reason, JSON.stringify(r.error));
  });
});

describe('serve --max-seq', () => {
  let srv;
  before(async () => {
    srv = await startServer({ model: MODEL, name: 'maxseq', extra: ['--tp', '2', '--max-seq', '64'] });
  });
  after(async () => {
    const r = await srv.stop();
    assert.equal(r.code, 0, `clean exit; stderr: ${srv.stderr}`);
  });

  test('WebSocket: prompt + gen_length over --max-seq is context_length_exceeded; at the limit it runs', async () => {
    const bad = await wsGenerate(srv, 'over', { prompt_ids: PROMPT, gen_length: 57, block_length: 57, steps: 1 });
    assert.equal(bad.error.code, 'context_length_exceeded');
    assert.equal(bad.error.message, "the prompt (8 tokens) + gen_length (57) = 65 tokens, more than this server's --max-seq of 64");
    const ok = await wsGenerate(srv, 'at', { prompt_ids: PROMPT, gen_length: 56, block_length: 8, steps: 7, temperature: 0 });
    assert.ok(!ok.error, JSON.stringify(ok.error));
    assert.equal(ok.done.finish_reason === 'length' || ok.done.finish_reason === 'stop', true);
    assert.equal((await srv.stats()).topology.max_seq, 64);
  });

  test('HTTP: the OpenAI and SGLang routes refuse the same with 400', async () => {
    const r = await post(srv.base, '/v1/completions', { prompt: PROMPT, max_tokens: 60 });
    assert.equal(r.status, 400);
    assert.equal(r.body.error.code, 'context_length_exceeded');
    assert.equal(r.body.error.message, "the prompt (8 tokens) + gen_length (60) = 68 tokens, more than this server's --max-seq of 64");
    const client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0 });
    await assert.rejects(client.completions.create({ model: 'tiny', prompt: PROMPT, max_tokens: 100 }),
      (e) => e.status === 400 && /--max-seq of 64/.test(e.message));
    const s = await post(srv.base, '/generate', { input_ids: PROMPT, sampling_params: { max_new_tokens: 57 } });
    assert.equal(s.status, 400);
    assert.match(JSON.stringify(s.body), /--max-seq of 64/);
    // with a suffix (infilling) the suffix counts too
    const f = await post(srv.base, '/v1/completions', { prompt: 'def f(x):', suffix: '    return y', max_tokens: 60 });
    assert.equal(f.status, 400);
    assert.equal(f.body.error.code, 'context_length_exceeded');
    assert.match(f.body.error.message, /^the prompt \(\d+ tokens\) \+ gen_length \(60\) \+ suffix \(\d+ tokens\) = \d+ tokens, more than this server's --max-seq of 64$/);
    const ok = await post(srv.base, '/v1/completions', { prompt: PROMPT, max_tokens: 56, temperature: 0, block_length: 8, steps: 7 });
    assert.equal(ok.status, 200, JSON.stringify(ok.body));
  });
});
