#!/usr/bin/env node
// jobs_store_bench.mjs — the async job store's cost, memory vs SQLite vs Redis, side by side on one
// machine: POST /v1/jobs -> 202 latency (p50 / p99 over N sequential submits) and the time for the
// server to run all N jobs (tokens/s of the whole run), which includes writing every step event
// through to the store; the store's overhead per logged event is the run's extra time over memory
// divided by the events logged. Starts `unmask serve` itself (interleaved runs, min of --repeat);
// for Redis, a fresh redis-server per run on a free loopback port (no persistence), when installed:
//
//   node tools/bench/jobs_store_bench.mjs --bin build/unmask --model DIR [--jobs 200] [--tokens 32] [--repeat 3]
//
// Prints a Markdown table for docs/perf.md.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import net from 'node:net';
import path from 'node:path';
import { spawnSync } from 'node:child_process';

const arg = (name, def) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : def;
};
const BIN = arg('bin', 'build/unmask');
const MODEL = arg('model', 'models/unmask-code-13m');
const N = Number(arg('jobs', 200));
const TOKENS = Number(arg('tokens', 32));
const REPEAT = Number(arg('repeat', 3));

async function serve(store) {
  const proc = spawn(BIN, ['serve', '--model', MODEL, '--host', '127.0.0.1', '--port', '0', '--store', store, '--max-batch', '8'],
    { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  proc.stdout.on('data', (d) => (out += d));
  proc.stderr.on('data', (d) => (out += d));
  const port = await new Promise((resolve, reject) => {
    const t = setInterval(() => {
      const m = out.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearInterval(t); resolve(Number(m[1])); }
      if (proc.exitCode !== null) { clearInterval(t); reject(new Error(out)); }
    }, 20);
  });
  const url = `http://127.0.0.1:${port}`;
  for (;;) { // model loaded
    try { if ((await fetch(`${url}/health`)).status === 200) break; } catch { /* not yet */ }
    await new Promise((r) => setTimeout(r, 20));
  }
  return { url, stop: () => new Promise((r) => { proc.on('exit', r); proc.kill('SIGTERM'); }) };
}

const freePort = async () => {
  const srv = net.createServer();
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  const { port } = srv.address();
  await new Promise((r) => srv.close(r));
  return port;
};

async function redisServer(dir) {
  const port = await freePort();
  const proc = spawn('redis-server', ['--save', '', '--appendonly', 'no', '--port', String(port), '--bind', '127.0.0.1', '--dir', dir],
    { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  proc.stdout.on('data', (d) => (out += d));
  while (!/Ready to accept connections/.test(out)) {
    if (proc.exitCode !== null) throw new Error(out);
    await new Promise((r) => setTimeout(r, 20));
  }
  return { url: `redis://127.0.0.1:${port}`, stop: () => new Promise((r) => { proc.on('exit', r); proc.kill('SIGKILL'); }) };
}

let events = 0; // events logged in one run (the same for every store)
async function once(store) {
  const rs = store === 'redis' ? await redisServer(dir) : null;
  const s = await serve(rs ? rs.url : store);
  const lat = [];
  const t0 = performance.now();
  for (let i = 0; i < N; i++) {
    const a = performance.now();
    const r = await fetch(`${s.url}/v1/jobs`, { method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: `def f${i}(x):`, max_tokens: TOKENS, block_length: TOKENS, steps: TOKENS, seed: i }) });
    if (r.status !== 202) throw new Error(`${r.status} ${await r.text()}`);
    await r.text();
    lat.push(performance.now() - a);
  }
  for (;;) {
    const l = await (await fetch(`${s.url}/v1/jobs?status=succeeded&limit=100`)).json();
    const q = await (await fetch(`${s.url}/v1/jobs?status=queued&limit=1`)).json();
    const r = await (await fetch(`${s.url}/v1/jobs?status=running&limit=1`)).json();
    if (!q.data.length && !r.data.length && l.data.length) break;
    await new Promise((res) => setTimeout(res, 20));
  }
  const wall = (performance.now() - t0) / 1000;
  let ev = 0;
  for (let after = ''; ;) {
    const l = await (await fetch(`${s.url}/v1/jobs?limit=100${after ? `&after=${after}` : ''}`)).json();
    for (const j of l.data) ev += j.progress.events + 1; // + the final status event
    if (!l.has_more) break;
    after = l.last_id;
  }
  events = ev;
  await s.stop();
  await rs?.stop();
  lat.sort((x, y) => x - y);
  return { p50: lat[Math.floor(N / 2)], p99: lat[Math.floor(N * 0.99)], wall, tps: (N * TOKENS) / wall };
}

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'jobs-bench-'));
const withRedis = !spawnSync('redis-server', ['--version']).error;
const res = { memory: [], sqlite: [], ...(withRedis ? { redis: [] } : {}) };
for (let k = 0; k < REPEAT; k++) {
  res.memory.push(await once('memory'));
  res.sqlite.push(await once(`sqlite:${path.join(dir, `jobs-${k}.db`)}`));
  if (withRedis) res.redis.push(await once('redis'));
}
fs.rmSync(dir, { recursive: true, force: true });
const best = (rs, f, min = true) => rs.map((r) => r[f]).reduce((a, b) => (min ? Math.min(a, b) : Math.max(a, b)));
console.log(`| store | submit p50 ms | submit p99 ms | ${N} jobs x ${TOKENS} tokens, s | tokens/s | overhead per event, µs |`);
console.log('|---|---|---|---|---|---|');
const base = best(res.memory, 'wall');
for (const k of Object.keys(res)) {
  const w = best(res[k], 'wall');
  console.log(`| ${k} | ${best(res[k], 'p50').toFixed(2)} | ${best(res[k], 'p99').toFixed(2)} | ${w.toFixed(2)} | ` +
    `${best(res[k], 'tps', false).toFixed(0)} | ${k === 'memory' ? '—' : (((w - base) / events) * 1e6).toFixed(1)} |`);
}
console.log(`(${events} events logged per run)`);
