// no_chat_template.test.mjs — chat on a model without a chat template gets one answer on every
// transport: the same error (code unsupported, param messages, one message) from a WebSocket
// `generate`, POST /v1/chat/completions (400, streaming or not) and POST /v1/jobs — no
// "role: content" fallback. Raw prompts still work. (The CLI's side: tests/cli/test_generate_errors.sh.)

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Client, TMP, postJson, startServer, tinyModel } from './harness.mjs';

const MESSAGE = 'this model has no chat template; send "prompt" (raw text) instead';

// A copy of the tiny checkpoint whose tokenizer_config.json has no chat_template.
function modelWithoutTemplate() {
  const src = tinyModel('no-chat-template-src');
  const dir = path.join(TMP, `model-no-chat-template-${process.pid}`);
  fs.rmSync(dir, { recursive: true, force: true });
  fs.cpSync(src, dir, { recursive: true });
  const f = path.join(dir, 'tokenizer_config.json');
  const cfg = JSON.parse(fs.readFileSync(f, 'utf8'));
  assert.ok('chat_template' in cfg, 'the tiny model ships a chat template to remove');
  delete cfg.chat_template;
  fs.writeFileSync(f, JSON.stringify(cfg));
  for (const extra of ['chat_template.jinja', 'chat_template.json']) fs.rmSync(path.join(dir, extra), { force: true });
  return dir;
}

describe('chat without a chat template: the same error everywhere', () => {
  let srv;
  let c;
  before(async () => {
    srv = await startServer({ model: modelWithoutTemplate() });
    c = new Client(srv.wsUrl);
    const created = await c.session();
    assert.equal(created.model.chat_template, false, 'the model has no chat template');
    assert.equal(created.model.tokenizer, true, 'but a tokenizer');
  });
  after(async () => {
    await c?.close();
    await srv?.stop();
  });

  const messages = [{ role: 'user', content: 'hi' }];

  test('WebSocket generate refuses messages', async () => {
    c.send({ type: 'generate', id: 'chat', messages, gen_length: 4 });
    const m = await c.wait((x) => x.id === 'chat' && (x.type === 'error' || x.type === 'accepted'), 'reply');
    assert.equal(m.type, 'error', JSON.stringify(m));
    assert.deepEqual(m.error, { code: 'unsupported', message: MESSAGE, param: 'messages' });
  });

  test('HTTP chat completions (plain and streaming) and jobs refuse it with 400 and the same error', async () => {
    for (const stream of [false, true]) {
      const r = await postJson(srv.base, '/v1/chat/completions', { messages, max_tokens: 4, stream });
      assert.equal(r.status, 400, `stream ${stream}: ${JSON.stringify(r.body)}`);
      assert.equal(r.body.error.code, 'unsupported');
      assert.equal(r.body.error.param, 'messages');
      assert.equal(r.body.error.message, MESSAGE);
      assert.equal(r.body.error.type, 'invalid_request_error');
    }
    const j = await postJson(srv.base, '/v1/jobs', { messages, max_tokens: 4 });
    assert.equal(j.status, 400, JSON.stringify(j.body));
    assert.equal(j.body.error.code, 'unsupported');
    assert.equal(j.body.error.param, 'messages');
    assert.equal(j.body.error.message, MESSAGE);
  });

  test('raw prompts still work on both transports', async () => {
    c.send({ type: 'generate', id: 'raw', prompt: 'hi', gen_length: 4, block_length: 4, steps: 4 });
    const d = await c.done('raw');
    assert.equal(d.finish_reason === 'error', false, JSON.stringify(d));
    const r = await postJson(srv.base, '/v1/completions', { prompt: 'hi', max_tokens: 4, block_length: 4, steps: 4 });
    assert.equal(r.status, 200, JSON.stringify(r.body));
  });
});
