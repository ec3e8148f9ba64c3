// errors.test.mjs — the bad-input battery of the HTTP APIs on a server with API keys and tight
// limits: every generation endpoint with missing / wrong / malformed credentials, malformed JSON,
// wrong types, out-of-range values, oversized bodies and prompts; unknown routes and methods.
// Status codes and the OpenAI error object ({message, type, param, code}) are asserted.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { startServer, post, TMP } from './server.mjs';

let srv;
const KEY = 'sk-test-one';
const auth = { authorization: `Bearer ${KEY}` };

before(async () => {
  const keys = path.join(TMP, 'http-errors-keys.txt');
  fs.writeFileSync(keys, `# test keys\n${KEY}\n  sk-test-two  \n`);
  srv = await startServer(['--api-keys', keys, '--max-message-bytes', '4096', '--max-gen-length', '64',
    '--max-prompt-tokens', '200']);
});
after(async () => {
  await srv?.stop();
});

function assertError(r, status, { type, code, param, message } = {}) {
  assert.equal(r.status, status, `status for ${r.text}`);
  const e = r.json().error;
  assert.deepEqual(Object.keys(e).sort(), ['code', 'message', 'param', 'type'], 'all four keys present');
  assert.equal(typeof e.message, 'string');
  assert.ok(e.message.length > 5);
  if (type) assert.equal(e.type, type);
  if (code !== undefined) assert.equal(e.code, code);
  if (param !== undefined) assert.equal(e.param, param);
  if (message) assert.match(e.message, message);
  assert.match(r.headers.get('x-request-id') || '', /./, 'x-request-id on errors');
  return e;
}

// endpoint -> a valid body, a wrong-type body (+ param), an out-of-range body (+ param)
const endpoints = {
  '/v1/chat/completions': {
    ok: { messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 },
    wrongType: [{ messages: 'hi' }, 'messages'],
    outOfRange: [{ messages: [{ role: 'user', content: 'hi' }], max_tokens: 100 }, 'max_tokens', /between 1 and 64, got 100/],
  },
  '/v1/completions': {
    ok: { prompt: 'hi', max_tokens: 4 },
    wrongType: [{ prompt: 5 }, 'prompt'],
    outOfRange: [{ prompt: 'hi', top_p: 1.5 }, 'top_p', /in \(0, 1\], got 1\.5/],
  },
  '/v1/fim/completions': {
    ok: { prompt: 'a', suffix: 'b', max_tokens: 4 },
    wrongType: [{ prompt: 'a', suffix: ['b'] }, 'suffix'],
    outOfRange: [{ prompt: 'a', diffusion_steps: 2000 }, 'diffusion_steps', /^diffusion_steps must be between 0 \(auto\) and 1024, got 2000$/],
  },
  '/generate': {
    ok: { text: 'hi', sampling_params: { max_new_tokens: 4 } },
    wrongType: [{ text: 5 }, 'text'],
    outOfRange: [{ text: 'hi', sampling_params: { max_new_tokens: 0 } }, 'sampling_params.max_new_tokens', /between 1 and 64/],
  },
  '/infill': {
    ok: { input_prefix: 'a', input_suffix: 'b', n_predict: 4 },
    wrongType: [{ input_prefix: 5 }, 'input_prefix'],
    outOfRange: [{ input_prefix: 'a', n_predict: 65 }, 'n_predict', /between 1 and 64, got 65/],
  },
  '/v1/jobs': {
    ok: { prompt: 'hi', max_tokens: 4 },
    wrongType: [{ prompt: 'hi', temperature: 'hot' }, 'temperature'],
    outOfRange: [{ prompt: 'hi', threshold: 0 }, 'threshold', /in \(0, 1\]/],
  },
};

for (const [route, cases] of Object.entries(endpoints)) {
  test(`${route}: auth, JSON, types, ranges, sizes`, async () => {
    const url = `${srv.url}${route}`;
    // credentials
    let e = assertError(await post(url, cases.ok), 401, { type: 'authentication_error', code: 'missing_api_key' });
    assert.match(e.message, /Authorization: Bearer/);
    const noAuth = await post(url, cases.ok);
    assert.equal(noAuth.headers.get('www-authenticate'), 'Bearer');
    assert.equal(noAuth.headers.get('x-should-retry'), 'false');
    assertError(await post(url, cases.ok, { authorization: 'Bearer sk-wrong' }), 401, { code: 'invalid_api_key' });
    assertError(await post(url, cases.ok, { authorization: `Basic ${KEY}` }), 401, { code: 'missing_api_key', message: /Malformed/ });
    const viaHeader = await post(url, cases.ok, { 'x-api-key': 'sk-test-two' });
    assert.ok([200, 202].includes(viaHeader.status), `x-api-key accepted: ${viaHeader.text}`);
    const good = await post(url, cases.ok, auth);
    assert.ok([200, 202].includes(good.status), good.text);
    // malformed bodies
    assertError(await post(url, '{"messages": [', auth), 400, { type: 'invalid_request_error', code: 'invalid_json', message: /not valid JSON/ });
    assertError(await post(url, '[1, 2, 3]', auth), 400, { code: 'invalid_json', message: /must be a JSON object, got an array/ });
    assertError(await post(url, '', auth), 400, { code: 'invalid_json' });
    assertError(await post(url, '{"a":1,"a":2}', auth), 400, { code: 'invalid_json' });
    // wrong types and out-of-range values name the client's field
    assertError(await post(url, cases.wrongType[0], auth), 400, { param: cases.wrongType[1] });
    assertError(await post(url, cases.outOfRange[0], auth), 400, { param: cases.outOfRange[1], message: cases.outOfRange[2] });
    // body over --max-message-bytes
    const big = JSON.stringify({ ...cases.ok, padding: 'x'.repeat(5000) });
    assertError(await post(url, big, auth), 413, { code: 'body_too_large' });
  });
}

test('prompt over --max-prompt-tokens: 400 context_length_exceeded', async () => {
  const long = 'word '.repeat(400);
  assertError(await post(`${srv.url}/v1/completions`, { prompt: long, max_tokens: 4 }, auth), 400, {
    code: 'context_length_exceeded', param: 'prompt', message: /limit of 200/,
  });
  assertError(await post(`${srv.url}/v1/chat/completions`, { messages: [{ role: 'user', content: long }] }, auth), 400, {
    code: 'context_length_exceeded', param: 'messages',
  });
  // jobs are tokenized (validated) the same way before one is created
  assertError(await post(`${srv.url}/v1/jobs`, { prompt: long, max_tokens: 4 }, auth), 400, {
    code: 'context_length_exceeded', param: 'prompt', message: /limit of 200/,
  });
});

test('unknown routes, wrong methods, unauthenticated operations endpoints', async () => {
  const nf = await fetch(`${srv.url}/v1/does-not-exist`, { method: 'POST', headers: auth, body: '{}' });
  assert.equal(nf.status, 404);
  assert.equal((await nf.json()).error.code, 'not_found');
  const m = await fetch(`${srv.url}/v1/chat/completions`, { headers: auth });
  assert.equal(m.status, 405);
  assert.equal((await m.json()).error.code, 'method_not_allowed');
  const d = await fetch(`${srv.url}/v1/models`, { method: 'DELETE', headers: auth });
  assert.equal(d.status, 405);
  const pu = await fetch(`${srv.url}/generate`, { method: 'PUT', headers: auth, body: '{}' });
  assert.equal(pu.status, 405);
  // models needs a key too; metrics and health do not
  assert.equal((await fetch(`${srv.url}/v1/models`)).status, 401);
  assert.equal((await fetch(`${srv.url}/v1/models`, { headers: auth })).status, 200);
  assert.equal((await fetch(`${srv.url}/metrics`)).status, 200);
  assert.equal((await fetch(`${srv.url}/health`)).status, 200);
  // a job of another key is invisible
  const j = (await post(`${srv.url}/v1/jobs`, { prompt: 'x', max_tokens: 2 }, auth)).json();
  assert.equal((await fetch(`${srv.url}/v1/jobs/${j.id}`, { headers: { authorization: 'Bearer sk-test-two' } })).status, 404);
  assert.equal((await fetch(`${srv.url}/v1/jobs/${j.id}`, { headers: auth })).status, 200);
});

test('bad values inside otherwise valid requests', async () => {
  const u = `${srv.url}/v1/chat/completions`;
  const msgs = [{ role: 'user', content: 'hi' }];
  assertError(await post(u, { messages: [{ role: 'wizard', content: 'x' }] }, auth), 400, { param: 'messages[0].role' });
  assertError(await post(u, { messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }, auth), 400, {
    param: 'messages[0].content', code: 'unsupported',
  });
  assertError(await post(u, { messages: msgs, decoder: 'beam' }, auth), 400, { param: 'decoder', message: /low_confidence/ });
  assertError(await post(u, { messages: msgs, n: 0 }, auth), 400, { param: 'n' });
  assertError(await post(u, { messages: msgs, stop: [1] }, auth), 400, { param: 'stop' });
  assertError(await post(u, { messages: msgs, logprobs: true }, auth), 400, { param: 'logprobs', code: 'unsupported' });
  assertError(await post(u, { messages: msgs, max_tokens: 8, block_length: 4, steps: 1 }, auth), 400, {
    param: 'steps', message: /steps must be between 2/,
  });
  assertError(await post(u, { messages: msgs, stream: 'yes' }, auth), 400, { param: 'stream' });
  assertError(await post(u, { messages: msgs, seed: -5 }, auth), 400, { param: 'seed' });
  assertError(await post(u, { messages: msgs, cfg_scale: 500 }, auth), 400, { param: 'cfg_scale' });
  assertError(await post(`${srv.url}/infill`, { input_prefix: 'a', input_extra: [{ filename: 'f' }] }, auth), 400, { param: 'input_extra' });
  assertError(await post(`${srv.url}/generate`, { text: 'a', input_ids: [1] }, auth), 400, { param: 'text' });
  assertError(await post(`${srv.url}/v1/completions`, { prompt: [1, -2] }, auth), 400, { param: 'prompt' });
});
