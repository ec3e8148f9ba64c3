// ws_jobs_replica.test.mjs — WebSocket job subscriptions across replicas sharing a Redis store
// (--store redis://): a session on replica B follows a job that replica A holds and runs. B learns
// of A's changes the way its SSE stream does, by polling the shared store: the first update (at
// once) says queued, the final one carries the result and equals GET /v1/jobs/{id} on B; a job A
// finished before the subscribe gets its one final update from B at once; another key's job is
// unknown_job on B as on A. Second case: the subscriptions belong to the session: a session on A
// that follows a queued job drops and resumes on B, which follows the session through Redis; the
// job's updates A keeps producing (running, succeeded with the result) reach the client on B live,
// in order, without a gap in seq; when A dies instead, the subscription ends with replica_lost on
// B. A runs the job for sure: B starts only once A holds both jobs
// (unmask_jobs_held), and --max-batch 1 with a blocker keeps the job queued until it is cancelled.
// Real redis-server, started and stopped here; no sleeps (waits on events, GETs and /metrics).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { post, until } from '../http/server.mjs';
import { Client } from '../protocol/harness.mjs';
import { redisCmd } from './infra.mjs';
import { useReplicas } from './fixture.mjs';

const KEY = 'sk-replica-jobs';
const OTHER = 'sk-replica-other';
const fx = useReplicas('ws-jobs-replica', {
  setup: (dir) => fs.writeFileSync(path.join(dir, 'keys.txt'), `${KEY}\n${OTHER}\n`),
  args: (dir) => ['--max-batch', '1', '--api-keys', path.join(dir, 'keys.txt')],
});
const replica = fx.replica;
const auth = (key = KEY) => ({ authorization: `Bearer ${key}` });
const small = { prompt: 'Once upon a time', max_tokens: 8, block_length: 4, temperature: 0 };
const long = { prompt: 'A long story', max_tokens: 256, block_length: 256, steps: 256, decoder: 'low_confidence',
  temperature: 0 };
const postJob = async (srv, body) => {
  const r = await post(`${srv.url}/v1/jobs`, body, auth());
  assert.equal(r.status, 202, r.text);
  return r.json();
};
const getJob = async (srv, id, key = KEY) => (await fetch(`${srv.url}/v1/jobs/${id}`, { headers: auth(key) })).json();
const waitStatus = (srv, id, statuses) =>
  until(`job ${id} in ${statuses}`, async () => {
    const j = await getJob(srv, id);
    return statuses.includes(j.status) && j;
  }, 120000);
// seqs of the session's events in its log in Redis (what its owner stored so far)
const storedSeqs = async (token) =>
  (await redisCmd(fx.redis.port, 'LRANGE', `unmask:wslog:${token}`, 0, -1)).map((t) => JSON.parse(t).seq);
// A session on A follows job j (still queued); its client drops and resumes the session on B, which
// then follows it from A: the subscribe's reply, B's client and its session.resumed
async function subscribeOnAResumeOnB(a, b, j) {
  const c = new Client(a.wsUrl, { headers: auth() });
  const s = await c.session();
  c.send({ type: 'job.subscribe', event_id: 'sub', id: j.id });
  const first = await c.wait((m) => m.event_id === 'sub', 'the reply to job.subscribe');
  assert.equal(first.job?.status, 'queued', JSON.stringify(first));
  // the owner writes the session's log a moment behind its socket: resume once it holds the update
  await until('the update in the session\'s log', async () => (await storedSeqs(s.session)).includes(first.seq), 30000);
  c.ws.terminate(); // the session stays on A, with its subscription
  await c.closedP;
  const r = new Client(b.wsUrl, { headers: auth() });
  await r.session();
  r.send({ type: 'session.resume', event_id: 'res', session: s.session, last_seq: first.seq });
  const resumed = await r.wait((m) => m.event_id === 'res', 'the reply to session.resume');
  assert.equal(resumed.type, 'session.resumed', JSON.stringify(resumed));
  return { first, r, resumed };
}
// A on its own holds a running blocker (the only batch slot) and a queued job behind it.
async function heldOnA(a) {
  const blocker = await postJob(a, long);
  await waitStatus(a, blocker.id, ['running']);
  const j = await postJob(a, small);
  await until('A holds the blocker and the job', async () => (await metric(a, 'jobs_held')) >= 2, 60000);
  return { blocker, j };
}
const metric = async (srv, name) => {
  const m = (await (await fetch(`${srv.url}/metrics`)).text()).match(new RegExp(`^unmask_${name} (\\S+)$`, 'm'));
  assert.ok(m, `metric ${name} on /metrics`);
  return Number(m[1]);
};

test('a session on replica B follows jobs replica A runs', async (t) => {
  const a = await replica();
  const done = await postJob(a, small);
  assert.equal((await waitStatus(a, done.id, ['succeeded', 'failed'])).status, 'succeeded');
  const blocker = await postJob(a, long);
  await waitStatus(a, blocker.id, ['running']);
  const j = await postJob(a, small); // waits for the slot the blocker holds
  await until('A holds the blocker and the job', async () => (await metric(a, 'jobs_held')) >= 3, 60000);
  const b = await replica();
  const c = new Client(`ws://127.0.0.1:${b.port}/ws`, { headers: auth() });
  await c.session();

  // finished on A before the subscribe: one final update, from the store
  c.send({ type: 'job.subscribe', event_id: 'f', id: done.id });
  const f = await c.wait((m) => m.event_id === 'f', 'the reply for the finished job');
  assert.equal(f.type, 'job.update', JSON.stringify(f));
  assert.equal(f.final, true);
  assert.equal(f.job.status, 'succeeded');
  assert.deepEqual(f.job, await getJob(b, done.id));

  // still queued on A: every change A makes reaches B's session, the last one with the result
  c.send({ type: 'job.subscribe', event_id: 'l', id: j.id });
  const first = await c.wait((m) => m.event_id === 'l', 'the reply for the queued job');
  assert.equal(first.type, 'job.update', JSON.stringify(first));
  assert.equal(first.job.status, 'queued');
  assert.equal(first.final, false);
  await fetch(`${a.url}/v1/jobs/${blocker.id}`, { method: 'DELETE', headers: auth() });
  const fin = await c.wait((m) => m.type === 'job.update' && m.id === j.id && m.final, 'the final update', 120000);
  assert.equal(fin.job.status, 'succeeded');
  assert.equal(fin.job.result.object, 'text_completion');
  assert.deepEqual(fin.job, await getJob(b, j.id), 'the object GET /v1/jobs/{id} returns on B');
  assert.deepEqual(fin.job.result, (await getJob(a, j.id)).result, 'the result A produced');
  // B polls the store: a status shorter than a poll may fold into the next update, never out of order
  const order = ['queued', 'running', 'succeeded'];
  const seen = c.msgs.filter((m) => m.type === 'job.update' && m.id === j.id).map((m) => order.indexOf(m.job.status));
  assert.ok(seen.every((x, i) => x >= 0 && (i === 0 || x > seen[i - 1])), `statuses in order, each once: ${seen}`);
  t.diagnostic(`updates seen on B: ${seen.map((x) => order[x]).join(', ')}`);

  // another key's job is unknown on B too
  const o = new Client(`ws://127.0.0.1:${b.port}/ws`, { headers: auth(OTHER) });
  await o.session();
  o.send({ type: 'job.subscribe', event_id: 'x', id: j.id });
  const e = await o.wait((m) => m.event_id === 'x', 'the reply for another key');
  assert.equal(e.error?.code, 'unknown_job', JSON.stringify(e));
  await c.close();
  await o.close();
});

test('subscriptions survive a resume on another replica: the job updates follow live', async () => {
  const a = await replica();
  const { blocker, j } = await heldOnA(a);
  const b = await replica();
  const { first, r, resumed } = await subscribeOnAResumeOnB(a, b, j);
  assert.ok(resumed.owner, 'B follows the session A holds');
  // the subscriptions are A's: B does not add any to that session
  r.send({ type: 'job.subscribe', event_id: 'more', id: blocker.id });
  const refused = await r.wait((m) => m.event_id === 'more', 'the reply to a subscribe on the followed session');
  assert.equal(refused.error?.code, 'session_followed', JSON.stringify(refused));
  await fetch(`${a.url}/v1/jobs/${blocker.id}`, { method: 'DELETE', headers: auth() });
  const fin = await r.wait((m) => m.type === 'job.update' && m.id === j.id && m.final, 'the final update on B', 60000);
  const ups = r.msgs.filter((m) => m.type === 'job.update' && m.id === j.id);
  // A runs the job: it sees each change as it happens, and B relays every event of the session
  assert.deepEqual(ups.map((u) => u.job.status), ['running', 'succeeded']);
  assert.deepEqual(ups.map((u) => u.seq), [first.seq + 1, first.seq + 2], 'the session\'s seq continues');
  assert.equal(fin.job.result.object, 'text_completion');
  // B's GET reads the shared store, which A writes a moment after it tells its session (the update
  // is A's view); once the store has the finished job, it is the same object
  await until('B reads the finished job from the store', async () => (await getJob(b, j.id)).status === fin.job.status, 30000);
  assert.deepEqual(fin.job, await getJob(b, j.id));
  await r.close();
});

test('the replica holding a followed session dies: each open job subscription ends with replica_lost', async () => {
  const a = await replica();
  const { j } = await heldOnA(a);
  const b = await replica();
  const { first, r } = await subscribeOnAResumeOnB(a, b, j);
  await a.stop(); // SIGKILL: its heartbeat expires within about 3 s
  const e = await r.wait((m) => m.type === 'error' && m.id === j.id, 'replica_lost for the subscription', 60000);
  assert.equal(e.error.code, 'replica_lost', JSON.stringify(e));
  assert.match(e.error.message, new RegExp(`subscription to job '${j.id}'`));
  assert.equal(e.seq, first.seq + 1, 'it continues the session\'s seq');
  await r.close();
});

test('a replica that is full keeps renewing its heartbeat (the others do not take it for dead)', async () => {
  const a = await replica();
  await heldOnA(a); // capacity 2 x --max-batch 1: A takes nothing more
  const keys = await redisCmd(fx.redis.port, 'KEYS', 'unmask:alive:*');
  assert.equal(keys.length, 1, `one replica, one heartbeat: ${keys}`);
  // the key lives 3 s and is renewed every 0.5 s: a renewal shows as its time to live going up
  let last = await redisCmd(fx.redis.port, 'PTTL', keys[0]);
  await until('A renews its heartbeat while full', async () => {
    const now = await redisCmd(fx.redis.port, 'PTTL', keys[0]);
    const renewed = now > last;
    last = now;
    return renewed;
  }, 10000);
  assert.ok(last > 0, 'the heartbeat is alive');
  assert.equal(await metric(a, 'jobs_held'), 2, 'A is still full');
});
