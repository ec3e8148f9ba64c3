// restart_torture.test.mjs — the restart torture test: the real server, built with AddressSanitizer
// + UBSan (sanitizers.mjs), on the SQLite store and on Redis, stopped and started again many times
// on the same store. Each cycle submits a mix of jobs (short, long enough that event rings grow
// past 64, two choices, with webhooks, with Idempotency-Key, failed by fault injection), cancels
// some, replays some keys, reads every job and its whole event log, then stops the server by
// SIGKILL or SIGTERM at a moment picked to be likely inside a decode step, a webhook delivery or a
// store write. After every restart:
//   - every job accepted with 202 is there exactly once (a POST cut by the kill may have created
//     its job or not: at most one, and a key replay finds it);
//   - every event read before the stop is there byte for byte; finished jobs keep their result
//     and their whole log; ids run 1, 2, 3, ... with nothing lost;
//   - each log follows the lifecycle: queued, then per attempt "running" followed at once by a
//     decode event (an attempt is spent only by a step that ran), ended by a retry or the final
//     status; attempts == the attempts logged;
//   - every webhook received names a finished job and its final status (deduplicable by
//     X-Unmask-Delivery: one delivery id, one job, one status, one result);
//   - no sanitizer report (ASan, UBSan, LeakSanitizer at a clean exit), and a SIGTERM exits 0.
// At the end a last server runs every job to its end: cancelled ones (DELETE answered 200) end
// cancelled, fault-injected ones failed, the others succeeded — or failed once stops (or a batch
// shared with a failing step) used up their attempts — and every webhook was delivered at least once.
//
// Seeded: TORTURE_SEED=N replays a run (the seed is printed first); TORTURE_CYCLES=N restarts per
// store (default 20 on SQLite, 10 on Redis: a few minutes on 2 cores). Timing still varies between
// runs; the seed fixes the choices (jobs, signals, stop moments), not the scheduler.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { TMP, startServer, makeModel, parseSSE, post, until } from './server.mjs';
import { asanBin, sanitizerEnv, sanitizerReports } from './sanitizers.mjs';
import { startRedis } from '../replica/infra.mjs';

const SEED = process.env.TORTURE_SEED ? Number(process.env.TORTURE_SEED) : crypto.randomInt(2 ** 31);
const CYCLES = process.env.TORTURE_CYCLES ? Number(process.env.TORTURE_CYCLES) : null;
const DIR = path.join(TMP, 'restart-torture');
const SECRET = 'torture-secret';
const FAULT_AT_START = 424242; // seeds whose decode steps fail (UNMASK_FAULT_FORWARD_FAIL): at the first step,
const FAULT_LATER = 434343; //    after 5 steps
const MAX_ATTEMPTS = 3; // --job-attempts (the default)
const STOPPED = /^(the server stopped while the job ran|the generation was cancelled \(server shutting down or request aborted\)|the server running the job stopped \(replica lost\))$/;
const INJECTED = /injected by UNMASK_FAULT_FORWARD_FAIL/;
let ASAN;
let model;

console.log(`restart torture: seed ${SEED} (replay with TORTURE_SEED=${SEED})`);

before(() => {
  ASAN = asanBin(); // fails (never skips) when the ASan build is missing, saying how to build it
  fs.rmSync(DIR, { recursive: true, force: true });
  fs.mkdirSync(DIR, { recursive: true });
  model = makeModel('http-tiny');
});

// mulberry32: small, seedable, good enough to pick test choices
function rng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return { next, int: (lo, hi) => lo + Math.floor(next() * (hi - lo + 1)), pick: (xs) => xs[Math.floor(next() * xs.length)],
    chance: (p) => next() < p };
}

// A webhook receiver that answers slowly (100-600 ms: deliveries are in flight when the server is
// stopped), refuses the first try of some deliveries with 500 (the sender retries), records every
// delivery, and tells a waiting stop trigger when a delivery arrives or was answered.
async function startReceiver(r) {
  const deliveries = []; // {id, job, status, body}
  const seen = new Set();
  const hooks = { request: null, answered: null };
  const srv = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d) => (body += d));
    req.on('end', () => {
      const id = req.headers['x-unmask-delivery'];
      const o = JSON.parse(body);
      deliveries.push({ id, job: o.id, status: o.status, signed: /^sha256=[0-9a-f]{64}$/.test(req.headers['x-unmask-signature'] ?? ''), body: o });
      const refuse = !seen.has(id) && r.chance(0.3);
      seen.add(id);
      hooks.request?.();
      setTimeout(() => { // a reply delayed: not synchronization, the in-flight window
        res.writeHead(refuse ? 500 : 204).end();
        hooks.answered?.();
      }, r.int(100, 600));
    });
  });
  await new Promise((ok) => srv.listen(0, '127.0.0.1', ok));
  return { url: `http://127.0.0.1:${srv.address().port}/hook`, deliveries, hooks, close: () => srv.close() };
}

// GET url's SSE stream until it ends (a finished job) or holds at least min events: [{id, data}].
function readEvents(url, min) {
  return new Promise((resolve, reject) => {
    let text = '';
    const req = http.get(url, (res) => {
      if (res.statusCode !== 200) {
        res.resume();
        reject(new Error(`${url}: ${res.statusCode}`));
        return;
      }
      // complete records only (a record ends with a blank line)
      const records = () => parseSSE(text.slice(0, text.lastIndexOf('\n\n') + 1)).filter((e) => e.id !== undefined);
      const done = () => resolve(records().map((e) => ({ id: Number(e.id), data: e.data })));
      res.setEncoding('utf8');
      res.on('data', (d) => {
        text += d;
        if (records().length >= min) {
          req.destroy();
          done();
        }
      });
      res.on('end', done);
    });
    req.on('error', (e) => (req.destroyed && text ? null : reject(e)));
    req.setTimeout(30000, () => req.destroy(new Error(`${url}: no events for 30 s`)));
  });
}

// Runs fn over xs, k at a time.
async function pool(xs, k, fn) {
  const out = new Array(xs.length);
  let at = 0;
  await Promise.all(Array.from({ length: Math.min(k, xs.length) }, async () => {
    while (at < xs.length) {
      const i = at++;
      out[i] = await fn(xs[i], i);
    }
  }));
  return out;
}

// Every job of the caller, following the listing's pages: ids in listing order.
async function listAll(base) {
  const ids = [];
  let after = '';
  for (;;) {
    const l = await (await fetch(`${base}/v1/jobs?limit=100${after ? `&after=${after}` : ''}`)).json();
    ids.push(...l.data.map((j) => j.id));
    if (!l.has_more) return ids;
    after = l.last_id;
  }
}

const TERMINAL = new Set(['succeeded', 'failed', 'cancelled']);
const DECODE = new Set(['step', 'block', 'done']);

// The lifecycle of one job's log (parsed events); returns the attempts it logged. terminal: the
// job's status read just before (the log may be ahead of it, never behind).
function checkLifecycle(id, evs, status) {
  assert.deepEqual(evs[0], { type: 'status', status: 'queued' }, `${id}: the log starts with "queued"`);
  let state = 'queued';
  let attempt = 0;
  for (let i = 1; i < evs.length; i++) {
    const e = evs[i];
    const what = `${id}: event ${i + 1} ${JSON.stringify(e).slice(0, 160)} in state ${state}`;
    assert.notEqual(e.type, 'lost', `${id}: event ${i + 1} lost`);
    if (state === 'end') assert.fail(`${what}: after the final status`);
    if (state === 'queued') {
      if (e.type === 'status' && e.status === 'running') {
        attempt++;
        assert.equal(e.attempt, attempt, what);
        state = 'started';
      } else if (e.type === 'status' && e.status === 'cancelled') {
        assert.equal(e.attempts, attempt, what);
        state = 'end';
      } else {
        assert.fail(`${what}: a queued job logs "running" (its first step ran) or ends cancelled`);
      }
    } else if (state === 'started') {
      assert.ok(DECODE.has(e.type), `${what}: an attempt starts with a step that ran`);
      state = 'running';
    } else if (DECODE.has(e.type)) {
      // steps of the attempt
    } else if (e.type === 'retry') {
      assert.equal(e.attempt, attempt, what);
      state = 'queued';
    } else if (e.type === 'status' && TERMINAL.has(e.status)) {
      assert.equal(e.attempts, attempt, what);
      state = 'end';
    } else {
      assert.fail(`${what}: unexpected`);
    }
  }
  if (TERMINAL.has(status)) assert.equal(state, 'end', `${id}: ${status}, its log ends with the final status`);
  return attempt;
}

const stable = (j) => ({ ...j, webhook: j.webhook && { url: j.webhook.url } }); // the delivery state may change

class Torture {
  constructor(kind, store, cycles, seed) {
    Object.assign(this, { kind, store, cycles, r: rng(seed) });
    this.jobs = new Map(); // id -> {id, body, fault, webhook, idem, cancelled: DELETE answered 200}
    this.uncertain = new Map(); // prompt -> body: POSTs cut by a stop (their job may exist)
    this.idem = new Map(); // key -> {body, id | null (answer lost)}
    this.snapshot = new Map(); // id -> {job, events}: read before the last stop
    this.stats = { cycles: 0, SIGKILL: 0, SIGTERM: 0, triggers: {}, accepted: 0, cut: 0, adopted: 0, eventsCompared: 0,
      jobsCompared: 0, deletes: 0, replays: 0, reports: 0, exhausted: 0, outcomes: {}, retriesAfterStops: 0,
      retriesAfterFaults: 0 };
    this.n = 0;
  }

  async serve(tag) {
    const reports = path.join(DIR, `${this.kind}-${tag}`);
    try {
      const s = await startServer(['--store', this.store, '--webhook-secret', SECRET, '--webhook-allow', '127.0.0.1/32',
        '--webhook-retry-base', '0.05', '--webhook-timeout', '2', '--max-batch', '4', '--job-attempts', String(MAX_ATTEMPTS),
        '--shutdown-grace', String(this.r.pick([0, 0.5, 1]))],
      { model, bin: ASAN, env: { ...sanitizerEnv(reports), UNMASK_FAULT_FORWARD_FAIL: `seed=${FAULT_AT_START};seed=${FAULT_LATER},after=5` } });
      s.reports = reports;
      return s;
    } catch (e) { // it did not start: say what the sanitizers saw
      const found = sanitizerReports(reports);
      this.stats.reports += found.length;
      e.message += found.length ? `\n--- sanitizer reports:\n${found.join('\n')}` : '';
      throw e;
    }
  }

  newBody(cycle) {
    const r = this.r;
    const i = this.n++;
    const kind = r.pick(['short', 'short', 'long', 'long', 'two', 'fault']);
    const body = { prompt: `torture ${this.kind} c${cycle} j${i}`, seed: 1000 + i * 2 };
    if (kind === 'short') Object.assign(body, { max_tokens: 8, block_length: 8, steps: 8 });
    if (kind === 'long') Object.assign(body, { max_tokens: 64, block_length: 32, steps: 64 }); // 66+ events
    if (kind === 'two') Object.assign(body, { max_tokens: 16, block_length: 16, steps: 16, n: 2 });
    if (kind === 'fault') Object.assign(body, { max_tokens: 16, block_length: 16, steps: 16, seed: r.pick([FAULT_AT_START, FAULT_LATER]) });
    if (r.chance(0.5)) body.webhook = this.hook.url;
    const idem = r.chance(0.3) ? `key-${this.kind}-${i}` : null;
    return { body, idem };
  }

  accept(id, body, idem) {
    assert.ok(!this.jobs.has(id) || this.jobs.get(id).body.prompt === body.prompt, `${id}: one job per request`);
    if (!this.jobs.has(id))
      this.jobs.set(id, { id, body, fault: [FAULT_AT_START, FAULT_LATER].includes(body.seed), webhook: !!body.webhook, idem, cancelled: false });
  }

  // POST a job; a reply cut by the stop leaves it uncertain.
  async submit(base, { body, idem }) {
    const headers = idem ? { 'idempotency-key': idem } : {};
    if (idem) this.idem.set(idem, { body, id: null });
    try {
      const res = await post(`${base}/v1/jobs`, body, headers);
      if (res.status === 202) {
        const id = res.json().id;
        this.accept(id, body, idem);
        if (idem) this.idem.get(idem).id = id;
        this.stats.accepted++;
        return id;
      }
      assert.equal(res.status, 503, `POST: ${res.status} ${res.text}`); // draining: refused, no job
      assert.equal(res.json().error.code, 'shutting_down', res.text);
    } catch (e) {
      if (e instanceof assert.AssertionError) throw e;
      this.uncertain.set(body.prompt, body);
      this.stats.cut++;
    }
    return null;
  }

  // Every job and its log, as the server answers now; verifies each against what was read before
  // the last stop and the invariants; returns the new snapshot.
  async readAll(base, { compare }) {
    const delivered = this.hook.deliveries.length; // deliveries before the jobs are read
    const listed = await listAll(base);
    assert.equal(new Set(listed).size, listed.length, `no job listed twice: ${listed.length} listed`);
    const known = new Set(this.jobs.keys());
    for (const id of known) assert.ok(listed.includes(id), `accepted job ${id} is listed`);
    const extra = listed.filter((id) => !known.has(id));
    const fresh = new Map();
    await pool(listed, 6, async (id) => {
      const jr = await fetch(`${base}/v1/jobs/${id}`);
      assert.equal(jr.status, 200, `${id}: GET`);
      const job = await jr.json();
      // an unfinished job's stream stays open: read what it had (a job held by a replica that
      // stopped shows its document's count, which lags its events) and what was read before
      const events = await readEvents(`${base}/v1/jobs/${id}/events`,
        Math.max(job.progress.events, (compare && this.snapshot.get(id)?.events.length) || 0));
      fresh.set(id, { job, events });
    });
    for (const id of extra) { // created by a POST whose answer the stop cut: one job per such POST
      const { job } = fresh.get(id);
      const body = this.uncertain.get(job.request.prompt);
      assert.ok(body, `${id}: an unknown job (${job.request.prompt}) is one of the POSTs the stop cut`);
      this.uncertain.delete(job.request.prompt);
      const idem = [...this.idem].find(([, v]) => v.body.prompt === body.prompt)?.[0] ?? null;
      if (idem) this.idem.get(idem).id = id;
      this.accept(id, body, idem);
      this.stats.adopted++;
    }
    for (const [id, { job, events }] of fresh) {
      assert.deepEqual(events.map((e) => e.id), events.map((_, i) => i + 1), `${id}: event ids 1..n`);
      const parsed = events.map((e) => JSON.parse(e.data));
      const attempts = checkLifecycle(id, parsed, job.status);
      if (TERMINAL.has(job.status)) assert.equal(job.attempts, attempts, `${id}: attempts == attempts logged`);
      const before = compare && this.snapshot.get(id);
      if (!before) continue;
      assert.ok(events.length >= before.events.length, `${id}: ${before.events.length} events before the stop, ${events.length} after`);
      for (let i = 0; i < before.events.length; i++)
        assert.equal(events[i].data, before.events[i].data, `${id}: event ${i + 1} byte for byte`);
      this.stats.eventsCompared += before.events.length;
      this.stats.jobsCompared++;
      if (TERMINAL.has(before.job.status)) {
        assert.equal(events.length, before.events.length, `${id}: a finished job's log does not grow`);
        assert.deepEqual(stable(job), stable(before.job), `${id}: a finished job is unchanged (result, status, attempts, times)`);
      }
    }
    this.checkDeliveries(fresh, delivered);
    return fresh;
  }

  // Every delivery names a finished job with that status; one delivery id = one job, one status,
  // one result (deduplicable).
  checkDeliveries(fresh, n) {
    const first = new Map();
    for (const d of this.hook.deliveries.slice(0, n)) {
      assert.ok(d.signed, `${d.id}: signed`);
      const j = fresh.get(d.job)?.job;
      assert.ok(j, `${d.id}: a delivery of a known job`);
      assert.equal(d.id, `${d.job}.${d.status}`, 'delivery id = <job>.<status>');
      assert.equal(d.status, j.status, `${d.id}: the job's final status`);
      const f = first.get(d.id);
      if (f) assert.deepEqual(stable(d.body), stable(f.body), `${d.id}: the same delivery again`);
      else first.set(d.id, d);
    }
  }

  // A moment to stop the server: a random delay, right after a step of a running job, while a
  // webhook is in flight, right after one was answered (its state is being written), or while POSTs
  // are in flight.
  async stopMoment(s, cycle) {
    const r = this.r;
    const trigger = r.pick(['delay', 'step', 'step', 'webhook', 'answered', 'submit']);
    this.stats.triggers[trigger] = (this.stats.triggers[trigger] ?? 0) + 1;
    const fallback = (ms) => new Promise((ok) => setTimeout(ok, ms).unref()); // nothing happened: stop anyway
    if (trigger === 'delay') return fallback(r.int(50, 2000));
    if (trigger === 'webhook' || trigger === 'answered') {
      const hit = new Promise((ok) => (this.hook.hooks[trigger === 'webhook' ? 'request' : 'answered'] = ok));
      await Promise.race([hit, fallback(5000)]);
      this.hook.hooks.request = this.hook.hooks.answered = null;
      return;
    }
    if (trigger === 'submit') { // a burst of POSTs; stop once two are answered
      let answered = 0;
      let go;
      const two = new Promise((ok) => (go = ok));
      const burst = Array.from({ length: 6 }, () => this.newBody(cycle)).map((b) =>
        this.submit(s.url, b).then(() => ++answered >= 2 && go()));
      await Promise.race([two, fallback(5000)]);
      return { burst };
    }
    // step: a running job advanced
    const t0 = Date.now();
    let last = null;
    while (Date.now() - t0 < 5000) {
      const l = await (await fetch(`${s.url}/v1/jobs?status=running&limit=100`)).json().catch(() => ({ data: [] }));
      const steps = (l.data ?? []).map((j) => `${j.id}:${j.progress.steps}`).join();
      if (last !== null && steps && steps !== last) return;
      last = steps;
    }
  }

  async cycle(c) {
    const s = await this.serve(`c${c}`);
    try {
      await this.readAll(s.url, { compare: true });
      const r = this.r;
      // key replays: the same job (also for a POST the stop cut: created then, or now)
      for (const [key, v] of [...this.idem].filter(() => r.chance(0.15))) {
        const res = await post(`${s.url}/v1/jobs`, v.body, { 'idempotency-key': key });
        assert.equal(res.status, 202, `${key}: replay ${res.text}`);
        if (v.id) {
          assert.equal(res.json().id, v.id, `${key}: the same job`);
          assert.equal(res.headers.get('idempotent-replayed'), 'true');
        } else {
          v.id = res.json().id;
          this.uncertain.delete(v.body.prompt);
          this.accept(v.id, v.body, key);
        }
        this.stats.replays++;
      }
      for (let i = r.int(3, 6); i > 0; i--) await this.submit(s.url, this.newBody(c));
      // cancel some unfinished jobs
      const open = [...this.jobs.values()].filter((j) => !j.cancelled && r.chance(0.08));
      for (const j of open) {
        const res = await fetch(`${s.url}/v1/jobs/${j.id}`, { method: 'DELETE' });
        assert.ok([200, 409].includes(res.status), `DELETE ${j.id}: ${res.status}`);
        if (res.status === 200) j.cancelled = true;
        this.stats.deletes++;
      }
      this.snapshot = await this.readAll(s.url, { compare: false });
      const signal = c === 0 ? 'SIGTERM' : c === 1 || r.chance(0.6) ? 'SIGKILL' : 'SIGTERM'; // both, whatever the seed
      const moment = await this.stopMoment(s, c);
      s.proc.kill(signal);
      const exit = await Promise.race([s.exit, new Promise((ok) => setTimeout(() => ok(null), 60000).unref())]);
      assert.ok(exit, `${signal}: the server exits (within 60 s)`);
      if (moment?.burst) await Promise.all(moment.burst);
      this.stats[signal]++;
      this.stats.cycles++;
      if (signal === 'SIGTERM') assert.deepEqual(exit, { code: 0, sig: null }, `SIGTERM: a clean exit\n${s.logs().slice(-3000)}`);
      else assert.equal(exit.sig, 'SIGKILL', `killed, not crashed: ${JSON.stringify(exit)}\n${s.logs().slice(-3000)}`);
    } catch (e) {
      e.message += `\n--- the server's log (${s.reports}/server.log), last lines:\n${s.logs().slice(-4000)}`;
      throw e;
    } finally {
      await s.stop('SIGKILL');
      fs.writeFileSync(path.join(s.reports, 'server.log'), s.logs());
      const found = sanitizerReports(s.reports, s.logs());
      this.stats.reports += found.length;
      assert.deepEqual(found, [], 'sanitizer reports');
    }
  }

  // The last server: every job to its end, every webhook delivered; then a clean SIGTERM.
  async finish() {
    const s = await this.serve('final');
    try {
      await this.readAll(s.url, { compare: true });
      for (const [key, v] of this.idem) // resolve the keys whose answer was cut
        if (!v.id) {
          const res = await post(`${s.url}/v1/jobs`, v.body, { 'idempotency-key': key });
          assert.equal(res.status, 202, res.text);
          v.id = res.json().id;
          this.uncertain.delete(v.body.prompt);
          this.accept(v.id, v.body, key);
        }
      await until('every job finished and its webhook delivered', async () => {
        for (const j of this.jobs.values()) {
          const o = await (await fetch(`${s.url}/v1/jobs/${j.id}`)).json();
          if (!TERMINAL.has(o.status) || (j.webhook && o.webhook.status !== 'delivered')) return false;
        }
        return true;
      }, 300000, 200);
      const fresh = await this.readAll(s.url, { compare: true });
      for (const j of this.jobs.values()) {
        const o = fresh.get(j.id).job;
        const outcome = o.status === 'failed' ? (INJECTED.test(o.error.message) ? 'failed_injected' : 'failed_stopped') : o.status;
        this.stats.outcomes[outcome] = (this.stats.outcomes[outcome] ?? 0) + 1;
        for (const e of fresh.get(j.id).events) {
          const ev = JSON.parse(e.data);
          if (ev.type === 'retry') this.stats[STOPPED.test(ev.error) ? 'retriesAfterStops' : 'retriesAfterFaults']++;
        }
        if (j.cancelled) assert.equal(o.status, 'cancelled', `${j.id}: DELETE answered 200`);
        else if (o.status === 'failed' || j.fault) {
          // a fault-injected job never succeeds; another fails only with its attempts used up, by
          // stops or by sharing a batch with a failing step (the whole step fails)
          assert.equal(o.status, 'failed', `${j.id}: fault injected`);
          assert.match(o.error.message, new RegExp(`${STOPPED.source}|${INJECTED.source}`), j.id);
          assert.equal(o.attempts, MAX_ATTEMPTS, `${j.id}: failed only once its attempts ran out`);
          if (STOPPED.test(o.error.message)) this.stats.exhausted++;
        } else {
          assert.equal(o.status, 'succeeded', `${j.id}: ${JSON.stringify(o.error)}`);
          assert.equal(o.result.id, j.id);
          assert.equal(o.result.choices.length, j.body.n ?? 1);
        }
        if (j.webhook) {
          const got = this.hook.deliveries.filter((d) => d.id === `${j.id}.${o.status}`);
          assert.ok(got.length >= 1, `${j.id}: its webhook delivered at least once`);
        }
      }
    } catch (e) {
      e.message += `\n--- the server's log (${s.reports}/server.log), last lines:\n${s.logs().slice(-4000)}`;
      throw e;
    } finally {
      s.proc.kill('SIGTERM');
      const exit = await s.exit;
      fs.writeFileSync(path.join(s.reports, 'server.log'), s.logs());
      const found = sanitizerReports(s.reports, s.logs());
      this.stats.reports += found.length;
      assert.deepEqual(found, [], 'sanitizer reports');
      assert.deepEqual(exit, { code: 0, sig: null }, `the last SIGTERM: a clean exit\n${s.logs().slice(-3000)}`);
    }
  }

  async run() {
    this.hook = await startReceiver(this.r);
    try {
      for (let c = 0; c < this.cycles; c++) {
        try {
          await this.cycle(c);
        } catch (e) {
          e.message = `[seed ${SEED}, ${this.kind} cycle ${c}] ${e.message}`;
          throw e;
        }
      }
      try {
        await this.finish();
      } catch (e) {
        e.message = `[seed ${SEED}, ${this.kind} final run] ${e.message}`;
        throw e;
      }
    } finally {
      this.hook.close();
    }
    const d = this.hook.deliveries;
    const st = { ...this.stats, jobs: this.jobs.size, webhooks: new Set(d.map((x) => x.id)).size, deliveries: d.length };
    console.log(`restart torture ${this.kind} (seed ${SEED}): ${JSON.stringify(st)}`);
    return st;
  }
}

let redis;
after(async () => {
  await redis?.stop();
});

test('SQLite store: restarts by SIGKILL and SIGTERM lose nothing, corrupt nothing', async () => {
  const t = new Torture('sqlite', `sqlite:${path.join(DIR, 'jobs.db')}`, CYCLES ?? 20, SEED);
  const st = await t.run();
  assert.equal(st.cycles, t.cycles);
});

test('Redis store: restarts by SIGKILL and SIGTERM lose nothing, corrupt nothing', async () => {
  redis = await startRedis(path.join(DIR, 'redis'));
  const t = new Torture('redis', redis.url, CYCLES ?? 10, SEED + 1);
  const st = await t.run();
  assert.equal(st.cycles, t.cycles);
});
