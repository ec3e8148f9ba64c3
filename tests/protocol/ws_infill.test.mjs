// ws_infill.test.mjs — infilling over the WebSocket: a `generate` with "prompt" + "suffix" builds
// the same canvas as POST /v1/completions with suffix and POST /infill (prompt ++ masks ++ suffix,
// one request core), streams step / block / done like any generate, and answers the same text as
// the HTTP APIs for the same seed and parameters. A bad suffix is refused with invalid_request.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Client, checkGeneration, postJson, startServer, tinyModel } from './harness.mjs';

const PROMPT = 'def add(a, b):\n    ';
const SUFFIX = '\n\nprint(add(1, 2))\n';
const DECODE = { seed: 11, steps: 8, block_length: 8 };
const G = 16;

describe('WebSocket generate with a suffix (infilling)', () => {
  let srv;
  let c;
  before(async () => {
    srv = await startServer({ model: tinyModel('ws-infill') });
    c = new Client(srv.wsUrl);
    await c.session();
  });
  after(async () => {
    await c?.close();
    await srv?.stop();
  });

  test('streams the hole between prompt and suffix, with the HTTP APIs\' text', async () => {
    c.send({ type: 'generate', id: 'fill', prompt: PROMPT, suffix: SUFFIX, gen_length: G, ...DECODE });
    const done = await c.done('fill');
    checkGeneration(assert, c.msgs, 'fill');
    assert.equal(done.finish_reason === 'error', false, JSON.stringify(done));
    const ev = c.of('fill');
    const acc = ev[0];
    const steps = ev.filter((m) => m.type === 'step');
    assert.ok(steps.length >= 2, `live denoising: ${steps.length} step events`);
    // every position the steps commit lies in the hole (0 .. gen_length-1), never in prompt or suffix
    const idx = steps.flatMap((s) => (s.commits ?? []).map((x) => x.index));
    assert.ok(idx.length > 0, 'the steps commit positions');
    assert.ok(idx.every((i) => i >= 0 && i < G), `commit indices within the hole: ${idx}`);

    // the same request over HTTP: /v1/completions with suffix, and llama.cpp's /infill
    const cmpl = await postJson(srv.base, '/v1/completions', { prompt: PROMPT, suffix: SUFFIX, max_tokens: G, ...DECODE });
    assert.equal(cmpl.status, 200, JSON.stringify(cmpl.body));
    const infill = await postJson(srv.base, '/infill', { input_prefix: PROMPT, input_suffix: SUFFIX, n_predict: G, ...DECODE });
    assert.equal(infill.status, 200, JSON.stringify(infill.body));
    assert.equal(done.text, cmpl.body.choices[0].text, 'the same text as /v1/completions with suffix');
    assert.equal(done.text, infill.body.content, 'the same text as /infill');
    // the suffix is part of the prompt the model reads, counted like the HTTP APIs count it
    assert.equal(acc.prompt_tokens, cmpl.body.usage.prompt_tokens, 'prompt + suffix tokens, as /v1/completions counts them');
    c.send({ type: 'generate', id: 'bare', prompt: PROMPT, gen_length: G, ...DECODE });
    const bare = await c.wait((m) => m.id === 'bare' && m.type === 'accepted', 'accepted of bare');
    assert.ok(acc.prompt_tokens > bare.prompt_tokens, `with suffix ${acc.prompt_tokens} > prompt alone ${bare.prompt_tokens}`);
    await c.done('bare');
  });

  test('an empty prompt with a suffix is accepted (the hole starts the text), as over HTTP', async () => {
    c.send({ type: 'generate', id: 'pre0', prompt: '', suffix: SUFFIX, gen_length: G, ...DECODE });
    const done = await c.done('pre0');
    const cmpl = await postJson(srv.base, '/v1/completions', { prompt: '', suffix: SUFFIX, max_tokens: G, ...DECODE });
    assert.equal(cmpl.status, 200, JSON.stringify(cmpl.body));
    assert.equal(done.text, cmpl.body.choices[0].text);
  });

  test('a bad suffix is refused with invalid_request naming it', async () => {
    const cases = [
      [{ prompt: PROMPT, suffix: 5 }, /^"suffix" must be a string, got /],
      [{ prompt: PROMPT, suffix: ['x'] }, /^"suffix" must be a string, got /],
      [{ messages: [{ role: 'user', content: 'hi' }], suffix: 'x' }, /not with "messages"/],
    ];
    for (const [i, [req, msg]] of cases.entries()) {
      const id = `bad-${i}`;
      c.send({ type: 'generate', id, gen_length: G, ...req });
      const m = await c.wait((x) => x.id === id && (x.type === 'error' || x.type === 'accepted'), `reply to ${id}`);
      assert.equal(m.type, 'error', JSON.stringify(m));
      assert.equal(m.error.code, 'invalid_request');
      assert.equal(m.error.param, 'suffix');
      assert.match(m.error.message, msg);
    }
    // still usable
    c.send({ type: 'generate', id: 'after', prompt: PROMPT, suffix: SUFFIX, gen_length: G, ...DECODE });
    await c.done('after');
  });
});
