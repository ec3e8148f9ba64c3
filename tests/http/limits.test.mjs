// limits.test.mjs — server-wide settings of the HTTP APIs: the SGLang-style algorithm config
// (YAML or JSON) becomes every request's decoder defaults, a bad config is refused at startup
// naming file:line, and a full queue answers 503 with Retry-After (+ retry-after-ms).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { startServer, makeModel, post, BIN, TMP, until } from './server.mjs';

test('--algorithm-config (YAML) sets the decoder defaults; requests still override them', async () => {
  const cfg = path.join(TMP, 'http-algo.yaml');
  fs.writeFileSync(cfg, '# SGLang dLLM algorithm config\nalgorithm: LowConfidence\nthreshold: 0.8   # tau\nblock_size: 16\n');
  const srv = await startServer(['--algorithm-config', cfg]);
  try {
    const r = (await post(`${srv.url}/infill`, { input_prefix: 'a', input_suffix: 'b', n_predict: 32 })).json();
    assert.equal(r.generation_settings.decoder, 'threshold', 'LowConfidence = threshold decoding');
    assert.equal(r.generation_settings.threshold, 0.8);
    assert.equal(r.generation_settings.block_length, 16);
    const o = (await post(`${srv.url}/infill`, { input_prefix: 'a', n_predict: 32, decoder: 'low_confidence', block_length: 8 })).json();
    assert.equal(o.generation_settings.decoder, 'low_confidence');
    assert.equal(o.generation_settings.block_length, 8);
  } finally {
    await srv.stop();
  }
  const json = path.join(TMP, 'http-algo.json');
  fs.writeFileSync(json, '{"algorithm": "low_confidence", "steps": 8}');
  const s2 = await startServer(['--algorithm-config', json]);
  try {
    const r = (await post(`${s2.url}/v1/completions`, { prompt: 'x', max_tokens: 16 })).json();
    assert.equal(r.usage.diffusion_steps, 8, 'steps from the JSON config');
  } finally {
    await s2.stop();
  }
});

test("SGLang's launch flags as SGLang users type them: --model-path, --dllm-algorithm, --dllm-algorithm-config", async () => {
  const dir = fs.mkdtempSync(path.join(TMP, 'sglang-launch-'));
  const cfg = path.join(dir, 'config.yaml');
  fs.writeFileSync(cfg, 'threshold: 0.95\nblock_size: 32\n');
  // unmask serve --model-path DIR --dllm-algorithm LowConfidence --dllm-algorithm-config ./config.yaml --host 0.0.0.0 --port P
  // (port 0: any free port; the working directory holds the default job store)
  const srv = await startServer([], {
    cwd: dir,
    base: ['--model-path', makeModel(), '--dllm-algorithm', 'LowConfidence', '--dllm-algorithm-config', './config.yaml',
      '--host', '0.0.0.0', '--port', '0'],
  });
  try {
    const r = (await post(`${srv.url}/generate`, { text: 'def f(x):', sampling_params: { max_new_tokens: 64 } })).json();
    assert.equal(typeof r.text, 'string');
    const g = (await post(`${srv.url}/infill`, { input_prefix: 'a', input_suffix: 'b', n_predict: 64 })).json();
    assert.equal(g.generation_settings.decoder, 'threshold', 'LowConfidence is the threshold decoder');
    assert.equal(g.generation_settings.threshold, 0.95, 'threshold from the config file');
    assert.equal(g.generation_settings.block_length, 32, 'block_size from the config file');
  } finally {
    await srv.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  }
  // an unknown algorithm, or a config naming another one, stops the server before it listens
  const bad = spawnSync(BIN, ['serve', '--store', 'memory', '--model-path', makeModel(), '--port', '0', '--dllm-algorithm', 'Greedy'],
    { encoding: 'utf8', timeout: 20000 });
  assert.notEqual(bad.status, 0);
  assert.match(bad.stderr, /--dllm-algorithm must be LowConfidence, JointThreshold, HierarchyBlock or one of .*got 'Greedy'/);
  const other = path.join(TMP, 'sglang-other.yaml');
  fs.writeFileSync(other, 'algorithm: random\n');
  const clash = spawnSync(BIN, ['serve', '--store', 'memory', '--model-path', makeModel(), '--port', '0', '--dllm-algorithm', 'LowConfidence',
    '--dllm-algorithm-config', other], { encoding: 'utf8', timeout: 20000 });
  assert.notEqual(clash.status, 0);
  assert.match(clash.stderr, /--dllm-algorithm LowConfidence is the threshold decoder, but .* names algorithm random/);
});

test('a bad algorithm config stops `unmask serve` with file:line and the key', () => {
  const cfg = path.join(TMP, 'http-algo-bad.yaml');
  fs.writeFileSync(cfg, 'threshold: 0.9\nthreshhold: 0.8\n');
  const r = spawnSync(BIN, ['serve', '--store', 'memory', '--model', makeModel(), '--port', '0', '--algorithm-config', cfg], { encoding: 'utf8', timeout: 20000 });
  assert.equal(r.status, 2);
  assert.match(r.stderr, /http-algo-bad\.yaml:2: unknown algorithm config key 'threshhold'/);
  const bad = spawnSync(BIN, ['serve', '--store', 'memory', '--model', makeModel(), '--port', '0', '--rate-limit', '-1'], { encoding: 'utf8', timeout: 20000 });
  assert.equal(bad.status, 2);
  assert.match(bad.stderr, /--rate-limit must be >= 0/);
});

test('a full queue answers 503 with Retry-After and retry-after-ms', async () => {
  const model = makeModel('http-slow', ['--d-model', '512', '--n-layers', '8']);
  const srv = await startServer(['--max-batch', '1', '--max-queue', '0'], { model });
  try {
    const ac = new AbortController();
    const running = fetch(`${srv.url}/v1/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, signal: ac.signal,
      body: JSON.stringify({ prompt: 'long', max_tokens: 32, block_length: 8, stream: true }),
    });
    const res = await running;
    const reader = res.body.getReader();
    await reader.read(); // the stream is admitted and running
    await until('active sequence', async () => /^unmask_active_sequences 1$/m.test(await (await fetch(`${srv.url}/metrics`)).text()));
    const r = await post(`${srv.url}/v1/chat/completions`, { messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 });
    assert.equal(r.status, 503);
    const e = r.json().error;
    assert.equal(e.code, 'queue_full');
    assert.equal(e.type, 'server_error');
    assert.equal(r.headers.get('retry-after'), '1');
    assert.equal(r.headers.get('retry-after-ms'), '1000');
    assert.equal(r.headers.get('x-should-retry'), 'true');
    ac.abort(); // closing the stream cancels its generation
    await until('engine idle after the client left',
      async () => /^unmask_active_sequences 0$/m.test(await (await fetch(`${srv.url}/metrics`)).text()));
    const ok = await post(`${srv.url}/v1/chat/completions`, { messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 });
    assert.equal(ok.status, 200);
    const m = await (await fetch(`${srv.url}/metrics`)).text();
    assert.match(m, /unmask_requests_finished_total\{finish_reason="cancelled"\} 1/);
  } finally {
    await srv.stop();
  }
});
