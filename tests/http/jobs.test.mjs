// jobs.test.mjs — async jobs on the real server: 202 + polling to the result, Idempotency-Key,
// the SSE event stream with id: lines resumed with Last-Event-ID (exactly the missing events),
// DELETE cancelling a running job, and signed webhooks received by a local HTTP listener
// (HMAC-SHA256 checked, retried with backoff after a failure).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import crypto from 'node:crypto';
import { startServer, makeModel, parseSSE, post, until } from './server.mjs';

const SECRET = 'test-webhook-secret';
let srv;
let hook; // local webhook receiver
const received = [];
let failFirst = 0;

before(async () => {
  // a slower checkpoint (about 0.1 s per step) so that a running job can be cancelled mid-way
  const model = makeModel('http-slow', ['--d-model', '512', '--n-layers', '8']);
  // the receiver listens on loopback: webhooks reach internal addresses only when allowed
  srv = await startServer(['--webhook-secret', SECRET, '--webhook-retry-base', '0.05', '--max-batch', '4',
    '--webhook-allow', '127.0.0.1/32'], { model });
  hook = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d) => (body += d));
    req.on('end', () => {
      received.push({ headers: req.headers, body, url: req.url });
      if (failFirst > 0) {
        failFirst--;
        res.writeHead(500).end('try again');
      } else {
        res.writeHead(204).end();
      }
    });
  });
  await new Promise((r) => hook.listen(0, '127.0.0.1', r));
});
after(async () => {
  await srv?.stop();
  hook?.close();
});

const job = (extra = {}) => ({ prompt: 'Once upon a time', max_tokens: 8, block_length: 4, temperature: 0, ...extra });
const getJob = async (id) => (await fetch(`${srv.url}/v1/jobs/${id}`)).json();
const waitStatus = (id, statuses) =>
  until(`job ${id} in ${statuses}`, async () => {
    const j = await getJob(id);
    return statuses.includes(j.status) && j;
  });

test('POST /v1/jobs -> 202, Location, polling to succeeded with the result', async () => {
  const r = await post(`${srv.url}/v1/jobs`, job());
  assert.equal(r.status, 202);
  assert.equal(r.statusText, 'Accepted', 'the status line has its reason phrase');
  const j = r.json();
  assert.match(j.id, /^job_[0-9a-f]{24}$/);
  assert.equal(r.headers.get('location'), `/v1/jobs/${j.id}`);
  assert.ok(['queued', 'running'].includes(j.status));
  const done = await waitStatus(j.id, ['succeeded', 'failed']);
  assert.equal(done.status, 'succeeded');
  assert.equal(done.progress.fraction, 1);
  assert.equal(done.attempts, 1);
  assert.equal(done.result.object, 'text_completion');
  assert.equal(done.result.id, j.id, 'the result is known by its job id');
  assert.equal(typeof done.result.choices[0].text, 'string');
  assert.ok(done.completed_at >= done.created_at);
  // chat-shaped jobs too
  const c = (await post(`${srv.url}/v1/jobs`, { messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 })).json();
  const cd = await waitStatus(c.id, ['succeeded', 'failed']);
  assert.equal(cd.result.object, 'chat.completion');
});

test('Idempotency-Key: same key + body -> same job; same key + other body -> 422', async () => {
  const h = { 'idempotency-key': 'order-77' };
  const a = await post(`${srv.url}/v1/jobs`, job(), h);
  const b = await post(`${srv.url}/v1/jobs`, job(), h);
  assert.equal(a.status, 202);
  assert.equal(b.status, 202);
  assert.equal(a.json().id, b.json().id);
  assert.equal(b.headers.get('idempotent-replayed'), 'true');
  const c = await post(`${srv.url}/v1/jobs`, job({ max_tokens: 4 }), h);
  assert.equal(c.status, 422);
  assert.equal(c.json().error.param, 'Idempotency-Key');
  const d = await post(`${srv.url}/v1/jobs`, job(), { 'idempotency-key': 'order-78' });
  assert.notEqual(d.json().id, a.json().id);
  // sent together (validated on preparation workers): still one job, the later ones replayed
  const h2 = { 'idempotency-key': 'order-79' };
  const all = await Promise.all([1, 2, 3].map(() => post(`${srv.url}/v1/jobs`, job(), h2)));
  assert.deepEqual(all.map((r) => r.status), [202, 202, 202]);
  assert.equal(new Set(all.map((r) => r.json().id)).size, 1);
  assert.equal(all.filter((r) => r.headers.get('idempotent-replayed') === 'true').length, 2);
});

// Read SSE records from a streaming fetch until `stop(recs)` is true, then abort.
async function readEvents(url, headers, stop) {
  const ac = new AbortController();
  const res = await fetch(url, { headers, signal: ac.signal });
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type'), /text\/event-stream/);
  const dec = new TextDecoder();
  let buf = '';
  const recs = [];
  try {
    for await (const chunk of res.body) {
      buf += dec.decode(chunk, { stream: true });
      const cut = buf.lastIndexOf('\n\n');
      if (cut < 0) continue;
      recs.push(...parseSSE(buf.slice(0, cut + 2)));
      buf = buf.slice(cut + 2);
      if (stop(recs)) {
        ac.abort();
        break;
      }
    }
  } catch (e) {
    if (e.name !== 'AbortError') throw e;
  }
  return recs;
}

test('job events: SSE with id: lines, resumed with Last-Event-ID gets exactly the missing events', async () => {
  const j = (await post(`${srv.url}/v1/jobs`, job())).json();
  const first = await readEvents(`${srv.url}/v1/jobs/${j.id}/events`, {}, (recs) => recs.length >= 3);
  assert.deepEqual(first.slice(0, 3).map((r) => r.id), ['1', '2', '3']);
  assert.equal(JSON.parse(first[0].data).status, 'queued');
  const lastSeen = 3; // the client processed 3 events, then lost its connection
  await waitStatus(j.id, ['succeeded']);
  // resume: everything after lastSeen, then the stream ends by itself
  const rest = await readEvents(`${srv.url}/v1/jobs/${j.id}/events`, { 'last-event-id': String(lastSeen) }, () => false);
  const all = await readEvents(`${srv.url}/v1/jobs/${j.id}/events`, {}, () => false);
  const ids = rest.map((r) => Number(r.id));
  assert.equal(ids[0], lastSeen + 1, 'starts right after Last-Event-ID');
  for (let i = 1; i < ids.length; i++) assert.equal(ids[i], ids[i - 1] + 1, 'no gaps, no repeats');
  assert.deepEqual(rest, all.slice(lastSeen), 'exactly the events the first connection missed');
  const types = all.map((r) => JSON.parse(r.data).type);
  assert.ok(types.includes('step') && types.includes('block') && types.includes('done'));
  const final = JSON.parse(all.at(-1).data);
  assert.equal(final.type, 'status');
  assert.equal(final.status, 'succeeded');
  // ?after= works like the header
  const q = await readEvents(`${srv.url}/v1/jobs/${j.id}/events?after=${all.length - 1}`, {}, () => false);
  assert.equal(q.length, 1);
  const bad = await fetch(`${srv.url}/v1/jobs/${j.id}/events`, { headers: { 'last-event-id': 'x' } });
  assert.equal(bad.status, 400);
});

test('DELETE cancels a running job; a finished one answers 409', async () => {
  const j = (await post(`${srv.url}/v1/jobs`, job({ max_tokens: 32, block_length: 8 }))).json();
  await until('running', async () => {
    const s = await getJob(j.id);
    return s.status === 'running' && s.progress.steps >= 1;
  });
  const d = await fetch(`${srv.url}/v1/jobs/${j.id}`, { method: 'DELETE' });
  assert.equal(d.status, 200);
  // not the pre-cancel status: cancelling until the engine stops at the next step, or already cancelled
  assert.ok(['cancelling', 'cancelled'].includes((await d.json()).status));
  const c = await waitStatus(j.id, ['cancelled', 'succeeded']);
  assert.equal(c.status, 'cancelled');
  assert.ok(c.progress.fraction < 1);
  const again = await fetch(`${srv.url}/v1/jobs/${j.id}`, { method: 'DELETE' });
  assert.equal(again.status, 409);
  assert.equal(again.headers.get('x-should-retry'), 'false');
  assert.equal((await again.json()).error.code, 'job_finished');
});

test('GET /v1/jobs: newest first, status filter, pagination with after/limit/has_more', async () => {
  const ids = [];
  for (let i = 0; i < 3; i++) ids.push((await post(`${srv.url}/v1/jobs`, job({ max_tokens: 4, seed: 100 + i }))).json().id);
  for (const id of ids) await waitStatus(id, ['succeeded', 'failed']);
  const list = async (q) => {
    const r = await fetch(`${srv.url}/v1/jobs${q}`);
    assert.equal(r.status, 200, q);
    return r.json();
  };
  const all = await list('?limit=100');
  assert.equal(all.object, 'list');
  const pos = ids.map((id) => all.data.findIndex((j) => j.id === id));
  assert.ok(pos.every((p) => p >= 0), 'every job listed');
  assert.deepEqual([...pos].sort((a, b) => b - a), pos, 'newest first');
  const created = all.data.map((j) => j.created_at);
  assert.deepEqual([...created].sort((a, b) => b - a), created);
  // pages of 2 walk the same list without gaps or repeats
  const walked = [];
  let after = '';
  for (;;) {
    const page = await list(`?limit=2${after ? `&after=${after}` : ''}`);
    walked.push(...page.data.map((j) => j.id));
    assert.ok(page.data.length <= 2);
    if (!page.has_more) break;
    assert.equal(page.last_id, page.data.at(-1).id);
    after = page.last_id;
  }
  assert.deepEqual(walked, all.data.map((j) => j.id));
  const ok = await list('?status=succeeded&limit=100');
  assert.ok(ok.data.length >= 3 && ok.data.every((j) => j.status === 'succeeded'));
  for (const q of ['?status=done', '?limit=0', '?limit=101', '?after=job_000000000000000000000000']) {
    const r = await fetch(`${srv.url}/v1/jobs${q}`);
    assert.equal(r.status, 400, q);
    assert.equal((await r.json()).error.code, 'invalid_value');
  }
});

const sign = (body) => 'sha256=' + crypto.createHmac('sha256', SECRET).update(body).digest('hex');

test('webhook: signed POST on completion, retried with backoff after a 500', async () => {
  received.length = 0;
  failFirst = 1;
  const url = `http://127.0.0.1:${hook.address().port}/hooks/unmask?x=1`;
  const j = (await post(`${srv.url}/v1/jobs`, job({ webhook: url }))).json();
  assert.equal(j.webhook.url, url);
  await until('two webhook deliveries', () => received.length >= 2);
  const [a, b] = received;
  assert.equal(a.url, '/hooks/unmask?x=1');
  for (const r of [a, b]) {
    assert.equal(r.headers['content-type'], 'application/json');
    assert.equal(r.headers['x-unmask-signature'], sign(r.body), 'HMAC-SHA256 of the raw body');
    assert.equal(r.headers['x-unmask-event'], 'job.succeeded');
  }
  assert.equal(a.headers['x-unmask-delivery'], b.headers['x-unmask-delivery'], 'same delivery id on the retry');
  assert.equal(a.body, b.body);
  const payload = JSON.parse(b.body);
  assert.equal(payload.id, j.id);
  assert.equal(payload.status, 'succeeded');
  assert.equal(typeof payload.result.choices[0].text, 'string');
  const s = await until('webhook delivered', async () => {
    const g = await getJob(j.id);
    return g.webhook.status === 'delivered' && g;
  });
  assert.equal(s.webhook.attempts, 2);
  // a tampered body would not verify
  assert.notEqual(sign(b.body + ' '), b.headers['x-unmask-signature']);
});

test('job input errors: stream, bad webhook URL, unknown job', async () => {
  const s = await post(`${srv.url}/v1/jobs`, job({ stream: true }));
  assert.equal(s.status, 400);
  assert.equal(s.json().error.param, 'stream');
  const w = await post(`${srv.url}/v1/jobs`, job({ webhook: 'ftp://x/y' }));
  assert.equal(w.status, 400);
  assert.equal(w.json().error.param, 'webhook');
  // SSRF: internal targets outside --webhook-allow are refused, in any spelling
  for (const target of ['http://169.254.169.254/latest/meta-data/', 'http://127.0.0.2:8080/', 'http://2130706434/',
    'http://[::ffff:10.0.0.1]/', 'http://10.0.0.1/',
    // IPv6 forms that embed an internal IPv4 address or are not global (accepted before issue 26)
    'http://[::ffff:0:a9fe:a9fe]/', 'http://[::ffff:0:10.0.0.1]/', 'http://[::ffff:0:127.0.0.1]/',
    'http://[64:ff9b:1::a9fe:a9fe]/', 'http://[64:ff9b:1::7f00:1]/', 'http://[::1:a9fe:a9fe]/',
    'http://[::ffff:0:0:a9fe:a9fe]/', 'http://[2001:10::1]/']) {
    const r = await post(`${srv.url}/v1/jobs`, job({ webhook: target }));
    assert.equal(r.status, 400, `${target}: ${r.text}`);
    assert.equal(r.json().error.param, 'webhook');
    assert.match(r.json().error.message, /internal address|--webhook-allow/);
  }
  const v = await post(`${srv.url}/v1/jobs`, job({ diffusion_steps: -1 }));
  assert.equal(v.status, 400);
  assert.equal(v.json().error.param, 'diffusion_steps');
  const u = await fetch(`${srv.url}/v1/jobs/job_000000000000000000000000`);
  assert.equal(u.status, 404);
  assert.equal((await u.json()).error.code, 'job_not_found');
  const e = await fetch(`${srv.url}/v1/jobs/job_000000000000000000000000/events`);
  assert.equal(e.status, 404);
  const x = await fetch(`${srv.url}/v1/jobs/abc/def`);
  assert.equal(x.status, 404);
});
