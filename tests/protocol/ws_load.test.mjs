// ws_load.test.mjs — many clients at once, and back-pressure: 50 simultaneous WebSocket clients
// each get a complete, well-formed generation; a client that stops reading (paused socket) does
// not stall anyone else, and when it reads again it gets every event (intermediate steps merged,
// committed tokens and block/done events intact, seq contiguous).

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Client, checkGeneration, checkSeqContiguous, startServer, tinyModel, untilStats } from './harness.mjs';

describe('load', () => {
  let srv;
  before(async () => {
    // --ping-interval: the paused reader below cannot answer pings, and the server rightly hangs up
    // on a client silent for ping interval + 10 s; on a loaded machine its generation can outlast
    // the default 30 s (CI saw 49 s), so this server waits longer instead of the test racing it.
    srv = await startServer({
      model: tinyModel('ws-load'),
      extra: ['--max-batch', '16', '--max-queue', '256', '--ping-interval', '600'],
    });
  });
  after(async () => {
    await srv.stop();
  });

  test('50 clients at once', async () => {
    const clients = [...Array(50)].map(() => new Client(srv.wsUrl));
    await Promise.all(clients.map((c) => c.session()));
    clients.forEach((c, i) =>
      c.send({ type: 'generate', id: `c${i}`, prompt_ids: [1 + (i % 7), 2, 3], gen_length: 8, block_length: 4, steps: 4 }));
    await Promise.all(clients.map((c, i) => c.done(`c${i}`)));
    const tokens = new Set();
    clients.forEach((c, i) => {
      const done = checkGeneration(assert, c.msgs, `c${i}`);
      checkSeqContiguous(assert, c.msgs);
      assert.equal(done.usage.completion_tokens <= 8, true);
      tokens.add(c.msgs[0].session);
    });
    assert.equal(tokens.size, 50, 'every client has its own session');
    const st = await srv.stats();
    assert.equal(st.connections.websocket, 50);
    assert.ok(st.scheduler.max_batch_seen >= 8, `batched (max ${st.scheduler.max_batch_seen} per step)`);
    await Promise.all(clients.map((c) => c.close()));
  });

  test('a paused reader does not stall other clients and loses no committed data', async (t) => {
    const slow = new Client(srv.wsUrl);
    await slow.session();
    // a chatty generation: drafts for a 1000-wide block on every step (up to ~90 KB per frame, ~11 MB in
    // all: more than the loopback socket buffers hold, so the server must hold frames back)
    const N = 1000;
    slow.send({ type: 'generate', id: 'slow', prompt_ids: [1, 2], gen_length: N, block_length: N, steps: N / 4, stream: { drafts: true } });
    await slow.wait((m) => m.type === 'step' && m.id === 'slow', 'first slow step');
    slow.ws._socket.pause(); // stop reading: the server's socket buffer fills up

    // meanwhile another client completes several generations
    const fast = new Client(srv.wsUrl);
    await fast.session();
    for (let i = 0; i < 3; i++) {
      fast.send({ type: 'generate', id: `f${i}`, prompt_ids: [4, 5], gen_length: 16, block_length: 8, steps: 8 });
      await fast.done(`f${i}`);
      checkGeneration(assert, fast.msgs, `f${i}`);
    }
    checkSeqContiguous(assert, fast.msgs);
    assert.equal(slow.msgs.some((m) => m.type === 'done'), false, 'the slow client is still paused');

    // the server is still producing for the paused client: wait until its generation finished
    await untilStats(srv, (st) => st.scheduler.active === 0 && st.scheduler.queued === 0, 'the paused client\'s generation to finish');
    slow.ws._socket.resume();
    const done = await slow.done('slow');
    checkSeqContiguous(assert, slow.msgs);
    checkGeneration(assert, slow.msgs, 'slow');
    const steps = slow.of('slow').filter((m) => m.type === 'step');
    const committed = steps.flatMap((m) => m.commits.map((c) => c.index));
    assert.equal(committed.length, N, 'every committed position arrives exactly once');
    assert.equal(new Set(committed).size, N);
    t.diagnostic(`${steps.length} step frames for ${done.usage.steps} steps, max merged ${Math.max(...steps.map((m) => m.merged || 1))}`);
    assert.ok(steps.length < N / 4 || steps.some((m) => m.merged > 1),
      `intermediate steps were merged while the reader was paused (${steps.length} step frames for ${done.usage.steps} steps)`);
    await slow.close();
    await fast.close();
  });
});

describe('capacity', () => {
  let srv;
  before(async () => {
    srv = await startServer({ model: tinyModel('ws-load'), extra: ['--max-sessions', '3', '--session-retention', '60'], name: 'capacity' });
  });
  after(async () => {
    await srv.stop();
  });

  test('max sessions: a detached session makes room; with all sessions connected the next is refused (1013)', async () => {
    const a = new Client(srv.wsUrl);
    const b = new Client(srv.wsUrl);
    const c = new Client(srv.wsUrl);
    const sa = await a.session();
    await b.session();
    await c.session();
    a.ws.terminate(); // a's session is retained (detached) ...
    await a.closedP;
    await untilStats(srv, (st) => st.connections.sessions_detached === 1, 'the server to notice the drop');
    const d = new Client(srv.wsUrl); // ... and is the one discarded to admit d
    await d.session();
    d.send({ type: 'session.resume', event_id: 'x', session: sa.session, last_seq: 1 });
    assert.equal((await d.wait((m) => m.event_id === 'x')).error.code, 'unknown_session');
    const e = new Client(srv.wsUrl); // b, c, d are all connected: no room
    const closed = await e.closedP;
    assert.equal(closed.code, 1013);
    assert.equal(e.msgs.length, 0);
    // the others are unaffected
    d.send({ type: 'generate', id: 'ok', prompt_ids: [1], gen_length: 8, block_length: 8, steps: 4 });
    await d.done('ok');
    for (const x of [b, c, d]) await x.close();
  });
});
