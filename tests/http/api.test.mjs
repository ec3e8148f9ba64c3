// api.test.mjs — the other HTTP APIs over plain fetch: raw SSE framing of the OpenAI stream,
// SGLang /generate (batch + cumulative stream), llama.cpp /infill shaped like llama.vscode's
// requests (and the n_predict: 0 warm-up), /v1/fim/completions, stop strings, x-request-id,
// CORS preflight, and GET /metrics checked with promtool.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { startServer, parseSSE, post, TMP } from './server.mjs';

let srv;
before(async () => {
  srv = await startServer(['--cors-origin', 'https://ide.example']);
});
after(async () => {
  await srv?.stop();
});

test('OpenAI SSE framing: data-only records, [DONE] last, text/event-stream', async () => {
  const r = await post(`${srv.url}/v1/chat/completions`, {
    messages: [{ role: 'user', content: 'hi' }], max_tokens: 16, stream: true,
  });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /^text\/event-stream/);
  assert.ok(r.text.endsWith('data: [DONE]\n\n'));
  const recs = parseSSE(r.text);
  for (const rec of recs) assert.deepEqual(Object.keys(rec), ['data'], 'no event:/id: fields');
  assert.equal(recs.at(-1).data, '[DONE]');
  const objs = recs.slice(0, -1).map((x) => JSON.parse(x.data));
  assert.equal(objs[0].object, 'chat.completion.chunk');
  assert.ok(objs.every((o) => o.created === objs[0].created && o.id === objs[0].id));
});

test('SGLang /generate: batch of texts, non-streaming list and cumulative stream', async () => {
  const r = await post(`${srv.url}/generate`, {
    text: ['The capital of France is', 'One plus one is'],
    sampling_params: { max_new_tokens: 12, temperature: 0 },
  });
  assert.equal(r.status, 200);
  const list = r.json();
  assert.ok(Array.isArray(list) && list.length === 2);
  for (const [i, o] of list.entries()) {
    assert.equal(typeof o.text, 'string');
    assert.ok(Array.isArray(o.output_ids));
    assert.equal(o.index, i);
    assert.ok(o.meta_info.prompt_tokens > 0);
    assert.ok(['stop', 'length'].includes(o.meta_info.finish_reason.type));
  }
  const single = (await post(`${srv.url}/generate`, { text: 'abc', sampling_params: { max_new_tokens: 16 }, rid: 'r-1' })).json();
  assert.equal(single.meta_info.id, 'r-1');
  assert.ok(!Array.isArray(single));
  const s = await post(`${srv.url}/generate`, { text: 'abc', sampling_params: { max_new_tokens: 16 }, stream: true });
  const recs = parseSSE(s.text);
  assert.equal(recs.at(-1).data, '[DONE]');
  const chunks = recs.slice(0, -1).map((x) => JSON.parse(x.data));
  for (let i = 1; i < chunks.length; i++) assert.ok(chunks[i].text.startsWith(chunks[i - 1].text), 'cumulative text');
  assert.equal(chunks.at(-1).text, single.text, 'the last cumulative chunk is the whole text');
  assert.ok(chunks.at(-1).meta_info.finish_reason);
  assert.ok(chunks.slice(0, -1).every((c) => c.meta_info.finish_reason === null));
});

test('llama.cpp /infill shaped like llama.vscode: native infill, warm-up, response_fields', async () => {
  const base = {
    id_slot: 0,
    input_prefix: 'function add(a, b) {\n',
    input_suffix: '\n}\n\nconsole.log(add(1, 2));\n',
    input_extra: [{ filename: 'util.js', text: 'export const zero = 0;\n' }],
    prompt: '  return',
    n_predict: 12,
    n_cmpl: 1,
    top_k: 40,
    top_p: 0.99,
    stream: false,
    samplers: ['top_k', 'top_p', 'infill'],
    cache_prompt: true,
    t_max_prompt_ms: 500,
    // enforced (the time limit): a budget no run here reaches, so the streamed and non-streamed
    // runs below decode alike (infill_plugins.test.mjs tests the limit)
    t_max_predict_ms: 60000,
  };
  const r = await post(`${srv.url}/infill`, base);
  assert.equal(r.status, 200);
  const o = r.json();
  assert.equal(typeof o.content, 'string');
  assert.equal(o.stop, true);
  assert.ok(['eos', 'limit', 'word'].includes(o.stop_type));
  assert.ok(o.tokens_evaluated > 10, 'prefix + extra + suffix evaluated');
  for (const k of ['prompt_n', 'prompt_ms', 'predicted_n', 'predicted_ms', 'predicted_per_second']) assert.equal(typeof o.timings[k], 'number');
  // counts are JSON integers, not 96.0: llama.vim formats timings.predicted_n with %d (E805 on a float)
  const countsAreIntegers = (text, where) => {
    for (const k of ['prompt_n', 'predicted_n', 'tokens_predicted', 'tokens_evaluated', 'tokens_cached', 'index', 'id_slot']) {
      for (const m of text.matchAll(new RegExp(`"${k}":\\s*([^,}\\s]+)`, 'g')))
        assert.match(m[1], /^-?\d+$/, `${where}: ${k} is written as an integer, got ${m[1]}`);
    }
  };
  assert.match(r.text, /"predicted_n":/);
  countsAreIntegers(r.text, '/infill');
  assert.ok(o.generation_settings && typeof o.generation_settings.gen_length === 'number');
  // llama.vim's context warm-up: n_predict 0 answers at once and generates nothing
  const t0 = Date.now();
  const w = await post(`${srv.url}/infill`, { ...base, n_predict: 0, samplers: [], t_max_predict_ms: 1, response_fields: [''] });
  assert.equal(w.status, 200);
  assert.deepEqual(w.json(), {});
  assert.ok(Date.now() - t0 < 2000);
  // response_fields select + flatten (llama.vim)
  const f = (await post(`${srv.url}/infill`, { ...base, response_fields: ['content', 'timings/prompt_n', 'truncated'] })).json();
  assert.deepEqual(Object.keys(f).sort(), ['content', 'timings/prompt_n', 'truncated']);
  // streaming /infill: deltas then a final object with stop: true, no [DONE]
  const s = await post(`${srv.url}/infill`, { ...base, stream: true });
  const recs = parseSSE(s.text).map((x) => JSON.parse(x.data));
  countsAreIntegers(s.text, 'streamed /infill');
  assert.equal(recs.at(-1).stop, true);
  assert.ok(recs.slice(0, -1).every((x) => x.stop === false));
  assert.equal(recs.at(-1).content, '');
  assert.equal(recs.slice(0, -1).map((x) => x.content).join(''), o.content, 'deltas add up to the non-streamed content');
});

test('/v1/fim/completions: text in choices[].text and delta.content / message.content', async () => {
  const body = { model: 'x', prompt: 'def f(x):\n    ', suffix: '\n    return y\n', max_tokens: 10, temperature: 0 };
  const r = (await post(`${srv.url}/v1/fim/completions`, body)).json();
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices[0].message.content, r.choices[0].text);
  const s = await post(`${srv.url}/v1/fim/completions`, { ...body, stream: true });
  const recs = parseSSE(s.text);
  assert.equal(recs.at(-1).data, '[DONE]');
  const chunks = recs.slice(0, -1).map((x) => JSON.parse(x.data));
  for (const c of chunks) assert.equal(c.choices[0].delta.content, c.choices[0].text);
  assert.equal(chunks.map((c) => c.choices[0].text).join(''), r.choices[0].text);
});

test('stop strings end the text (and the generation) at the first match', async () => {
  const full = (await post(`${srv.url}/v1/completions`, { prompt: 'a b c', max_tokens: 32, temperature: 0 })).json();
  const text = full.choices[0].text;
  assert.ok(text.length > 4, `need some text, got ${JSON.stringify(text)}`);
  const stop = text.slice(2, 4);
  const cut = text.indexOf(stop);
  const r = (await post(`${srv.url}/v1/completions`, { prompt: 'a b c', max_tokens: 32, temperature: 0, stop: [stop] })).json();
  assert.equal(r.choices[0].text, text.slice(0, cut));
  assert.equal(r.choices[0].finish_reason, 'stop');
  const s = await post(`${srv.url}/v1/completions`, { prompt: 'a b c', max_tokens: 32, temperature: 0, stop: stop, stream: true });
  const chunks = parseSSE(s.text).slice(0, -1).map((x) => JSON.parse(x.data));
  assert.equal(chunks.map((c) => c.choices[0].text).join(''), text.slice(0, cut), 'streamed text never passes the stop');
});

test('x-request-id: echoed when sent, generated otherwise, on errors too', async () => {
  const a = await fetch(`${srv.url}/v1/models`, { headers: { 'x-request-id': 'my-trace-42' } });
  assert.equal(a.headers.get('x-request-id'), 'my-trace-42');
  const b = await fetch(`${srv.url}/v1/models`);
  assert.match(b.headers.get('x-request-id'), /^req_[0-9a-f]{24}$/);
  const c = await post(`${srv.url}/v1/chat/completions`, '{bad');
  assert.equal(c.status, 400);
  assert.match(c.headers.get('x-request-id'), /^req_/);
  const d = await fetch(`${srv.url}/v1/nope`);
  assert.equal(d.status, 404);
  assert.match(d.headers.get('x-request-id'), /^req_/);
});

test('CORS: preflight for the allowed origin, refusal for others, headers on responses', async () => {
  const pre = await fetch(`${srv.url}/v1/chat/completions`, {
    method: 'OPTIONS',
    headers: { origin: 'https://ide.example', 'access-control-request-method': 'POST', 'access-control-request-headers': 'authorization, content-type' },
  });
  assert.equal(pre.status, 204);
  assert.equal(pre.headers.get('access-control-allow-origin'), 'https://ide.example');
  assert.match(pre.headers.get('access-control-allow-methods'), /POST/);
  assert.match(pre.headers.get('access-control-allow-headers'), /authorization/);
  const bad = await fetch(`${srv.url}/v1/chat/completions`, {
    method: 'OPTIONS', headers: { origin: 'https://evil.example', 'access-control-request-method': 'POST' },
  });
  assert.equal(bad.status, 403);
  assert.equal(bad.headers.get('access-control-allow-origin'), null);
  const get = await fetch(`${srv.url}/v1/models`, { headers: { origin: 'https://ide.example' } });
  assert.equal(get.headers.get('access-control-allow-origin'), 'https://ide.example');
  assert.match(get.headers.get('access-control-expose-headers'), /x-request-id/);
  // a browser on the allowed origin may read which request fields were ignored
  assert.match(get.headers.get('access-control-expose-headers'), /x-unmask-ignored-fields/);
});

test('GET /metrics: Prometheus text that promtool accepts, with the counters that moved', async () => {
  const r = await fetch(`${srv.url}/metrics`);
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /^text\/plain; version=0\.0\.4/);
  const text = await r.text();
  const file = path.join(TMP, 'http-metrics.prom');
  fs.writeFileSync(file, text);
  let out = '';
  try {
    out = execFileSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
  } catch (e) {
    assert.fail(`promtool check metrics failed:\n${e.stdout}${e.stderr}`);
  }
  assert.equal(out.trim(), '', `promtool lint output: ${out}`);
  assert.match(text, /unmask_http_requests_total\{route="\/v1\/chat\/completions",method="POST",status="200"\} \d+/);
  assert.match(text, /unmask_http_requests_total\{route="\/v1\/chat\/completions",method="POST",status="400"\} \d+/);
  assert.match(text, /^unmask_queue_depth \d+$/m);
  assert.match(text, /^unmask_active_sequences \d+$/m);
  const num = (re) => Number(text.match(re)[1]);
  assert.ok(num(/^unmask_generated_tokens_total (\d+)$/m) > 0);
  assert.ok(num(/^unmask_decode_steps_total (\d+)$/m) > 0);
  assert.ok(num(/^unmask_step_latency_seconds_count (\d+)$/m) > 0);
  assert.ok(num(/^unmask_event_overhead_seconds_count (\d+)$/m) > 0);
});
