// ws_jobs.test.mjs — async job notifications over the WebSocket (job.subscribe / job.unsubscribe,
// docs/protocol.md), with the real npm `ws` client against the real server: a job subscribed to
// while it waits sees queued, running and succeeded in that order, the last one carrying the
// result and equal to GET /v1/jobs/{id}; a job finished before the subscribe gets one final update
// at once; another API key's job and an id that does not exist are `unknown_job`, worded like the
// HTTP 404; job.unsubscribe stops the updates (and is a no-op for a job not followed); the
// subscriptions belong to the session: updates made while the client was away are replayed by
// session.resume and the live ones continue on the new connection (a connection whose own session
// follows a job cannot resume another); the per-session bound.
// Jobs are held back deterministically: --max-batch 1 and a long "blocker" job that runs until the
// test cancels it, so the job under test stays queued until then. No sleeps: every wait is on an
// event or on GET /v1/jobs/{id}.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { startServer, makeModel, post, until, TMP } from '../http/server.mjs';
import { Client } from './harness.mjs';

const KEY_A = 'sk-jobs-a';
const KEY_B = 'sk-jobs-b';
const MAX_SUBS = 3;
let srv;

before(async () => {
  const keys = path.join(TMP, 'ws-jobs-keys.txt');
  fs.writeFileSync(keys, `${KEY_A}\n${KEY_B}\n`);
  // about 0.1 s per step: the blocker runs for as long as a test needs it
  const model = makeModel('http-slow', ['--d-model', '512', '--n-layers', '8']);
  srv = await startServer(['--api-keys', keys, '--max-batch', '1', '--session-retention', '60',
    '--max-session-job-subscriptions', String(MAX_SUBS)], { model });
});
after(async () => {
  await srv?.stop();
});

const auth = (key) => ({ authorization: `Bearer ${key}` });
const small = { prompt: 'Once upon a time', max_tokens: 8, block_length: 4, temperature: 0 };
// one token per step, 256 steps: about 25 s unless cancelled
const long = { prompt: 'A long story', max_tokens: 256, block_length: 256, steps: 256, decoder: 'low_confidence',
  temperature: 0 };

async function postJob(key, body) {
  const r = await post(`${srv.url}/v1/jobs`, body, auth(key));
  assert.equal(r.status, 202, r.text);
  return r.json();
}
const getJob = async (key, id) => (await fetch(`${srv.url}/v1/jobs/${id}`, { headers: auth(key) })).json();
const cancelJob = async (key, id) => fetch(`${srv.url}/v1/jobs/${id}`, { method: 'DELETE', headers: auth(key) });
const waitStatus = (key, id, statuses) =>
  until(`job ${id} in ${statuses}`, async () => {
    const j = await getJob(key, id);
    return statuses.includes(j.status) && j;
  }, 120000);
// A running job that holds the only batch slot until it is cancelled.
async function blocker(key = KEY_A) {
  const b = await postJob(key, long);
  await waitStatus(key, b.id, ['running']);
  return b;
}
async function connect(key = KEY_A) {
  const c = new Client(`ws://127.0.0.1:${srv.port}/ws`, { headers: auth(key) });
  const s = await c.session();
  return { c, s };
}
const updatesOf = (c, id) => c.msgs.filter((m) => m.type === 'job.update' && m.id === id);
const finalOf = (c, id) => c.wait((m) => m.type === 'job.update' && m.id === id && m.final, `the final job.update of ${id}`, 120000);
// A ping's pong: every event queued before it has arrived (one connection's events come in order).
async function barrier(c, tag) {
  c.send({ type: 'ping', event_id: tag });
  await c.wait((m) => m.type === 'pong' && m.event_id === tag, `pong ${tag}`);
}

test('subscribed while queued: queued, running, succeeded in order; the last one carries the result', async () => {
  const { c, s } = await connect();
  assert.equal(s.limits.max_job_subscriptions, MAX_SUBS, 'session.created announces the bound');
  const b = await blocker();
  const j = await postJob(KEY_A, small);
  c.send({ type: 'job.subscribe', event_id: 's1', id: j.id });
  const first = await c.wait((m) => m.event_id === 's1', 'the reply to job.subscribe');
  assert.equal(first.type, 'job.update', JSON.stringify(first));
  assert.equal(first.id, j.id);
  assert.equal(first.final, false);
  assert.equal(first.job.status, 'queued');
  assert.equal(first.job.result, null);
  await cancelJob(KEY_A, b.id); // the slot frees: the job runs now
  const fin = await finalOf(c, j.id);
  const ups = updatesOf(c, j.id);
  assert.deepEqual(ups.map((u) => u.job.status), ['queued', 'running', 'succeeded']);
  assert.deepEqual(ups.map((u) => u.final), [false, false, true]);
  assert.ok(ups.slice(1).every((u) => u.event_id === undefined), 'only the reply echoes event_id');
  assert.equal(fin.job.result.object, 'text_completion');
  assert.equal(typeof fin.job.result.choices[0].text, 'string');
  assert.deepEqual(fin.job, await getJob(KEY_A, j.id), 'the same object GET /v1/jobs/{id} returns');
  // updates are session events like the others: seq keeps counting without gaps
  const seqs = c.msgs.map((m) => m.seq);
  assert.deepEqual(seqs, seqs.map((_, i) => i + 1));
  await c.close();
});

test('a job finished before the subscribe: one final update at once', async () => {
  const { c } = await connect();
  const j = await postJob(KEY_A, small);
  const done = await waitStatus(KEY_A, j.id, ['succeeded', 'failed']);
  assert.equal(done.status, 'succeeded');
  c.send({ type: 'job.subscribe', event_id: 's2', id: j.id });
  const u = await c.wait((m) => m.event_id === 's2', 'the reply to job.subscribe');
  assert.equal(u.type, 'job.update', JSON.stringify(u));
  assert.equal(u.final, true);
  assert.equal(u.job.status, 'succeeded');
  assert.deepEqual(u.job, await getJob(KEY_A, j.id));
  assert.equal(u.job.result.choices.length, 1);
  await barrier(c, 'p2');
  assert.equal(updatesOf(c, j.id).length, 1, 'nothing follows the final update');
  // it is not followed any more: unsubscribing is a no-op, said so
  c.send({ type: 'job.unsubscribe', event_id: 'u2', id: j.id });
  const un = await c.wait((m) => m.event_id === 'u2', 'the reply to job.unsubscribe');
  assert.deepEqual([un.type, un.id, un.subscribed], ['job.unsubscribed', j.id, false]);
  await c.close();
});

test("another key's job and an unknown id are unknown_job, worded like GET's 404; a bad id is invalid_request", async () => {
  const j = await postJob(KEY_A, small);
  const { c } = await connect(KEY_B);
  const http404 = await fetch(`${srv.url}/v1/jobs/${j.id}`, { headers: auth(KEY_B) });
  assert.equal(http404.status, 404);
  const httpErr = (await http404.json()).error;
  c.send({ type: 'job.subscribe', event_id: 'x1', id: j.id });
  const e1 = await c.wait((m) => m.event_id === 'x1', 'the reply for another key\'s job');
  assert.equal(e1.type, 'error', JSON.stringify(e1));
  assert.equal(e1.error.code, 'unknown_job');
  assert.equal(e1.error.param, 'id');
  assert.equal(e1.id, j.id);
  assert.equal(e1.error.message, httpErr.message, 'the same words as the HTTP API');
  c.send({ type: 'job.subscribe', event_id: 'x2', id: 'job_000000000000000000000000' });
  const e2 = await c.wait((m) => m.event_id === 'x2', 'the reply for an unknown id');
  assert.equal(e2.error?.code, 'unknown_job', JSON.stringify(e2));
  assert.equal(e2.error.message, "no job 'job_000000000000000000000000'");
  for (const [n, bad] of [[3, 5], [4, ''], [5, null]]) {
    c.send({ type: 'job.subscribe', event_id: `x${n}`, id: bad });
    const e = await c.wait((m) => m.event_id === `x${n}`, `the reply for id ${JSON.stringify(bad)}`);
    assert.equal(e.error?.code, 'invalid_request', JSON.stringify(e));
    assert.equal(e.error.param, 'id');
  }
  await barrier(c, 'p3');
  assert.equal(c.msgs.filter((m) => m.type === 'job.update').length, 0, 'nothing about the other key\'s job');
  // the owner's session can follow it
  const { c: a } = await connect(KEY_A);
  a.send({ type: 'job.subscribe', event_id: 'o1', id: j.id });
  assert.equal((await a.wait((m) => m.event_id === 'o1', 'the owner\'s reply')).type, 'job.update');
  await c.close();
  await a.close();
});

test('job.unsubscribe stops the updates', async () => {
  const { c } = await connect();
  const b = await blocker();
  const j = await postJob(KEY_A, small);
  c.send({ type: 'job.subscribe', event_id: 's4', id: j.id });
  assert.equal((await c.wait((m) => m.event_id === 's4', 'subscribed')).job?.status, 'queued');
  c.send({ type: 'job.unsubscribe', event_id: 'u4', id: j.id });
  const un = await c.wait((m) => m.event_id === 'u4', 'the reply to job.unsubscribe');
  assert.deepEqual([un.type, un.id, un.subscribed], ['job.unsubscribed', j.id, true]);
  await cancelJob(KEY_A, b.id);
  await waitStatus(KEY_A, j.id, ['succeeded']);
  // a job's changes are queued to its subscribers as they happen: once GET says succeeded, an
  // update would be ahead of this pong
  await barrier(c, 'p4');
  assert.equal(updatesOf(c, j.id).length, 1, 'only the update before the unsubscribe');
  await c.close();
});

test('subscriptions survive session.resume: missed updates replayed, later ones live', async () => {
  const { c, s } = await connect();
  const b = await blocker();
  const j1 = await postJob(KEY_A, small);
  const j2 = await postJob(KEY_A, small); // runs after j1 (one slot)
  c.send({ type: 'job.subscribe', event_id: 'r-s1', id: j1.id });
  c.send({ type: 'job.subscribe', event_id: 'r-s2', id: j2.id });
  const last = await c.wait((m) => m.event_id === 'r-s2', 'the second subscription');
  assert.equal(last.job?.status, 'queued', JSON.stringify(last));
  c.ws.terminate(); // a drop: the session stays, with its subscriptions
  await c.closedP;
  await cancelJob(KEY_A, b.id);
  await waitStatus(KEY_A, j1.id, ['succeeded']); // while nobody is connected
  const r = new Client(`ws://127.0.0.1:${srv.port}/ws`, { headers: auth(KEY_A) });
  await r.session();
  r.send({ type: 'session.resume', event_id: 'res', session: s.session, last_seq: last.seq });
  const resumed = await r.wait((m) => m.event_id === 'res', 'the reply to session.resume');
  assert.equal(resumed.type, 'session.resumed', JSON.stringify(resumed));
  assert.ok(resumed.replayed >= 2, 'j1 running + succeeded were replayed');
  await finalOf(r, j1.id);
  await finalOf(r, j2.id);
  assert.deepEqual(updatesOf(r, j1.id).map((u) => u.job.status), ['running', 'succeeded']);
  assert.deepEqual(updatesOf(r, j2.id).map((u) => u.job.status), ['running', 'succeeded']);
  const resumedPart = r.msgs.slice(1);
  assert.deepEqual(resumedPart.map((m) => m.seq), resumedPart.map((_, i) => last.seq + 1 + i), 'seq continues');
  assert.deepEqual(updatesOf(r, j2.id).at(-1).job, await getJob(KEY_A, j2.id));
  await r.close();
  // a connection whose own session follows a job does not resume another (that would drop it)
  const { c: x } = await connect();
  const b2 = await blocker();
  x.send({ type: 'job.subscribe', event_id: 'xs', id: b2.id });
  assert.equal((await x.wait((m) => m.event_id === 'xs', 'subscribed')).job?.status, 'running');
  x.send({ type: 'session.resume', event_id: 'xr', session: s.session, last_seq: 1 });
  assert.equal((await x.wait((m) => m.event_id === 'xr', 'the reply to the resume')).error?.code, 'resume_not_allowed');
  await cancelJob(KEY_A, b2.id);
  assert.equal((await finalOf(x, b2.id)).job.status, 'cancelled');
  await x.close();
});

test('the per-session bound: a clear error past it; subscribing again is not counted twice; cancels are updates', async () => {
  const { c } = await connect();
  const b = await blocker();
  const jobs = [];
  for (let i = 0; i <= MAX_SUBS; i++) jobs.push(await postJob(KEY_A, small));
  for (let i = 0; i < MAX_SUBS; i++) {
    c.send({ type: 'job.subscribe', event_id: `l${i}`, id: jobs[i].id });
    assert.equal((await c.wait((m) => m.event_id === `l${i}`, `subscription ${i}`)).type, 'job.update');
  }
  c.send({ type: 'job.subscribe', event_id: 'over', id: jobs[MAX_SUBS].id });
  const e = await c.wait((m) => m.event_id === 'over', 'the reply past the bound');
  assert.equal(e.error?.code, 'too_many_subscriptions', JSON.stringify(e));
  assert.match(e.error.message, new RegExp(`already follows ${MAX_SUBS} jobs \\(--max-session-job-subscriptions\\)`));
  c.send({ type: 'job.subscribe', event_id: 'again', id: jobs[0].id });
  const again = await c.wait((m) => m.event_id === 'again', 'the reply to a second subscribe');
  assert.equal(again.type, 'job.update', JSON.stringify(again));
  assert.equal(again.job.status, 'queued');
  // cancelled while queued: the final update says so, and frees a place
  await cancelJob(KEY_A, jobs[0].id);
  const fin = await finalOf(c, jobs[0].id);
  assert.equal(fin.job.status, 'cancelled');
  c.send({ type: 'job.subscribe', event_id: 'room', id: jobs[MAX_SUBS].id });
  assert.equal((await c.wait((m) => m.event_id === 'room', 'the reply once there is room')).type, 'job.update');
  for (const j of jobs) await cancelJob(KEY_A, j.id);
  await cancelJob(KEY_A, b.id);
  for (const j of jobs.slice(1)) assert.equal((await finalOf(c, j.id)).job.status, 'cancelled');
  await c.close();
});
