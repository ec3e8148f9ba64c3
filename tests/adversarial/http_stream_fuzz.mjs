#!/usr/bin/env node
// http_stream_fuzz.mjs — a byte-stream fuzzer for the HTTP port: random concatenations of valid
// and invalid requests (and fragments and garbage), split at random offsets, written with random
// pauses on one connection, sometimes abandoned half way, many connections at once, against a real
// `unmask serve`. It checks what a client can see: every byte the server sends parses as HTTP/1.x
// answers (a status line, headers, a body of the announced framing), no answer to a request that
// was not sent, /health keeps answering within a deadline while the storm runs, and the process
// is alive at the end with its memory and descriptors back near where they started. Built with
// ASan (scripts/fuzz.sh), any sanitizer report in its log fails the run.
//
// usage: node http_stream_fuzz.mjs --bin PATH [--seconds N] [--seed N] [--conns N] [--tls]
//        [--asan-log PREFIX] [--web-root DIR] [--model DIR]
// Prints one summary line (connections, requests, answers, resets, max /health latency, RSS and
// fds before/after) and exits non-zero on any failure.

import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const SRC = path.resolve(here, '../..');

function arg(name, def) {
  const i = process.argv.indexOf(`--${name}`);
  if (i < 0) return def;
  const v = process.argv[i + 1];
  return v === undefined || v.startsWith('--') ? true : v;
}
const BIN = arg('bin', process.env.UNMASK_BIN);
const SECONDS = Number(arg('seconds', 20));
const CONNS = Number(arg('conns', 16));
const USE_TLS = arg('tls', false) === true;
const ASAN_LOG = arg('asan-log', null);
const IDLE_MS = Number(arg('idle-ms', 4000));
let seed = Number(arg('seed', Date.now() % 100000));
if (!BIN) {
  console.error('http_stream_fuzz: --bin PATH (or UNMASK_BIN) is required');
  process.exit(2);
}

// deterministic PRNG (mulberry32) so a failing seed can be replayed
function rng() {
  seed |= 0;
  seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (a) => a[Math.floor(rng() * a.length)];
const int = (lo, hi) => lo + Math.floor(rng() * (hi - lo + 1));

const KEY = 'sk-fuzz';
const tmp = fs.mkdtempSync(path.join(process.env.UNMASK_TEST_TMP || os.tmpdir(), 'stream-fuzz-'));

// ---------------------------------------------------------------- the pieces a stream is built from

const gen = () => JSON.stringify({ prompt: pick(['hi', 'def f(', 'x'.repeat(int(1, 40))]), max_tokens: int(1, 8), stream: rng() < 0.3 });
const post = (p, body, extra = '') => `POST ${p} HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer ${KEY}\r\nContent-Type: application/json\r\n${extra}Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
const PIECES = [
  () => 'GET /health HTTP/1.1\r\nHost: h\r\n\r\n',
  () => `GET /v1/models HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer ${KEY}\r\n\r\n`,
  () => 'GET / HTTP/1.1\r\nHost: h\r\n\r\n',
  () => 'GET /app.js HTTP/1.1\r\nHost: h\r\n\r\n',
  () => 'HEAD /health HTTP/1.1\r\nHost: h\r\n\r\n',
  () => 'OPTIONS /v1/completions HTTP/1.1\r\nHost: h\r\n\r\n',
  () => post('/v1/completions', gen()),
  () => post('/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: int(1, 6) })),
  () => post('/v1/completions', '{"prompt": ['),
  () => post('/v1/completions', gen(), 'Connection: close\r\n'),
  () => post('/nope', '{}'),
  () => post('/v1/jobs', gen()),
  () => 'POST /v1/completions HTTP/1.1\r\nHost: h\r\n\r\n', // no length
  () => 'POST /v1/completions HTTP/1.1\r\nHost: h\r\nContent-Length: 0x10\r\n\r\n0123456789abcdef',
  () => 'POST /v1/completions HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{}{}\r\n0\r\n\r\n',
  () => 'POST /v1/completions HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n',
  () => `GET /${'a'.repeat(int(100, 12000))} HTTP/1.1\r\nHost: h\r\n\r\n`,
  () => `GET /health HTTP/1.1\r\nHost: h\r\nX-Big: ${'b'.repeat(int(100, 40000))}\r\n\r\n`,
  () => 'GET /ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n',
  () => 'GET /elsewhere HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n',
  () => 'GET /../../etc/passwd HTTP/1.1\r\nHost: h\r\n\r\n',
  () => 'BREW /pot HTTP/1.1\r\nHost: h\r\n\r\n',
  () => 'GET /health HTTP/1.0\r\n\r\n',
  () => '\r\n',
  () => Buffer.from(Array.from({ length: int(1, 64) }, () => int(0, 255))).toString('latin1'),
  () => 'GET /health HTTP/1.1\r\nHost: h\r\n', // an unfinished head
];

// A random byte stream for one connection: 1-4 pieces, sometimes mutated.
function makeStream() {
  let s = '';
  const n = int(1, 4);
  for (let i = 0; i < n; i++) s += pick(PIECES)();
  let b = Buffer.from(s, 'latin1');
  if (rng() < 0.15) {
    b = Buffer.from(b);
    for (let k = int(1, 4); k > 0; k--) b[int(0, b.length - 1)] = int(0, 255);
  }
  if (rng() < 0.1) b = b.subarray(0, int(1, b.length)); // truncated
  return b;
}

// ---------------------------------------------------------------- response framing check

// Checks that buf is a sequence of well-formed HTTP answers. A response with a Content-Length
// followed directly by the next status line (or nothing) is taken as a HEAD answer when the
// stream sent HEAD requests (which answer has which request is not tracked: the HTTP library
// answers some malformed requests itself). When the server closed the connection, the last
// answer may be a chunked stream cut short (the documented reaction to bytes pipelined behind a
// stream); a Content-Length body must be complete unless we abandoned the connection ourselves.
// Returns the number of answers.
function checkAnswers(buf, sentHead, closedByServer, abandoned) {
  let off = 0;
  let n = 0;
  while (off < buf.length) {
    const end = buf.indexOf('\r\n\r\n', off);
    if (end < 0) {
      if (abandoned) return n;
      throw new Error(`an answer head without its end: ${JSON.stringify(buf.subarray(off, off + 120).toString('latin1'))}`);
    }
    const lines = buf.subarray(off, end).toString('latin1').split('\r\n');
    if (!/^HTTP\/1\.[01] \d{3}( |$)/.test(lines[0])) throw new Error(`not a status line: ${JSON.stringify(lines[0])}`);
    const h = {};
    for (const l of lines.slice(1)) {
      const i = l.indexOf(':');
      if (i <= 0) throw new Error(`malformed header line ${JSON.stringify(l)}`);
      h[l.slice(0, i).toLowerCase()] = l.slice(i + 1).trim();
    }
    const status = Number(lines[0].slice(9, 12));
    let p = end + 4;
    n++;
    if (status === 101) return n; // a WebSocket: the rest is frames
    const nextIsAnswer = p >= buf.length || buf.subarray(p, p + 7).toString('latin1') === 'HTTP/1.';
    if (status === 204 || status === 304 || (sentHead && nextIsAnswer && 'content-length' in h)) {
      // no body
    } else if (h['transfer-encoding'] === 'chunked') {
      for (;;) {
        const le = buf.indexOf('\r\n', p);
        const sz = le < 0 ? NaN : parseInt(buf.subarray(p, le).toString('latin1'), 16);
        if (le < 0 || p + (le - p) + 2 + sz + 2 > buf.length) {
          if (closedByServer || abandoned) return n; // cut at the close (see above)
          throw new Error('a chunked body cut short on an open connection');
        }
        if (!Number.isFinite(sz)) throw new Error('a bad chunk size line');
        p = le + 2 + sz + 2;
        if (sz === 0) break;
      }
    } else if ('content-length' in h) {
      p += Number(h['content-length']);
      if (p > buf.length) {
        if (abandoned) return n; // we hung up while it arrived
        throw new Error('a body shorter than its Content-Length');
      }
    } else {
      if (!/close/i.test(h.connection || '')) throw new Error('a body without framing on a kept connection');
      p = buf.length;
    }
    off = p;
  }
  return n;
}

// ---------------------------------------------------------------- server

function procStats(pid) {
  try {
    const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
    const rss = Number(status.match(/VmRSS:\s+(\d+)/)[1]);
    const fds = fs.readdirSync(`/proc/${pid}/fd`).length;
    return { rss, fds };
  } catch {
    return { rss: -1, fds: -1 };
  }
}

async function main() {
  const model = arg('model', null) || (() => {
    const dir = path.join(tmp, 'model');
    const r = spawnSync(BIN, ['make-model', '--out', dir, '--preset', 'tiny', '--quiet'], { encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`make-model failed: ${r.stderr}`);
    return dir;
  })();
  fs.writeFileSync(path.join(tmp, 'keys'), `${KEY}\n`);
  const args = ['serve', '--store', 'memory', '--model', model, '--host', '127.0.0.1', '--port', '0', '--threads', '1',
    '--web-root', arg('web-root', path.join(SRC, 'web')), '--api-keys', path.join(tmp, 'keys'), '--max-message-bytes', '65536',
    '--max-gen-length', '64'];
  let certs = null;
  if (USE_TLS) {
    const r = spawnSync('bash', [path.join(SRC, 'certs/make-dev-certs.sh'), path.join(tmp, 'certs')], { encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`make-dev-certs failed: ${r.stderr}`);
    certs = { cert: path.join(tmp, 'certs/server.pem'), key: path.join(tmp, 'certs/server.key'), ca: path.join(tmp, 'certs/ca.pem') };
    args.push('--tls-cert', certs.cert, '--tls-key', certs.key);
  }
  const env = { ...process.env };
  if (ASAN_LOG) env.ASAN_OPTIONS = `log_path=${ASAN_LOG}:detect_leaks=0:abort_on_error=1 ${env.ASAN_OPTIONS || ''}`;
  const srv = spawn(BIN, args, { stdio: ['ignore', 'pipe', 'pipe'], env });
  let log = '';
  srv.stdout.on('data', (d) => (log += d));
  srv.stderr.on('data', (d) => (log += d));
  let exited = null;
  srv.on('exit', (code, sig) => (exited = { code, sig }));
  const port = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`server not listening: ${log}`)), 60000);
    const check = () => {
      const m = log.match(/listening on https?:\/\/127\.0\.0\.1:(\d+)\//);
      if (m) { clearTimeout(t); resolve(Number(m[1])); }
      if (exited) { clearTimeout(t); reject(new Error(`server exited: ${log}`)); }
    };
    srv.stdout.on('data', check);
    srv.on('exit', check);
  });

  const connect = () => (USE_TLS
    ? tls.connect({ host: '127.0.0.1', port, ca: fs.readFileSync(certs.ca), servername: 'localhost' })
    : net.connect(port, '127.0.0.1'));
  const connEvent = USE_TLS ? 'secureConnect' : 'connect';

  // one GET /health on a fresh connection; resolves with its latency (ms) or throws
  const health = (deadlineMs) => new Promise((resolve, reject) => {
    const t0 = Date.now();
    const s = connect();
    let b = '';
    const timer = setTimeout(() => { s.destroy(); reject(new Error(`/health did not answer within ${deadlineMs} ms`)); }, deadlineMs);
    s.on(connEvent, () => s.write('GET /health HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n'));
    s.on('data', (d) => (b += d.toString('latin1')));
    s.on('close', () => {
      clearTimeout(timer);
      if (/^HTTP\/1\.1 (200|503)/.test(b)) resolve(Date.now() - t0); // 503 only while loading
      else reject(new Error(`/health answered ${JSON.stringify(b.slice(0, 80))}`));
    });
    s.on('error', (e) => { clearTimeout(timer); reject(e); });
  });
  for (;;) {
    const ok = await health(5000).then(() => true, () => false);
    if (ok) break;
    if (exited) throw new Error(`server exited: ${log}`);
  }
  const before = procStats(srv.pid);

  const stats = { conns: 0, bytes: 0, answers: 0, resets: 0, abandoned: 0, maxHealthMs: 0, failures: [] };
  const fail = (msg) => { if (stats.failures.length < 20) stats.failures.push(msg); };

  // one fuzzed connection
  const oneConn = () => new Promise((resolve) => {
    const stream = makeStream();
    const sentHead = stream.includes('HEAD ');
    const cuts = Array.from({ length: int(0, 5) }, () => int(1, Math.max(1, stream.length - 1))).sort((a, b) => a - b);
    const parts = [];
    let last = 0;
    for (const c of [...cuts, stream.length]) { if (c > last) parts.push(stream.subarray(last, c)); last = c; }
    const abandonAt = rng() < 0.15 ? int(0, parts.length - 1) : -1;
    const mode = rng();
    const s = connect();
    let recv = Buffer.alloc(0);
    let finished = false;
    const done = (why) => {
      if (finished) return;
      const closedByServer = why === 'closed' || why === 'error';
      finished = true;
      clearTimeout(idle);
      s.destroy();
      try {
        stats.answers += checkAnswers(recv, sentHead, closedByServer, why === 'abandoned');
      } catch (e) {
        fail(`seed-stream ${JSON.stringify(stream.toString('latin1').slice(0, 200))}: ${e.message} (${why})`);
      }
      resolve();
    };
    // the connection ends when the server closes it, or after IDLE_MS without any byte from the
    // server (keep-alive, or an unfinished head the server waits on)
    let idle = setTimeout(() => done('idle'), IDLE_MS);
    s.on('data', (d) => {
      recv = Buffer.concat([recv, d]);
      clearTimeout(idle);
      idle = setTimeout(() => done('idle'), IDLE_MS);
    });
    s.on('close', () => done('closed'));
    s.on('error', (e) => { if (/ECONNRESET|EPIPE/.test(e.code || '')) stats.resets++; done('error'); });
    s.on(connEvent, async () => {
      stats.conns++;
      for (let i = 0; i < parts.length && !finished; i++) {
        if (i === abandonAt) { stats.abandoned++; done('abandoned'); return; }
        s.write(parts[i]);
        stats.bytes += parts[i].length;
        if (rng() < 0.5) await new Promise((r) => setTimeout(r, int(0, 30)));
      }
      if (mode < 0.1 && !finished) s.end(); // half-close after sending
    });
  });

  const t0 = Date.now();
  const workers = Array.from({ length: CONNS }, async () => {
    while (Date.now() - t0 < SECONDS * 1000 && !exited) await oneConn();
  });
  const prober = (async () => {
    while (Date.now() - t0 < SECONDS * 1000 && !exited) {
      try {
        stats.maxHealthMs = Math.max(stats.maxHealthMs, await health(10000));
      } catch (e) {
        fail(`health probe: ${e.message}`);
      }
      await new Promise((r) => setTimeout(r, 250));
    }
  })();
  await Promise.all([...workers, prober]);
  if (exited) fail(`the server died: ${JSON.stringify(exited)}\n${log.slice(-3000)}`);
  else {
    await health(10000).catch((e) => fail(`final probe: ${e.message}`));
  }
  const afterStats = procStats(srv.pid);
  srv.kill('SIGTERM');
  const code = await new Promise((r) => (exited ? r(exited) : srv.on('exit', (c, sig) => r({ code: c, sig }))));
  if (!exited || code.code !== 0) {
    if (code.code !== 0) fail(`exit after SIGTERM: ${JSON.stringify(code)}\n${log.slice(-2000)}`);
  }
  if (ASAN_LOG) {
    const dir = path.dirname(ASAN_LOG);
    for (const f of fs.readdirSync(dir)) {
      if (f.startsWith(path.basename(ASAN_LOG))) fail(`sanitizer report ${f}:\n${fs.readFileSync(path.join(dir, f), 'utf8').slice(0, 3000)}`);
    }
  }
  if (/ERROR: AddressSanitizer|runtime error:/.test(log)) fail(`sanitizer output in the server log:\n${log.slice(-3000)}`);
  const fdGrowth = afterStats.fds - before.fds;
  if (before.fds > 0 && fdGrowth > 16) fail(`descriptors grew from ${before.fds} to ${afterStats.fds}`);

  console.log(`http_stream_fuzz: ${SECONDS} s, seed ${arg('seed', '(time)')}, ${USE_TLS ? 'TLS' : 'plain'}: ` +
    `${stats.conns} connections, ${stats.bytes} bytes sent, ${stats.answers} answers, ${stats.resets} resets, ` +
    `${stats.abandoned} abandoned, max /health ${stats.maxHealthMs} ms, RSS ${before.rss} -> ${afterStats.rss} kB, ` +
    `fds ${before.fds} -> ${afterStats.fds}`);
  fs.rmSync(tmp, { recursive: true, force: true });
  if (stats.failures.length) {
    console.error(`http_stream_fuzz: ${stats.failures.length} failure(s):\n${stats.failures.join('\n---\n')}`);
    process.exit(1);
  }
}

main().catch((e) => {
  console.error(`http_stream_fuzz: ${e.stack || e}`);
  process.exit(1);
});
