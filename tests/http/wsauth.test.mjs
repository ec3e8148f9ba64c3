// wsauth.test.mjs — API keys on the WebSocket handshake: browsers pass the key as a subprotocol
// next to "unmask" (they cannot set headers), other clients use Authorization: Bearer; a missing
// or wrong key is refused before any session exists.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import WebSocket from 'ws';
import { startServer, TMP } from './server.mjs';

let srv;
const KEY = 'sk-ws-key';
before(async () => {
  const keys = path.join(TMP, 'http-wsauth-keys.txt');
  fs.writeFileSync(keys, `${KEY}\n`);
  srv = await startServer(['--api-keys', keys]);
});
after(async () => {
  await srv?.stop();
});

// Resolves with the first message (opened) or {refused: reason}.
function connect(protocols, headers = {}) {
  return new Promise((resolve) => {
    const ws = new WebSocket(`${srv.url.replace('http', 'ws')}/ws`, protocols, { headers });
    ws.on('message', (d) => {
      resolve({ first: JSON.parse(String(d)), protocol: ws.protocol });
      ws.close();
    });
    ws.on('unexpected-response', (_req, res) => resolve({ refused: `http ${res.statusCode}` }));
    ws.on('error', (e) => resolve({ refused: e.message }));
    ws.on('close', () => resolve({ refused: 'closed' }));
  });
}

test('subprotocol key (browser style) opens a session', async () => {
  const r = await connect(['unmask', `unmask-key.${KEY}`]);
  assert.equal(r.first?.type, 'session.created', JSON.stringify(r));
  assert.equal(r.protocol, 'unmask');
  const o = await connect(['unmask', `openai-insecure-api-key.${KEY}`]);
  assert.equal(o.first?.type, 'session.created');
});

test('Authorization: Bearer opens a session', async () => {
  const r = await connect(['unmask'], { authorization: `Bearer ${KEY}` });
  assert.equal(r.first?.type, 'session.created', JSON.stringify(r));
});

test('missing or wrong keys are refused', async () => {
  for (const [protocols, headers] of [
    [['unmask'], {}],
    [['unmask', 'unmask-key.wrong'], {}],
    [['unmask'], { authorization: 'Bearer nope' }],
    [['unmask'], { authorization: `Basic ${KEY}` }],
  ]) {
    const r = await connect(protocols, headers);
    assert.ok(r.refused, `refused: ${JSON.stringify({ protocols, headers, r })}`);
  }
});
