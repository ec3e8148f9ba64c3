// ws_preempt.test.mjs — preemption at step boundaries against the real server:
// - caller B with nothing running is served while caller A's long generations fill the batch: one
//   of A's is paused at a step boundary, B's first step event arrives while A's generations are
//   unfinished and one is paused, and every generation of A's — the paused one too — ends with
//   exactly the commits of its run alone (trace: every step once, numbered 0, 1, 2, ...); the same
//   with A's generations as OpenAI SSE streams (same text as unpaused, ended with [DONE]);
// - the generations of an abruptly dropped session (detached, kept for resume) yield to a new
//   client: its first step arrives while the dropped generation is unfinished and paused; the
//   dropped session resumes and gets its generation completed with the output of an unpaused run;
//   a paused generation cancelled after the resume ends at once ("cancelled").
// Timing is never asserted: the observables are the order of events and the scheduler's counters
// (/stats), read while the paused generation cannot resume (the batch stays full of longer work).

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Client, TMP, checkGeneration, startServer, tinyModel, untilStats } from './harness.mjs';

// A long generation: ~1000 steps on the tiny model (seconds), so what runs beside a paused one
// cannot finish while the test looks. Sampled (temperature + seed): its commits are its own,
// whatever ran beside it.
const LONG = { prompt_ids: [3, 4, 5], gen_length: 960, block_length: 64, steps: 960, temperature: 0.8, stop_at_eos: false };

// A normal close (1000) ends a session at once (other codes leave it detached, resumable).
async function bye(...cs) {
  for (const c of cs) c.ws.close(1000);
  await Promise.all(cs.map((c) => c.closedP));
}

// The trace of a generation (GET /v1/generations/{id}/trace): its steps as the engine made them.
async function trace(srv, traceId, key) {
  const r = await fetch(`${srv.base}/v1/generations/${traceId}/trace`, { headers: key ? { authorization: `Bearer ${key}` } : {} });
  assert.equal(r.status, 200);
  return r.json();
}
// Its step events: numbered 0..n-1, and their commits as "step:pos=id" strings.
function commitsOf(tr) {
  const steps = tr.events.filter((e) => e.type === 'step');
  assert.deepEqual(steps.map((e) => e.step), [...Array(steps.length).keys()], 'every step once, numbered 0, 1, 2, ...');
  return steps.flatMap((e) => e.commits.map((c) => `${e.step}:${c.pos}=${c.id}`));
}

// Run gen alone on client c (nothing else running) and return its trace's commits and done text.
async function runAlone(srv, c, id, gen, key) {
  c.send({ type: 'generate', id, ...gen });
  const acc = await c.wait((m) => m.id === id && (m.type === 'accepted' || m.type === 'error'), `accepted ${id}`);
  assert.equal(acc.type, 'accepted', JSON.stringify(acc));
  const done = await c.done(id);
  assert.ok(!(done.timings.paused_ms > 0), `${id} alone was never paused`);
  return { commits: commitsOf(await trace(srv, acc.trace_id, key)), text: done.text };
}

describe('a caller with nothing running does not wait for another caller\'s flood', () => {
  let srv;
  const KEY_A = 'sk-preempt-a';
  const KEY_B = 'sk-preempt-b';
  before(async () => {
    const keys = path.join(TMP, 'ws-preempt-keys.txt');
    fs.writeFileSync(keys, `${KEY_A}\n${KEY_B}\n`);
    srv = await startServer({ model: tinyModel('ws-preempt'), name: 'flood',
      extra: ['--api-keys', keys, '--max-batch', '2', '--max-queue', '64'] });
  });
  after(async () => {
    await srv.stop();
  });
  const as = (key) => new Client(srv.wsUrl, { headers: { authorization: `Bearer ${key}` } });
  const stats = async () => (await fetch(`${srv.base}/stats`, { headers: { authorization: `Bearer ${KEY_A}` } })).json();

  test('B\'s first step comes while A\'s generations are unfinished and one is paused; A\'s outputs are those of unpaused runs', async () => {
    const a = as(KEY_A);
    const b = as(KEY_B);
    await Promise.all([a.session(), b.session()]);
    const aGens = [0, 1, 2].map((i) => ({ ...LONG, seed: 11 + i, prompt_ids: [3 + i, 4, 5] }));
    const ref = [];
    for (const [i, g] of aGens.entries()) ref.push(await runAlone(srv, a, `ref${i}`, g, KEY_A));

    // A's flood: two run (the batch is full), one waits
    const ids = aGens.map((g, i) => `a${i}`);
    ids.forEach((id, i) => a.send({ type: 'generate', id, ...aGens[i] }));
    const acc = await Promise.all(ids.map((id) => a.wait((m) => m.type === 'accepted' && m.id === id)));
    await untilStats({ stats }, (st) => st.scheduler.active === 2 && st.scheduler.queued === 1, 'A\'s flood running');
    const stBefore = await stats();

    b.send({ type: 'generate', id: 'b', ...LONG, seed: 99 });
    await b.wait((m) => m.type === 'step' && m.id === 'b', 'B\'s first step');
    // A's generations are long: none of them can finish, and the paused one cannot resume, before
    // this read (the batch stays full: B's and one of A's)
    const st = await stats();
    assert.equal(st.scheduler.finished, stBefore.scheduler.finished, 'none of A\'s generations finished');
    assert.equal(a.msgs.filter((m) => m.type === 'done' && ids.includes(m.id)).length, 0, 'none of A\'s finished');
    assert.equal(st.scheduler.paused, 1, 'one of A\'s generations is paused');
    assert.equal(st.scheduler.preempted, 1);

    const dones = await Promise.all(ids.map((id) => a.done(id)));
    await b.done('b');
    const paused = dones.filter((d) => d.timings.paused_ms > 0);
    assert.equal(paused.length, 1, 'exactly one of A\'s was paused (and resumed)');
    for (const [i, id] of ids.entries()) {
      checkGeneration(assert, a.msgs, id);
      const tr = await trace(srv, acc[i].trace_id, KEY_A);
      assert.equal(tr.complete, true);
      assert.deepEqual(commitsOf(tr), ref[i].commits, `${id}: the commits of its unpaused run`);
      assert.equal(dones[i].text, ref[i].text, `${id}: the text of its unpaused run`);
    }
    const stAfter = await stats();
    assert.equal(stAfter.scheduler.resumed, 1);
    assert.equal(stAfter.scheduler.paused, 0);
    await bye(a, b);
  });
});

// An OpenAI completions stream (SSE): its text (the concatenated chunks) and whether it ended with
// [DONE].
async function completionStream(srv, key, body) {
  const r = await fetch(`${srv.base}/v1/completions`, { method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: JSON.stringify({ ...body, stream: true }) });
  assert.equal(r.status, 200);
  const raw = await r.text();
  let text = '';
  let ended = false;
  for (const rec of raw.split(/\r?\n\r?\n/)) {
    const data = rec.split(/\r?\n/).filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).join('\n');
    if (!data) continue;
    if (data === '[DONE]') ended = true;
    else text += JSON.parse(data).choices?.[0]?.text ?? '';
  }
  return { text, ended };
}

describe('a caller with nothing running does not wait for another caller\'s SSE streams', () => {
  let srv;
  const KEY_A = 'sk-preempt-sse-a';
  const KEY_B = 'sk-preempt-sse-b';
  before(async () => {
    const keys = path.join(TMP, 'ws-preempt-sse-keys.txt');
    fs.writeFileSync(keys, `${KEY_A}\n${KEY_B}\n`);
    srv = await startServer({ model: tinyModel('ws-preempt'), name: 'sse',
      extra: ['--api-keys', keys, '--max-batch', '2'] });
  });
  after(async () => {
    await srv.stop();
  });
  const stats = async () => (await fetch(`${srv.base}/stats`, { headers: { authorization: `Bearer ${KEY_A}` } })).json();

  test('A\'s two streams fill the batch; B\'s first step comes before they finish; the paused stream goes on to the text of its unpaused run', async () => {
    const body = (i) => ({ prompt: `def f${i}(x):`, max_tokens: 960, block_length: 64, steps: 960, temperature: 0.8,
      seed: 21 + i, stop_at_eos: false });
    const ref = [await completionStream(srv, KEY_A, body(0)), await completionStream(srv, KEY_A, body(1))];
    const st0 = await stats();
    const streams = [0, 1].map((i) => completionStream(srv, KEY_A, body(i)));
    await untilStats({ stats }, (st) => st.scheduler.active === 2, 'A\'s streams running');
    const b = new Client(srv.wsUrl, { headers: { authorization: `Bearer ${KEY_B}` } });
    await b.session();
    b.send({ type: 'generate', id: 'b', ...LONG, seed: 1 });
    await b.wait((m) => m.type === 'step' && m.id === 'b', 'B\'s first step');
    const st = await stats();
    assert.equal(st.scheduler.finished, st0.scheduler.finished, 'A\'s streams are unfinished');
    assert.equal(st.scheduler.paused, 1, 'one of them is paused');
    const got = await Promise.all(streams);
    await b.done('b');
    for (const i of [0, 1]) {
      assert.ok(got[i].ended && ref[i].ended, `stream ${i} ended with [DONE]`);
      assert.ok(ref[i].text.length > 0);
      assert.equal(got[i].text, ref[i].text, `stream ${i}: the text of its unpaused run`);
    }
    const stAfter = await stats();
    assert.equal(stAfter.scheduler.preempted, 1);
    assert.equal(stAfter.scheduler.resumed, 1);
    await bye(b);
  });
});

describe('a dropped session\'s generations yield to a connected client', () => {
  let srv;
  before(async () => {
    srv = await startServer({ model: tinyModel('ws-preempt'), name: 'dropped',
      extra: ['--max-batch', '1', '--session-retention', '120'] });
  });
  after(async () => {
    await srv.stop();
  });

  test('the new client\'s first step comes while the dropped generation is paused; the session resumes and completes it exactly', async () => {
    const gen = { ...LONG, seed: 5 };
    const r = new Client(srv.wsUrl);
    await r.session();
    const ref = await runAlone(srv, r, 'ref', gen);
    await bye(r);

    // a client starts a long generation and vanishes mid-way (TCP drop, no close frame)
    const d = new Client(srv.wsUrl);
    const s = await d.session();
    d.send({ type: 'generate', id: 'g', ...gen });
    const acc = await d.wait((m) => m.type === 'accepted' && m.id === 'g');
    const last = (await d.wait((m) => m.type === 'step' && m.id === 'g' && m.step >= 2, 'a few steps')).seq;
    d.ws.terminate();
    await d.closedP;
    await untilStats(srv, (st) => st.connections.sessions_detached === 1, 'the session detached');

    // a new client: the batch (one slot) holds the dropped session's generation
    const n = new Client(srv.wsUrl);
    await n.session();
    n.send({ type: 'generate', id: 'n', ...gen, seed: 6 });
    await n.wait((m) => m.type === 'step' && m.id === 'n', 'the new client\'s first step');
    // n is long and holds the only slot: the dropped generation stays paused while we look
    const st = await srv.stats();
    assert.equal(st.scheduler.finished, 1, 'the dropped session\'s generation is unfinished (only the reference run finished)');
    assert.equal(st.scheduler.paused, 1, 'the dropped session\'s generation is paused');
    assert.equal(st.scheduler.active, 1);

    // the dropped client comes back: its generation is reported running and completes
    const back = new Client(srv.wsUrl);
    await back.session();
    back.send({ type: 'session.resume', session: s.session, last_seq: last });
    const resumed = await back.wait((m) => m.type === 'session.resumed');
    assert.deepEqual(resumed.running, ['g'], 'still unfinished when the client came back');
    const done = await back.done('g');
    await n.done('n');
    assert.ok(done.timings.paused_ms > 0, 'it was paused');
    const all = [...d.msgs.filter((m) => m.seq <= last), ...back.msgs.slice(1)].filter((m) => m.type !== 'session.resumed');
    checkGeneration(assert, all, 'g');
    assert.equal(done.text, ref.text, 'the text of its unpaused run');
    assert.deepEqual(commitsOf(await trace(srv, acc.trace_id)), ref.commits, 'the commits of its unpaused run');
    await bye(n, back);
  });

  test('a paused generation is cancelled after the resume: done "cancelled" at once, nothing after it', async () => {
    const gen = { ...LONG, seed: 7 };
    const d = new Client(srv.wsUrl);
    const s = await d.session();
    d.send({ type: 'generate', id: 'g', ...gen });
    const last = (await d.wait((m) => m.type === 'step' && m.id === 'g' && m.step >= 2, 'a few steps')).seq;
    const before = await srv.stats();
    d.ws.terminate();
    await d.closedP;
    await untilStats(srv, (st) => st.connections.sessions_detached === 1, 'the session detached');
    const n = new Client(srv.wsUrl);
    await n.session();
    n.send({ type: 'generate', id: 'n', ...gen, seed: 8 });
    await n.wait((m) => m.type === 'step' && m.id === 'n', 'the new client\'s first step');
    assert.equal((await srv.stats()).scheduler.paused, 1, 'the dropped generation is paused');
    const back = new Client(srv.wsUrl);
    await back.session();
    back.send({ type: 'session.resume', session: s.session, last_seq: last });
    await back.wait((m) => m.type === 'session.resumed');
    back.send({ type: 'cancel', id: 'g' });
    const done = await back.done('g');
    assert.equal(done.finish_reason, 'cancelled');
    assert.ok(done.usage.steps < gen.steps, `it stopped where it was paused (${done.usage.steps} steps)`);
    // the engine counts it after the iteration that sent its done
    const st = await untilStats(srv, (x) => x.scheduler.cancelled === before.scheduler.cancelled + 1, 'the cancel counted');
    assert.equal(st.scheduler.paused, 0);
    assert.equal(st.scheduler.active, 1, 'the new client\'s generation runs on');
    n.send({ type: 'cancel', id: 'n' });
    await n.done('n');
    const gSteps = back.msgs.filter((m) => m.id === 'g' && m.type === 'step' && m.seq > done.seq);
    assert.equal(gSteps.length, 0, 'nothing after done');
    await bye(n, back);
  });
});
