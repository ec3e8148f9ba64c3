// replica.test.mjs — several `unmask serve` replicas on one Redis job store (--store redis://):
// they share one queue (both run jobs, each job is taken once), any replica answers for any job
// (GET, SSE, Idempotency-Key); a replica SIGKILLed mid-job has its jobs finished by the other,
// each exactly once as its webhook receiver sees them after deduplication by X-Unmask-Delivery;
// DELETE ends a running job, one waiting for a batch slot and one still in the shared queue;
// Redis restarted mid-run gives 503 + Retry-After during the gap and loses no job; jobs and SSE
// pass through nginx (config/nginx/unmask.conf); 1000 jobs across two replicas complete with no
// loss and no duplicate. Real redis-server and nginx, started and stopped here.
import { test, before, after, beforeEach, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { TMP, startServer, makeModel, parseSSE, post, startWebhookReceiver, until } from '../http/server.mjs';
import { startRedis, startNginx, redisCmd } from './infra.mjs';

const SECRET = 'replica-secret';
const DIR = path.join(TMP, 'replica');
let redis;
let hook;
const deliveries = []; // {id: X-Unmask-Delivery, job, status}
let tiny;
let slow;
let running = []; // servers and proxies of the current test

before(async () => {
  fs.rmSync(DIR, { recursive: true, force: true });
  fs.mkdirSync(DIR, { recursive: true });
  tiny = makeModel();
  slow = makeModel('http-slow', ['--d-model', '512', '--n-layers', '8']); // about 0.1 s per step
  redis = await startRedis(path.join(DIR, 'redis'));
  hook = await startWebhookReceiver(deliveries);
});
after(async () => {
  for (const s of running) await s.stop();
  await redis?.stop();
  hook?.close();
});
beforeEach(async () => {
  deliveries.length = 0;
  await redisCmd(redis.port, 'FLUSHALL');
});
afterEach(async () => {
  for (const s of running) await s.stop();
  running = [];
});

const webhook = () => hook.url;
const replica = async (extra = [], model = tiny) => {
  const s = await startServer(['--store', redis.url, '--webhook-secret', SECRET, '--webhook-allow', '127.0.0.1/32',
    '--webhook-retry-base', '0.05', ...extra], { model });
  running.push(s);
  return s;
};
const metric = async (srv, name) => {
  const m = (await (await fetch(`${srv.url}/metrics`)).text()).match(new RegExp(`^unmask_${name} (\\S+)$`, 'm'));
  assert.ok(m, `metric ${name}`);
  return Number(m[1]);
};
const job = async (base, id) => (await fetch(`${base}/v1/jobs/${id}`)).json();
const allSucceeded = (base, ids, ms = 120000) => until(`${ids.length} jobs succeeded`, async () => {
  for (const id of ids) if ((await job(base, id)).status !== 'succeeded') return false;
  return true;
}, ms, 100);
// after deduplication by delivery id: exactly one delivery per job, and it says succeeded
const exactlyOnce = (ids) => {
  const byId = new Map(deliveries.map((d) => [d.id, d]));
  assert.equal(byId.size, ids.length, `distinct deliveries ${byId.size} for ${ids.length} jobs`);
  for (const id of ids) {
    const d = byId.get(`${id}.succeeded`);
    assert.ok(d && d.job === id && d.status === 'succeeded', `one succeeded delivery for ${id}`);
  }
};
const eventsOf = async (base, id) => {
  const ev = parseSSE(await (await fetch(`${base}/v1/jobs/${id}/events`)).text());
  const ids = ev.map((e) => Number(e.id));
  assert.deepEqual(ids, ids.map((_, i) => i + 1), `${id}: event ids 1..n without gaps`);
  return ev.map((e) => JSON.parse(e.data));
};

test('two replicas share the queue: both run jobs, each job once, any replica answers', async () => {
  const a = await replica(['--job-capacity', '2']);
  const b = await replica(['--job-capacity', '2']);
  const ids = [];
  for (let i = 0; i < 20; i++) {
    const r = await post(`${(i % 2 ? b : a).url}/v1/jobs`, { prompt: `job ${i}`, max_tokens: 16, block_length: 8, steps: 16, seed: i, webhook: webhook() });
    assert.equal(r.status, 202, r.text);
    ids.push(r.json().id);
  }
  await allSucceeded(a.url, ids);
  await until('every webhook', async () => new Set(deliveries.map((d) => d.id)).size >= ids.length, 30000);
  exactlyOnce(ids);
  const heldA = await metric(a, 'jobs_held');
  const heldB = await metric(b, 'jobs_held');
  assert.ok(heldA > 0 && heldB > 0, `both replicas ran jobs (A ${heldA}, B ${heldB})`);
  assert.equal(heldA + heldB, ids.length, 'each job was taken by one replica only');
  for (const id of ids.slice(0, 4)) {
    const ja = await job(a.url, id);
    const jb = await job(b.url, id);
    assert.deepEqual(ja.result, jb.result, 'the same job on either replica');
    assert.equal(ja.result.id, id);
    assert.equal(ja.attempts, 1);
    for (const base of [a.url, b.url]) {
      const ev = await eventsOf(base, id);
      assert.equal(ev[0].status, 'queued');
      assert.equal(ev.at(-1).status, 'succeeded');
      assert.ok(ev.some((e) => e.type === 'step' || e.progress), `${id}: step events in the log`);
    }
  }
  // GET /v1/jobs lists the caller's jobs from the shared store on either replica
  const list = await (await fetch(`${b.url}/v1/jobs?limit=100`)).json();
  assert.deepEqual(new Set(list.data.map((j) => j.id)), new Set(ids));
  // Idempotency-Key across replicas: the same job; another body under the key is refused
  const body = { prompt: 'keyed', max_tokens: 8, steps: 8, block_length: 8 };
  const k1 = await post(`${a.url}/v1/jobs`, body, { 'idempotency-key': 'rk-1' });
  assert.equal(k1.status, 202, k1.text);
  const k2 = await post(`${b.url}/v1/jobs`, body, { 'idempotency-key': 'rk-1' });
  assert.equal(k2.status, 202, k2.text);
  assert.equal(k2.json().id, k1.json().id, 'the replay on the other replica is the same job');
  assert.equal(k2.headers.get('idempotent-replayed'), 'true');
  const k3 = await post(`${b.url}/v1/jobs`, { ...body, prompt: 'other' }, { 'idempotency-key': 'rk-1' });
  assert.equal(k3.status, 422);
  assert.equal(k3.json().error.code, 'idempotency_key_reused');
  // the same key on both replicas at once: one job
  const raced = [];
  for (let i = 0; i < 10; i++) {
    const [x, y] = await Promise.all([a, b].map((r) => post(`${r.url}/v1/jobs`, { ...body, prompt: `race ${i}` }, { 'idempotency-key': `race-${i}` })));
    assert.equal(x.status, 202, x.text);
    assert.equal(y.status, 202, y.text);
    assert.equal(x.json().id, y.json().id, `race-${i}: one job`);
    raced.push(x.json().id);
  }
  await allSucceeded(b.url, [k1.json().id, ...raced]);
});

test('SIGKILL one replica mid-job: its jobs complete on the other, each exactly once', async () => {
  const a = await replica(['--job-capacity', '2', '--max-batch', '2'], slow);
  const b = await replica(['--job-capacity', '2', '--max-batch', '2'], slow);
  const ids = [];
  for (let i = 0; i < 8; i++) {
    const r = await post(`${a.url}/v1/jobs`, { prompt: `kill ${i}`, max_tokens: 32, block_length: 8, steps: 32, seed: i, webhook: webhook() });
    assert.equal(r.status, 202, r.text);
    ids.push(r.json().id);
  }
  await until('a job running on A', async () => (await metric(a, 'jobs_running')) >= 1, 60000);
  await a.stop('SIGKILL');
  await allSucceeded(b.url, ids, 180000);
  await until('every webhook', async () => new Set(deliveries.map((d) => d.id)).size >= ids.length, 30000);
  exactlyOnce(ids);
  let retried = 0;
  for (const id of ids) {
    const j = await job(b.url, id);
    assert.equal(j.result.id, id);
    const ev = await eventsOf(b.url, id);
    assert.equal(ev.at(-1).status, 'succeeded');
    if (j.attempts > 1) {
      retried++;
      const retry = ev.find((e) => e.type === 'retry');
      assert.ok(retry, `${id}: the retry is logged`);
      assert.match(retry.error, /replica lost/);
    }
  }
  assert.ok(retried >= 1, 'the job A was running ran again on B');
  assert.match(b.logs(), /took over job/);
});

test('DELETE: a job running, one waiting for a batch slot, one still in the shared queue: each ends cancelled', async () => {
  // capacity 2, batch 1: the replica holds two jobs (one runs, one waits for the slot); the next
  // two stay in the Redis queue, held by no replica
  const a = await replica(['--job-capacity', '2', '--max-batch', '1'], slow);
  const ids = [];
  for (let i = 0; i < 4; i++) {
    const r = await post(`${a.url}/v1/jobs`, { prompt: `cancel ${i}`, max_tokens: 32, block_length: 8, steps: 32, seed: i });
    assert.equal(r.status, 202, r.text);
    ids.push(r.json().id);
  }
  await until('the first job ran a step, two jobs held', async () => (await job(a.url, ids[0])).progress.steps >= 1 &&
    (await metric(a, 'jobs_queued')) + (await metric(a, 'jobs_running')) === 2, 60000);
  assert.equal(await metric(a, 'jobs_running'), 1, 'only the job in the batch is running');
  const waiting = await job(a.url, ids[1]);
  assert.equal(waiting.status, 'queued', 'a job waiting for a batch slot is queued (not running)');
  assert.equal(waiting.attempts, 0);
  const del = async (id) => {
    const r = await fetch(`${a.url}/v1/jobs/${id}`, { method: 'DELETE' });
    assert.equal(r.status, 200, `DELETE ${id}`);
    return (await r.json()).status;
  };
  assert.equal(await del(ids[3]), 'cancelled', 'in the shared queue: cancelled at once');
  assert.equal(await del(ids[1]), 'cancelled', 'waiting for a batch slot: cancelled at once');
  assert.equal(await del(ids[0]), 'cancelling', 'running: stops at the next step');
  await until('the running job cancelled', async () => (await job(a.url, ids[0])).status === 'cancelled', 60000);
  await allSucceeded(a.url, [ids[2]], 120000);
  for (const id of [ids[1], ids[3]]) {
    assert.deepEqual(await eventsOf(a.url, id), [{ type: 'status', status: 'queued' }, { type: 'status', status: 'cancelled', attempts: 0 }],
      `${id}: queued, then cancelled; nothing ran`);
    assert.equal((await job(a.url, id)).started_at, null);
  }
  const ev = await eventsOf(a.url, ids[0]);
  assert.deepEqual(ev.slice(0, 2), [{ type: 'status', status: 'queued' }, { type: 'status', status: 'running', attempt: 1 }]);
  assert.equal(ev[2].type, 'step');
  assert.deepEqual(ev.at(-1), { type: 'status', status: 'cancelled', attempts: 1 });
});

test('Redis restarted mid-run: 503 with Retry-After during the gap, /health and metrics say so, no job lost', async () => {
  const a = await replica(['--job-capacity', '2', '--max-batch', '2'], slow);
  const b = await replica(['--job-capacity', '2', '--max-batch', '2'], slow);
  const ids = [];
  for (let i = 0; i < 6; i++) {
    const r = await post(`${(i % 2 ? b : a).url}/v1/jobs`, { prompt: `gap ${i}`, max_tokens: 16, block_length: 8, steps: 16, seed: i, webhook: webhook() });
    assert.equal(r.status, 202, r.text);
    ids.push(r.json().id);
  }
  await until('a job running', async () => (await metric(a, 'jobs_running')) + (await metric(b, 'jobs_running')) >= 1, 60000);
  await redis.shutdownSave();
  const refused = await until('a 503 while Redis is down', async () => {
    const r = await post(`${a.url}/v1/jobs`, { prompt: 'in the gap', max_tokens: 8 });
    return r.status === 503 ? r : r.status === 202 ? assert.fail('a job was accepted while Redis was down') : null;
  }, 15000, 50);
  assert.equal(refused.json().error.code, 'store_unavailable');
  assert.match(refused.json().error.message, /redis:\/\/127\.0\.0\.1/i);
  assert.ok(Number(refused.headers.get('retry-after')) >= 1, 'Retry-After');
  await until('/health not ready on both', async () => (await fetch(`${a.url}/health`)).status === 503 &&
    (await fetch(`${b.url}/health`)).status === 503, 10000, 50);
  assert.equal((await (await fetch(`${b.url}/health`)).json()).status, 'degraded');
  assert.equal((await fetch(`${a.url}/health/live`)).status, 200, 'alive all the same');
  assert.equal(await metric(a, 'job_store_failing'), 1);
  await redis.start();
  await until('new jobs accepted again', async () => {
    const r = await post(`${b.url}/v1/jobs`, { prompt: 'after the gap', max_tokens: 8, steps: 8, block_length: 8, webhook: webhook() });
    if (r.status === 202) ids.push(r.json().id);
    return r.status === 202;
  }, 15000, 50);
  // each replica reconnects on its own backoff (0.1 s doubling, at most 2 s)
  await until('/health ready again on both', async () => (await fetch(`${a.url}/health`)).status === 200 &&
    (await fetch(`${b.url}/health`)).status === 200, 10000, 50);
  await allSucceeded(a.url, ids, 180000);
  await until('every webhook', async () => new Set(deliveries.map((d) => d.id)).size >= ids.length, 30000);
  exactlyOnce(ids);
  assert.equal(await metric(a, 'job_store_failing'), 0);
});

test('behind nginx (config/nginx/unmask.conf): jobs and their SSE events through the proxy', async () => {
  const a = await replica(['--job-capacity', '2', '--trusted-proxies', '127.0.0.1/32'], slow);
  const b = await replica(['--job-capacity', '2', '--trusted-proxies', '127.0.0.1/32'], slow);
  const nginx = await startNginx(path.join(DIR, 'nginx'), [`127.0.0.1:${a.port}`, `127.0.0.1:${b.port}`]);
  running.push(nginx);
  const ids = [];
  for (let i = 0; i < 6; i++) {
    const r = await post(`${nginx.url}/v1/jobs`, { prompt: `proxied ${i}`, max_tokens: 32, block_length: 8, steps: 32, seed: i });
    assert.equal(r.status, 202, r.text);
    ids.push(r.json().id);
  }
  // SSE through nginx arrives as it is written (proxy_buffering off): the first events come while
  // the job still runs, and the stream ends with the final status
  const res = await fetch(`${nginx.url}/v1/jobs/${ids.at(-1)}/events`);
  assert.equal(res.headers.get('content-type'), 'text/event-stream');
  const reader = res.body.getReader();
  const first = await reader.read();
  assert.ok(!first.done && first.value.length > 0);
  const statusAtFirst = (await job(nginx.url, ids.at(-1))).status;
  assert.notEqual(statusAtFirst, 'succeeded', 'the first event came before the job finished');
  let text = Buffer.from(first.value).toString();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    text += Buffer.from(value).toString();
  }
  const ev = parseSSE(text).map((e) => JSON.parse(e.data));
  assert.equal(ev[0].status, 'queued');
  assert.equal(ev.at(-1).status, 'succeeded');
  await allSucceeded(nginx.url, ids, 120000);
  const heldA = await metric(a, 'jobs_held');
  const heldB = await metric(b, 'jobs_held');
  assert.equal(heldA + heldB, ids.length);
  assert.ok(heldA > 0 && heldB > 0, `both replicas ran jobs (A ${heldA}, B ${heldB})`);
});

test('load: 1000 small jobs across two replicas complete with no loss and no duplicate', async () => {
  const a = await replica(['--job-capacity', '16', '--max-batch', '16']);
  const b = await replica(['--job-capacity', '16', '--max-batch', '16']);
  const t0 = Date.now();
  const ids = [];
  for (let i = 0; i < 1000; i += 50) {
    const rs = await Promise.all(Array.from({ length: 50 }, (_, k) => post(`${((i + k) % 2 ? b : a).url}/v1/jobs`,
      { prompt: `load ${i + k}`, max_tokens: 4, block_length: 4, steps: 4, seed: i + k, webhook: webhook() })));
    for (const r of rs) {
      assert.equal(r.status, 202, r.text);
      ids.push(r.json().id);
    }
  }
  assert.equal(new Set(ids).size, 1000);
  await until('1000 webhooks', async () => new Set(deliveries.map((d) => d.id)).size >= ids.length, 120000, 100);
  exactlyOnce(ids);
  const heldA = await metric(a, 'jobs_held');
  const heldB = await metric(b, 'jobs_held');
  assert.equal(heldA + heldB, 1000, 'each job taken once');
  // the queue is empty and nothing is left pending
  await until('queue drained', async () => (await redisCmd(redis.port, 'XLEN', 'unmask:queue')) === 0 &&
    (await redisCmd(redis.port, 'XPENDING', 'unmask:queue', 'unmask'))[0] === 0, 10000, 50);
  console.log(`1000 jobs in ${((Date.now() - t0) / 1000).toFixed(1)} s (A ran ${heldA}, B ${heldB})`);
});

test('Redis unreachable at start, or a bad URL: a clear error naming the URL, exit status not 0', async () => {
  const { spawnSync } = await import('node:child_process');
  const { freePort } = await import('./infra.mjs');
  const port = await freePort(); // nothing listens there
  const down = spawnSync(process.env.UNMASK_BIN, ['serve', '--store', `redis://127.0.0.1:${port}/2`, '--model', tiny, '--port', '0'],
    { encoding: 'utf8', timeout: 30000 });
  assert.notEqual(down.status, 0);
  assert.match(down.stderr, new RegExp(`cannot reach Redis at redis://127\\.0\\.0\\.1:${port}/2`));
  const bad = spawnSync(process.env.UNMASK_BIN, ['serve', '--store', 'redis://127.0.0.1:notaport', '--model', tiny, '--port', '0'],
    { encoding: 'utf8', timeout: 30000 });
  assert.notEqual(bad.status, 0);
  assert.match(bad.stderr, /--store redis:\/\/127\.0\.0\.1:notaport: the port must be 1\.\.65535/);
});
