#!/usr/bin/env node
// rss_load.mjs — the server's memory after a burst of many clients: how much it takes, and how
// much it gives back once every client is gone (docs/reliability.md, "Memory after load").
//
// Starts `unmask serve` on the tiny checkpoint, then:
//   1. opens --idle WebSocket sessions that only sit there (default 5000);
//   2. runs --gens generations with drafts at once, each on a session of its own (default 500);
//   3. once half of them are done, kills every client at once (TCP drops, no close frames);
//   4. waits until the server holds no session (they expire after --retention s) and runs
//      nothing, then until it has returned its freed memory to the OS (/stats memory.trims counts
//      up; at most --settle s: a server without that just gets sampled that long).
// Prints one JSON line: RSS (MB) at start, after the idle sessions, the peak, and idle after the
// load (the last sample), plus /stats counters. Exits non-zero if the server died or did not
// come back to 0 sessions / 0 session bytes. Not a test (it measures, asserts no figure); run it
// by hand, with the ASan build for LeakSanitizer (the server's exit report shows in stderr):
//
//   node tests/adversarial/rss_load.mjs --bin build/unmask [--idle 5000] [--gens 500] [--env K=V]
//
// Needs about idle + gens file descriptors in this process and in the server (ulimit -n).

import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import WebSocket from 'ws';

const here = path.dirname(fileURLToPath(import.meta.url));
const SRC = path.resolve(here, '../..');
const arg = (name, def) => {
  const i = process.argv.indexOf(`--${name}`);
  return i < 0 || process.argv[i + 1] === undefined ? def : process.argv[i + 1];
};
const BIN = arg('bin', process.env.UNMASK_BIN);
const IDLE = Number(arg('idle', 5000));
const GENS = Number(arg('gens', 500));
const RETENTION = Number(arg('retention', 2));
const SETTLE = Number(arg('settle', 10));
const SERVER_ARGS = (arg('server-args', '') || '').split(' ').filter(Boolean); // e.g. "--verbose"
const ENV = {};
for (let i = 0; i < process.argv.length; i++)
  if (process.argv[i] === '--env') {
    const [k, ...v] = process.argv[i + 1].split('=');
    ENV[k] = v.join('=');
  }
if (!BIN) {
  console.error('rss_load: --bin PATH (or UNMASK_BIN) is required');
  process.exit(2);
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const tmp = fs.mkdtempSync(path.join(process.env.UNMASK_TEST_TMP || os.tmpdir(), 'rss-load-'));

const rssMB = (pid) => {
  try {
    return Number(fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/)[1]) / 1024;
  } catch {
    return -1;
  }
};

async function until(what, fn, ms = 600000) {
  const t0 = Date.now();
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() - t0 > ms) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

// ---------------------------------------------------------------- server

const model = path.join(tmp, 'model');
const mk = spawnSync(BIN, ['make-model', '--out', model, '--preset', 'tiny', '--quiet'], { encoding: 'utf8' });
if (mk.status !== 0) throw new Error(`make-model: ${mk.stderr}`);
const proc = spawn(BIN, ['serve', '--store', 'memory', '--model', model, '--host', '127.0.0.1', '--port', '0',
  '--threads', '2', '--web-root', path.join(SRC, 'web'), '--ping-interval', '600',
  '--max-sessions', String(IDLE + GENS + 64), '--max-queue', String(GENS + 64), '--session-retention', String(RETENTION),
  '--key-max-sessions', '0', '--key-max-generations', '0', '--max-conns-per-address', '0', ...SERVER_ARGS], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...ENV } });
let log = '';
proc.stdout.on('data', (d) => (log += d));
proc.stderr.on('data', (d) => (log += d));
let exited = null;
const exitP = new Promise((resolve) => proc.on('exit', (code, sig) => resolve((exited = { code, sig }))));
const port = await new Promise((resolve, reject) => {
  const check = () => {
    const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)\//);
    if (m) resolve(Number(m[1]));
  };
  proc.stdout.on('data', check);
  exitP.then(() => reject(new Error(`the server exited: ${log}`)));
});
const base = `http://127.0.0.1:${port}`;
const stats = async () => (await fetch(`${base}/stats`)).json();
await until('the model', async () => (await fetch(`${base}/health`).catch(() => null))?.status === 200, 60000);

let peak = 0;
const sampler = setInterval(() => (peak = Math.max(peak, rssMB(proc.pid))), 100);
const out = { idle_sessions: IDLE, generations: GENS, env: ENV, rss_mb: {} };
out.rss_mb.start = rssMB(proc.pid);

// ---------------------------------------------------------------- clients

const clients = [];
function open() {
  const ws = new WebSocket(`ws://127.0.0.1:${port}/ws`, ['unmask']);
  const c = { ws, done: false };
  ws.on('error', () => {});
  c.created = new Promise((resolve, reject) => {
    ws.on('message', (d) => {
      const m = JSON.parse(String(d));
      if (m.type === 'session.created') resolve(m);
      if (m.type === 'done') c.done = true;
    });
    ws.on('close', () => reject(new Error('closed before session.created')));
  });
  clients.push(c);
  return c;
}

for (let i = 0; i < IDLE; i += 250) {
  const batch = [];
  for (let k = i; k < Math.min(IDLE, i + 250); k++) batch.push(open().created);
  await Promise.all(batch);
}
out.rss_mb.idle_sessions = rssMB(proc.pid);

const gens = [];
for (let i = 0; i < GENS; i++) gens.push(open());
await Promise.all(gens.map((c) => c.created));
for (const [i, c] of gens.entries())
  c.ws.send(JSON.stringify({ type: 'generate', id: `g${i}`, prompt: `Tell me a story about the number ${i}.`, gen_length: 64,
    block_length: 16, steps: 64, stream: { drafts: true } }));
await until('half of the generations done', () => gens.filter((c) => c.done).length >= GENS / 2);
out.done_before_kill = gens.filter((c) => c.done).length;
out.rss_mb.before_kill = rssMB(proc.pid);
for (const c of clients) c.ws.terminate();
const t0Kill = Date.now();

// ---------------------------------------------------------------- after

const st = await until('0 sessions and nothing running', async () => {
  const s = await stats();
  return s.connections.sessions === 0 && s.connections.websocket === 0 && s.scheduler.active === 0 && s.scheduler.queued === 0 && s;
});
const t0Quiet = Date.now();
out.quiet_after_kill_s = (t0Quiet - t0Kill) / 1000;
const trims0 = st.memory?.trims;
const samples = [];
let trimmed = null;
for (let t = 0; t < SETTLE * 10 && !trimmed; t++) {
  samples.push(rssMB(proc.pid));
  if (trims0 !== undefined && (await stats()).memory.trims > trims0) trimmed = (Date.now() - t0Quiet) / 1000;
  else await sleep(100);
}
samples.push(rssMB(proc.pid));
out.trim_after_s = trimmed;
clearInterval(sampler);
out.rss_mb.peak = Math.max(peak, ...samples);
out.rss_mb.idle_after = samples.at(-1);
out.rss_mb.idle_after_min = Math.min(...samples);
out.stats = { connections: st.connections, finished: st.scheduler.finished, cancelled: st.scheduler.cancelled,
  memory: (await stats()).memory };
for (const k of Object.keys(out.rss_mb)) out.rss_mb[k] = Math.round(out.rss_mb[k] * 10) / 10;

proc.kill('SIGTERM');
const ex = await exitP;
out.exit = ex;
const lsan = log.match(/SUMMARY: (AddressSanitizer|LeakSanitizer)[^\n]*/g);
out.sanitizer = lsan || [];
console.log(JSON.stringify(out));
if (process.argv.includes('--log')) console.error(log.slice(-20000));
fs.rmSync(tmp, { recursive: true, force: true });
process.exit(ex.code === 0 && st.connections.session_bytes === 0 && out.sanitizer.length === 0 ? 0 : 1);
