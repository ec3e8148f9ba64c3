// openai.test.mjs — the official `openai` npm client against the real server: chat (stream and
// not), completions with a suffix (native infilling), the models list, diffusion parameters as
// extra body fields, Mercury-style diffusing frames, error objects, and the client's automatic
// retry honouring our 429 + Retry-After.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer } from './server.mjs';

let srv, client;
before(async () => {
  srv = await startServer();
  client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  await srv?.stop();
});

const messages = [{ role: 'user', content: 'Write one short sentence.' }];

test('chat completion (non-streaming): shape, usage, finish_reason', async () => {
  const r = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 16, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.model, 'http-tiny', 'the served model id');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
});

test('chat streaming: role chunk, append-only deltas equal the non-streamed text, finish, usage, same id', async () => {
  const body = { model: 'tiny', messages, max_tokens: 24, block_length: 8, seed: 3, temperature: 0 };
  const full = await client.chat.completions.create(body);
  const stream = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  const chunks = [];
  for await (const ch of stream) chunks.push(ch);
  assert.ok(chunks.length >= 3);
  const ids = new Set(chunks.map((c) => c.id));
  assert.equal(ids.size, 1, 'every chunk has the same id');
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  const text = chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
  assert.equal(text, full.choices[0].message.content, 'deltas concatenate to the final text');
  const fin = chunks.filter((c) => c.choices[0]?.finish_reason);
  assert.equal(fin.length, 1, 'exactly one finish chunk');
  assert.deepEqual(fin[0].choices[0].delta, {});
  const last = chunks.at(-1);
  assert.deepEqual(last.choices, []);
  assert.equal(last.usage.completion_tokens, full.usage.completion_tokens);
  for (const c of chunks.slice(0, -1)) assert.equal(c.usage, null, 'usage null on content chunks');
});

test('legacy completions with suffix: native infilling, prompt and suffix preserved', async () => {
  const r = await client.completions.create({
    model: 'tiny',
    prompt: 'def add(a, b):\n',
    suffix: '\n\nprint(add(1, 2))\n',
    max_tokens: 12,
    temperature: 0,
  });
  assert.equal(r.object, 'text_completion');
  assert.equal(typeof r.choices[0].text, 'string');
  assert.ok(!r.choices[0].text.includes('print(add(1, 2))'), 'the suffix is context, not output');
  // the suffix reaches the model: it is counted beside the prompt (dropping it would count the prompt alone)
  const bare = await client.completions.create({ model: 'tiny', prompt: 'def add(a, b):\n', max_tokens: 12, temperature: 0 });
  assert.ok(r.usage.prompt_tokens > bare.usage.prompt_tokens,
    `prompt + suffix (${r.usage.prompt_tokens} tokens) counts more than the prompt alone (${bare.usage.prompt_tokens})`);
  // streaming completions with echo: the prompt comes first
  const s = await client.completions.create({ model: 'tiny', prompt: 'Hello', max_tokens: 8, stream: true, echo: true });
  let text = '';
  for await (const ch of s) text += ch.choices[0]?.text ?? '';
  assert.ok(text.startsWith('Hello'));
});

test('models list', async () => {
  const list = await client.models.list();
  const ids = [];
  for await (const m of list) ids.push(m);
  assert.equal(ids.length, 1);
  assert.equal(ids[0].object, 'model');
  assert.equal(ids[0].id, 'http-tiny');
  assert.equal(typeof ids[0].created, 'number');
  const one = await client.models.retrieve('http-tiny');
  assert.equal(one.id, 'http-tiny');
  await assert.rejects(client.models.retrieve('gpt-4'), (e) => e.status === 404 && e.error?.code === 'model_not_found');
});

test('diffusion parameters as extra body fields, validated with the client name', async () => {
  const r = await client.chat.completions.create({
    model: 'tiny', messages, max_tokens: 16, diffusion_steps: 8, block_size: 8, decoder: 'low_confidence', seed: 1,
  });
  assert.equal(r.usage.diffusion_steps, 8);
  await assert.rejects(
    client.chat.completions.create({ model: 'tiny', messages, diffusion_steps: 2000 }),
    (e) => {
      assert.equal(e.status, 400);
      assert.equal(e.error.param, 'diffusion_steps');
      assert.equal(e.error.message, 'diffusion_steps must be between 0 (auto) and 1024, got 2000');
      assert.equal(e.error.type, 'invalid_request_error');
      return true;
    },
  );
  await assert.rejects(client.chat.completions.create({ model: 'tiny', messages, temperature: 7 }), (e) =>
    e.status === 400 && e.error.param === 'temperature');
});

test('diffusing: true streams whole-canvas frames (replace semantics) with diffusion_meta', async () => {
  const stream = await client.chat.completions.create({
    model: 'tiny', messages, max_tokens: 16, block_length: 8, stream: true, diffusing: true, seed: 2,
  });
  const frames = [];
  for await (const ch of stream) frames.push(ch);
  const withMeta = frames.filter((f) => f.diffusion_meta);
  assert.ok(withMeta.length >= 2, 'several frames');
  let prev = -1;
  for (const f of withMeta) {
    const m = f.diffusion_meta;
    assert.equal(m.diffusion_content, true);
    assert.ok(m.diffusion_progress >= prev && m.diffusion_progress <= 1);
    prev = m.diffusion_progress;
    assert.equal(m.state.length, 16);
    assert.match(m.state, /^[cdm]+$/);
  }
  const last = withMeta.at(-1);
  assert.equal(last.diffusion_meta.diffusion_progress, 1);
  assert.ok(last.choices[0].finish_reason);
  const full = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 16, block_length: 8, seed: 2 });
  assert.equal(last.choices[0].delta.content, full.choices[0].message.content, 'the last frame is the final text');
  assert.deepEqual(frames.at(-1).choices[0].delta, {}, 'closing chunk');
});

test('the client retries our 429 after Retry-After and then succeeds', async () => {
  const limited = await startServer(['--rate-limit', '1', '--rate-burst', '1']);
  try {
    const seen = [];
    const c = new OpenAI({
      baseURL: `${limited.url}/v1`, apiKey: 'k', maxRetries: 2,
      fetch: async (url, init) => {
        const res = await fetch(url, init);
        seen.push({ status: res.status, ra: res.headers.get('retry-after'), ram: res.headers.get('retry-after-ms'), t: Date.now() });
        return res;
      },
    });
    await c.chat.completions.create({ model: 'tiny', messages, max_tokens: 4 }); // takes the only token
    const t0 = Date.now();
    const r = await c.chat.completions.create({ model: 'tiny', messages, max_tokens: 4 });
    assert.equal(r.object, 'chat.completion');
    assert.deepEqual(seen.map((s) => s.status), [200, 429, 200]);
    const rl = seen[1];
    assert.ok(Number(rl.ra) >= 1, `Retry-After ${rl.ra}`);
    assert.ok(Number(rl.ram) > 0 && Number(rl.ram) <= 1000, `retry-after-ms ${rl.ram}`);
    assert.ok(seen[2].t - t0 >= Number(rl.ram) - 50, 'the retry waited for retry-after-ms');
    // with retries off the error surfaces as RateLimitError
    const c0 = new OpenAI({ baseURL: `${limited.url}/v1`, apiKey: 'k', maxRetries: 0 });
    await assert.rejects(c0.chat.completions.create({ model: 'tiny', messages, max_tokens: 4 }), (e) =>
      e.status === 429 && e.error.type === 'rate_limit_error' && e.error.code === 'rate_limit_exceeded');
  } finally {
    await limited.stop();
  }
});
