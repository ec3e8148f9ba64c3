// ws_replica.test.mjs — WebSocket sessions shared through Redis (--store redis://): a session
// started on replica A (a direct connection) with a running generation; the client drops; it
// resumes on replica B, which does not hold the session: B replays every missed event exactly
// once from the session's log in Redis (the same bytes A produced, in seq order), then follows the
// live events until `done`. Second case: A is SIGKILLed mid-generation: the resume on B gets the
// replay, then an `error` replica_lost for the unfinished generation once A's heartbeat expired.
// The live events after a resume come through Redis pub/sub (B's
// unmask_ws_follow_pubsub_events_total counts them), not the 2 s fallback poll. Third case: the
// same session through nginx (config/nginx/unmask.conf in front of A and B): the client
// reconnects through nginx until its resume lands on the replica that does not own the session
// (session.resumed names an `owner`), then the same checks.
// Real redis-server (and nginx), started and stopped here.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { until } from '../http/server.mjs';
import { Client, checkGeneration, checkSeqContiguous } from '../protocol/harness.mjs';
import { startNginx, redisCmd } from './infra.mjs';
import { useReplicas } from './fixture.mjs';

const fx = useReplicas('ws-replica');
const replica = fx.replica;
const GEN = { type: 'generate', id: 'g', prompt_ids: [3, 4, 5], gen_length: 64, block_length: 32, steps: 64 };
// the session's log as stored in Redis (what its owner produced), parsed
const storedLog = async (token) => (await redisCmd(fx.redis.port, 'LRANGE', `unmask:wslog:${token}`, 0, -1)).map((s) => JSON.parse(s));
const metric = async (srv, name) => {
  const m = (await (await fetch(`${srv.url}/metrics`)).text()).match(new RegExp(`^unmask_${name} (\\S+)$`, 'm'));
  assert.ok(m, `metric ${name} on /metrics`);
  return Number(m[1]);
};
// on A: generate, take some steps as "processed" (up to seq L), see more on the wire, drop the TCP connection
async function startAndDrop(a) {
  const c = new Client(a.wsUrl);
  const s = await c.session();
  c.send(GEN);
  const L = (await c.wait((m) => m.type === 'step' && m.id === 'g' && m.step >= 3, 'some steps')).seq;
  await c.wait((m) => m.seq >= L + 2, 'events after L on the wire');
  c.ws.terminate();
  await c.closedP;
  return { token: s.session, L, seen: c.msgs };
}
async function resumeOn(b, token, L) {
  const c = new Client(b.wsUrl);
  const fresh = await c.session();
  assert.notEqual(fresh.session, token);
  c.send({ type: 'session.resume', event_id: 'r1', session: token, last_seq: L });
  const resumed = await c.wait((m) => m.event_id === 'r1', 'the reply to session.resume');
  assert.equal(resumed.type, 'session.resumed', JSON.stringify(resumed));
  return { c, resumed };
}

// the resumed stream on the following replica: every event after L once, in order, then live
// until done; with what the client saw before the drop, the whole log the owner produced
async function checkFollowed({ token, L, seen }, c, resumed) {
  assert.equal(resumed.session, token);
  assert.equal(resumed.last_seq, L);
  assert.equal(resumed.event_id, 'r1');
  assert.deepEqual(resumed.running, ['g'], 'the generation was still running on A at the resume');
  await c.wait((m) => m.type === 'done' && m.id === 'g', 'done of g', 60000);
  const got = c.msgs.slice(1); // after B's own session.created
  const iMarker = got.indexOf(resumed);
  const replayed = got.slice(0, iMarker);
  const live = got.slice(iMarker + 1);
  assert.equal(replayed.length, resumed.replayed);
  assert.ok(live.some((m) => m.type === 'step' && m.id === 'g'), 'live steps followed from A after the resume');
  assert.equal(live.at(-1).type, 'done', 'done is last');
  const events = [...replayed, ...live];
  checkSeqContiguous(assert, events, L + 1); // exactly once, in order: L+1, L+2, ... without gaps or duplicates
  // what the client saw before the drop and after the resume is the whole session as A produced it
  const before = seen.filter((m) => m.seq <= L);
  const all = [...before, ...events];
  checkSeqContiguous(assert, all);
  const log = await storedLog(token);
  assert.deepEqual(all, log, 'every event A produced, byte-for-byte the same JSON, once');
  seen.filter((m) => m.seq > L).forEach((m) => assert.deepEqual(events[m.seq - L - 1], m, `seq ${m.seq} replayed as sent`));
  checkGeneration(assert, all, 'g');
  const committed = all.filter((m) => m.type === 'step' && m.id === 'g').flatMap((m) => m.commits.map((x) => x.index));
  assert.equal(committed.length, 64, 'every position committed once');
  assert.equal(new Set(committed).size, 64);
}

test('a session started on A resumes on B: missed events exactly once, in order, then live until done', async () => {
  const a = await replica();
  const b = await replica();
  const { token, L, seen } = await startAndDrop(a);
  const { c, resumed } = await resumeOn(b, token, L);
  assert.ok(resumed.owner, 'B follows the session (A owns it)');
  await checkFollowed({ token, L, seen }, c, resumed);
  assert.ok(await metric(b, 'ws_follow_pubsub_events_total') > 0, 'B got the live events through Redis pub/sub');
  assert.equal(await metric(a, 'ws_follow_pubsub_events_total'), 0, 'A owns the session: it follows nothing');
  await c.close();
});

test('A SIGKILLed mid-generation: the resume on B replays, then error replica_lost', async () => {
  const a = await replica();
  const b = await replica();
  const { token, L, seen } = await startAndDrop(a);
  await a.stop('SIGKILL');
  const { c, resumed } = await resumeOn(b, token, L);
  assert.deepEqual(resumed.running, ['g'], 'the generation had not finished');
  const lost = await c.wait((m) => m.type === 'error' && m.error?.code === 'replica_lost', 'error replica_lost', 20000);
  assert.equal(lost.id, 'g');
  const got = c.msgs.slice(1).filter((m) => m !== resumed);
  checkSeqContiguous(assert, got, L + 1); // the replay and the error continue the session's seq
  assert.equal(got.at(-1), lost, 'replica_lost ends the stream');
  assert.ok(!got.some((m) => m.type === 'done'), 'no done for a generation that did not finish');
  // everything A stored, then B's replica_lost (written to the log too: B's store writer runs beside
  // its socket, so the client can read the error a moment before it is in Redis)
  const log = await until('the replica_lost event in the stored log', async () => {
    const l = await storedLog(token);
    return l.length >= lost.seq ? l : null;
  });
  assert.deepEqual([...seen.filter((m) => m.seq <= L), ...got], log);
  // what A stored is replayed as A sent it; events A sent past L but had not stored yet when it was
  // killed (its writer batches behind the socket) died with it, and replica_lost takes the next seq
  // after the stored log (the client resumed at L, so it discarded those)
  seen.filter((m) => m.seq > L && m.seq < lost.seq).forEach((m) =>
    assert.deepEqual(got[m.seq - L - 1], m, `seq ${m.seq} replayed as sent`));
  assert.equal(lost.seq, log.length, 'replica_lost follows the last stored event');
  const committed = log.filter((m) => m.type === 'step').flatMap((m) => m.commits.map((x) => x.index));
  assert.equal(new Set(committed).size, committed.length, 'no position committed twice');
  assert.ok(committed.length < 64, 'the generation was interrupted');
  // the client leaves; a later resume (loaded from Redis again) sees the generation ended: the
  // error is in the log, no second one
  await c.close();
  const again = await resumeOn(b, token, lost.seq - 1);
  assert.deepEqual(again.resumed.running, []);
  assert.equal(again.resumed.replayed, 1);
  assert.deepEqual(again.c.msgs[1], lost, 'the stored replica_lost replayed');
  await again.c.close();
});

test('through nginx: the client reconnects until the resume lands on the other replica, then the same stream', async () => {
  const a = await replica();
  const b = await replica();
  const nginx = await startNginx(path.join(fx.dir, 'nginx'), [`127.0.0.1:${a.port}`, `127.0.0.1:${b.port}`]);
  try {
    const wsUrl = `ws://127.0.0.1:${nginx.port}/ws`;
    const dropped = await startAndDrop({ wsUrl });
    // round robin: a new connection may reach the owner again (a local resume: no `owner`); such a
    // connection is dropped unacknowledged (the client still has processed up to L) and retried
    let c, resumed;
    for (let attempt = 1; ; attempt++) {
      ({ c, resumed } = await resumeOn({ wsUrl }, dropped.token, dropped.L));
      if (resumed.owner) break;
      c.ws.terminate();
      await c.closedP;
      assert.ok(attempt < 6, 'a resume through nginx reached the replica that does not own the session');
    }
    await checkFollowed(dropped, c, resumed);
    const relayed = [await metric(a, 'ws_follow_pubsub_events_total'), await metric(b, 'ws_follow_pubsub_events_total')];
    assert.ok(relayed.some((n) => n > 0), `live events relayed through Redis pub/sub (A, B: ${relayed})`);
    assert.ok(relayed.some((n) => n === 0), 'only the follower relays');
  } finally {
    await nginx.stop();
  }
});
