// wsauth.test.mjs — API keys on the WebSocket handshake: browsers pass the key as a subprotocol
// next to "unmask" (they cannot set headers), other clients use Authorization: Bearer; a missing
// or wrong key is refused before any session exists. The longest key a browser can send (107
// characters) works; a key file with one no browser could send (longer, or other characters)
// stops the server at start; a credential header with a NUL byte inside never authenticates.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import WebSocket from 'ws';
import { BIN, makeModel, startServer, TMP } from './server.mjs';

let srv;
const KEY = 'sk-ws-key';
const LONGEST = `sk-${'x'.repeat(100)}.~_-`; // 107 characters
before(async () => {
  const keys = path.join(TMP, 'http-wsauth-keys.txt');
  fs.writeFileSync(keys, `${KEY}\n${LONGEST}\n`);
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

// One raw request (bytes as given: no client library would send a NUL in a header); resolves with
// the status line's code (0: closed without an answer).
function raw(head) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(srv.port, '127.0.0.1');
    let data = '';
    sock.setEncoding('latin1');
    sock.on('connect', () => sock.write(Buffer.from(head, 'latin1')));
    sock.on('data', (d) => {
      data += d;
      if (data.includes('\r\n\r\n')) sock.destroy();
    });
    sock.on('close', () => resolve(Number((data.match(/^HTTP\/1\.1 (\d{3})/) || [])[1] || 0)));
    sock.on('error', reject);
    sock.setTimeout(10000, () => sock.destroy(new Error('raw request timed out')));
  });
}
const upgrade = (extra) => 'GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n' +
  'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n' + extra + '\r\n';

test('the longest key a browser can send (107 characters) opens a session', async () => {
  assert.equal(LONGEST.length, 107);
  // exactly what Chromium and Firefox send: the list joined with ", " (126 characters here)
  const header = `Sec-WebSocket-Protocol: unmask, unmask-key.${LONGEST}\r\n`;
  assert.equal(header.length - 'Sec-WebSocket-Protocol: '.length - 2, 126);
  assert.equal(await raw(upgrade(header)), 101);
  const r = await connect(['unmask', `unmask-key.${LONGEST}`]);
  assert.equal(r.first?.type, 'session.created', JSON.stringify(r));
  const h = await fetch(`${srv.url}/v1/models`, { headers: { authorization: `Bearer ${LONGEST}` } });
  assert.equal(h.status, 200);
});

test('keys no browser could send stop the server at start, naming the limit', () => {
  const model = makeModel();
  for (const [name, key, want] of [
    ['long', 'k'.repeat(108), /at most 107 characters, this one has 108/],
    ['huge', 'k'.repeat(401), /at most 107 characters, this one has 401/],
    ['slash', 'sk/abc=', /may only hold letters, digits and/],
  ]) {
    const keys = path.join(TMP, `http-wsauth-bad-${name}.txt`);
    fs.writeFileSync(keys, `${KEY}\n${key}\n`);
    const r = spawnSync(BIN, ['serve', '--store', 'memory', '--model', model, '--host', '127.0.0.1', '--port', '0',
      '--threads', '1', '--api-keys', keys], { encoding: 'utf8', timeout: 60000 });
    assert.equal(r.signal, null, `${name}: the server exited by itself (not kept running): ${r.stderr}`);
    assert.notEqual(r.status, 0, `${name}: exit status`);
    assert.match(r.stderr, want, name);
    assert.ok(r.stderr.includes(`${keys}:2:`), `${name}: file and line named: ${r.stderr}`);
  }
});

test('a NUL inside a credential header never authenticates', async () => {
  const http = (h) => `GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n${h}\r\nConnection: close\r\n\r\n`;
  assert.equal(await raw(http(`Authorization: Bearer ${KEY}`)), 200, 'the same request without the NUL');
  assert.equal(await raw(http(`Authorization: Bearer ${KEY}\0junk`)), 401);
  assert.equal(await raw(http(`x-api-key: ${KEY}\0junk`)), 401);
  assert.equal(await raw(upgrade(`Sec-WebSocket-Protocol: unmask\r\nAuthorization: Bearer ${KEY}\r\n`)), 101);
  assert.notEqual(await raw(upgrade(`Sec-WebSocket-Protocol: unmask\r\nAuthorization: Bearer ${KEY}\0junk\r\n`)), 101);
  assert.notEqual(await raw(upgrade(`Sec-WebSocket-Protocol: unmask\r\nx-api-key: ${KEY}\0junk\r\n`)), 101);
  assert.notEqual(await raw(upgrade(`Sec-WebSocket-Protocol: unmask, unmask-key.${KEY}\0junk\r\n`)), 101);
});
