// decoder_fields.test.mjs — which decode parameters each decoder reads, from the one parameter
// table: session.created.decoder_fields maps every decoder to the parameters it reads on the
// served model (a block-diffusion model's threshold decoder reads steps; a LLaDA model's does not),
// and a parameter the request set that its decoder does not read is reported like any ignored
// field — WebSocket accepted.ignored_fields, the HTTP APIs' x-unmask-ignored-fields header
// (streaming or not, and POST /v1/jobs' 202), in the name the client used.

import assert from 'node:assert/strict';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Client, TMP, makeModelOnce, postJson, startServer, tinyModel } from './harness.mjs';

const DECODERS = ['low_confidence', 'random', 'threshold', 'factor', 'hierarchy', 'credit', 'origin', 'maskgit_plus',
  'topk_margin', 'entropy', 'joint_threshold', 'hierarchy_block'];

describe('decoder fields on a LLaDA model', () => {
  let srv;
  let c;
  let created;
  before(async () => {
    srv = await startServer({ model: tinyModel('decoder-fields') });
    c = new Client(srv.wsUrl);
    created = await c.session();
  });
  after(async () => {
    await c?.close();
    await srv?.stop();
  });

  test('session.created.decoder_fields: every decoder, the parameters it reads, named as in defaults', () => {
    const df = created.decoder_fields;
    assert.ok(df && typeof df === 'object', 'decoder_fields present');
    assert.deepEqual(Object.keys(df).sort(), [...DECODERS].sort());
    const names = Object.keys(created.defaults);
    for (const [d, fields] of Object.entries(df)) {
      assert.ok(Array.isArray(fields) && fields.length > 0, d);
      for (const f of fields) assert.ok(names.includes(f), `${d}: ${f} is a defaults name`);
      for (const f of ['gen_length', 'block_length', 'temperature', 'seed', 'cache']) assert.ok(fields.includes(f), `${d} reads ${f}`);
    }
    assert.ok(df.low_confidence.includes('steps'), 'fixed-step decoders read steps');
    assert.ok(!df.threshold.includes('steps') && !df.threshold.includes('steps_per_block'), 'threshold runs until the block is full');
    assert.ok(df.threshold.includes('threshold') && !df.low_confidence.includes('threshold'));
    assert.ok(df.factor.includes('factor') && !df.threshold.includes('factor'));
    assert.ok(df.credit.includes('credit_alpha') && df.credit.includes('threshold'));
    assert.ok(df.origin.includes('eps') && !df.origin.includes('alg_temp') && df.entropy.includes('alg_temp'));
    assert.ok(df.joint_threshold.includes('edit_threshold') && df.hierarchy_block.includes('sub_block_length'));
  });

  test('WebSocket: a parameter the decoder does not read is in accepted.ignored_fields', async () => {
    c.send({ type: 'generate', id: 'thr', prompt: 'hi', gen_length: 8, block_length: 8, decoder: 'threshold', steps: 2,
      params: { factor: 2 }, temprature: 1 });
    const acc = await c.wait((m) => m.id === 'thr' && (m.type === 'accepted' || m.type === 'error'), 'accepted thr');
    assert.equal(acc.type, 'accepted', JSON.stringify(acc));
    assert.deepEqual(acc.ignored_fields, ['temprature', 'steps', 'factor']);
    const done = await c.done('thr');
    // and it really is not read: the threshold decoder took its own number of steps
    c.send({ type: 'generate', id: 'thr8', prompt: 'hi', gen_length: 8, block_length: 8, decoder: 'threshold', steps: 8 });
    const done8 = await c.done('thr8');
    assert.equal(done.usage.steps, done8.usage.steps, 'steps 2 and 8 take the same steps under threshold');
    // a decoder that reads them: nothing reported
    c.send({ type: 'generate', id: 'lc', prompt: 'hi', gen_length: 8, block_length: 8, decoder: 'low_confidence', steps: 4 });
    const lc = await c.wait((m) => m.id === 'lc' && m.type === 'accepted', 'accepted lc');
    assert.equal(lc.ignored_fields, undefined);
    await c.done('lc');
  });

  test('HTTP: the x-unmask-ignored-fields header names them as the client spelled them', async () => {
    const body = { prompt: 'hi', max_tokens: 8, block_length: 8, decoder: 'threshold', diffusion_steps: 4 };
    for (const stream of [false, true]) {
      const r = await postJson(srv.base, '/v1/completions', { ...body, stream });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.headers.get('x-unmask-ignored-fields'), 'diffusion_steps', `stream ${stream}`);
    }
    const sg = await postJson(srv.base, '/generate', { text: 'hi', sampling_params: { max_new_tokens: 8, block_size: 8, decoder: 'threshold', steps: 4, eps: 0.01 } });
    assert.equal(sg.status, 200, sg.text);
    assert.equal(sg.headers.get('x-unmask-ignored-fields'), 'steps, eps');
    const job = await postJson(srv.base, '/v1/jobs', body);
    assert.equal(job.status, 202, job.text);
    assert.equal(job.headers.get('x-unmask-ignored-fields'), 'diffusion_steps', 'POST /v1/jobs');
    const lc = await postJson(srv.base, '/v1/completions', { ...body, decoder: 'low_confidence' });
    assert.equal(lc.status, 200, lc.text);
    assert.equal(lc.headers.get('x-unmask-ignored-fields'), null, 'nothing ignored: no header');
  });
});

describe('decoder fields on a block-diffusion (LLaDA2) model', () => {
  let srv;
  let c;
  before(async () => {
    srv = await startServer({ model: makeModelOnce(path.join(TMP, 'model-llada2-tiny'), ['--preset', 'llada2-tiny']), name: 'llada2' });
    c = new Client(srv.wsUrl);
  });
  after(async () => {
    await c?.close();
    await srv?.stop();
  });

  test('its threshold decoder reads steps and steps_per_block, so they are not reported', async () => {
    const created = await c.session();
    assert.ok(created.decoder_fields.threshold.includes('steps'));
    assert.ok(created.decoder_fields.threshold.includes('steps_per_block'));
    c.send({ type: 'generate', id: 'bd', prompt_ids: [5, 6, 7], gen_length: 8, decoder: 'threshold', steps_per_block: 4 });
    const acc = await c.wait((m) => m.id === 'bd' && (m.type === 'accepted' || m.type === 'error'), 'accepted bd');
    assert.equal(acc.type, 'accepted', JSON.stringify(acc));
    assert.equal(acc.ignored_fields, undefined);
    await c.done('bd');
  });
});
