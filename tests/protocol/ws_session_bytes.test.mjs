// ws_session_bytes.test.mjs — the sessions' byte budget (--sessions-max-bytes, /stats
// connections.session_bytes) balances: sessions that held frames (generations with drafts) and
// ended every way a session ends — a normal close, an abrupt drop followed by expiry after the
// retention time, a drop mid-generation, a resume on a new connection and then a close or a drop,
// an ack and a close — leave 0 bytes charged once 0 sessions remain (and the server, quiet then,
// returns the freed memory to the OS: /stats memory.trims), and a fresh session under the small
// budget can then replay all of its events (no resume_gap).

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Client, checkSeqContiguous, startServer, tinyModel, untilStats } from './harness.mjs';

const GEN = { prompt: 'tell me everything', gen_length: 64, block_length: 16, steps: 64, stream: { drafts: true } };
const ENDINGS = ['close', 'drop', 'drop-mid', 'resume-close', 'resume-drop', 'ack-close'];

describe('session byte budget', () => {
  let srv;
  before(async () => {
    // the smallest global budget; a detached session expires after 1 s
    srv = await startServer({
      model: tinyModel('ws-session-bytes'),
      extra: ['--sessions-max-bytes', '1048576', '--session-retention', '1', '--max-sessions', '1024'],
    });
  });
  after(async () => {
    const r = await srv.stop();
    assert.equal(r.code, 0, `clean exit; stderr: ${srv.stderr.slice(-2000)}`);
  });

  // One session: a generation with drafts (about 50 KB of frames, none acknowledged), then `ending`.
  async function lifetime(ending, i) {
    const c = new Client(srv.wsUrl);
    const s = await c.session();
    const id = `g${i}`;
    c.send({ type: 'generate', id, ...GEN });
    if (ending === 'drop-mid') {
      await c.wait((m) => m.type === 'step' && m.id === id, 'a first step');
      c.ws.terminate(); // the generation runs on while the session waits for its client
      await c.closedP;
      return;
    }
    await c.done(id);
    if (ending === 'close') return c.close(); // status 1000: the session ends at once
    if (ending === 'ack-close') { // half of it acknowledged (released), then a normal close
      c.send({ type: 'ack', seq: Math.floor(c.msgs.at(-1).seq / 2) });
      c.send({ type: 'ping', event_id: 'acked' });
      await c.wait((m) => m.type === 'pong' && m.event_id === 'acked', 'pong after the ack');
      return c.close();
    }
    c.ws.terminate();
    await c.closedP;
    if (ending === 'drop') return; // expires after --session-retention
    const r = new Client(srv.wsUrl);
    await r.session();
    const mid = Math.floor(c.msgs.length / 2);
    r.send({ type: 'session.resume', session: s.session, last_seq: mid });
    await r.wait((m) => m.type === 'session.resumed', 'session.resumed');
    if (ending === 'resume-close') return r.close();
    r.ws.terminate();
    await r.closedP;
  }

  test('every session that ends takes its bytes with it: 0 sessions, 0 bytes', async () => {
    const rounds = 8; // 48 sessions of about 50 KB each: more than twice the 1 MiB budget
    for (let k = 0; k < rounds; k++) await Promise.all(ENDINGS.map((e, j) => lifetime(e, k * ENDINGS.length + j)));
    const st = await untilStats(srv, (s) => s.connections.sessions === 0, 'every session ended or expired');
    assert.equal(st.connections.session_bytes, 0, `bytes still charged with 0 sessions: ${JSON.stringify(st.connections)}`);
    // quiet now: the server hands what the sessions freed back to the OS (malloc_trim), once
    const trims = st.memory.trims;
    const later = await untilStats(srv, (x) => x.memory.trims > trims, 'freed memory returned to the OS');
    assert.equal(later.memory.trims, trims + 1, 'one trim for the quiet period');
  });

  test('after that churn a fresh session replays everything it sent', async () => {
    const a = new Client(srv.wsUrl);
    const s = await a.session();
    a.send({ type: 'generate', id: 'fresh', ...GEN });
    await a.done('fresh');
    const sent = a.msgs.slice();
    checkSeqContiguous(assert, sent);
    a.ws.terminate();
    await a.closedP;
    const b = new Client(srv.wsUrl);
    await b.session();
    b.send({ type: 'session.resume', event_id: 'r', session: s.session, last_seq: 0 });
    const resumed = await b.wait((m) => m.type === 'session.resumed', 'session.resumed');
    const got = b.msgs.slice(1); // after b's own session.created
    assert.deepEqual(got.filter((m) => m.type === 'error'), [], 'no resume_gap');
    assert.equal(resumed.replayed, sent.length, 'every event was kept');
    got.slice(0, sent.length).forEach((m, i) => assert.deepEqual(m, sent[i], `seq ${sent[i].seq} replayed as sent`));
    await b.close();
    const st = await untilStats(srv, (x) => x.connections.sessions === 0, 'the session ended');
    assert.equal(st.connections.session_bytes, 0);
  });
});
