// ws_resume.test.mjs — persistent sessions: after a forced disconnect, session.resume replays
// exactly the missed events (seq continuity, no gaps, no duplicates) and the generation continues
// live; a generation that finished while the client was away is replayed too; acks release the
// replay buffer; forged tokens, impossible last_seq values and acks of seqs never sent are refused; an expired session's
// generations are cancelled (they stop using compute).

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Client, checkGeneration, checkSeqContiguous, startServer, tinyModel, untilStats } from './harness.mjs';

// Resume `token` after `last` on a new connection; resolves with the client once session.resumed
// arrived.
async function resume(srv, token, last, eventId = 'r1') {
  const c = new Client(srv.wsUrl);
  const fresh = await c.session();
  assert.notEqual(fresh.session, token);
  c.send({ type: 'session.resume', event_id: eventId, session: token, last_seq: last });
  return c;
}

// Messages of the resumed session on connection c (everything after its own session.created).
const resumedPart = (c) => c.msgs.slice(1);

describe('session resume', () => {
  let srv;
  before(async () => {
    srv = await startServer({ model: tinyModel('ws-resume'), extra: ['--session-retention', '30'] });
  });
  after(async () => {
    await srv.stop();
  });

  test('a forced disconnect mid-generation: the missed events come back exactly once, then live', async (t) => {
    const a = new Client(srv.wsUrl);
    const s = await a.session();
    a.send({ type: 'generate', id: 'g', prompt_ids: [3, 4, 5], gen_length: 192, block_length: 64, steps: 192, stream: { drafts: true } });
    // the client "processes" events up to L; what arrives after L is lost with the socket
    const L = (await a.wait((m) => m.type === 'step' && m.id === 'g' && m.step >= 3, 'some steps')).seq;
    await a.wait((m) => m.seq >= L + 5, 'events after L on the wire');
    a.ws.terminate(); // TCP drop, no close frame
    await a.closedP;
    const before = a.msgs.filter((m) => m.seq <= L);
    const lost = a.msgs.filter((m) => m.seq > L);
    checkSeqContiguous(assert, a.msgs);

    const b = await resume(srv, s.session, L);
    await b.done('g');
    const resumed = await b.wait((m) => m.type === 'session.resumed');
    assert.equal(resumed.session, s.session);
    assert.equal(resumed.last_seq, L);
    assert.equal(resumed.event_id, 'r1');
    const after = resumedPart(b);
    // continuity: L+1, L+2, ... with the missed events first, then session.resumed, then live
    checkSeqContiguous(assert, after, L + 1);
    assert.equal(after.filter((m) => m.type === 'session.resumed').length, 1);
    const replayed = after.slice(0, after.indexOf(resumed));
    assert.equal(replayed.length, resumed.replayed);
    assert.ok(replayed.length >= lost.length);
    // events that had been sent before the drop come back identical
    lost.forEach((m, i) => assert.deepEqual(replayed[i], m, `seq ${m.seq} replayed as sent`));
    // the union is one complete, well-formed generation
    const all = [...before, ...after];
    checkSeqContiguous(assert, all);
    const done = checkGeneration(assert, all.filter((m) => m.type !== 'session.resumed'), 'g');
    const committed = all.filter((m) => m.type === 'step' && m.id === 'g').flatMap((m) => m.commits.map((x) => x.index));
    assert.equal(new Set(committed).size, 192, 'every position committed once over the whole stream');
    assert.equal(committed.length, 192);
    assert.ok(['length', 'stop'].includes(done.finish_reason));
    t.diagnostic(`${before.length} events processed, ${lost.length} lost on the wire, ${replayed.length} replayed, ${after.length - replayed.length - 1} live after the resume`);
    await b.close();
  });

  test('a generation that finished while disconnected is replayed on resume', async () => {
    const a = new Client(srv.wsUrl);
    const s = await a.session();
    // counted before the generation starts: it may finish before a later read (a race on a fast machine)
    const finishedBefore = (await srv.stats()).scheduler.finished;
    // long enough that its done cannot arrive in the same read as its first step (then nothing
    // would be left to replay)
    a.send({ type: 'generate', id: 'h', prompt_ids: [9, 9], gen_length: 512, block_length: 32, steps: 512 });
    await a.wait((m) => m.type === 'step' && m.id === 'h');
    assert.ok(!a.msgs.some((m) => m.type === 'done'), 'disconnected before the generation finished');
    a.ws.terminate();
    await a.closedP;
    const last = a.msgs.at(-1).seq;
    // wait (by polling the server's counters, not by sleeping) until it finished server-side
    await untilStats(srv, (st) => st.scheduler.finished > finishedBefore && st.scheduler.active === 0, 'the generation to finish server-side');
    const b = await resume(srv, s.session, last);
    const resumed = await b.wait((m) => m.type === 'session.resumed');
    const after = resumedPart(b);
    checkSeqContiguous(assert, after, last + 1);
    const replayedDone = after.findIndex((m) => m.type === 'done' && m.id === 'h');
    assert.ok(replayedDone >= 0 && replayedDone < after.indexOf(resumed), 'done is among the replayed events');
    checkGeneration(assert, [...a.msgs, ...after].filter((m) => m.type !== 'session.resumed'), 'h');
    assert.deepEqual(resumed.running, []);
    await b.close();
  });

  test('resume after an ack: acknowledged events are released, the rest replayed', async () => {
    const a = new Client(srv.wsUrl);
    const s = await a.session();
    a.send({ type: 'generate', id: 'k', prompt_ids: [1], gen_length: 16, block_length: 8, steps: 16 });
    await a.done('k');
    const ackAt = a.msgs[Math.floor(a.msgs.length / 2)].seq;
    a.send({ type: 'ack', seq: ackAt });
    a.send({ type: 'ping', event_id: 'p' }); // the pong proves the ack was processed first
    await a.wait((m) => m.type === 'pong');
    a.ws.terminate();
    await a.closedP;
    // resuming below the ack point: those events are gone, the server says so
    const b = await resume(srv, s.session, ackAt - 2, 'r-gap');
    const resumed = await b.wait((m) => m.type === 'session.resumed');
    assert.ok(resumed.replayed > 0);
    const after = resumedPart(b);
    checkSeqContiguous(assert, after, ackAt + 1);
    await b.close();
  });

  test('an ack of a seq never sent is refused like a future last_seq, and releases nothing', async () => {
    const a = new Client(srv.wsUrl);
    const s = await a.session();
    a.send({ type: 'generate', id: 'bogus', prompt_ids: [1], gen_length: 16, block_length: 8, steps: 16 });
    await a.done('bogus');
    const last = a.msgs.at(-1).seq;
    a.send({ type: 'ack', event_id: 'far', seq: 1e6 });
    const e = await a.wait((m) => m.type === 'error' && m.event_id === 'far', 'the ack refused');
    assert.equal(e.error.code, 'invalid_request');
    assert.equal(e.error.param, 'seq');
    assert.match(e.error.message, new RegExp(`ack seq 1000000 is ahead of the last event this session sent \\(${last}\\)`));
    const sent = a.msgs.slice();
    a.ws.terminate();
    await a.closedP;
    // nothing was released: a resume from the middle gets every later event, the error included
    const L = Math.floor(last / 2);
    const b = await resume(srv, s.session, L, 'r-bogus');
    const resumed = await b.wait((m) => m.type === 'session.resumed');
    const after = resumedPart(b);
    checkSeqContiguous(assert, after, L + 1);
    assert.equal(after.filter((m) => m.error?.code === 'resume_gap').length, 0, 'no resume_gap');
    assert.equal(resumed.replayed, sent.length - L);
    sent.slice(L).forEach((m, i) => assert.deepEqual(after[i], m, `seq ${m.seq} replayed as sent`));
    await b.close();
  });

  test('forged token, impossible last_seq, resume after own generations', async () => {
    const c = new Client(srv.wsUrl);
    const s = await c.session();
    c.send({ type: 'session.resume', event_id: 'f1', session: 'ab'.repeat(32), last_seq: 0 });
    const e1 = await c.wait((m) => m.type === 'error' && m.event_id === 'f1');
    assert.equal(e1.error.code, 'unknown_session');
    c.send({ type: 'session.resume', event_id: 'f2', session: 'short', last_seq: 0 });
    const e2 = await c.wait((m) => m.type === 'error' && m.event_id === 'f2');
    assert.equal(e2.error.code, 'invalid_request');
    assert.equal(e2.error.param, 'session');
    // our own session, but a last_seq from the future
    c.send({ type: 'session.resume', event_id: 'f3', session: s.session, last_seq: 1e9 });
    const e3 = await c.wait((m) => m.type === 'error' && m.event_id === 'f3');
    assert.equal(e3.error.param, 'last_seq');
    // the connection still works
    c.send({ type: 'ping', event_id: 'p1' });
    await c.wait((m) => m.type === 'pong' && m.event_id === 'p1');
    checkSeqContiguous(assert, c.msgs);
    // another session's token while this connection runs generations of its own: refused
    const other = new Client(srv.wsUrl);
    const os = await other.session();
    c.send({ type: 'generate', id: 'mine', prompt_ids: [1], gen_length: 64, block_length: 64, steps: 64 });
    await c.wait((m) => m.type === 'accepted' && m.id === 'mine');
    c.send({ type: 'session.resume', event_id: 'f4', session: os.session, last_seq: 1 });
    const e4 = await c.wait((m) => m.type === 'error' && m.event_id === 'f4');
    assert.equal(e4.error.code, 'resume_not_allowed');
    await c.done('mine');
    await c.close();
    await other.close();
  });

  test('a second connection resuming a live session takes it over (the old socket is closed)', async () => {
    const a = new Client(srv.wsUrl);
    const s = await a.session();
    a.send({ type: 'generate', id: 't', prompt_ids: [1, 2], gen_length: 64, block_length: 16, steps: 64 });
    await a.wait((m) => m.type === 'step' && m.id === 't');
    const last = a.msgs.at(-1).seq;
    const b = await resume(srv, s.session, last);
    const closed = await a.closedP;
    assert.equal(closed.code, 4001);
    await b.done('t');
    // a may have received more events before it was closed: b's stream still starts at last+1
    checkSeqContiguous(assert, resumedPart(b), last + 1);
    await b.close();
  });
});

describe('session retention', () => {
  let srv;
  before(async () => {
    srv = await startServer({ model: tinyModel('ws-resume'), extra: ['--session-retention', '0.3'], name: 'short-retention' });
  });
  after(async () => {
    await srv.stop();
  });

  test('an expired session cancels its generations and can no longer be resumed', async () => {
    const a = new Client(srv.wsUrl);
    const s = await a.session();
    a.send({ type: 'generate', id: 'x', prompt_ids: [1], gen_length: 960, block_length: 960, steps: 960 });
    await a.wait((m) => m.type === 'step' && m.id === 'x');
    const cancelledBefore = (await srv.stats()).scheduler.cancelled;
    a.ws.terminate();
    // retention 0.3 s: the generation is cancelled well before its 960 steps
    const st = await untilStats(srv, (x) => x.scheduler.cancelled > cancelledBefore && x.connections.sessions === 0,
      'the session to expire and its generation to be cancelled');
    assert.equal(st.scheduler.active, 0, 'no compute is spent on it any more');
    const b = new Client(srv.wsUrl);
    await b.session();
    b.send({ type: 'session.resume', event_id: 'late', session: s.session, last_seq: 3 });
    const e = await b.wait((m) => m.type === 'error' && m.event_id === 'late');
    assert.equal(e.error.code, 'unknown_session');
    await b.close();
  });

  test('a normal close (1000) ends the session and cancels its generations at once', async () => {
    const a = new Client(srv.wsUrl);
    const s = await a.session();
    a.send({ type: 'generate', id: 'n', prompt_ids: [1], gen_length: 960, block_length: 960, steps: 960 });
    await a.wait((m) => m.type === 'step' && m.id === 'n');
    const before = await srv.stats();
    a.ws.close(1000, 'bye');
    await a.closedP;
    // (other sessions of this suite may expire meanwhile: count down, not to an exact number)
    await untilStats(srv, (st) => st.scheduler.cancelled > before.scheduler.cancelled && st.scheduler.active === 0 &&
      st.connections.sessions_detached === 0 && st.connections.sessions <= before.connections.sessions - 1,
    'the session to end and its generation to be cancelled');
    const b = new Client(srv.wsUrl);
    await b.session();
    b.send({ type: 'session.resume', event_id: 'gone', session: s.session, last_seq: 1 });
    assert.equal((await b.wait((m) => m.type === 'error' && m.event_id === 'gone')).error.code, 'unknown_session');
    await b.close();
  });
});

describe('session buffer limits', () => {
  let srv;
  before(async () => {
    srv = await startServer({
      model: tinyModel('ws-resume'),
      extra: ['--session-retention', '60', '--session-max-events', '64', '--session-max-bytes', '65536', '--max-batch', '1'],
      name: 'small-buffers',
    });
  });
  after(async () => {
    await srv.stop();
  });

  test('a detached session whose unsent events exceed the budget is discarded, and resume says so', async () => {
    // Another client's long generation holds the only batch slot (--max-batch 1), so the session's
    // generations wait in the queue while it is attached: none of its events can pile up unsent
    // before the drop (while attached, a producer faster than the socket overflows too: 4008).
    const hold = new Client(srv.wsUrl);
    await hold.session();
    hold.send({ type: 'generate', id: 'hold', prompt_ids: [1, 2], gen_length: 960, block_length: 64, steps: 960,
      stop_at_eos: false });
    await hold.wait((m) => m.type === 'step' && m.id === 'hold', 'the holding generation to run');
    const a = new Client(srv.wsUrl);
    const s = await a.session();
    // 8 generations with one block per token: 8 x 48 block events cannot be merged away
    for (let i = 0; i < 8; i++) a.send({ type: 'generate', id: `o${i}`, prompt_ids: [1, 2], gen_length: 48, block_length: 1, steps: 48 });
    await a.wait((m) => m.type === 'accepted' && m.id === 'o7');
    const before = await srv.stats();
    assert.equal(before.scheduler.queued, 8, 'the session\'s generations wait behind the holding one');
    a.ws.terminate();
    await a.closedP;
    await untilStats(srv, (st) => st.connections.sessions_detached === 1, 'the server to notice the drop');
    hold.send({ type: 'cancel', id: 'hold' }); // the slot frees: the detached session's generations run
    assert.equal((await hold.done('hold')).finish_reason, 'cancelled');
    // the overflow cancels the generations and discards the session
    const st = await untilStats(srv, (x) => x.connections.sessions === before.connections.sessions - 1 &&
      x.scheduler.active === 0 && x.scheduler.queued === 0, 'the overflowing session to be discarded');
    assert.ok(st.scheduler.cancelled > before.scheduler.cancelled + 1, 'its generations were cancelled');
    await hold.close();
    const b = new Client(srv.wsUrl);
    await b.session();
    b.send({ type: 'session.resume', event_id: 'ov', session: s.session, last_seq: a.msgs.at(-1).seq });
    const e = await b.wait((m) => m.type === 'error' && m.event_id === 'ov');
    assert.equal(e.error.code, 'session_overflow');
    await b.close();
  });

  test('sent events beyond the budget are released oldest first; a resume from before them reports a gap', async () => {
    const a = new Client(srv.wsUrl);
    const s = await a.session();
    // one block per token: 128 block events that cannot be merged away (step frames merge while
    // unsent, so how many of those there are depends on load)
    a.send({ type: 'generate', id: 'big', prompt_ids: [1, 2], gen_length: 128, block_length: 1, steps: 128 });
    await a.done('big'); // 130+ events written and never acked: only the newest 64 stay
    const last = a.msgs.at(-1).seq;
    a.ws.terminate();
    await a.closedP;
    const b = await resume(srv, s.session, 3, 'gap');
    const gap = await b.wait((m) => m.type === 'error' && m.event_id === 'gap');
    assert.equal(gap.error.code, 'resume_gap');
    const resumed = await b.wait((m) => m.type === 'session.resumed');
    const after = resumedPart(b);
    // the replay is the newest retained events, contiguous up to the last one sent
    const replayed = after.slice(0, after.indexOf(gap));
    assert.ok(replayed.length > 0 && replayed.length <= 64);
    checkSeqContiguous(assert, replayed, replayed[0].seq);
    assert.equal(replayed.at(-1).seq, last);
    assert.ok(replayed[0].seq > 4, 'older events were released');
    assert.equal(resumed.seq, gap.seq + 1);
    await b.close();
  });
});
