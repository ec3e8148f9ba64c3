#!/usr/bin/env node
// bench_fairness.mjs — caller B's time to first event while caller A floods the server, against a
// running `unmask serve` started with --api-keys (A and B are two of its keys):
//
//   node scripts/bench_fairness.mjs --url http://127.0.0.1:8080 --key-a KEY_A --key-b KEY_B \
//        [--flood 150] [--tokens 256] [--b-requests 5] [--idle 5]
//
// 1. idle: B runs --idle WebSocket generations of --tokens tokens one after another; each is timed
//    from sending `generate` to its first `step` event and then cancelled.
// 2. flood: A sends --flood concurrent POST /v1/completions of --tokens tokens; once /stats shows
//    the batch full and A's requests waiting, B runs --b-requests generations the same way.
// 3. A's requests are aborted (the server cancels them).
// Prints one JSON object: B's idle and flood times to first step (ms), the mean batched step time
// of the flood (/stats scheduler.mean_step_ms), and the scheduler's pause counters. Needs npm `ws`
// (tests/node_modules).

import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, '..', 'tests', 'package.json'));
let WebSocket;
try {
  WebSocket = require('ws');
} catch {
  console.error('error: npm package "ws" not found; run `npm ci` in tests/ (scripts/install-deps.sh does)');
  process.exit(2);
}

function parseArgs(argv) {
  const o = { url: null, keyA: null, keyB: null, flood: 150, tokens: 256, bRequests: 5, idle: 5, prompt: 'def f(x):' };
  for (let i = 2; i < argv.length; i++) {
    const a = argv[i];
    const v = () => argv[++i];
    if (a === '--url') o.url = v();
    else if (a === '--key-a') o.keyA = v();
    else if (a === '--key-b') o.keyB = v();
    else if (a === '--flood') o.flood = Number(v());
    else if (a === '--tokens') o.tokens = Number(v());
    else if (a === '--b-requests') o.bRequests = Number(v());
    else if (a === '--idle') o.idle = Number(v());
    else if (a === '--prompt') o.prompt = v();
    else {
      console.error(`unknown option ${a}`);
      process.exit(2);
    }
  }
  if (!o.url || !o.keyA || !o.keyB || !(o.flood >= 1) || !(o.tokens >= 1) || !(o.bRequests >= 1) || !(o.idle >= 1)) {
    console.error('usage: bench_fairness.mjs --url http://HOST:PORT --key-a KEY --key-b KEY [--flood N] [--tokens N] [--b-requests N] [--idle N]');
    process.exit(2);
  }
  return o;
}

const o = parseArgs(process.argv);
const auth = (k) => ({ authorization: `Bearer ${k}`, 'content-type': 'application/json' });
const stats = async () => (await fetch(`${o.url}/stats`, { headers: auth(o.keyB) })).json();

// B's WebSocket: one generation at a time, timed to its first step event, then cancelled.
function openB() {
  const ws = new WebSocket(o.url.replace(/^http/, 'ws') + '/ws', { headers: { authorization: `Bearer ${o.keyB}` } });
  const msgs = [];
  const waiters = [];
  ws.on('message', (d) => {
    const m = JSON.parse(d.toString());
    msgs.push(m);
    for (const w of waiters.slice()) if (w.pred(m)) waiters.splice(waiters.indexOf(w), 1), w.resolve(m);
  });
  const wait = (pred) => {
    const have = msgs.find(pred);
    return have ? Promise.resolve(have) : new Promise((resolve) => waiters.push({ pred, resolve }));
  };
  return { ws, wait, opened: new Promise((r) => ws.once('open', r)) };
}

let genNo = 0;
async function timeB(b) {
  const id = `b${genNo++}`;
  const first = b.wait((m) => m.type === 'step' && m.id === id);
  const done = b.wait((m) => m.type === 'done' && m.id === id);
  const t0 = performance.now();
  b.ws.send(JSON.stringify({ type: 'generate', id, prompt: o.prompt, gen_length: o.tokens }));
  await first;
  const ms = performance.now() - t0;
  b.ws.send(JSON.stringify({ type: 'cancel', id }));
  await done;
  return ms;
}

const summary = (v) => {
  const s = [...v].sort((a, b) => a - b);
  return { n: s.length, min: +s[0].toFixed(1), median: +s[Math.floor(s.length / 2)].toFixed(1), max: +s.at(-1).toFixed(1) };
};

const b = openB();
await b.opened;
await b.wait((m) => m.type === 'session.created');
const idle = [];
for (let i = 0; i < o.idle; i++) idle.push(await timeB(b));

const ac = new AbortController();
const before = await stats();
const maxBatch = before.scheduler.max_batch * before.scheduler.engines;
const flood = [];
for (let i = 0; i < o.flood; i++)
  flood.push(fetch(`${o.url}/v1/completions`, { method: 'POST', headers: auth(o.keyA), signal: ac.signal,
    body: JSON.stringify({ prompt: `${o.prompt} ${i}`, max_tokens: o.tokens }) }).then((r) => r.status).catch(() => 'aborted'));
// the flood is on: every batch slot busy and more of A's requests waiting
for (;;) {
  const st = await stats();
  if (st.scheduler.active >= maxBatch && st.scheduler.queued > 0) break;
  const early = await Promise.race([Promise.race(flood), new Promise((r) => setTimeout(() => r(null), 20))]);
  if (typeof early === 'number' && early !== 200) {
    console.error(`error: a flood request answered ${early} (raise --key-max-generations / --max-queue on the server)`);
    process.exit(1);
  }
}
const during = [];
for (let i = 0; i < o.bRequests; i++) during.push(await timeB(b));
const st = await stats();
ac.abort();
await Promise.all(flood);
b.ws.close(1000);
console.log(JSON.stringify({
  flood: o.flood, tokens: o.tokens, max_batch: maxBatch,
  b_idle_first_step_ms: summary(idle), b_flood_first_step_ms: summary(during),
  mean_step_ms: +st.scheduler.mean_step_ms.toFixed(2),
  scheduler: { paused: st.scheduler.paused, preempted: st.scheduler.preempted, resumed: st.scheduler.resumed, queued: st.scheduler.queued, active: st.scheduler.active },
}, null, 1));
