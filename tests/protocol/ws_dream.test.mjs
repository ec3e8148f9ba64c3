// ws_dream.test.mjs — a Dream-layout checkpoint (make-model --preset dream-tiny: Qwen2 names, q/k/v
// biases, shifted logits, the Qwen2 tokenizer and chat template) served over the WebSocket protocol:
// the session's defaults come from its generation_config.json (alg origin, eps), a chat request with
// decoder entropy runs end to end with exactly `steps` step events that commit every generated
// position once, `alg` is accepted as Dream's name for the decoder, the served commits (cache none)
// equal `unmask generate --json` on the same prompt ids, Dream requests batched together equal each
// alone (origin at temperature 1: positions and tokens come from the seeded rng, so rounding
// differences between batch shapes cannot reorder near-ties), the dual cache (the serving default)
// completes, and bad Dream parameters are refused naming the field.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { BIN, Client, TMP, checkGeneration, makeModelOnce, startServer } from './harness.mjs';

// every commit of a generation in order (step events may be merged under backpressure: flattened)
const commitsOf = (msgs) => msgs.filter((m) => m.type === 'step').flatMap((m) => m.commits.map((x) => [x.pos, x.id]));

describe('ws Dream', () => {
  let srv, model;
  before(async () => {
    model = makeModelOnce(path.join(TMP, 'model-ws-dream'), ['--preset', 'dream-tiny']);
    srv = await startServer({ model, extra: ['--max-batch', '4'] });
  });
  after(async () => {
    const r = await srv.stop();
    assert.equal(r.code, 0, `server exits 0 on SIGTERM, stderr: ${srv.stderr}`);
  });

  test('defaults from generation_config.json; a chat request with decoder entropy end to end', async () => {
    const c = new Client(srv.wsUrl);
    const s = await c.session();
    assert.equal(s.model.family, 'dream', 'session.created names the family');
    const models = JSON.parse((await srv.get('/v1/models')).body);
    assert.equal(models.data[0].meta.family, 'dream', '/v1/models names the family');
    assert.equal(s.defaults.decoder, 'origin', 'Dream generation_config alg');
    assert.equal(s.defaults.eps, 0.001);
    assert.equal(s.defaults.alg_temp, 0);
    c.send({ type: 'generate', id: 'e', messages: [{ role: 'user', content: 'What is a diffusion model?' }],
      decoder: 'entropy', gen_length: 16, steps: 6, cache: 'none' });
    const acc = await c.wait((m) => m.type === 'accepted' && m.id === 'e');
    assert.equal(acc.params.decoder, 'entropy');
    assert.equal(acc.params.block_length, 16, 'Dream: one block over the whole generation by default');
    await c.done('e');
    const done = checkGeneration(assert, c.msgs, 'e');
    assert.ok(done.finish_reason === 'length' || done.finish_reason === 'stop');
    assert.equal(done.usage.steps, 6, 'exactly `steps` steps');
    const pos = commitsOf(c.of('e')).map(([p]) => p).sort((a, b) => a - b);
    const np = done.usage.prompt_tokens;
    assert.ok(np > 10, 'the chat template wrapped the message');
    assert.deepEqual(pos, Array.from({ length: 16 }, (_, i) => np + i), 'every generated position committed once');
    await c.close();
  });

  test('alg is accepted as the decoder; served commits equal `unmask generate`', async () => {
    const c = new Client(srv.wsUrl);
    await c.session();
    const ids = [101, 202, 303, 404, 505];
    c.send({ type: 'generate', id: 'm', prompt_ids: ids, alg: 'maskgit_plus', gen_length: 12, steps: 5, cache: 'none' });
    const acc = await c.wait((m) => m.type === 'accepted' && m.id === 'm');
    assert.equal(acc.params.decoder, 'maskgit_plus');
    await c.done('m');
    const r = spawnSync(BIN, ['generate', '--model', model, '--prompt-ids', ids.join(','), '--json', '--decoder',
      'maskgit_plus', '--gen-length', '12', '--steps', '5', '--threads', '2'], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    const cli = r.stdout.split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l));
    assert.deepEqual(commitsOf(c.of('m')), commitsOf(cli), 'server and CLI commit the same tokens in the same order');
    await c.close();
  });

  test('Dream requests batched together == each alone; dual cache completes', async () => {
    const reqs = [
      { prompt_ids: [7, 8, 9], gen_length: 16, steps: 8, seed: 1 },
      { prompt_ids: [40, 41, 42, 43, 44, 45], gen_length: 12, steps: 12, seed: 2 },
      { prompt_ids: [3], gen_length: 16, block_length: 8, steps: 8, seed: 3 },
    ].map((r) => ({ decoder: 'origin', temperature: 1, cache: 'none', ...r }));
    const c = new Client(srv.wsUrl);
    await c.session();
    const alone = [];
    for (const [i, r] of reqs.entries()) {
      c.send({ type: 'generate', id: `a${i}`, ...r });
      alone.push(await c.done(`a${i}`));
    }
    for (const [i, r] of reqs.entries()) c.send({ type: 'generate', id: `b${i}`, ...r });
    for (let i = 0; i < reqs.length; i++) {
      const d = await c.done(`b${i}`);
      assert.deepEqual(commitsOf(c.of(`b${i}`)), commitsOf(c.of(`a${i}`)), `request ${i}: same commits batched`);
      assert.equal(d.text, alone[i].text, `request ${i}: text`);
      assert.equal(d.usage.steps, alone[i].usage.steps, `request ${i}: steps`);
    }
    const st = await srv.stats();
    assert.ok(st.scheduler.max_batch_seen >= 2, 'requests were batched');
    c.send({ type: 'generate', id: 'dual', prompt_ids: [5, 6, 7], decoder: 'entropy', gen_length: 16, steps: 8 });
    const acc = await c.wait((m) => m.type === 'accepted' && m.id === 'dual');
    assert.equal(acc.params.cache, 'dual', 'serving default cache');
    await c.done('dual');
    const d = checkGeneration(assert, c.msgs, 'dual');
    assert.equal(d.usage.committed, 16);
    await c.close();
  });

  test('bad Dream parameters: invalid_request naming the field', async () => {
    const c = new Client(srv.wsUrl);
    await c.session();
    const bad = [
      [{ decoder: 'entropy', alg_temp: -0.5 }, 'alg_temp', /alg_temp must be between 0/],
      [{ decoder: 'origin', eps: 0 }, 'eps', /eps must be in \(0, 1\)/],
      [{ alg: 'maskgit' }, 'alg', /origin, maskgit_plus, topk_margin, entropy/],
    ];
    for (const [i, [body, param, msg]] of bad.entries()) {
      c.send({ type: 'generate', event_id: `e${i}`, prompt_ids: [1, 2], gen_length: 8, ...body });
      const e = await c.wait((m) => m.type === 'error' && m.event_id === `e${i}`, `error for ${JSON.stringify(body)}`);
      assert.equal(e.error.code, 'invalid_request', JSON.stringify(body));
      assert.equal(e.error.param, param, JSON.stringify(body));
      assert.match(e.error.message, msg);
    }
    await c.close();
  });
});

// The serving defaults are computed once, when the model loads: editing generation_config.json
// while serving changes nothing (the file is not read again per session or request).
describe('ws Dream: serving defaults are read once', () => {
  let srv, model;
  before(async () => {
    model = path.join(TMP, `model-ws-dream-edit-${process.pid}`);
    fs.rmSync(model, { recursive: true, force: true });
    fs.cpSync(makeModelOnce(path.join(TMP, 'model-ws-dream'), ['--preset', 'dream-tiny']), model, { recursive: true });
    srv = await startServer({ model });
  });
  after(async () => {
    const r = await srv.stop();
    fs.rmSync(model, { recursive: true, force: true });
    assert.equal(r.code, 0, `server exits 0 on SIGTERM, stderr: ${srv.stderr}`);
  });

  test('an edited generation_config.json does not change the defaults of a running server', async () => {
    const a = new Client(srv.wsUrl);
    assert.equal((await a.session()).defaults.decoder, 'origin', 'from the file at load');
    await a.close();
    const file = path.join(model, 'generation_config.json');
    const g = JSON.parse(fs.readFileSync(file, 'utf8'));
    fs.writeFileSync(file, JSON.stringify({ ...g, alg: 'entropy', eps: 0.25, temperature: 1.5 }));
    const b = new Client(srv.wsUrl);
    const s = await b.session();
    assert.equal(s.defaults.decoder, 'origin', 'a new session: the defaults of the load');
    assert.equal(s.defaults.eps, 0.001);
    assert.equal(s.defaults.temperature, g.temperature ?? 0);
    b.send({ type: 'generate', id: 'x', prompt_ids: [5, 6, 7], gen_length: 8, steps: 4 });
    const acc = await b.wait((m) => m.type === 'accepted' && m.id === 'x');
    assert.equal(acc.params.decoder, 'origin', 'a request: the defaults of the load');
    await b.done('x');
    await b.close();
  });
});

