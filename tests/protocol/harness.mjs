// harness.mjs — shared helpers for the node suites (protocol, browser, http, parallel, device): make
// a tiny checkpoint once, start the real `unmask serve` (or unmask-emu) on 127.0.0.1 with a free
// port (--port 0, port read from its "listening on" line, readiness from GET /health), always stop
// it, read the .npy files `unmask logits` writes, and a WebSocket client that records every server
// event and lets a test await the next one matching a predicate (no sleeps).

import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import path from 'node:path';
import WebSocket from 'ws';

export const BIN = process.env.UNMASK_BIN;
export const SRC = process.env.UNMASK_SOURCE_DIR;
export const TMP = process.env.UNMASK_TEST_TMP;
if (!BIN || !SRC || !TMP) throw new Error('UNMASK_BIN, UNMASK_SOURCE_DIR and UNMASK_TEST_TMP must be set (run through ctest)');

// `make-model ...args` into dir unless a checkpoint is there; bin: unmask or unmask-emu. Written to
// a private folder and renamed into place, so test files that ask for the same dir at once
// (ctest -j) never read a half-written model. Returns dir.
export function makeModelOnce(dir, args = [], bin = BIN) {
  if (fs.existsSync(path.join(dir, 'config.json'))) return dir;
  const tmp = `${dir}.tmp-${process.pid}`;
  fs.rmSync(tmp, { recursive: true, force: true });
  const r = spawnSync(bin, ['make-model', '--out', tmp, '--quiet', ...args], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`make-model failed: ${r.stderr}`);
  try {
    fs.renameSync(tmp, dir);
  } catch (e) {
    // another test file finished first: its model is complete and identical (make-model is deterministic)
    fs.rmSync(tmp, { recursive: true, force: true });
    if (!fs.existsSync(path.join(dir, 'config.json'))) throw e;
  }
  return dir;
}

// A tiny checkpoint (with the built-in tokenizer) private to the calling test file.
export function tinyModel(name, bin = BIN) {
  return makeModelOnce(path.join(TMP, `model-${name}`), ['--preset', 'tiny'], bin);
}

// what `unmask logits --out F.npy` writes: float32 .npy (version 1.0, little-endian '<f4') -> Float32Array + shape
export function readNpy(file) {
  const b = fs.readFileSync(file);
  assert.equal(b.toString('latin1', 1, 6), 'NUMPY');
  const hlen = b.readUInt16LE(8);
  const header = b.toString('latin1', 10, 10 + hlen);
  assert.match(header, /'descr': '<f4'/);
  const shape = header.match(/'shape': \((\d+), (\d+),?\)/).slice(1).map(Number);
  const off = 10 + hlen;
  const data = new Float32Array(b.buffer.slice(b.byteOffset + off, b.byteOffset + b.length));
  assert.equal(data.length, shape[0] * shape[1]);
  return { data, shape };
}

export function httpGet(url, opts = {}) {
  const mod = url.startsWith('https:') ? https : http;
  return new Promise((resolve, reject) => {
    const req = mod.get(url, { ...opts, agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body }));
    });
    req.on('error', reject);
    req.setTimeout(10000, () => req.destroy(new Error(`GET ${url} timed out`)));
  });
}

// POST body as JSON to base + p (fetch). Resolves with { status, headers, text, body }: body is the
// parsed JSON answer, or null when it is not JSON (an SSE stream: read text).
export async function postJson(base, p, body) {
  const r = await fetch(`${base}${p}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const text = await r.text();
  let parsed = null;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = null;
  }
  return { status: r.status, headers: r.headers, text, body: parsed };
}

// Waits for a spawned `unmask serve` (or unmask-emu) to print where it listens and for GET /health
// to answer 200 (its model is loaded). out()/err(): its stdout/stderr so far (collected by the
// caller's own listeners, registered before this); exited: resolves when it exits. Rejects if it
// exits first or is not ready after readyMs. tls: the certs of makeDevCerts() for an https server.
// Resolves with { port, base, getOpts } (getOpts: the options for httpGet on base).
export async function serverReady(proc, out, err, exited, { name = 'srv', readyMs = 30000, tls = null } = {}) {
  const port = await new Promise((resolve, reject) => {
    const check = () => {
      const m = out().match(/listening on https?:\/\/127\.0\.0\.1:(\d+)\//);
      if (m) resolve(Number(m[1]));
    };
    proc.stdout.on('data', check);
    check();
    exited.then(({ code, signal }) => reject(new Error(`${name}: server exited early (${code ?? signal}): ${err()}`)));
  });
  const base = `${tls ? 'https' : 'http'}://127.0.0.1:${port}`;
  const getOpts = tls ? { ca: fs.readFileSync(tls.ca) } : {};
  // readiness: /health turns 200 once the model is loaded (503 before)
  for (let i = 0; ; i++) {
    const r = await httpGet(`${base}/health`, getOpts).catch(() => null);
    if (r && r.status === 200) break;
    if (proc.exitCode !== null) throw new Error(`${name}: server exited (${proc.exitCode}): ${err()}`);
    if (i * 50 > readyMs) throw new Error(`${name}: /health never became ready: ${err()}`);
    await new Promise((res) => setTimeout(res, 50));
  }
  return { port, base, getOpts };
}

// Start `unmask serve` (bin: UNMASK_BIN, or unmask-emu) with more CLI flags (extra) and environment
// (env). Resolves once GET /health says 200; a server that fails to get there is killed and the
// error thrown. stop(): SIGTERM, SIGKILL after stopGraceMs.
export async function startServer({ model, extra = [], tls = null, name = 'srv', bin = BIN, env = {}, threads = 2,
  readyMs = 30000, stopGraceMs = 10000 } = {}) {
  const args = ['serve', '--store', 'memory', '--model', model, '--host', '127.0.0.1', '--port', '0', '--web-root', path.join(SRC, 'web'),
    '--threads', String(threads), ...extra];
  if (tls) args.push('--tls-cert', tls.cert, '--tls-key', tls.key);
  const proc = spawn(bin, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } });
  let stdout = '';
  let stderr = '';
  proc.stdout.setEncoding('utf8');
  proc.stderr.setEncoding('utf8');
  proc.stdout.on('data', (d) => (stdout += d));
  proc.stderr.on('data', (d) => (stderr += d));
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  const stop = async () => {
    if (proc.exitCode !== null || proc.signalCode !== null) return exited;
    proc.kill('SIGTERM');
    const t = setTimeout(() => proc.kill('SIGKILL'), stopGraceMs);
    const r = await exited;
    clearTimeout(t);
    return r;
  };
  let ready;
  try {
    ready = await serverReady(proc, () => stdout, () => stderr, exited, { name, readyMs, tls });
  } catch (e) {
    proc.kill('SIGKILL');
    await exited;
    throw e;
  }
  const { port, base, getOpts } = ready;
  return {
    proc, port, base, exited, stop,
    wsUrl: `${tls ? 'wss' : 'ws'}://127.0.0.1:${port}/ws`,
    get stderr() { return stderr; },
    get: (p) => httpGet(`${base}${p}`, getOpts),
    async stats() {
      return JSON.parse((await httpGet(`${base}/stats`, getOpts)).body);
    },
  };
}

// Poll the server's state (GET /stats) until cond(stats) holds: the server's counters are the
// observable, not time. Fails after timeoutMs with what it was waiting for.
export async function untilStats(srv, cond, what, timeoutMs = 60000) {
  const t0 = Date.now();
  for (;;) {
    const st = await srv.stats();
    if (cond(st)) return st;
    if (Date.now() - t0 > timeoutMs) throw new Error(`timed out waiting for ${what}; last /stats: ${JSON.stringify(st)}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

// A recording WebSocket client. msgs: every parsed server event in arrival order.
export class Client {
  constructor(url, opts = {}) {
    this.ws = new WebSocket(url, opts);
    this.msgs = [];
    this.waiters = [];
    this.closed = null;
    this.opened = new Promise((resolve, reject) => {
      this.ws.once('open', resolve);
      this.ws.once('error', reject);
    });
    this.closedP = new Promise((resolve) => {
      this.ws.on('close', (code, reason) => {
        this.closed = { code, reason: reason.toString() };
        for (const w of this.waiters.splice(0)) w.reject(new Error(`socket closed (${code} ${reason}) while waiting for ${w.what}`));
        resolve(this.closed);
      });
    });
    this.ws.on('error', () => {});
    this.ws.on('message', (data, isBinary) => {
      const m = JSON.parse(isBinary ? data : data.toString());
      this.msgs.push(m);
      for (const w of this.waiters.slice()) {
        if (w.pred(m)) {
          this.waiters.splice(this.waiters.indexOf(w), 1);
          w.resolve(m);
        }
      }
    });
  }

  send(obj) {
    this.ws.send(typeof obj === 'string' ? obj : JSON.stringify(obj));
  }

  // Resolve with the first message (already received or future) matching pred.
  wait(pred, what = 'a message', timeoutMs = 60000) {
    const have = this.msgs.find(pred);
    if (have) return Promise.resolve(have);
    if (this.closed) return Promise.reject(new Error(`socket closed before ${what}`));
    return new Promise((resolve, reject) => {
      const w = { pred, what };
      const timer = setTimeout(() => {
        const i = this.waiters.indexOf(w);
        if (i >= 0) {
          this.waiters.splice(i, 1);
          reject(new Error(`timed out waiting for ${what}; got ${this.msgs.length} messages, last: ${JSON.stringify(this.msgs.at(-1))?.slice(0, 300)}`));
        }
      }, timeoutMs);
      w.resolve = (m) => { clearTimeout(timer); resolve(m); };
      w.reject = (e) => { clearTimeout(timer); reject(e); };
      this.waiters.push(w);
    });
  }

  session() {
    return this.wait((m) => m.type === 'session.created', 'session.created');
  }

  done(id) {
    return this.wait((m) => m.type === 'done' && m.id === id, `done of ${id}`);
  }

  of(id) {
    return this.msgs.filter((m) => m.id === id);
  }

  close() {
    this.ws.close();
    return this.closedP;
  }
}

// Every event of a generation is well-formed: accepted first, done last, block texts concatenate
// to done.text, blocks in order. Returns the done event.
export function checkGeneration(assert, msgs, id) {
  const ev = msgs.filter((m) => m.id === id);
  assert.ok(ev.length >= 2, `${id}: has events`);
  assert.equal(ev[0].type, 'accepted', `${id}: accepted comes first`);
  const done = ev.at(-1);
  assert.equal(done.type, 'done', `${id}: done comes last`);
  assert.equal(ev.filter((m) => m.type === 'done').length, 1, `${id}: exactly one done`);
  const blocks = ev.filter((m) => m.type === 'block');
  blocks.forEach((b, i) => assert.equal(b.block, i, `${id}: blocks in order`));
  if (done.finish_reason === 'stop' || done.finish_reason === 'length')
    assert.equal(blocks.map((b) => b.text).join(''), done.text, `${id}: block texts concatenate to the done text`);
  return done;
}

// seq numbers of a list of messages are 1..n (or from..) without gaps or duplicates.
export function checkSeqContiguous(assert, msgs, from = 1) {
  msgs.forEach((m, i) => assert.equal(m.seq, from + i, `seq ${from + i} expected, got ${m.seq} (${m.type})`));
}

export function makeDevCerts(dir) {
  fs.rmSync(dir, { recursive: true, force: true });
  const r = spawnSync('bash', [path.join(SRC, 'certs', 'make-dev-certs.sh'), dir], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`make-dev-certs.sh failed: ${r.stderr}`);
  return { cert: path.join(dir, 'server.pem'), key: path.join(dir, 'server.key'), ca: path.join(dir, 'ca.pem') };
}
