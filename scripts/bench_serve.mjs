#!/usr/bin/env node
// bench_serve.mjs — WebSocket load generator for `unmask bench --serve` (which starts the server
// and prints the table); usable alone against a running server:
//
//   node scripts/bench_serve.mjs --url ws://127.0.0.1:8080/ws --clients 8 --requests 4 \
//        [--gen-length 32] [--block-length 8] [--steps 0] [--drafts] [--prompt-len 16] [--eos]
//
// N clients connect at once; each runs its requests one after another (closed loop). Prints one
// JSON object: wall time, generated tokens, tokens/s, latency percentiles (send -> accepted,
// send -> first step event, send -> done) and frame counts. Needs npm `ws` (tests/node_modules).

import WebSocket from './ws.mjs';

function parseArgs(argv) {
  const o = { url: null, clients: 8, requests: 4, genLength: 32, blockLength: 8, steps: 0, drafts: false, promptLen: 16, eos: false, timeoutS: 600 };
  for (let i = 2; i < argv.length; i++) {
    const a = argv[i];
    const v = () => argv[++i];
    if (a === '--url') o.url = v();
    else if (a === '--clients') o.clients = Number(v());
    else if (a === '--requests') o.requests = Number(v());
    else if (a === '--gen-length') o.genLength = Number(v());
    else if (a === '--block-length') o.blockLength = Number(v());
    else if (a === '--steps') o.steps = Number(v());
    else if (a === '--prompt-len') o.promptLen = Number(v());
    else if (a === '--timeout') o.timeoutS = Number(v());
    else if (a === '--drafts') o.drafts = true;
    else if (a === '--eos') o.eos = true;
    else {
      console.error(`error: unknown option ${a}`);
      process.exit(2);
    }
  }
  if (!o.url) {
    console.error('error: --url ws://HOST:PORT/ws is required');
    process.exit(2);
  }
  return o;
}

const pct = (xs, q) => {
  if (!xs.length) return 0;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil(q * s.length) - 1)];
};

async function runClient(o, k, out) {
  const ws = new WebSocket(o.url, { perMessageDeflate: false });
  const pending = new Map(); // id -> {t0, accepted, first, resolve}
  await new Promise((resolve, reject) => {
    ws.once('error', reject);
    ws.on('message', (data) => {
      const m = JSON.parse(data);
      out.frames++;
      out.bytes += data.length;
      if (m.type === 'session.created') return resolve();
      const p = pending.get(m.id);
      if (!p) {
        if (m.type === 'error') out.errors.push(m.error.code);
        return;
      }
      const t = performance.now();
      if (m.type === 'accepted') p.accepted = t - p.t0;
      else if (m.type === 'step') {
        out.steps++;
        if (m.merged) out.merged += m.merged - 1;
        if (!p.first) p.first = t - p.t0;
      } else if (m.type === 'done') {
        pending.delete(m.id);
        p.resolve(m, t - p.t0);
      } else if (m.type === 'error') {
        out.errors.push(m.error.code);
        pending.delete(m.id);
        p.resolve(null, t - p.t0);
      }
    });
  });
  for (let r = 0; r < o.requests; r++) {
    const id = `c${k}r${r}`;
    const prompt_ids = Array.from({ length: o.promptLen }, (_, i) => 1 + ((k * 131 + r * 17 + i * 7) % 250));
    const body = {
      type: 'generate', id, prompt_ids, gen_length: o.genLength, block_length: o.blockLength, steps: o.steps,
      stream: { drafts: o.drafts }, logits_eos_inf: !o.eos, stop_at_eos: o.eos,
    };
    const done = await new Promise((resolve) => {
      const p = { t0: performance.now(), accepted: 0, first: 0 };
      p.resolve = (m, total) => resolve({ m, total, accepted: p.accepted, first: p.first });
      pending.set(id, p);
      ws.send(JSON.stringify(body));
    });
    if (!done.m) continue;
    out.requests++;
    out.tokens += done.m.usage.completion_tokens;
    out.accepted.push(done.accepted);
    out.first.push(done.first || done.total);
    out.total.push(done.total);
  }
  ws.close();
}

const o = parseArgs(process.argv);
const out = { frames: 0, bytes: 0, steps: 0, merged: 0, requests: 0, tokens: 0, accepted: [], first: [], total: [], errors: [] };
const timer = setTimeout(() => {
  console.error(`error: benchmark did not finish within ${o.timeoutS} s`);
  process.exit(1);
}, o.timeoutS * 1000);
const t0 = performance.now();
await Promise.all(Array.from({ length: o.clients }, (_, k) => runClient(o, k, out)));
const wall = (performance.now() - t0) / 1000;
clearTimeout(timer);
const r3 = (x) => Math.round(x * 1000) / 1000;
console.log(JSON.stringify({
  clients: o.clients, requests: out.requests, failed: out.errors.length, errors: [...new Set(out.errors)],
  gen_length: o.genLength, block_length: o.blockLength, steps: o.steps, drafts: o.drafts,
  wall_s: r3(wall), tokens: out.tokens, tokens_per_s: r3(out.tokens / wall), requests_per_s: r3(out.requests / wall),
  frames: out.frames, bytes: out.bytes, step_frames: out.steps, merged_steps: out.merged,
  accepted_ms: { p50: r3(pct(out.accepted, 0.5)), p99: r3(pct(out.accepted, 0.99)) },
  first_step_ms: { p50: r3(pct(out.first, 0.5)), p99: r3(pct(out.first, 0.99)) },
  total_ms: { p50: r3(pct(out.total, 0.5)), p99: r3(pct(out.total, 0.99)) },
}));
