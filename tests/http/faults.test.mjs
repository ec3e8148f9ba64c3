// faults.test.mjs — the engine-failure path end to end, on the real server with the test hook
// UNMASK_FAULT_FORWARD_FAIL (docs/reliability.md, "Test hooks"): decode steps whose batch holds a
// sequence with a chosen seed fail exactly as a failing backend forward does (decode_step -> -1,
// every sequence of that step finishes with finish_reason "error").
//
// Checked: a job whose engine work keeps failing is retried up to --job-attempts and then `failed`
// (attempts, retry records, event ids, the job.failed webhook); a job whose fault clears after two
// failures succeeds on its third attempt; an OpenAI SSE stream that fails mid-way sends
// `data: {"error":...}` and ends (no [DONE]), and the openai client raises it; a WebSocket
// generation ends with `done` finish_reason "error" and the session keeps working; what a failed
// step means for batch-mates (they fail with it: one forward computes the whole batch) and for
// requests outside that step (unaffected); the server keeps serving afterwards.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import OpenAI from 'openai';
import WebSocket from 'ws';
import { startServer, makeModel, parseSSE, post, until } from './server.mjs';

const ALWAYS = 9001; // every step of a sequence with this seed fails
const TWICE = 9002; //  the first two such steps fail, then the fault clears
const MIDWAY = 9003; // fails once the sequence has taken 2 steps (its 3rd step)
const INJECTED = /forward pass failed \(injected by UNMASK_FAULT_FORWARD_FAIL, seed (\d+)\)/;

let srv; // slow model (~0.1 s per step), --max-batch 4: requests share steps
let solo; // tiny model, --max-batch 1: no two requests ever share a step
let hook; // webhook receiver
const received = [];

before(async () => {
  const slow = makeModel('http-slow', ['--d-model', '512', '--n-layers', '8']);
  srv = await startServer(['--max-batch', '4', '--job-attempts', '3', '--webhook-retry-base', '0.05',
    '--webhook-secret', 'faults-secret', '--webhook-allow', '127.0.0.1'], {
    model: slow,
    env: { UNMASK_FAULT_FORWARD_FAIL: `seed=${ALWAYS};seed=${TWICE},times=2;seed=${MIDWAY},after=2` },
  });
  solo = await startServer(['--max-batch', '1'], { env: { UNMASK_FAULT_FORWARD_FAIL: `seed=${ALWAYS}` } });
  hook = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d) => (body += d));
    req.on('end', () => {
      received.push({ headers: req.headers, body });
      res.writeHead(204).end();
    });
  });
  await new Promise((r) => hook.listen(0, '127.0.0.1', r));
});
after(async () => {
  await srv?.stop();
  await solo?.stop();
  hook?.close();
});

const getJob = async (id) => (await fetch(`${srv.url}/v1/jobs/${id}`)).json();
const waitStatus = (id, statuses) =>
  until(`job ${id} in ${statuses}`, async () => {
    const j = await getJob(id);
    return statuses.includes(j.status) && j;
  });
// The whole event log of a terminal job (the stream ends by itself).
async function jobEvents(id) {
  const res = await fetch(`${srv.url}/v1/jobs/${id}/events`);
  assert.equal(res.status, 200);
  return parseSSE(await res.text()).map((r) => ({ id: Number(r.id), ...JSON.parse(r.data) }));
}
// Compact view of a job log: status/retry records and the engine's done events.
const outline = (evs) =>
  evs
    .filter((e) => e.type !== 'step' && e.type !== 'block')
    .map((e) =>
      e.type === 'status'
        ? `${e.status}${e.attempt ? ' ' + e.attempt : ''}`
        : e.type === 'retry'
          ? `retry ${e.attempt}`
          : `${e.type} ${e.finish_reason}`,
    );
const finishedErrors = async (s) => {
  const text = await (await fetch(`${s.url}/metrics`)).text();
  const m = text.match(/^unmask_requests_finished_total\{finish_reason="error"\} (\d+)/m);
  return m ? Number(m[1]) : 0;
};

test('job: engine failure retried up to --job-attempts, then failed (attempts, retry log, webhook)', async () => {
  received.length = 0;
  const webhook = `http://127.0.0.1:${hook.address().port}/failed`;
  const r = await post(`${srv.url}/v1/jobs`, { prompt: 'Once upon a time', max_tokens: 8, block_length: 4, stop_at_eos: false, seed: ALWAYS, webhook });
  assert.equal(r.status, 202);
  const j = await waitStatus(r.json().id, ['failed', 'succeeded', 'cancelled']);
  assert.equal(j.status, 'failed');
  assert.equal(j.attempts, 3, 'tried --job-attempts times');
  assert.equal(j.result, null);
  assert.equal(j.error.code, 'engine_failure');
  assert.equal(j.error.type, 'server_error');
  assert.match(j.error.message, INJECTED);
  const evs = await jobEvents(j.id);
  assert.deepEqual(evs.map((e) => e.id), evs.map((_, i) => i + 1), 'event ids 1..n across attempts');
  assert.deepEqual(outline(evs), [
    'queued',
    'running 1',
    'done error',
    'retry 1',
    'running 2',
    'done error',
    'retry 2',
    'running 3',
    'done error',
    'failed',
  ]);
  for (const e of evs.filter((x) => x.type === 'retry' || x.type === 'done')) assert.match(e.error, INJECTED);
  assert.equal(evs.at(-1).attempts, 3);
  const d = await until('the job.failed webhook', () => received.find((x) => x.headers['x-unmask-event'] === 'job.failed'));
  const payload = JSON.parse(d.body);
  assert.equal(payload.id, j.id);
  assert.equal(payload.status, 'failed');
  assert.equal(payload.attempts, 3);
});

test('job: the fault clears after two failed attempts -> the third succeeds', async () => {
  const r = await post(`${srv.url}/v1/jobs`, { prompt: 'Once upon a time', max_tokens: 8, block_length: 4, stop_at_eos: false, seed: TWICE });
  assert.equal(r.status, 202);
  const j = await waitStatus(r.json().id, ['failed', 'succeeded', 'cancelled']);
  assert.equal(j.status, 'succeeded');
  assert.equal(j.attempts, 3);
  assert.equal(j.error, null);
  assert.equal(j.progress.fraction, 1);
  assert.equal(j.result.choices[0].finish_reason, 'length');
  assert.equal(typeof j.result.choices[0].text, 'string');
  const evs = await jobEvents(j.id);
  assert.deepEqual(outline(evs), [
    'queued',
    'running 1',
    'done error',
    'retry 1',
    'running 2',
    'done error',
    'retry 2',
    'running 3',
    'done length',
    'succeeded',
  ]);
  assert.equal(evs.filter((e) => e.type === 'step').length, 8, 'only the successful attempt made steps');
});

const chat = (seed, extra = {}) => ({
  model: 'x',
  messages: [{ role: 'user', content: 'Write one short sentence.' }],
  max_tokens: 8,
  block_length: 4,
  temperature: 0,
  stop_at_eos: false, // every generation runs to its full length: finish_reason "length"
  seed,
  ...extra,
});

test('SSE: an error mid-stream is sent as data: {"error":...} and the stream ends without [DONE]', async () => {
  const res = await fetch(`${srv.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(chat(MIDWAY, { stream: true, diffusing: true })),
  });
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type'), /text\/event-stream/);
  const text = await res.text(); // resolves only once the server ended the response
  assert.ok(text.endsWith('\n\n'), 'the last record is complete');
  const recs = parseSSE(text).map((r) => r.data);
  assert.ok(!recs.includes('[DONE]'), 'no [DONE] after an error');
  const objs = recs.map((d) => JSON.parse(d));
  const last = objs.at(-1);
  assert.deepEqual(Object.keys(last), ['error'], 'the error record is the last one');
  assert.equal(last.error.code, 'generation_failed');
  assert.equal(last.error.type, 'server_error');
  assert.match(last.error.message, INJECTED);
  assert.equal(objs.filter((o) => o.error).length, 1, 'exactly one error record');
  const frames = objs.filter((o) => o.diffusion_meta);
  assert.deepEqual(frames.map((o) => o.diffusion_meta.step), [1, 2], 'two steps streamed before the failing third');
  assert.equal(objs[0].choices[0].delta.role, 'assistant', 'the stream had started');
  assert.ok(objs.every((o) => o.error || o.choices[0].finish_reason === null), 'no finish chunk');

  // the official client raises the error from the stream after the chunks it got
  const client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  const stream = await client.chat.completions.create(chat(MIDWAY, { stream: true, diffusing: true }));
  const got = [];
  await assert.rejects(
    (async () => {
      for await (const ch of stream) got.push(ch);
    })(),
    (e) => e instanceof OpenAI.APIError && INJECTED.test(e.message) && e.error?.code === 'generation_failed',
  );
  assert.equal(got.filter((c) => c.diffusion_meta).length, 2);
});

test('WebSocket: done with finish_reason "error", then the session keeps generating', async () => {
  const ws = new WebSocket(`${srv.url.replace('http', 'ws')}/ws`);
  const msgs = [];
  const waiters = [];
  ws.on('message', (d) => {
    const m = JSON.parse(d.toString());
    msgs.push(m);
    for (const w of waiters.splice(0)) if (!w(m)) waiters.push(w);
  });
  const wait = (pred) =>
    new Promise((resolve, reject) => {
      const have = msgs.find(pred);
      if (have) return resolve(have);
      ws.once('close', () => reject(new Error('socket closed')));
      waiters.push((m) => pred(m) && (resolve(m), true));
    });
  try {
    await wait((m) => m.type === 'session.created');
    ws.send(JSON.stringify({ type: 'generate', id: 'bad', prompt: 'Hello', gen_length: 8, block_length: 4, stop_at_eos: false, seed: MIDWAY }));
    const done = await wait((m) => m.type === 'done' && m.id === 'bad');
    assert.equal(done.finish_reason, 'error');
    assert.match(done.error, INJECTED);
    const bad = msgs.filter((m) => m.id === 'bad');
    assert.equal(bad[0].type, 'accepted');
    // a slow reader's unsent step frames merge (`merged` counts the steps a frame carries)
    const steps = bad.filter((m) => m.type === 'step').reduce((n, m) => n + (m.merged ?? 1), 0);
    assert.equal(steps, 2, 'two steps, then the failing one');
    assert.equal(bad.filter((m) => m.type === 'done').length, 1);
    assert.equal(bad.at(-1), done, 'done is the last event of the generation');
    ws.send(JSON.stringify({ type: 'generate', id: 'good', prompt: 'Hello', gen_length: 8, block_length: 4, stop_at_eos: false, seed: 5 }));
    const ok = await wait((m) => m.type === 'done' && m.id === 'good');
    assert.equal(ok.finish_reason, 'length');
    assert.equal(ok.error, null);
  } finally {
    ws.terminate();
  }
});

// Read one streamed chat completion; onFrame(frames) is called after each diffusing frame.
async function streamChat(url, body, onFrame = () => {}) {
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true, diffusing: true }),
  });
  assert.equal(res.status, 200);
  const dec = new TextDecoder();
  let buf = '';
  const objs = [];
  let done = false;
  for await (const chunk of res.body) {
    buf += dec.decode(chunk, { stream: true });
    const cut = buf.lastIndexOf('\n\n');
    if (cut < 0) continue;
    for (const r of parseSSE(buf.slice(0, cut + 2))) {
      if (r.data === '[DONE]') done = true;
      else objs.push(JSON.parse(r.data));
    }
    buf = buf.slice(cut + 2);
    onFrame(objs.filter((o) => o.diffusion_meta));
  }
  return { objs, done, error: objs.find((o) => o.error)?.error, frames: objs.filter((o) => o.diffusion_meta) };
}

test('batch-mates: a failed step fails every sequence in it; the server keeps serving', async () => {
  const errors0 = await finishedErrors(srv);
  // a healthy request that would take 512 steps; once it is running, a failing one joins its batch
  // (the failure comes 3 steps later, so the healthy one is certainly still running then)
  let running;
  const isRunning = new Promise((r) => (running = r));
  const long = { max_tokens: 512, block_length: 512, steps: 512 };
  const healthyP = streamChat(srv.url, chat(77, long), (f) => f.length && running());
  await isRunning;
  const bad = await streamChat(srv.url, chat(MIDWAY));
  const healthy = await healthyP;
  assert.match(bad.error.message, INJECTED);
  assert.equal(bad.frames.length, 2);
  // the healthy request shared the failing step: it fails with the same error, mid-way
  assert.equal(healthy.done, false);
  assert.equal(healthy.error?.code, 'generation_failed');
  assert.equal(healthy.error.message, bad.error.message, 'the batch-wide failure, naming the seed that caused it');
  assert.ok(healthy.frames.length >= 3 && healthy.frames.length < 512, `failed mid-way (${healthy.frames.length} frames)`);
  assert.equal(await finishedErrors(srv), errors0 + 2, 'exactly the two sequences of that step failed');
  // afterwards: healthy requests succeed
  const after = await streamChat(srv.url, chat(78));
  assert.equal(after.done, true);
  assert.equal(after.error, undefined);
  assert.equal(after.frames.at(-1).choices[0].finish_reason, 'length');
  assert.equal((await fetch(`${srv.url}/health`)).status, 200);
  assert.equal(await finishedErrors(srv), errors0 + 2);
});

test('requests outside the failing step are unaffected (--max-batch 1: no shared steps)', async () => {
  const client = new OpenAI({ baseURL: `${solo.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  const body = (seed) => ({ ...chat(seed), max_tokens: 16 });
  const reqs = [1, ALWAYS, 2, ALWAYS, 3, ALWAYS].map((seed) =>
    client.chat.completions.create(body(seed)).then(
      (r) => ({ seed, ok: r }),
      (e) => ({ seed, err: e }),
    ),
  );
  const out = await Promise.all(reqs);
  for (const o of out) {
    if (o.seed === ALWAYS) {
      assert.equal(o.err?.status, 500, 'the faulty request fails');
      assert.equal(o.err.error.code, 'generation_failed');
      assert.match(o.err.message, INJECTED);
    } else {
      assert.equal(o.err, undefined, `healthy seed ${o.seed}: ${o.err?.message}`);
      assert.equal(o.ok.choices[0].finish_reason, 'length');
      assert.equal(o.ok.usage.completion_tokens, 16);
    }
  }
  assert.equal(await finishedErrors(solo), 3);
  assert.equal((await fetch(`${solo.url}/health`)).status, 200);
});
