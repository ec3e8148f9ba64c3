// quant.test.mjs — `unmask serve --quant`: a server whose weights are quantized at load (q4_0 from
// the flag, q8_0 from the config file's "quant" key) answers completions, says so in its log, and
// reports the setting in GET /stats; an unknown type, and fp8 on the CPU (CUDA only), are refused at
// start with exit 2, before listening.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { BIN, TMP, makeModel, post, startServer } from './server.mjs';

async function servesQuantized(srv, want) {
  const r = await post(`${srv.url}/v1/completions`, { prompt: 'a b c', max_tokens: 16, temperature: 0 });
  assert.equal(r.status, 200, r.text);
  const body = r.json();
  assert.equal(body.choices.length, 1);
  assert.ok(body.usage.completion_tokens > 0, 'tokens were generated');
  const stats = await (await fetch(`${srv.url}/stats`)).json();
  assert.equal(stats.settings.quant, want);
  assert.match(srv.logs(), new RegExp(`weights quantized to ${want}`));
}

test('--quant q4_0: completions on quantized weights, reported in /stats', async () => {
  const srv = await startServer(['--quant', 'q4_0']);
  try {
    await servesQuantized(srv, 'q4_0');
  } finally {
    await srv.stop();
  }
});

test('"quant": "q8_0" in the config file', async () => {
  const cfg = path.join(TMP, 'quant-serve.json');
  fs.writeFileSync(cfg, JSON.stringify({ quant: 'q8_0' }));
  const srv = await startServer(['--config', cfg]);
  try {
    await servesQuantized(srv, 'q8_0');
  } finally {
    await srv.stop();
  }
});

test('an unknown --quant is refused at start', () => {
  const r = spawnSync(BIN, ['serve', '--store', 'memory', '--model', makeModel(), '--port', '0', '--quant', 'q3_k'],
    { encoding: 'utf8', timeout: 60000 });
  assert.equal(r.status, 2);
  assert.match(r.stderr, /--quant must be one of bf16, q8_0, q4_0, fp8, got 'q3_k'/);
});

test('--quant fp8 on the CPU is refused at start, before listening', () => {
  const r = spawnSync(BIN, ['serve', '--store', 'memory', '--model', makeModel(), '--port', '0', '--quant', 'fp8'],
    { encoding: 'utf8', timeout: 60000 });
  assert.equal(r.status, 2);
  assert.match(r.stderr, /--quant fp8 needs a CUDA device \(Hopper FP8 weights\); on the CPU use q8_0 or q4_0/);
  assert.doesNotMatch(r.stdout + r.stderr, /listening/);
});
