#!/usr/bin/env node
// battery.mjs — the adversarial battery against a real `unmask serve` (bounded in time, one
// command: tests/adversarial/run.sh). Each storm runs while a prober checks that GET /health keeps
// answering; between storms the server must still be alive. At the end it prints a Markdown table
// (storm, what was tried, what was held, failures) plus RSS and descriptors before/after, and
// exits non-zero when any storm failed.
//
// Storms: bad HTTP inputs (malformed heads, bodies, methods, paths, lengths), path traversal,
// slowloris (more connections than --max-conns-per-address from one address, dripping their head
// or body: those beyond the cap are closed at once, the others get 408 at --request-timeout, while
// other addresses are served), WebSocket sessions with
// generations, SSE streams, disconnects in several modes (mid-request, mid-stream, mid-generation,
// half-close, reset, abandoned WebSocket), session resume cycles, bad WebSocket messages/frames.
//
// usage: node battery.mjs --bin PATH [--scale X] [--tls]    (--scale 1 = a few minutes)

import { spawn, spawnSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { fileURLToPath } from 'node:url';
import WebSocket from 'ws';

const here = path.dirname(fileURLToPath(import.meta.url));
const SRC = path.resolve(here, '../..');
const arg = (name, def) => {
  const i = process.argv.indexOf(`--${name}`);
  if (i < 0) return def;
  const v = process.argv[i + 1];
  return v === undefined || v.startsWith('--') ? true : v;
};
const BIN = arg('bin', process.env.UNMASK_BIN);
const SCALE = Number(arg('scale', 1));
const USE_TLS = arg('tls', false) === true;
const KEY = 'sk-battery';
if (!BIN) {
  console.error('battery: --bin PATH (or UNMASK_BIN) is required');
  process.exit(2);
}
const n = (x) => Math.max(1, Math.round(x * SCALE));
const REQUEST_TIMEOUT_S = 6;
const CONN_CAP = 256; // the default --max-conns-per-address, set explicitly
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const tmp = fs.mkdtempSync(path.join(process.env.UNMASK_TEST_TMP || os.tmpdir(), 'battery-'));

// ---------------------------------------------------------------- server

function procStats(pid) {
  try {
    const rss = Number(fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/)[1]);
    return { rss, fds: fs.readdirSync(`/proc/${pid}/fd`).length };
  } catch {
    return { rss: -1, fds: -1 };
  }
}

async function startServer() {
  const model = path.join(tmp, 'model');
  const r = spawnSync(BIN, ['make-model', '--out', model, '--preset', 'tiny', '--quiet'], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`make-model: ${r.stderr}`);
  fs.writeFileSync(path.join(tmp, 'keys'), `${KEY}\n`);
  const args = ['serve', '--store', 'memory', '--model', model, '--host', '127.0.0.1', '--port', '0', '--threads', '1',
    '--web-root', path.join(SRC, 'web'), '--api-keys', path.join(tmp, 'keys'), '--max-gen-length', '64',
    '--max-message-bytes', '65536', '--ping-interval', '600',
    // slow clients: cut after REQUEST_TIMEOUT_S, at most CONN_CAP connections per address
    '--request-timeout', String(REQUEST_TIMEOUT_S), '--max-conns-per-address', String(CONN_CAP),
    // one key drives every storm: the per-caller quotas (tests/http/isolation) would refuse its
    // work at larger scales, which is not what this battery measures
    '--key-max-generations', '0', '--key-max-sessions', '0', '--key-max-jobs', '0'];
  let certs = null;
  if (USE_TLS) {
    const c = spawnSync('bash', [path.join(SRC, 'certs/make-dev-certs.sh'), path.join(tmp, 'certs')], { encoding: 'utf8' });
    if (c.status !== 0) throw new Error(`certs: ${c.stderr}`);
    certs = { cert: path.join(tmp, 'certs/server.pem'), key: path.join(tmp, 'certs/server.key'), ca: fs.readFileSync(path.join(tmp, 'certs/ca.pem')) };
    args.push('--tls-cert', certs.cert, '--tls-key', certs.key);
  }
  const proc = spawn(BIN, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  proc.stdout.on('data', (d) => (log += d));
  proc.stderr.on('data', (d) => (log += d));
  let exited = null;
  proc.on('exit', (code, sig) => (exited = { code, sig }));
  const port = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`not listening: ${log}`)), 60000);
    proc.stdout.on('data', () => {
      const m = log.match(/listening on https?:\/\/127\.0\.0\.1:(\d+)\//);
      if (m) { clearTimeout(t); resolve(Number(m[1])); }
    });
    proc.on('exit', () => { clearTimeout(t); reject(new Error(`exited: ${log}`)); });
  });
  return { proc, port, certs, log: () => log, exited: () => exited };
}

let S; // the server
// local: the client's source address (loopback has the whole 127/8; the cap is per address)
const connect = (local = '127.0.0.1') => { // over a plain socket of our own, so a reset can reach TCP (s._parent)
  const sock = net.connect({ port: S.port, host: '127.0.0.1', localAddress: local });
  return USE_TLS ? tls.connect({ socket: sock, ca: S.certs.ca, servername: 'localhost' }) : sock;
};
const CONN_EV = USE_TLS ? 'secureConnect' : 'connect';
const wsUrl = () => `${USE_TLS ? 'wss' : 'ws'}://127.0.0.1:${S.port}/ws`;
const wsOpts = () => ({ headers: { authorization: `Bearer ${KEY}` }, ...(USE_TLS ? { ca: S.certs.ca, servername: 'localhost' } : {}) });

// Raw exchange: write bytes, collect until the server closes or timeoutMs (then close ourselves).
function raw(bytes, timeoutMs = 5000) {
  return new Promise((resolve) => {
    const s = connect();
    let buf = '';
    const t = setTimeout(() => { s.destroy(); resolve({ buf, closed: false }); }, timeoutMs);
    s.on(CONN_EV, () => s.write(bytes));
    s.on('data', (d) => (buf += d.toString('latin1')));
    s.on('close', () => { clearTimeout(t); resolve({ buf, closed: true }); });
    s.on('error', () => {});
  });
}

async function health(deadlineMs = 5000) {
  const t0 = Date.now();
  const r = await raw('GET /health HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n', deadlineMs);
  if (!/^HTTP\/1\.1 200/.test(r.buf)) throw new Error(`/health: ${JSON.stringify(r.buf.slice(0, 60))}`);
  return Date.now() - t0;
}

// ---------------------------------------------------------------- storms

const post = (p, body, extra = '') => `POST ${p} HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer ${KEY}\r\nContent-Type: application/json\r\nConnection: close\r\n${extra}Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;

async function stormBadHttp() {
  const inputs = [];
  const bodies = ['', '{', '[]', 'null', '{"prompt":', '{"prompt":5}', '{"messages":"x"}', '{"prompt":"hi","max_tokens":-1}',
    '{"prompt":"hi","max_tokens":1e309}', '{"prompt":"hi","temperature":"hot"}', `{"prompt":"${'x'.repeat(70000)}"}`,
    '{"prompt":"\\ud800"}', '{"a":1,"a":2}', `{"prompt":"hi","stop":${JSON.stringify(Array(50).fill('s'))}}`,
    '{"prompt":"hi","n":1000}', '{"prompt_ids":[-1,99999999]}', '\u0000\u0001\u0002'];
  for (const route of ['/v1/completions', '/v1/chat/completions', '/v1/fim/completions', '/generate', '/infill', '/v1/jobs'])
    for (const b of bodies) inputs.push(post(route, b));
  const heads = ['GET', 'PUT', 'PATCH', 'DELETE', 'TRACE', 'CONNECT', 'BREW', 'G\u0000T'];
  for (const m of heads) inputs.push(`${m} /v1/completions HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n`);
  inputs.push('GET / HTTP/9.9\r\n\r\n', 'GET\r\n\r\n', 'GET /health\r\n\r\n', '\r\n\r\n\r\n', 'HELLO\r\n\r\n',
    `GET /${'%'.repeat(5000)} HTTP/1.1\r\n\r\n`, 'GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n',
    'POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello',
    'POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n', `GET /health HTTP/1.1\r\nX: ${'y'.repeat(40000)}\r\n\r\n`);
  for (let i = 0; i < n(200); i++) inputs.push(crypto.randomBytes(1 + (i % 300)).toString('latin1'));
  let answered = 0;
  const conc = 8;
  for (let i = 0; i < inputs.length; i += conc) {
    const rs = await Promise.all(inputs.slice(i, i + conc).map((x) => raw(x, 4000)));
    for (const r of rs) if (/^HTTP\/1\.[01] \d{3}/.test(r.buf)) answered++;
    for (const r of rs) if (/^HTTP\/1\.[01] 5\d\d/.test(r.buf) && !/queue_full|model_loading|shutting_down/.test(r.buf))
      throw new Error(`a 5xx for bad input: ${r.buf.slice(0, 200)}`);
  }
  for (const m of ['CONNECT', 'BREW', 'TRACE']) { // methods the server does not take: a JSON 405 each
    const r = await raw(`${m} /v1/completions HTTP/1.1\r\nHost: h\r\n\r\n`, 4000);
    if (!/^HTTP\/1\.1 405 [^]*\r\nAllow: [^]*"method_not_allowed"/.test(r.buf)) throw new Error(`${m}: ${JSON.stringify(r.buf.slice(0, 120))}`);
  }
  return { tried: `${inputs.length} inputs`, held: `${answered} answered with a status`, fail: 0 };
}

async function stormTraversal() {
  const paths = ['/../../etc/passwd', '/..%2f..%2fetc/passwd', '/%2e%2e/%2e%2e/etc/passwd', '/....//....//etc/passwd',
    '/.git/config', '/.env', '/app.js/../../../etc/passwd', '/%252e%252e/etc/passwd', '//etc/passwd', '/\\..\\..\\etc\\passwd',
    '/web/../README.md', '/index.html%00.js', '/%c0%ae%c0%ae/etc/passwd', '/./././../etc/passwd', '/static/../../../../etc/shadow'];
  let leaks = 0;
  for (const p of paths) {
    const r = await raw(`GET ${p} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n`);
    if (/root:.*:0:0:|\[core\]|BEGIN .*PRIVATE KEY/.test(r.buf)) leaks++;
  }
  if (leaks) throw new Error(`${leaks} traversal paths leaked a file`);
  return { tried: `${paths.length} paths`, held: 'no file outside the web root served', fail: 0 };
}

async function stormSlowloris() {
  // more slow connections from one address (127.0.0.2) than the cap; the prober (127.0.0.1) must
  // be answered throughout. Half drip a head, half a body.
  const N = CONN_CAP + n(100);
  const conns = [];
  for (let i = 0; i < N; i++) {
    const c = { s: connect('127.0.0.2'), data: '', up: false, closed: false };
    c.s.on('error', () => {});
    c.s.on('data', (d) => (c.data += d.toString('latin1')));
    c.s.on('close', () => (c.closed = true));
    c.s.on(CONN_EV, () => {
      c.up = true;
      c.s.write(i % 2 ? 'GET /health HTTP/1.1\r\nHost: h\r\n'
        : `POST /v1/completions HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer ${KEY}\r\nContent-Length: 60000\r\n\r\n{`);
    });
    conns.push(c);
  }
  const settle = async (what, pred, ms) => {
    const t0 = Date.now();
    while (!pred()) {
      if (Date.now() - t0 > ms) throw new Error(`slowloris: timed out waiting for ${what}`);
      await sleep(50);
    }
  };
  let drip = null;
  let refused = 0;
  let held = [];
  try {
    // (a client sees its connection up as soon as the kernel completes the handshake; the server
    // closes those beyond the cap when it accepts them)
    await settle('the connections beyond the cap to be closed', () => conns.filter((c) => c.closed).length >= N - CONN_CAP,
      60000);
    await health(10000); // another address is served while 127.0.0.2 is at its cap
    refused = conns.filter((c) => c.closed && !c.data).length;
    held = conns.filter((c) => !c.closed);
    if (held.length > CONN_CAP) throw new Error(`${held.length} slow connections open from one address, cap ${CONN_CAP}`);
    // one more byte each second until the deadline cuts them all
    drip = setInterval(() => { for (const c of held) if (!c.closed && !c.data) c.s.write('X'); }, 1000);
    await settle('the request deadline to close the slow connections', () => held.every((c) => c.closed),
      (REQUEST_TIMEOUT_S + 60) * 1000);
  } finally {
    if (drip) clearInterval(drip);
    for (const c of conns) c.s.destroy();
  }
  const answered = held.filter((c) => /^HTTP\/1\.1 408 /.test(c.data) && /"request_timeout"/.test(c.data)).length;
  if (answered !== held.length) throw new Error(`${held.length - answered} of ${held.length} slow connections closed without a 408`);
  return { tried: `${N} slow heads/bodies from one address`, held: `${refused} refused at the cap (${CONN_CAP}), ${answered} cut with 408 at ${REQUEST_TIMEOUT_S} s; /health answered throughout`, fail: 0 };
}

function wsClient() {
  const ws = new WebSocket(wsUrl(), ['unmask'], wsOpts());
  const msgs = [];
  const waiters = [];
  ws.on('message', (d) => {
    const m = JSON.parse(d.toString());
    msgs.push(m);
    for (const w of waiters.slice()) if (w.pred(m)) { waiters.splice(waiters.indexOf(w), 1); w.resolve(m); }
  });
  ws.on('error', () => {});
  const wait = (pred, ms = 60000) => {
    const have = msgs.find(pred);
    if (have) return Promise.resolve(have);
    return new Promise((resolve, reject) => {
      const w = { pred, resolve };
      waiters.push(w);
      setTimeout(() => reject(new Error('ws wait timed out')), ms);
    });
  };
  const opened = new Promise((resolve, reject) => { ws.once('open', resolve); ws.once('error', reject); });
  return { ws, msgs, wait, opened };
}

async function stormWebSocket() {
  const N = n(40);
  let done = 0;
  let full = 0;
  await Promise.all(Array.from({ length: N }, async (_, i) => {
    const c = wsClient();
    await c.opened;
    await c.wait((m) => m.type === 'session.created');
    for (let g = 0; g < 3; g++) c.ws.send(JSON.stringify({ type: 'generate', id: `g${g}`, prompt: `s${i}`, gen_length: 8, block_length: 8, steps: 4 }));
    // every generation ends: done, or refused at once with queue_full when more wait than
    // --max-queue (larger scales)
    for (let g = 0; g < 3; g++) {
      const m = await c.wait((x) => x.id === `g${g}` && (x.type === 'done' || (x.type === 'error' && x.error?.code === 'queue_full')));
      if (m.type === 'done') done++;
      else full++;
    }
    // bad messages on the same socket: errors, the session survives
    for (const bad of ['{', '[]', '{"type":"nope"}', '{"type":"generate","prompt":5}', JSON.stringify({ type: 'cancel', id: 'zzz' })]) c.ws.send(bad);
    c.ws.send(Buffer.from([1, 2, 3])); // binary
    c.ws.send(JSON.stringify({ type: 'ping', event_id: 'p' }));
    await c.wait((m) => m.type === 'pong');
    c.ws.close(1000);
  }));
  return { tried: `${N} sessions x 3 generations + 6 bad messages`, held: `${done} generations done${full ? `, ${full} refused (queue_full)` : ''}`, fail: 0 };
}

async function stormSse() {
  const N = n(20);
  let ok = 0;
  await Promise.all(Array.from({ length: N }, async () => {
    for (let k = 0; k < 3; k++) {
      const r = await raw(post('/v1/completions', JSON.stringify({ prompt: 'stream', max_tokens: 8, stream: true })), 30000);
      if (/data: \[DONE\]/.test(r.buf)) ok++;
    }
  }));
  if (ok !== N * 3) throw new Error(`${N * 3 - ok} streams did not end with [DONE]`);
  return { tried: `${N} clients x 3 SSE streams`, held: `${ok} complete`, fail: 0 };
}

async function stormDisconnects() {
  const modes = {
    midHead: (s) => { s.write('POST /v1/completions HTTP/1.1\r\nHost: h\r\nContent-Le'); s.destroy(); },
    midBody: (s) => { s.write(`POST /v1/completions HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer ${KEY}\r\nContent-Length: 100\r\n\r\n{"pro`); s.destroy(); },
    midGeneration: (s) => { s.write(post('/v1/completions', JSON.stringify({ prompt: 'x', max_tokens: 64 }))); setTimeout(() => s.destroy(), 30); },
    midStream: (s) => { s.write(post('/v1/completions', JSON.stringify({ prompt: 'x', max_tokens: 64, stream: true }))); s.once('data', () => s.destroy()); },
    halfClose: (s) => { s.write(post('/v1/completions', JSON.stringify({ prompt: 'x', max_tokens: 8 }))); s.end(); },
    // a TCP reset (RST); over TLS the reset goes to the TCP socket under the TLS one
    reset: (s) => { s.write(post('/v1/completions', JSON.stringify({ prompt: 'x', max_tokens: 16 }))); setTimeout(() => (s._parent ?? s).resetAndDestroy(), 20); },
  };
  const per = n(40);
  for (const [name, fn] of Object.entries(modes)) {
    await Promise.all(Array.from({ length: per }, () => new Promise((resolve) => {
      const s = connect();
      s.on('error', () => {});
      s.on('close', resolve);
      s.on(CONN_EV, () => fn(s));
      setTimeout(() => { s.destroy(); resolve(); }, 10000);
    })));
    void name;
  }
  // abandoned WebSockets with running generations
  for (let i = 0; i < per; i++) {
    const c = wsClient();
    await c.opened;
    c.ws.send(JSON.stringify({ type: 'generate', prompt: 'gone', gen_length: 32, block_length: 8 }));
    c.ws.terminate();
  }
  // everything cancelled or finished: the scheduler drains back to idle
  const t0 = Date.now();
  for (;;) {
    const r = await raw(`GET /stats HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer ${KEY}\r\nConnection: close\r\n\r\n`);
    const st = JSON.parse(r.buf.slice(r.buf.indexOf('\r\n\r\n') + 4));
    if (st.scheduler.active === 0 && st.scheduler.queued === 0) break;
    if (Date.now() - t0 > 60000) throw new Error(`work left after the disconnect storms: ${JSON.stringify(st.scheduler)}`);
    await sleep(100);
  }
  return { tried: `${per * (Object.keys(modes).length + 1)} disconnects in ${Object.keys(modes).length + 1} modes`, held: 'scheduler idle afterwards', fail: 0 };
}

async function stormResume() {
  const N = n(30);
  let cycles = 0;
  for (let i = 0; i < N; i++) {
    let c = wsClient();
    await c.opened;
    const created = await c.wait((m) => m.type === 'session.created');
    c.ws.send(JSON.stringify({ type: 'generate', id: 'r', prompt: 'resume me', gen_length: 16, block_length: 8, steps: 8 }));
    await c.wait((m) => m.type === 'accepted');
    const seen = new Set();
    for (let k = 0; k < 3; k++) {
      c.ws.terminate(); // no message is received after this
      const got = c.msgs.filter((m) => m.seq !== undefined && !(k > 0 && m.type === 'session.created'));
      for (const m of got) {
        if (seen.has(m.seq)) throw new Error(`seq ${m.seq} delivered twice across a resume`);
        seen.add(m.seq);
      }
      if (c.msgs.some((m) => m.type === 'done' && m.id === 'r')) break;
      const last = Math.max(...seen);
      c = wsClient();
      await c.opened;
      await c.wait((m) => m.type === 'session.created');
      c.msgs.length = 0; // this connection's own session is replaced by the resumed one
      c.ws.send(JSON.stringify({ type: 'session.resume', session: created.session, last_seq: last }));
      await c.wait((m) => m.type === 'session.resumed');
      cycles++;
      if (k === 2) {
        await c.wait((m) => m.type === 'done' && m.id === 'r');
        for (const m of c.msgs.filter((x) => x.seq !== undefined)) {
          if (seen.has(m.seq)) throw new Error(`seq ${m.seq} delivered twice across a resume`);
          seen.add(m.seq);
        }
      }
    }
    const all = [...seen].sort((a, b) => a - b);
    if (all[0] !== 1) throw new Error(`first seq ${all[0]}`);
    for (let k = 1; k < all.length; k++) if (all[k] !== all[k - 1] + 1) throw new Error(`gap in seq: ${all[k - 1]} -> ${all[k]}`);
    c.ws.close(1000);
  }
  return { tried: `${N} sessions, ${cycles} resume cycles`, held: 'no gap, no duplicate', fail: 0 };
}

// ---------------------------------------------------------------- main

async function main() {
  S = await startServer();
  for (;;) { try { await health(); break; } catch { if (S.exited()) throw new Error(S.log()); await sleep(100); } }
  const before = procStats(S.proc.pid);
  const storms = [['bad HTTP inputs', stormBadHttp], ['path traversal', stormTraversal], ['slowloris', stormSlowloris],
    ['WebSocket sessions', stormWebSocket], ['SSE streams', stormSse], ['disconnects', stormDisconnects],
    ['session resume', stormResume]];
  const rows = [];
  let failed = 0;
  for (const [name, fn] of storms) {
    const t0 = Date.now();
    let maxHealth = 0;
    let stop = false;
    const prober = (async () => {
      while (!stop) {
        try { maxHealth = Math.max(maxHealth, await health(10000)); } catch (e) { rows.push([name, '', '', `/health: ${e.message}`]); failed++; }
        await sleep(200);
      }
    })();
    try {
      const r = await fn();
      rows.push([name, r.tried, `${r.held}; max /health ${maxHealth} ms`, 'ok', ((Date.now() - t0) / 1000).toFixed(1)]);
    } catch (e) {
      failed++;
      rows.push([name, '', '', `FAILED: ${e.message}`, ((Date.now() - t0) / 1000).toFixed(1)]);
    }
    stop = true;
    await prober;
    if (S.exited()) { failed++; rows.push([name, '', '', `the server died: ${JSON.stringify(S.exited())}`]); break; }
  }
  await sleep(500);
  const after = procStats(S.proc.pid);
  S.proc.kill('SIGTERM');
  const code = await new Promise((r) => (S.exited() ? r(S.exited()) : S.proc.on('exit', (c, sig) => r({ code: c, sig }))));
  if (code.code !== 0) { failed++; rows.push(['shutdown', '', '', `exit ${JSON.stringify(code)}`]); }
  console.log(`\n| storm (${USE_TLS ? 'TLS' : 'plain'}, scale ${SCALE}) | tried | held / survived | result | s |\n|---|---|---|---|---|`);
  for (const r of rows) console.log(`| ${r.join(' | ')} |`);
  console.log(`\nRSS ${before.rss} kB -> ${after.rss} kB, descriptors ${before.fds} -> ${after.fds}; exit after SIGTERM: ${code.code}`);
  if (after.fds > before.fds + 16) { failed++; console.log(`descriptors leaked: ${before.fds} -> ${after.fds}`); }
  fs.rmSync(tmp, { recursive: true, force: true });
  console.log(`battery: ${failed ? `${failed} failure(s)` : 'all storms survived'}`);
  process.exit(failed ? 1 : 0);
}

main().catch((e) => {
  console.error(`battery: ${e.stack || e}`);
  process.exit(1);
});
