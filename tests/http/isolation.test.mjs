// isolation.test.mjs — callers (API keys) are isolated from each other, against the real server:
// per-key quotas on generations (HTTP and WebSocket together), WebSocket sessions and unfinished
// jobs, with another key unaffected; the rate limit covers WebSocket generations; jobs and
// sessions belong to the whole key (two keys sharing 100 leading characters are strangers); a
// WebSocket asking for the subprotocol "http" is refused; /stats needs a key; /metrics counts
// WebSocket generations.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import WebSocket from 'ws';
import { Client } from '../protocol/harness.mjs';
import { TMP, startServer } from './server.mjs';

const PREFIX = 'sk-'.padEnd(100, 'p'); // keys of 106 characters: near the longest allowed (107)
const KEY_A = `${PREFIX}-alpha`;
const KEY_B = `${PREFIX}-bravo`;
const KEY_C = 'sk-charlie';

const auth = (k) => ({ authorization: `Bearer ${k}`, 'content-type': 'application/json' });
const ws = (srv, key, extra = {}) => new Client(`ws://127.0.0.1:${srv.port}/ws`, { headers: key ? { authorization: `Bearer ${key}` } : {}, ...extra });
async function post(srv, p, key, body) {
  const r = await fetch(`${srv.url}${p}`, { method: 'POST', headers: auth(key), body: JSON.stringify(body) });
  return { status: r.status, json: await r.json() };
}
async function stats(srv) {
  return (await fetch(`${srv.url}/stats`, { headers: auth(KEY_C) })).json();
}
// a normal close (1000) ends the session at once (other codes leave it resumable for a while)
async function bye(...cs) {
  for (const c of cs) c.ws.close(1000);
  await Promise.all(cs.map((c) => c.closedP));
}
async function until(what, fn, ms = 60000) {
  const t0 = Date.now();
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() - t0 > ms) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe('per-caller isolation', () => {
  let srv;
  // the previous test's closes are processed: no WebSocket connection or session left
  const quiet = () => until('no WebSocket left', async () => {
    const st = await stats(srv);
    return st.connections.websocket === 0 && st.connections.sessions === 0;
  });
  before(async () => {
    const keys = path.join(TMP, 'isolation-keys.txt');
    fs.writeFileSync(keys, `${KEY_A}\n${KEY_B}\n${KEY_C}\n`);
    srv = await startServer(['--api-keys', keys, '--max-batch', '1', '--key-max-generations', '2',
      '--key-max-sessions', '2', '--key-max-jobs', '2']);
  });
  after(async () => {
    await srv.stop();
  });

  test('generation quota: a key over its quota gets 429 quota_exceeded (HTTP and WebSocket together); another key is served', async () => {
    const long = { prompt: 'busy', max_tokens: 512 };
    // A's WebSocket holds one generation, an HTTP request the second: A is full
    const a = ws(srv, KEY_A);
    await a.session();
    a.send({ type: 'generate', id: 'w', prompt_ids: [1, 2], gen_length: 512, block_length: 64 });
    await a.wait((m) => m.type === 'accepted' && m.id === 'w');
    const held = fetch(`${srv.url}/v1/completions`, { method: 'POST', headers: auth(KEY_A), body: JSON.stringify(long) });
    await until('two generations of A', async () => (await stats(srv)).scheduler.submitted >= 2);
    const over = await post(srv, '/v1/completions', KEY_A, { prompt: 'one more', max_tokens: 4 });
    assert.equal(over.status, 429);
    assert.equal(over.json.error.code, 'quota_exceeded');
    assert.match(over.json.error.message, /--key-max-generations/);
    a.send({ type: 'generate', id: 'w2', prompt_ids: [3], gen_length: 8, block_length: 8 });
    const err = await a.wait((m) => m.type === 'error' && m.id === 'w2');
    assert.equal(err.error.code, 'quota_exceeded');
    // B is not affected by A
    const b = await post(srv, '/v1/completions', KEY_B, { prompt: 'me too', max_tokens: 4 });
    assert.equal(b.status, 200, JSON.stringify(b.json));
    a.send({ type: 'cancel', id: 'w' });
    await a.done('w');
    await bye(a);
    // a finished (cancelled) generation returns its slot
    const again = await post(srv, '/v1/completions', KEY_A, { prompt: 'again', max_tokens: 4 });
    assert.equal(again.status, 200, JSON.stringify(again.json));
    await held;
  });

  test('session quota: a third WebSocket of one key is closed (1013); another key connects', async () => {
    await quiet();
    const s1 = ws(srv, KEY_A);
    const s2 = ws(srv, KEY_A);
    await Promise.all([s1.session(), s2.session()]);
    const s3 = ws(srv, KEY_A);
    const closed = await s3.closedP;
    assert.equal(closed.code, 1013);
    assert.match(closed.reason, /key-max-sessions/);
    const other = ws(srv, KEY_B);
    await other.session();
    await bye(s1); // a closed session frees its slot
    await until('the closed session to go', async () => (await stats(srv)).connections.sessions === 2);
    const s4 = ws(srv, KEY_A);
    await s4.session();
    await bye(s2, s4, other);
  });

  test('job quota: a third unfinished job of one key gets 429; jobs are invisible to a key sharing 100 characters', async () => {
    const slow = { prompt: 'job', max_tokens: 512 };
    const j1 = await post(srv, '/v1/jobs', KEY_A, slow);
    const j2 = await post(srv, '/v1/jobs', KEY_A, slow);
    assert.equal(j1.status, 202);
    assert.equal(j2.status, 202);
    const j3 = await post(srv, '/v1/jobs', KEY_A, slow);
    assert.equal(j3.status, 429);
    assert.equal(j3.json.error.code, 'quota_exceeded');
    assert.match(j3.json.error.message, /--key-max-jobs/);
    // the whole key decides ownership
    for (const method of ['GET', 'DELETE']) {
      const r = await fetch(`${srv.url}/v1/jobs/${j1.json.id}`, { method, headers: auth(KEY_B) });
      assert.equal(r.status, 404, `${method} by the other key`);
    }
    const mine = await fetch(`${srv.url}/v1/jobs/${j1.json.id}`, { headers: auth(KEY_A) });
    assert.equal(mine.status, 200);
    // GET /v1/jobs lists the caller's own jobs only
    const listA = await (await fetch(`${srv.url}/v1/jobs`, { headers: auth(KEY_A) })).json();
    assert.deepEqual(listA.data.map((j) => j.id), [j2.json.id, j1.json.id]);
    const listB = await (await fetch(`${srv.url}/v1/jobs`, { headers: auth(KEY_B) })).json();
    assert.deepEqual(listB.data, []);
    const afterB = await fetch(`${srv.url}/v1/jobs?after=${j1.json.id}`, { headers: auth(KEY_B) });
    assert.equal(afterB.status, 400, 'another key cannot page from A\'s job');
    for (const j of [j1, j2]) await fetch(`${srv.url}/v1/jobs/${j.json.id}`, { method: 'DELETE', headers: auth(KEY_A) });
    await until('the cancelled jobs to end', async () => {
      const r = await Promise.all([j1, j2].map((j) => fetch(`${srv.url}/v1/jobs/${j.json.id}`, { headers: auth(KEY_A) }).then((x) => x.json())));
      return r.every((o) => o.status === 'cancelled');
    });
    const j4 = await post(srv, '/v1/jobs', KEY_A, { prompt: 'after', max_tokens: 4 });
    assert.equal(j4.status, 202, 'finished jobs free the quota');
  });

  test('without a signing key webhooks are off: a job asking for one is refused', async () => {
    const r = await post(srv, '/v1/jobs', KEY_C, { prompt: 'x', max_tokens: 2, webhook: 'http://93.184.216.34/hook' });
    assert.equal(r.status, 400);
    assert.equal(r.json.error.code, 'webhooks_disabled');
    assert.match(r.json.error.message, /--webhook-secret/);
  });

  test('a session token is bound to its key: another key resuming it is told the session is unknown', async () => {
    await quiet();
    const a = ws(srv, KEY_A);
    const s = await a.session();
    a.ws.terminate();
    await a.closedP;
    const b = ws(srv, KEY_B);
    await b.session();
    b.send({ type: 'session.resume', session: s.session, last_seq: 1, event_id: 'steal' });
    const e = await b.wait((m) => m.type === 'error' && m.event_id === 'steal');
    assert.equal(e.error.code, 'unknown_session');
    const a2 = ws(srv, KEY_A);
    await a2.session();
    a2.send({ type: 'session.resume', session: s.session, last_seq: 1, event_id: 'mine' });
    await a2.wait((m) => m.type === 'session.resumed' && m.event_id === 'mine');
    await bye(b, a2);
  });

  test('a WebSocket asking for the subprotocol "http" is refused, with or without a key', async () => {
    await quiet();
    for (const headers of [{}, { authorization: `Bearer ${KEY_C}` }]) {
      const sock = new WebSocket(`ws://127.0.0.1:${srv.port}/ws`, ['http'], { headers });
      const outcome = await new Promise((resolve) => {
        sock.once('open', () => resolve('open'));
        sock.once('error', () => resolve('refused'));
        sock.once('unexpected-response', () => resolve('refused'));
      });
      sock.terminate();
      assert.equal(outcome, 'refused');
    }
    const st = await stats(srv);
    assert.equal(st.connections.websocket, 0, 'no uncounted socket stayed open');
  });

  test('/stats needs a key; /metrics counts WebSocket generations', async () => {
    const anon = await fetch(`${srv.url}/stats`);
    assert.equal(anon.status, 401);
    const metric = async () => {
      const t = await (await fetch(`${srv.url}/metrics`)).text();
      return Number((t.match(/^unmask_generated_tokens_total (\d+)$/m) || [0, 0])[1]);
    };
    const before = await metric();
    const c = ws(srv, KEY_C);
    await c.session();
    c.send({ type: 'generate', id: 'm', prompt_ids: [1], gen_length: 8, block_length: 8, steps: 8 });
    const done = await c.done('m');
    assert.equal(await metric(), before + done.usage.completion_tokens);
    await bye(c);
  });
});

describe('rate limit over WebSocket', () => {
  let srv;
  before(async () => {
    srv = await startServer(['--rate-limit', '0.5', '--rate-burst', '1']);
  });
  after(async () => {
    await srv.stop();
  });

  test('--rate-limit applies to WebSocket generations too', async () => {
    const c = new Client(`ws://127.0.0.1:${srv.port}/ws`);
    await c.session();
    c.send({ type: 'generate', id: 'r1', prompt_ids: [1], gen_length: 4, block_length: 4 });
    c.send({ type: 'generate', id: 'r2', prompt_ids: [1], gen_length: 4, block_length: 4 });
    await c.done('r1');
    const e = await c.wait((m) => m.type === 'error' && m.id === 'r2');
    assert.equal(e.error.code, 'rate_limited');
    // and HTTP shares the bucket: the next HTTP request is limited too
    const r = await fetch(`${srv.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"prompt":"x","max_tokens":2}' });
    assert.equal(r.status, 429);
    await c.close();
  });
});
