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
//    all of them submitted, the batch full and A's requests waiting, B runs --b-requests
//    generations the same way.
// 3. A's requests are aborted (the server cancels them).
// With --dropped, A's flood is --flood WebSocket sessions of one generation each, all dropped
// abruptly (TCP reset, no close frame) once the batch is full: their generations go on for the
// session retention while nobody reads them. B's flood samples are then taken on a new connection
// of caller A (the same caller: only the rule for detached sessions can help it).
// Prints one JSON object: B's idle and flood times to first step (ms), the mean batched step time
// while B was measured (from /stats), the target 2 x B's idle median + that step, how many of B's
// flood samples met it, and the scheduler's pause counters. Needs npm `ws`
// (tests/node_modules).

import WebSocket from './ws.mjs';

function parseArgs(argv) {
  const o = { url: null, keyA: null, keyB: null, flood: 150, tokens: 256, bRequests: 5, idle: 5, prompt: 'def f(x):',
    dropped: false };
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
    else if (a === '--dropped') o.dropped = true;
    else {
      console.error(`unknown option ${a}`);
      process.exit(2);
    }
  }
  if (!o.url || !o.keyA || !o.keyB || !(o.flood >= 1) || !(o.tokens >= 1) || !(o.bRequests >= 1) || !(o.idle >= 1)) {
    console.error('usage: bench_fairness.mjs --url http://HOST:PORT --key-a KEY --key-b KEY [--flood N] [--tokens N] [--b-requests N] [--idle N] [--dropped]');
    process.exit(2);
  }
  return o;
}

const o = parseArgs(process.argv);
const auth = (k) => ({ authorization: `Bearer ${k}`, 'content-type': 'application/json' });
const stats = async () => (await fetch(`${o.url}/stats`, { headers: auth(o.keyB) })).json();

// A WebSocket client of key: its messages, and wait(pred) for the first one matching.
function openClient(key) {
  const ws = new WebSocket(o.url.replace(/^http/, 'ws') + '/ws', { headers: { authorization: `Bearer ${key}` } });
  ws.on('error', () => {});
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

// One generation of B at a time, timed to its first step event, then cancelled.
let genNo = 0;
const acceptedMs = [];
const queueMs = [];   // the server's: submitted -> admitted into the batch
async function timeB(b) {
  const id = `b${genNo++}`;
  const accepted = b.wait((m) => m.type === 'accepted' && m.id === id);
  const first = b.wait((m) => m.type === 'step' && m.id === id);
  const done = b.wait((m) => m.type === 'done' && m.id === id);
  const t0 = performance.now();
  b.ws.send(JSON.stringify({ type: 'generate', id, prompt: o.prompt, gen_length: o.tokens }));
  await accepted;
  acceptedMs.push(performance.now() - t0);
  await first;
  const ms = performance.now() - t0;
  b.ws.send(JSON.stringify({ type: 'cancel', id }));
  queueMs.push((await done).timings.queue_ms);
  return ms;
}

const summary = (v) => {
  const s = [...v].sort((a, b) => a - b);
  return { n: s.length, min: +s[0].toFixed(1), median: +s[Math.floor(s.length / 2)].toFixed(1), max: +s.at(-1).toFixed(1),
    all: v.map((x) => +x.toFixed(1)) };
};

const b = openClient(o.keyB);
await b.opened;
await b.wait((m) => m.type === 'session.created');
const idle = [];
for (let i = 0; i < o.idle; i++) idle.push(await timeB(b));

const ac = new AbortController();
const before = await stats();
const maxBatch = before.scheduler.max_batch * before.scheduler.engines;
const flood = [];
let probe = b;
if (o.dropped) {
  const socks = [];
  for (let i = 0; i < o.flood; i++) socks.push(openClient(o.keyA));
  await Promise.all(socks.map((c) => c.opened));
  await Promise.all(socks.map((c) => c.wait((m) => m.type === 'session.created')));
  socks.forEach((c, i) => c.ws.send(JSON.stringify({ type: 'generate', id: 'd', prompt: `${o.prompt} ${i}`, gen_length: o.tokens })));
  const acc = await Promise.all(socks.map((c) => c.wait((m) => (m.type === 'accepted' || m.type === 'error') && m.id === 'd')));
  const refused = acc.find((m) => m.type === 'error');
  if (refused) {
    console.error(`error: a dropped-to-be generation was refused: ${JSON.stringify(refused.error)} (raise --key-max-sessions / --key-max-generations / --max-queue)`);
    process.exit(1);
  }
  for (;;) {
    const st = await stats();
    if (st.scheduler.active >= maxBatch) break;
    await new Promise((r) => setTimeout(r, 20));
  }
  for (const c of socks) c.ws.terminate();
  for (;;) {
    const st = await stats();
    if (st.connections.sessions_detached >= o.flood) break;
    await new Promise((r) => setTimeout(r, 20));
  }
  probe = openClient(o.keyA);
  await probe.opened;
  await probe.wait((m) => m.type === 'session.created');
} else {
  for (let i = 0; i < o.flood; i++)
    flood.push(fetch(`${o.url}/v1/completions`, { method: 'POST', headers: auth(o.keyA), signal: ac.signal,
      body: JSON.stringify({ prompt: `${o.prompt} ${i}`, max_tokens: o.tokens }) }).then((r) => r.status).catch(() => 'aborted'));
}
// the flood is on: all of A's requests accepted, every batch slot busy, the rest waiting
for (;;) {
  const st = await stats();
  if (st.scheduler.submitted >= before.scheduler.submitted + o.flood && st.scheduler.active >= maxBatch &&
      st.scheduler.queued > 0) break;
  const early = await Promise.race([Promise.race(flood), new Promise((r) => setTimeout(() => r(null), 20))]);
  if (typeof early === 'number' && early !== 200) {
    console.error(`error: a flood request answered ${early} (raise --key-max-generations / --max-queue on the server)`);
    process.exit(1);
  }
}
const st0 = await stats();
const during = [];
for (let i = 0; i < o.bRequests; i++) during.push(await timeB(probe));
const st = await stats();
// the batched step time while B was measured (the flood's steps and B's)
const stepTotal = (x) => x.scheduler.mean_step_ms * x.scheduler.steps;
const windowStep = (stepTotal(st) - stepTotal(st0)) / Math.max(1, st.scheduler.steps - st0.scheduler.steps);
const idleMedian = summary(idle).median;
const target = 2 * idleMedian + windowStep;
ac.abort();
await Promise.all(flood);
b.ws.close(1000);
if (probe !== b) probe.ws.close(1000);
console.log(JSON.stringify({
  flood: o.flood, dropped: o.dropped, tokens: o.tokens, max_batch: maxBatch,
  b_idle_first_step_ms: summary(idle), b_flood_first_step_ms: summary(during),
  b_accepted_ms: acceptedMs.map((x) => +x.toFixed(1)),
  b_queue_ms: queueMs.map((x) => +x.toFixed(1)),
  flood_step_ms: +windowStep.toFixed(1),
  target_ms: +target.toFixed(1),
  within_target: during.filter((x) => x <= target).length,
  scheduler: { paused: st.scheduler.paused, preempted: st.scheduler.preempted, resumed: st.scheduler.resumed, queued: st.scheduler.queued, active: st.scheduler.active, finished: st.scheduler.finished },
}, null, 1));
