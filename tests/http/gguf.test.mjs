// gguf.test.mjs — `unmask serve --model FILE.gguf`: a tiny checkpoint written as GGUF by the tests'
// own writer (tests/reference/gguf_convert.py, the way llama.cpp's converter writes it: LLaDA's q / k
// rows permuted, tokenizer and chat template in the metadata) is served like its safetensors
// directory: /v1/models names the file without ".gguf", and chat / text completions and a WebSocket
// generation (same seed, sampled and greedy) answer exactly what the directory's server answers —
// the same prompt tokens (the file's tokenizer and template) and the same text (the same weights).
// A GGUF file unmask cannot read (a K-quant tensor) is refused at start: exit 2, one line naming the
// file, the tensor and its type, nothing listening.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { Client, checkGeneration } from '../protocol/harness.mjs';
import { BIN, TMP, makeModel, post, startServer } from './server.mjs';

const SRC = process.env.UNMASK_SOURCE_DIR;
let dir, dirSrv, ggufSrv;

// Write checkpoint directory src as GGUF file dst (renamed into place) with gguf_convert.convert's
// keyword arguments kw (a Python expression list; gw is gguf_write).
function convert(src, dst, kw) {
  const tmp = `${dst}.tmp-${process.pid}`;
  const py = `import sys; sys.path.insert(0, sys.argv[1]); import gguf_convert as gc, gguf_write as gw; gc.convert(sys.argv[2], sys.argv[3], ${kw})`;
  const r = spawnSync('/usr/bin/python3', ['-c', py, path.join(SRC, 'tests/reference'), src, tmp], { encoding: 'utf8' });
  assert.equal(r.status, 0, `gguf_convert.py failed: ${r.stderr}`);
  fs.renameSync(tmp, dst);
  return dst;
}

before(async () => {
  dir = makeModel('http-gguf-src', ['--preset', 'tiny', '--dtype', 'bf16']);
  const file = convert(dir, path.join(TMP, 'served-tiny.gguf'), "'bf16'");
  [dirSrv, ggufSrv] = await Promise.all([startServer([], { model: dir }), startServer([], { model: file })]);
});
after(async () => {
  await Promise.all([dirSrv?.stop(), ggufSrv?.stop()]);
});

test('/v1/models: the file name without .gguf', async () => {
  const j = await (await fetch(`${ggufSrv.url}/v1/models`)).json();
  assert.deepEqual(j.data.map((m) => m.id), ['served-tiny']);
});

test('chat completion from the GGUF metadata equals the directory', async () => {
  for (const extra of [{ temperature: 0, seed: 4 }, { temperature: 1, seed: 9 }]) {
    const body = { model: 'x', messages: [{ role: 'user', content: 'Say something short.' }], max_tokens: 16, ...extra };
    const [a, b] = await Promise.all([post(`${dirSrv.url}/v1/chat/completions`, body), post(`${ggufSrv.url}/v1/chat/completions`, body)]);
    assert.equal(a.status, 200, a.text);
    assert.equal(b.status, 200, b.text);
    assert.equal(b.json().choices[0].message.content, a.json().choices[0].message.content, JSON.stringify(extra));
    assert.deepEqual(b.json().usage, a.json().usage, 'the same prompt tokens: the template and tokenizer match');
  }
});

test('text completion equals the directory', async () => {
  const body = { model: 'x', prompt: 'def add(a, b):', max_tokens: 16, temperature: 0, seed: 2 };
  const [a, b] = await Promise.all([post(`${dirSrv.url}/v1/completions`, body), post(`${ggufSrv.url}/v1/completions`, body)]);
  assert.equal(a.status, 200, a.text);
  assert.equal(b.status, 200, b.text);
  assert.equal(b.json().choices[0].text, a.json().choices[0].text);
  assert.deepEqual(b.json().usage, a.json().usage);
});

test('WebSocket generate (chat messages, sampled with a seed) equals the directory', async () => {
  const run = async (srv) => {
    const c = new Client(`${srv.url.replace('http', 'ws')}/ws`);
    try {
      await c.session();
      c.send({ type: 'generate', id: 'g', messages: [{ role: 'user', content: 'Name a colour.' }], gen_length: 16, block_length: 8,
        steps: 16, temperature: 0.8, seed: 21 });
      await c.done('g');
      return checkGeneration(assert, c.msgs, 'g');
    } finally {
      await c.close();
    }
  };
  const [a, b] = await Promise.all([run(dirSrv), run(ggufSrv)]);
  assert.equal(a.error, null, JSON.stringify(a));
  assert.equal(b.error, null, JSON.stringify(b));
  assert.ok(b.usage.prompt_tokens > 4, 'the chat template was applied');
  assert.equal(b.usage.prompt_tokens, a.usage.prompt_tokens, 'the same prompt tokens: the template and tokenizer match');
  assert.equal(b.text, a.text);
  assert.equal(b.finish_reason, a.finish_reason);
});

test('a GGUF file with a K-quant tensor is refused at start: exit 2, one clear line', () => {
  const wide = makeModel('http-gguf-wide', ['--preset', 'tiny', '--dtype', 'f32', '--d-model', '256', '--n-heads', '4', '--ffn', '512']);
  const bad = convert(wide, path.join(TMP, 'http-q4k.gguf'), "'f32', override_types={'blk.0.attn_q.weight': gw.T_Q4_K}");
  const r = spawnSync(BIN, ['serve', '--store', 'memory', '--model', bad, '--host', '127.0.0.1', '--port', '0', '--threads', '1'],
    { encoding: 'utf8', timeout: 120000 });
  assert.equal(r.status, 2, `exit ${r.status} ${r.signal}: ${r.stderr}`);
  assert.doesNotMatch(r.stdout, /listening/i, 'refused before listening');
  const lines = r.stderr.trim().split('\n');
  assert.equal(lines.length, 1, r.stderr);
  assert.match(lines[0], /http-q4k\.gguf: tensor blk\.0\.attn_q\.weight has type Q4_K, which unmask does not support; supported: F32, F16, BF16, Q8_0, Q4_0/);
});
