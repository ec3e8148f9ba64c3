// ws_moe.test.mjs — the MoE family served over the WebSocket protocol: an LLaDA2 checkpoint
// (make-model --preset llada2-tiny: block-causal, aligned blocks, the exact block KV cache the
// server uses by default) reports its family and aligned layout, its served commits with the cache
// equal `unmask generate --json` without one on the same prompt ids, block events sit on absolute
// 32-aligned boundaries; token editing and hierarchy_block (sub-blocks in order; served with the
// cache == the CLI without) run over the WebSocket and HTTP; an LLaDA-MoE checkpoint (lladamoe-tiny)
// generates end to end and batched requests equal each alone.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { parseSSE, post } from '../http/server.mjs';
import { BIN, Client, TMP, checkGeneration, makeModelOnce, startServer } from './harness.mjs';

const commitsOf = (msgs) => msgs.filter((m) => m.type === 'step').flatMap((m) => m.commits.map((x) => [x.pos, x.id]));

describe('ws LLaDA2 (block diffusion)', () => {
  let srv, model;
  before(async () => {
    model = makeModelOnce(path.join(TMP, 'model-ws-llada2'), ['--preset', 'llada2-tiny']);
    srv = await startServer({ model, extra: ['--max-batch', '4'] });
  });
  after(async () => {
    await srv.stop();
  });

  test('family, aligned blocks, served commits with the block KV cache == the CLI without cache', async () => {
    const c = new Client(srv.wsUrl);
    const s = await c.session();
    assert.equal(s.model.family, 'llada2');
    assert.equal(s.defaults.block_layout, 'aligned');
    const ids = [101, 202, 303, 404, 505, 606, 707];
    c.send({ type: 'generate', id: 'g', prompt_ids: ids, gen_length: 40, decoder: 'threshold', threshold: 0.5,
      steps_per_block: 4, stop_at_eos: false });
    const acc = await c.wait((m) => m.id === 'g' && (m.type === 'accepted' || m.type === 'error'), 'accepted');
    assert.equal(acc.type, 'accepted', JSON.stringify(acc));
    assert.notEqual(acc.params.cache, 'none', 'the server decodes with a cache by default');
    await c.done('g');
    checkGeneration(assert, c.msgs, 'g');
    // blocks of 32 aligned to absolute position 0: generated-region boundaries are 32k - prompt
    for (const b of c.of('g').filter((m) => m.type === 'block')) {
      assert.equal((b.start + ids.length) % 32 === 0 || b.start === 0, true, `block start ${b.start}`);
    }
    const r = spawnSync(BIN, ['generate', '--model', model, '--prompt-ids', ids.join(','), '--json', '--gen-length', '40',
      '--decoder', 'threshold', '--threshold', '0.5', '--steps-per-block', '4', '--no-stop-at-eos', '--cache', 'none',
      '--threads', '2'], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    const cli = r.stdout.split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l));
    assert.deepEqual(commitsOf(c.of('g')), commitsOf(cli), 'exact block KV through the server == no cache');
    await c.close();
  });
});

describe('token editing (joint_threshold) over the WebSocket and HTTP', () => {
  let srv, model;
  before(async () => {
    model = makeModelOnce(path.join(TMP, 'model-ws-llada2'), ['--preset', 'llada2-tiny']);
    srv = await startServer({ model });
  });
  after(async () => {
    await srv.stop();
  });

  test('revised commits are marked; the final text is the blocks\' text; the OpenAI stream stays append-only', async () => {
    const c = new Client(srv.wsUrl);
    await c.session();
    const req = { prompt: 'def f(x):', gen_length: 40, decoder: 'joint_threshold', threshold: 0.5, edit_threshold: 0,
      max_post_steps: 4, stop_at_eos: false };
    c.send({ type: 'generate', id: 'jt', ...req });
    const acc = await c.wait((m) => m.id === 'jt' && (m.type === 'accepted' || m.type === 'error'), 'accepted');
    assert.equal(acc.type, 'accepted', JSON.stringify(acc));
    assert.equal(acc.params.decoder, 'joint_threshold');
    await c.done('jt');
    checkGeneration(assert, c.msgs, 'jt'); // block texts concatenate to done.text
    const revised = c.of('jt').filter((m) => m.type === 'step').flatMap((m) => m.commits).filter((x) => x.revised);
    assert.ok(revised.length > 0, 'a random model with edit_threshold 0 edits');
    for (const r of revised) assert.equal(typeof r.previous, 'number');
    await c.close();
    // the same request streamed over /v1/completions: the deltas concatenate to the final text,
    // which is the non-streamed answer's (text is only sent from finished blocks)
    const body = { prompt: 'def f(x):', max_tokens: 40, decoder: 'JointThreshold', threshold: 0.5, edit_threshold: 0,
      max_post_steps: 4, stop_at_eos: false };
    const plain = await post(`${srv.base}/v1/completions`, body);
    assert.equal(plain.status, 200, plain.text);
    const streamed = await post(`${srv.base}/v1/completions`, { ...body, stream: true });
    const deltas = parseSSE(streamed.text).map((x) => x.data).filter((d) => d !== '[DONE]').map((d) => JSON.parse(d));
    assert.equal(deltas.map((d) => d.choices[0].text).join(''), plain.json().choices[0].text);
  });
});

describe('hierarchy_block (Fast-dLLM v2 sub-blocks) over the WebSocket and HTTP', () => {
  let srv, model;
  before(async () => {
    model = makeModelOnce(path.join(TMP, 'model-ws-llada2'), ['--preset', 'llada2-tiny']);
    srv = await startServer({ model });
  });
  after(async () => {
    await srv.stop();
  });

  test('served with the block KV cache == the CLI without; each step commits inside one sub-block, in order', async () => {
    const c = new Client(srv.wsUrl);
    await c.session();
    const ids = [11, 22, 33, 44, 55, 66, 77, 88, 99, 111];
    const sub = 4;
    c.send({ type: 'generate', id: 'hb', prompt_ids: ids, gen_length: 40, decoder: 'hierarchy_block', sub_block_length: sub,
      threshold: 0.3, stop_at_eos: false });
    const acc = await c.wait((m) => m.id === 'hb' && (m.type === 'accepted' || m.type === 'error'), 'accepted');
    assert.equal(acc.type, 'accepted', JSON.stringify(acc));
    assert.equal(acc.params.decoder, 'hierarchy_block');
    assert.equal(acc.params.sub_block_length, sub);
    assert.equal(acc.params.token_shift, 1);
    assert.notEqual(acc.params.cache, 'none');
    await c.done('hb');
    checkGeneration(assert, c.msgs, 'hb');
    // sub-blocks of 4 counted from the aligned (32) block start: every step writes into one of them,
    // and inside a block they are visited in order (frames that merged several steps are skipped)
    let last = -1, lastBlock = -1, checked = 0;
    for (const m of c.of('hb').filter((x) => x.type === 'step' && x.commits.length && !(x.merged > 1))) {
      checked++;
      const subs = new Set(m.commits.map((x) => Math.floor((x.pos % 32) / sub)));
      assert.equal(subs.size, 1, `step ${m.step} writes into one sub-block: ${JSON.stringify(m.commits.map((x) => x.pos))}`);
      const k = [...subs][0];
      if (m.block !== lastBlock) last = -1, lastBlock = m.block;
      assert.ok(k >= last, `step ${m.step}: sub-block ${k} after ${last}`);
      last = k;
    }
    assert.ok(checked > 0, 'some unmerged step frames');
    const r = spawnSync(BIN, ['generate', '--model', model, '--prompt-ids', ids.join(','), '--json', '--gen-length', '40',
      '--decoder', 'hierarchy_block', '--sub-block-length', String(sub), '--threshold', '0.3', '--no-stop-at-eos',
      '--cache', 'none', '--threads', '2'], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    const cli = r.stdout.split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l));
    assert.deepEqual(commitsOf(c.of('hb')), commitsOf(cli), 'served (exact block KV) == CLI (no cache)');
    await c.close();
  });

  test('HTTP: SGLang names (HierarchyBlock, sub_block_size); streamed == plain; errors name the alias', async () => {
    const body = { prompt: 'def f(x):', max_tokens: 40, decoder: 'HierarchyBlock', sub_block_size: 8, threshold: 0.5,
      stop_at_eos: false };
    const plain = await post(`${srv.base}/v1/completions`, body);
    assert.equal(plain.status, 200, plain.text);
    assert.equal(plain.json().usage.completion_tokens, 40);
    const streamed = await post(`${srv.base}/v1/completions`, { ...body, stream: true });
    const deltas = parseSSE(streamed.text).map((x) => x.data).filter((d) => d !== '[DONE]').map((d) => JSON.parse(d));
    assert.equal(deltas.map((d) => d.choices[0].text).join(''), plain.json().choices[0].text);
    const bad = await post(`${srv.base}/v1/completions`, { ...body, sub_block_size: 0 });
    assert.equal(bad.status, 400, bad.text);
    assert.equal(bad.json().error.param, 'sub_block_size');
    assert.match(bad.json().error.message, /^sub_block_size must be/);
  });
});

describe('ws LLaDA-MoE', () => {
  let srv, model;
  before(async () => {
    model = makeModelOnce(path.join(TMP, 'model-ws-lladamoe'), ['--preset', 'lladamoe-tiny']);
    srv = await startServer({ model, extra: ['--max-batch', '4'] });
  });
  after(async () => {
    await srv.stop();
  });

  test('generates end to end; batched == alone', async () => {
    const c = new Client(srv.wsUrl);
    const s = await c.session();
    assert.equal(s.model.family, 'llada-moe');
    const reqs = [[7, 8, 9], [40, 41, 42, 43], [3]].map((p, i) => ({ prompt_ids: p, gen_length: 16, block_length: 8,
      steps: 8, cache: 'none', stop_at_eos: false, seed: i }));
    for (const [i, r] of reqs.entries()) {
      c.send({ type: 'generate', id: `a${i}`, ...r });
      await c.done(`a${i}`);
    }
    for (const [i, r] of reqs.entries()) c.send({ type: 'generate', id: `b${i}`, ...r });
    for (let i = 0; i < reqs.length; i++) {
      const d = await c.done(`b${i}`);
      checkGeneration(assert, c.msgs, `b${i}`);
      assert.equal(d.usage.committed, 16);
      assert.deepEqual(commitsOf(c.of(`b${i}`)), commitsOf(c.of(`a${i}`)), `request ${i}: same commits batched`);
    }
    await c.close();
  });
});
