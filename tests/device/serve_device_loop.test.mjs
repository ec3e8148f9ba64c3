// serve_device_loop.test.mjs — end to end: `unmask serve --device cuda:0` on the CUDA emulator
// (UNMASK_EMU_BIN, the unmask binary built against the emulated CUDA runtime) with the
// device-resident decode loop (default) and with the host loop forced (--device-loop off),
// driven by the real `ws` and `openai` clients: the same requests — every eligible decoder, greedy
// and seeded sampling, drafts, different lengths and block sizes, submitted at staggered times so
// they join and leave each other's batches — return the same texts, finish reasons, usage and
// per-position commits on both servers; a cancelled generation ends with done(cancelled) and
// nothing after it, and its batch-mates still match the host loop; CFG requests (not supported on
// the device) still work next to device ones; the device server really ran the device loop and
// replayed CUDA graphs (its debug log), the host one did not. LLaDA2 (llada2-tiny, block diffusion):
// requests with and without the exact block cache on the device loop (counted in device_loop) equal
// the host loop's.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import OpenAI from 'openai';
import { EMU, NO_EMU } from '../parallel/emu_harness.mjs';
import { Client, TMP, checkGeneration, httpGet, makeModelOnce, startServer, tinyModel } from '../protocol/harness.mjs';

// `unmask serve` from the emulator binary, one engine thread (the harness's startServer)
const startEmuServer = (opts) => startServer({ ...opts, bin: EMU, threads: 1, readyMs: 60000 });

// The requests: [id, body]. Lengths/blocks differ so sequences leave the batch at different steps.
const REQS = [
  ['lc0', { prompt: 'The quick brown fox', gen_length: 12, block_length: 4, steps: 6, decoder: 'low_confidence' }],
  ['lc1', { prompt: 'Once upon a time', gen_length: 8, block_length: 8, steps: 8, decoder: 'low_confidence',
    temperature: 0.8, seed: 41, stream: { drafts: true } }],
  ['rnd', { prompt: 'Tell me about GPUs', gen_length: 10, block_length: 4, steps: 5, decoder: 'random', seed: 7,
    temperature: 0.6, top_k: 30 }],
  ['thr', { prompt: 'Why is the sky blue?', gen_length: 12, block_length: 4, decoder: 'threshold', threshold: 0.2,
    temperature: 0.9, top_p: 0.9, seed: 5, stream: { drafts: true } }],
  ['fac', { prompt: 'A list of colours:', gen_length: 8, block_length: 4, decoder: 'factor', factor: 1.5 }],
  ['cfg', { prompt: 'Guided generation', gen_length: 8, block_length: 4, steps: 4, cfg_scale: 1.0 }],
];

// Run every request on one connection, each submitted after the previous one has streamed a step
// (so they join a running batch), and cancel `cancelId` after its 2nd step.
async function runAll(srv, cancelId) {
  const c = new Client(srv.wsUrl);
  await c.session();
  for (const [id, body] of REQS) {
    c.send({ type: 'generate', id, ...body });
    await c.wait((m) => m.id === id && (m.type === 'step' || m.type === 'done'), `first step of ${id}`);
  }
  const long = { prompt_ids: [1, 2, 3], gen_length: 200, block_length: 4, steps: 200, decoder: 'low_confidence' };
  c.send({ type: 'generate', id: cancelId, ...long });
  await c.wait((m) => m.type === 'step' && m.id === cancelId && m.step >= 2, 'a few steps of the long one');
  c.send({ type: 'cancel', id: cancelId });
  const out = {};
  for (const [id] of [...REQS, [cancelId]]) {
    const done = await c.done(id);
    checkGeneration(assert, c.msgs, id);
    const commits = c.of(id).filter((m) => m.type === 'step').flatMap((m) => m.commits.map((x) => [x.index, x.token]));
    commits.sort((a, b) => a[0] - b[0]);
    out[id] = { done, commits, after: c.msgs.filter((m) => m.id === id && m.seq > done.seq).length };
  }
  await c.close();
  return out;
}

// The engine adds an iteration's counters to /stats (under the lock that also retires finished
// requests) after the iteration, which may have sent DONE already: read them once nothing is
// active or queued, i.e. once the iteration that finished the last request is accounted for.
async function settledStats(srv) {
  const t0 = Date.now();
  for (;;) {
    const st = await (await fetch(`${srv.base}/stats`)).json();
    if (st.scheduler.active === 0 && st.scheduler.queued === 0) return st;
    if (Date.now() - t0 > 60000) throw new Error(`engine never went idle: ${JSON.stringify(st)}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe('serve: device-resident loop vs host loop on emulated CUDA', { skip: NO_EMU }, () => {
  let dev, host;
  before(async () => {
    const model = tinyModel('device-loop', EMU);
    const common = { model, extra: ['--device', 'cuda:0', '--max-batch', '8', '--verbose'] };
    dev = await startEmuServer({ ...common, extra: [...common.extra, '--device-loop', 'on'], name: 'device-loop' });
    host = await startEmuServer({ ...common, extra: [...common.extra, '--device-loop', 'off'], name: 'host-loop' });
  });
  after(async () => {
    const r1 = await dev?.stop();
    const r2 = await host?.stop();
    assert.equal(r1?.code, 0, `device-loop server exits 0 on SIGTERM: ${dev?.stderr}`);
    assert.equal(r2?.code, 0, `host-loop server exits 0 on SIGTERM: ${host?.stderr}`);
  });

  test('WebSocket: same texts, finish reasons, usage and commits; cancel ends the stream', async () => {
    const [a, b] = await Promise.all([runAll(dev, 'long'), runAll(host, 'long')]);
    for (const [id] of REQS) {
      assert.equal(a[id].done.finish_reason, b[id].done.finish_reason, `${id}: finish_reason`);
      assert.equal(a[id].done.text, b[id].done.text, `${id}: text`);
      assert.deepEqual(a[id].done.usage, b[id].done.usage, `${id}: usage`);
      assert.deepEqual(a[id].commits, b[id].commits, `${id}: every position committed to the same token`);
      assert.equal(a[id].after, 0, `${id}: nothing after done`);
    }
    for (const r of [a, b]) {
      assert.equal(r.long.done.finish_reason, 'cancelled');
      assert.ok(r.long.done.usage.steps < 200, 'stopped early');
      assert.equal(r.long.after, 0, 'nothing after done(cancelled)');
    }
    // commits of the cancelled one: the device's are a prefix of the uncancelled run's order,
    // position by position the same token wherever both committed
    const hostTok = new Map(b.long.commits);
    for (const [i, t] of a.long.commits) if (hostTok.has(i)) assert.equal(t, hostTok.get(i), `long: position ${i}`);
  });

  test('OpenAI client: chat completions (streamed and not) are the same on both servers', async () => {
    const mk = (srv) => new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0 });
    const body = { model: 'tiny', messages: [{ role: 'user', content: 'Write one short sentence.' }], max_tokens: 8,
      block_length: 4, seed: 9, temperature: 0.7, decoder: 'threshold', threshold: 0.3 };
    for (const srv of [dev, host]) srv.client = mk(srv);
    const [x, y] = await Promise.all([dev.client.chat.completions.create(body), host.client.chat.completions.create(body)]);
    assert.equal(x.choices[0].message.content, y.choices[0].message.content);
    assert.equal(x.choices[0].finish_reason, y.choices[0].finish_reason);
    assert.deepEqual(x.usage, y.usage);
    const text = async (srv) => {
      let t = '';
      for await (const ch of await srv.client.chat.completions.create({ ...body, stream: true, seed: 10 }))
        t += ch.choices[0]?.delta?.content ?? '';
      return t;
    };
    const [s1, s2] = await Promise.all([text(dev), text(host)]);
    assert.equal(s1, s2, 'streamed texts');
  });

  test('the device server ran the device loop with graph replays; the host server did not', async () => {
    assert.match(dev.stderr, /device-resident decode loop on/);
    assert.match(dev.stderr, /device decode: graph captured/);
    assert.doesNotMatch(host.stderr, /device-resident decode loop on|device decode:/);
    const [D, H] = await Promise.all([settledStats(dev), settledStats(host)]);
    const d = D.device_loop, h = H.device_loop;
    assert.equal(d.enabled, true);
    assert.ok(d.steps > 0 && d.graph_captures > 0 && d.graph_replays > 0 && d.rebuilds > 0, JSON.stringify(d));
    // every rebuild has a cause; the first one of each batch is a join
    const c = d.rebuild_causes;
    assert.ok(c.join > 0 && c.join + c.leave + c.cancel + c.ineligible >= d.rebuilds, JSON.stringify(d));
    // a host-loop server: the five zero fields, no device details
    assert.deepEqual(h, { enabled: false, steps: 0, rebuilds: 0, graph_captures: 0, graph_replays: 0 });
    assert.ok(d.lm_head_rows_masked > 0 && d.lm_head_rows_masked <= d.lm_head_rows, JSON.stringify(d));
    // step times: the device loop reports GPU time per applied step, the host loop decode_step's
    // wall time; the same requests ran on both servers (same emulated forward), so the means are
    // comparable — a device step timed by its enqueue alone would be ~0
    assert.ok(d.steps_applied > 0 && d.steps_applied <= d.steps, JSON.stringify(d));
    assert.equal(H.host_loop.steps, H.scheduler.steps, 'the host server took host-loop steps only');
    const ratio = d.mean_step_ms / H.host_loop.mean_step_ms;
    assert.ok(ratio > 0.1 && ratio < 10,
      `device step ${d.mean_step_ms.toFixed(2)} ms vs host step ${H.host_loop.mean_step_ms.toFixed(2)} ms (ratio ${ratio.toFixed(2)})`);
    assert.ok(D.scheduler.mean_step_ms > 0.1 * H.scheduler.mean_step_ms, 'the scheduler mean includes device steps honestly');
    // /metrics: the step-latency histogram gets one sample per reported step, device steps with
    // their GPU time
    const hist = async (srv) => {
      const text = await (await fetch(`${srv.base}/metrics`)).text();
      const num = (re) => Number(text.match(re)[1]);
      return { count: num(/^unmask_step_latency_seconds_count (\d+)$/m), sum: num(/^unmask_step_latency_seconds_sum (\S+)$/m) };
    };
    const [mD, mH] = await Promise.all([hist(dev), hist(host)]);
    assert.equal(mD.count, D.scheduler.steps, 'one histogram sample per step');
    assert.ok(mD.count >= d.steps_applied, `device steps are in the histogram (${mD.count} samples, ${d.steps_applied} device steps)`);
    const r2 = (mD.sum / mD.count) / (mH.sum / mH.count);
    assert.ok(r2 > 0.1 && r2 < 10, `histogram mean step: device server ${(1e3 * mD.sum / mD.count).toFixed(2)} ms vs host server ${(1e3 * mH.sum / mH.count).toFixed(2)} ms`);
  });
});

// A stale CUDA graph (docs/decode.md "Stale graphs"): a plain request runs on the device loop with
// a captured graph; a CFG request (host loop) with a long prompt joins the same engine, so its
// forward over 2 canvases outgrows the model's scratch and regrows it under the graph. The graph
// must not be replayed (graph_stale, recaptured), and both texts equal a host-loop server's.
describe('serve: a bigger host-loop forward beside a captured graph', { skip: NO_EMU }, () => {
  let dev, host;
  before(async () => {
    const model = tinyModel('device-loop', EMU);
    const common = ['--device', 'cuda:0', '--max-batch', '4'];
    dev = await startEmuServer({ model, extra: [...common, '--device-loop', 'on'], name: 'stale-dev' });
    host = await startEmuServer({ model, extra: [...common, '--device-loop', 'off'], name: 'stale-host' });
  });
  after(async () => {
    await dev?.stop();
    await host?.stop();
  });
  const PLAIN = { prompt_ids: [5, 6, 7], gen_length: 64, block_length: 4, steps: 64, decoder: 'low_confidence' };
  const CFG = { prompt_ids: Array.from({ length: 80 }, (_, i) => 10 + ((i * 37) % 200)), gen_length: 8,
    block_length: 4, steps: 4, cfg_scale: 1.0 };
  async function run(srv, waitGraph) {
    const c = new Client(srv.wsUrl);
    await c.session();
    c.send({ type: 'generate', id: 'p', ...PLAIN });
    await c.wait((m) => m.id === 'p' && m.type === 'step', 'first step of the plain request');
    if (waitGraph) {
      // poll the server's counters (not time): the plain request's batch replays a graph
      for (let t0 = Date.now(); ;) {
        const st = await (await fetch(`${srv.base}/stats`)).json();
        if (st.device_loop.graph_replays > 0) break;
        if (Date.now() - t0 > 60000) throw new Error(`no graph replay: ${JSON.stringify(st.device_loop)}`);
        await new Promise((r) => setTimeout(r, 20));
      }
    }
    c.send({ type: 'generate', id: 'g', ...CFG });
    const g = await c.done('g');
    const gotPlainFirst = c.msgs.some((m) => m.id === 'p' && m.type === 'done');
    const p = await c.done('p');
    checkGeneration(assert, c.msgs, 'p');
    checkGeneration(assert, c.msgs, 'g');
    await c.close();
    return { p, g, gotPlainFirst };
  }

  test('the stale graph is dropped and recaptured; texts equal the host loop', async () => {
    const [a, b] = await Promise.all([run(dev, true), run(host, false)]);
    assert.equal(a.gotPlainFirst, false, 'the CFG request ran while the plain one was still decoding');
    for (const k of ['p', 'g']) {
      assert.equal(a[k].text, b[k].text, `${k}: same text`);
      assert.equal(a[k].finish_reason, b[k].finish_reason, `${k}: same finish`);
      assert.deepEqual(a[k].usage, b[k].usage, `${k}: same usage`);
    }
    const d = (await settledStats(dev)).device_loop;
    assert.ok(d.graph_stale >= 1, `the graph captured before the CFG forward went stale: ${JSON.stringify(d)}`);
    assert.ok(d.graph_captures >= 2, `and was captured again: ${JSON.stringify(d)}`);
  });
});

// The fault-injection hook (UNMASK_FAULT_FORWARD_FAIL) fails device steps like host steps: the
// same steps stream before the error on both loops, then done(error); the next request is fine.
// The hook does not reshape the schedule: the device loop still keeps a step in flight (a loop
// drained before every step, as the hook once made it, would overlap none).
describe('serve: injected forward failures on the device loop', { skip: NO_EMU }, () => {
  let dev, host;
  const SEED = 777;
  before(async () => {
    const model = tinyModel('device-loop', EMU);
    const common = { model, extra: ['--device', 'cuda:0', '--max-batch', '4', '--verbose'] };
    const fault = { UNMASK_FAULT_FORWARD_FAIL: `seed=${SEED},after=3` };
    dev = await startEmuServer({ ...common, extra: [...common.extra, '--device-loop', 'on'], name: 'device-fault', env: fault });
    host = await startEmuServer({ ...common, extra: [...common.extra, '--device-loop', 'off'], name: 'host-fault', env: fault });
  });
  after(async () => {
    await dev?.stop();
    await host?.stop();
  });

  async function run(srv) {
    const c = new Client(srv.wsUrl);
    await c.session();
    // no KV cache: the device loop pipelines these (a cached batch runs host-planned steps, one in flight)
    c.send({ type: 'generate', id: 'f', prompt: 'Fail me', gen_length: 16, block_length: 4, steps: 16, seed: SEED,
      temperature: 0.5, cache: 'none' });
    const f = await c.done('f');
    c.send({ type: 'generate', id: 'ok', prompt: 'Fine', gen_length: 8, block_length: 4, steps: 4, seed: 1, cache: 'none' });
    const ok = await c.done('ok');
    const steps = c.of('f').filter((m) => m.type === 'step').flatMap((m) => m.commits.map((x) => [x.index, x.token]));
    await c.close();
    return { f, ok, steps };
  }

  test('same steps then done(error) on both loops; the server keeps serving', async () => {
    const [a, b] = await Promise.all([run(dev), run(host)]);
    for (const r of [a, b]) {
      assert.equal(r.f.finish_reason, 'error');
      assert.match(r.f.error?.message ?? JSON.stringify(r.f), /injected by UNMASK_FAULT_FORWARD_FAIL/);
      assert.equal(r.f.usage.steps, 3, 'failed at its 4th step (after=3)');
      assert.equal(r.ok.finish_reason === 'stop' || r.ok.finish_reason === 'length', true, 'the next request finishes');
    }
    assert.deepEqual(a.steps, b.steps, 'the same commits before the failure');
    assert.equal(a.ok.text, b.ok.text);
    assert.match(dev.stderr, /device-resident decode loop on/);
    const d = (await settledStats(dev)).device_loop;
    assert.ok(d.steps_overlapped > 0, `the production schedule with the hook on: steps overlapped ${JSON.stringify(d)}`);
  });
});

// The device batch's LM-head row budget (sched_opts.device_rows = --max-batch x the model's default
// block length, 32 for the tiny preset, reserved by the start-up fit check): a request whose block
// fits runs on the device loop; one asking for a longer block than the budget left runs on the
// host loop (same server, same answer as a host-loop server), so the device never holds more
// logits than the fit check reserved.
describe('serve: device rows budget', { skip: NO_EMU }, () => {
  let dev, host;
  before(async () => {
    const model = tinyModel('device-loop', EMU);
    const common = ['--device', 'cuda:0', '--max-batch', '1'];
    dev = await startEmuServer({ model, extra: [...common, '--device-loop', 'on'], name: 'rows-dev' });
    host = await startEmuServer({ model, extra: [...common, '--device-loop', 'off'], name: 'rows-host' });
  });
  after(async () => {
    await dev?.stop();
    await host?.stop();
  });
  const stats = async (srv) => (await settledStats(srv)).device_loop;
  async function gen(srv, id, block) {
    const c = new Client(srv.wsUrl);
    await c.session();
    c.send({ type: 'generate', id, prompt_ids: [5, 6, 7], gen_length: block, block_length: block, steps: 4 });
    const d = await c.done(id);
    await c.close();
    return d;
  }

  test('a 32-row block runs on the device, a 64-row block on the host loop', async () => {
    const s0 = await stats(dev);
    assert.equal(s0.enabled, true);
    const a = await gen(dev, 'fits', 32);
    const s1 = await stats(dev);
    assert.ok(s1.steps >= s0.steps + 4, `device steps for the 32-row block: ${JSON.stringify([s0, s1])}`);
    const b = await gen(dev, 'over', 64);
    const s2 = await stats(dev);
    assert.equal(s2.steps, s1.steps, `no device steps for the 64-row block: ${JSON.stringify([s1, s2])}`);
    const [ha, hb] = [await gen(host, 'fits', 32), await gen(host, 'over', 64)];
    assert.equal(a.text, ha.text);
    assert.equal(b.text, hb.text);
    assert.equal(b.usage.steps, 4);
  });
});

// LLaDA2 (block diffusion) served: cache-free requests (both device-loop decoders, prompt tails in
// the first block, gen lengths that leave padding) and one with the exact block cache (the server
// default, dual: chunked prefill, then the active block) join each other on the device loop. Every
// text, usage and commit equals a host-loop server's, and device_loop counts their steps.
describe('serve: LLaDA2 on the device loop', { skip: NO_EMU }, () => {
  let dev, host;
  before(async () => {
    const model = makeModelOnce(path.join(TMP, 'model-llada2-device-loop'), ['--preset', 'llada2-tiny'], EMU);
    const common = { model, extra: ['--device', 'cuda:0', '--max-batch', '8'] };
    dev = await startEmuServer({ ...common, extra: [...common.extra, '--device-loop', 'on'], name: 'llada2-device' });
    host = await startEmuServer({ ...common, extra: [...common.extra, '--device-loop', 'off'], name: 'llada2-host' });
  });
  after(async () => {
    const r1 = await dev?.stop();
    const r2 = await host?.stop();
    assert.equal(r1?.code, 0, `device-loop server exits 0 on SIGTERM: ${dev?.stderr}`);
    assert.equal(r2?.code, 0, `host-loop server exits 0 on SIGTERM: ${host?.stderr}`);
  });

  const L2 = [
    ['a', { prompt_ids: [5, 9, 14, 2, 77, 31, 8, 40, 12, 6], gen_length: 7, block_length: 4, steps_per_block: 2,
      decoder: 'low_confidence', cache: 'none' }],
    ['b', { prompt_ids: [3, 1, 4, 1, 5, 9, 2, 6, 5], gen_length: 13, block_length: 8, steps_per_block: 4,
      decoder: 'threshold', threshold: 0.015, temperature: 0.7, seed: 12, cache: 'none', stream: { drafts: true } }],
    ['c', { prompt_ids: [7, 7, 2, 90, 11], gen_length: 9, block_length: 4, decoder: 'threshold', threshold: 0.02,
      cache: 'none' }],
    ['kv', { prompt_ids: [8, 6, 4, 2, 10, 12], gen_length: 8, block_length: 4, steps_per_block: 2,
      decoder: 'low_confidence' }],
  ];
  const run = async (srv) => {
    const c = new Client(srv.wsUrl);
    await c.session();
    for (const [id, body] of L2) {
      c.send({ type: 'generate', id, ...body });
      await c.wait((m) => m.id === id && (m.type === 'step' || m.type === 'done'), `first step of ${id}`);
    }
    const out = {};
    for (const [id] of L2) {
      const done = await c.done(id);
      checkGeneration(assert, c.msgs, id);
      out[id] = { done, steps: c.of(id).filter((m) => m.type === 'step').map((m) => [m.commits, m.drafts ?? null]) };
    }
    await c.close();
    return out;
  };

  test('same events as the host loop; device_loop counts the LLaDA2 requests', async () => {
    const [a, b] = await Promise.all([run(dev), run(host)]);
    for (const [id] of L2) {
      assert.equal(a[id].done.finish_reason, b[id].done.finish_reason, `${id}: finish_reason`);
      assert.equal(a[id].done.text, b[id].done.text, `${id}: text`);
      assert.deepEqual(a[id].done.usage, b[id].done.usage, `${id}: usage`);
      assert.deepEqual(a[id].steps, b[id].steps, `${id}: every step's commits and drafts`);
    }
    const [D, H] = await Promise.all([settledStats(dev), settledStats(host)]);
    const d = D.device_loop;
    // every request took every one of its steps on the device (host-planned, one in flight: each
    // enqueued step applied; a batched step advances several requests). Graphs: these short requests
    // change the batch's shape nearly every step (tests/device/test_device_loop.c checks replays)
    const all = L2.reduce((n, [id]) => n + a[id].done.usage.steps, 0);
    const longest = Math.max(...L2.map(([id]) => a[id].done.usage.steps));
    assert.ok(d.steps >= longest && d.steps <= all && d.steps_applied === d.steps, JSON.stringify(d));
    assert.equal(D.host_loop.steps, 0, `no host-loop step: ${JSON.stringify(D.host_loop)}`);
    assert.ok(d.forward_rows > 0 && d.lm_head_rows > 0, JSON.stringify(d));
    assert.equal(H.device_loop.steps, 0, 'the host server took no device steps');
  });
});

test('generate --device-loop: only on|off', () => {
  const r = spawnSync(process.env.UNMASK_BIN, ['generate', '--model', 'unused', '--prompt-ids', '1,2', '--device-loop',
    'maybe'], { encoding: 'utf8' });
  assert.equal(r.status, 2, 'bad parameter: exit 2');
  assert.match(r.stderr, /--device-loop must be on or off, got 'maybe'/);
});
