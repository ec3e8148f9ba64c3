// durable.test.mjs — async jobs in the SQLite store (--store sqlite:PATH) survive SIGKILL: 50 jobs
// submitted, the server killed mid-run, restarted on the same file: every job reaches succeeded
// exactly once as its webhook receiver sees it after deduplication by X-Unmask-Delivery, results
// and event logs are intact, interrupted jobs were retried (a "retry" event, the attempt count kept),
// Idempotency-Key replays the same job after the restart. A store that cannot write refuses new
// jobs (503, /health degraded) until it can again. Bad stores are clear startup errors:
// a file another server holds, a file that is not a job store, an unknown --store.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { BIN, TMP, startServer, makeModel, parseSSE, post, startWebhookReceiver, until } from './server.mjs';

const SECRET = 'durable-secret';
const DIR = path.join(TMP, 'durable');
const STORE = path.join(DIR, 'jobs.db');
let hook;
const deliveries = []; // {id: X-Unmask-Delivery, job, status}
let model;
const servers = [];

before(async () => {
  fs.rmSync(DIR, { recursive: true, force: true });
  fs.mkdirSync(DIR, { recursive: true });
  // about 0.1 s per step: the server is killed while jobs are still queued and running
  model = makeModel('http-slow', ['--d-model', '512', '--n-layers', '8']);
  hook = await startWebhookReceiver(deliveries);
});
after(async () => {
  for (const s of servers) await s.stop();
  hook?.close();
});

const serve = async () => {
  const s = await startServer(['--store', `sqlite:${STORE}`, '--webhook-secret', SECRET, '--webhook-allow', '127.0.0.1/32',
    '--webhook-retry-base', '0.05', '--max-batch', '8'], { model });
  servers.push(s);
  return s;
};

test('50 jobs survive SIGKILL: each succeeds exactly once, results and logs intact', async () => {
  const a = await serve();
  const webhook = hook.url;
  const ids = [];
  for (let i = 0; i < 50; i++) {
    const r = await post(`${a.url}/v1/jobs`, { prompt: `job ${i}`, max_tokens: 8, block_length: 8, steps: 8, seed: i, webhook });
    assert.equal(r.status, 202, r.text);
    ids.push(r.json().id);
  }
  const idem = await post(`${a.url}/v1/jobs`, { prompt: 'keyed', max_tokens: 8, webhook }, { 'idempotency-key': 'k-1' });
  assert.equal(idem.status, 202);
  ids.push(idem.json().id);
  // kill it mid-run: some jobs done, others queued or running
  await until('10 jobs done', async () => new Set(deliveries.map((d) => d.job)).size >= 10, 120000);
  await a.stop('SIGKILL');
  const doneBefore = new Set(deliveries.map((d) => d.job)).size;
  assert.ok(doneBefore < ids.length, `killed before the end (${doneBefore} done)`);

  const b = await serve();
  assert.match(b.logs(), /job store: \d+ jobs? to run again/);
  await until('every job succeeded', async () => {
    const l = await (await fetch(`${b.url}/v1/jobs?status=succeeded&limit=100`)).json();
    return l.data.length === ids.length;
  }, 240000);
  await until('every webhook', async () => new Set(deliveries.map((d) => d.id)).size >= ids.length, 60000);
  // after deduplication by delivery id: exactly one "succeeded" delivery per job, nothing else
  const byId = new Map(deliveries.map((d) => [d.id, d]));
  assert.equal(byId.size, ids.length, `distinct deliveries: ${[...byId.keys()].length}`);
  for (const id of ids) {
    const d = byId.get(`${id}.succeeded`);
    assert.ok(d && d.job === id && d.status === 'succeeded', `webhook of ${id}`);
  }
  let retried = 0;
  for (const id of ids) {
    const j = await (await fetch(`${b.url}/v1/jobs/${id}`)).json();
    assert.equal(j.status, 'succeeded');
    assert.equal(j.result.id, id);
    assert.equal(typeof j.result.choices[0].text, 'string');
    assert.ok(j.attempts >= 1 && j.attempts <= 3, `${id} attempts ${j.attempts}`);
    // the event log (SSE) is complete from id 1 and ends with the final status
    const ev = parseSSE(await (await fetch(`${b.url}/v1/jobs/${id}/events`)).text());
    const evIds = ev.map((e) => Number(e.id));
    assert.deepEqual(evIds, evIds.map((_, i) => i + 1), `${id}: event ids 1..n without gaps`);
    const types = ev.map((e) => JSON.parse(e.data).type);
    assert.equal(JSON.parse(ev.at(-1).data).status, 'succeeded');
    if (j.attempts > 1) {
      retried++;
      assert.ok(types.includes('retry'), `${id}: a retried job logs its retry`);
    }
  }
  assert.ok(retried >= 1, 'the jobs running at the kill were run again');
  // Idempotency-Key after the restart: the same job
  const again = await post(`${b.url}/v1/jobs`, { prompt: 'keyed', max_tokens: 8, webhook }, { 'idempotency-key': 'k-1' });
  assert.equal(again.status, 202);
  assert.equal(again.json().id, idem.json().id);
  assert.equal(again.headers.get('idempotent-replayed'), 'true');
});

test('a long event log written after its job row comes back intact after SIGKILL', async () => {
  const s1 = await startServer(['--store', `sqlite:${path.join(DIR, 'long.db')}`], { model });
  servers.push(s1);
  const id = (await post(`${s1.url}/v1/jobs`, { prompt: 'long', max_tokens: 64, block_length: 64, steps: 64 })).json().id;
  // the job row was last written when the attempt started; 30+ step events follow it (past the
  // event ring's first capacity of 16, which reloading must grow without aliasing)
  await until('30 steps', async () => (await (await fetch(`${s1.url}/v1/jobs/${id}`)).json()).progress.steps >= 30, 120000);
  await s1.stop('SIGKILL');
  const s2 = await startServer(['--store', `sqlite:${path.join(DIR, 'long.db')}`], { model });
  servers.push(s2);
  await until('the retried job', async () => (await (await fetch(`${s2.url}/v1/jobs/${id}`)).json()).status === 'succeeded', 120000);
  const ev = parseSSE(await (await fetch(`${s2.url}/v1/jobs/${id}/events`)).text());
  const ids = ev.map((e) => Number(e.id));
  assert.deepEqual(ids, ids.map((_, i) => i + 1), 'event ids 1..n without gaps');
  const data = ev.map((e) => JSON.parse(e.data));
  assert.ok(!data.some((d) => d.type === 'lost'), 'no event lost');
  const steps = data.filter((d) => d.type === 'step').map((d) => d.step);
  assert.ok(steps.length >= 30 + 64, `the first attempt's steps and the retry's: ${steps.length}`);
  assert.deepEqual(steps.slice(0, 30), [...Array(30).keys()], 'the first attempt\'s steps, in order');
  assert.ok(data.some((d) => d.type === 'retry'));
});

test('attempts are spent only by work that ran: jobs waiting for a batch slot survive three SIGKILLs', async () => {
  // 24 jobs behind --max-batch 2: two run, the rest wait for a slot (queued, not running). Three
  // SIGKILLs, each once the jobs the previous one interrupted have finished and a step of other
  // jobs ran: only the jobs in the batch lose an attempt (the default 3 would fail a job
  // interrupted three times); every job still succeeds, and the ones that waited report
  // attempts == 1.
  const store = path.join(DIR, 'attempts.db');
  const KILLS = 3, BATCH = 2, N = 24;
  const serveBatch = async () => {
    const s = await startServer(['--store', `sqlite:${store}`, '--max-batch', String(BATCH)], { model });
    servers.push(s);
    return s;
  };
  const list = async (s, status) => (await (await fetch(`${s.url}/v1/jobs?status=${status}&limit=100`)).json()).data;
  let s = await serveBatch();
  const ids = [];
  for (let i = 0; i < N; i++) {
    const r = await post(`${s.url}/v1/jobs`, { prompt: `wait ${i}`, max_tokens: 16, block_length: 16, steps: 16, seed: i });
    assert.equal(r.status, 202, r.text);
    ids.push(r.json().id);
  }
  for (let k = 0; k < KILLS; k++) {
    // a step of this run went through: only the batch is running, the others wait, not started
    await until(`a step of run ${k + 1}`, async () => (await list(s, 'running')).some((j) => j.progress.steps >= 1), 120000);
    const running = await list(s, 'running');
    assert.ok(running.length <= BATCH, `run ${k + 1}: ${running.length} jobs running with --max-batch ${BATCH} (only the batch runs)`);
    const waiting = (await list(s, 'queued')).filter((j) => j.attempts === 0);
    assert.ok(waiting.length > 0, `run ${k + 1}: jobs still wait`);
    for (const j of waiting) assert.equal(j.started_at, null, `${j.id} waits: not started`);
    // the jobs interrupted before ran again to the end, and a step of other jobs went through
    const all = (await (await fetch(`${s.url}/v1/jobs?limit=100`)).json()).data;
    const ran = all.filter((j) => j.status !== 'succeeded' && j.attempts > 0).map((j) => j.id);
    const progressed = async () => {
      const done = new Set((await list(s, 'succeeded')).map((j) => j.id));
      return ran.every((id) => done.has(id)) && (await list(s, 'running')).some((j) => j.progress.steps >= 2 && !ran.includes(j.id));
    };
    await until(`the jobs interrupted before done, a step of others in run ${k + 1}`, progressed, 120000);
    await s.stop('SIGKILL');
    s = await serveBatch();
  }
  await until('every job succeeded', async () => (await list(s, 'succeeded')).length === N, 240000);
  let once = 0, retries = 0;
  for (const id of ids) {
    const j = await (await fetch(`${s.url}/v1/jobs/${id}`)).json();
    assert.equal(j.status, 'succeeded', `${id}: ${JSON.stringify(j.error)}`);
    const ev = parseSSE(await (await fetch(`${s.url}/v1/jobs/${id}/events`)).text()).map((e) => JSON.parse(e.data));
    const starts = ev.filter((e) => e.type === 'status' && e.status === 'running');
    const retried = ev.filter((e) => e.type === 'retry');
    assert.equal(j.attempts, starts.length, `${id}: one "running" event per attempt`);
    assert.equal(retried.length, j.attempts - 1, `${id}: a retry event per interrupted attempt, none for a wait`);
    // every attempt begins with a step that ran: its "running" event is followed by a decode event
    ev.forEach((e, i) => {
      if (e.type === 'status' && e.status === 'running') assert.match(ev[i + 1]?.type ?? '', /^(step|block|done)$/, `${id}: attempt ${e.attempt} ran`);
    });
    if (j.attempts === 1) once++;
    retries += j.attempts - 1;
  }
  assert.ok(retries <= KILLS * BATCH, `only the jobs in the batch lost an attempt: ${retries} retries in ${KILLS} kills`);
  assert.ok(once >= N - KILLS * BATCH, `${once} of ${N} jobs ran once`);
});

test('bad stores are clear startup errors, nothing is reset', async () => {
  const run = (args) => spawnSync(BIN, ['serve', '--model', model, '--host', '127.0.0.1', '--port', '0', ...args],
    { encoding: 'utf8', timeout: 30000 });
  // the file is held by the running server
  const busy = run(['--store', `sqlite:${STORE}`]);
  assert.equal(busy.status, 2, busy.stderr);
  assert.match(busy.stderr, /job store .*jobs\.db is in use by another unmask server/);
  // not a job store: refused, left as it was
  const junk = path.join(DIR, 'junk.db');
  fs.writeFileSync(junk, 'this is not a database, but it is somebody\'s file\n'.repeat(100));
  const before = fs.readFileSync(junk);
  const bad = run(['--store', `sqlite:${junk}`]);
  assert.equal(bad.status, 2);
  assert.match(bad.stderr, /is not a valid SQLite database .*nothing is reset automatically/);
  assert.deepEqual(fs.readFileSync(junk), before);
  const unknown = run(['--store', 'postgres://x']);
  assert.equal(unknown.status, 2);
  assert.match(unknown.stderr, /--store must be sqlite, sqlite:PATH, redis:\/\/HOST:PORT\[\/DB\] or memory/);
});

test('a store that cannot write: new jobs 503 + Retry-After, /health degraded, running work finishes, then it recovers', async () => {
  const flag = path.join(DIR, 'store-fails-while-this-exists');
  fs.rmSync(flag, { force: true });
  const s = await startServer(['--store', `sqlite:${path.join(DIR, 'faulty.db')}`], { model, env: { UNMASK_FAULT_STORE_FAIL: flag } });
  servers.push(s);
  const running = await post(`${s.url}/v1/jobs`, { prompt: 'before', max_tokens: 8, block_length: 8, steps: 8 });
  assert.equal(running.status, 202);
  fs.writeFileSync(flag, '');
  const refused = await post(`${s.url}/v1/jobs`, { prompt: 'during', max_tokens: 8 });
  assert.equal(refused.status, 503, refused.text);
  assert.equal(refused.json().error.code, 'store_unavailable');
  assert.match(refused.json().error.message, /cannot write .*not accepted, retry later/);
  assert.equal(refused.headers.get('retry-after'), '5');
  const health = await fetch(`${s.url}/health`);
  assert.equal(health.status, 503);
  assert.equal((await health.json()).status, 'degraded');
  assert.equal((await fetch(`${s.url}/health/live`)).status, 200);
  const metrics = await (await fetch(`${s.url}/metrics`)).text();
  assert.match(metrics, /^unmask_job_store_failing 1$/m);
  assert.match(metrics, /^unmask_job_store_write_errors [1-9]/m);
  // the job accepted before still runs to the end
  await until('the running job', async () => (await (await fetch(`${s.url}/v1/jobs/${running.json().id}`)).json()).status === 'succeeded', 120000);
  const list = await (await fetch(`${s.url}/v1/jobs?limit=100`)).json();
  assert.deepEqual(list.data.map((j) => j.id), [running.json().id], 'the refused job does not exist');
  // writes work again: accepted, ready again
  fs.rmSync(flag);
  const after = await post(`${s.url}/v1/jobs`, { prompt: 'after', max_tokens: 8 });
  assert.equal(after.status, 202, after.text);
  assert.equal((await fetch(`${s.url}/health`)).status, 200);
  assert.match(await (await fetch(`${s.url}/metrics`)).text(), /^unmask_job_store_failing 0$/m);
});
