// proxy.test.mjs — behind a reverse proxy (--trusted-proxies): the client named by X-Forwarded-For
// is the caller for per-address rate limits and quotas, HTTP and WebSocket alike; the right-most
// entry that is not a trusted proxy counts (entries to its left could be forged by the client);
// without --trusted-proxies the header is ignored (anyone could send it).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Client } from '../protocol/harness.mjs';
import { startServer } from './server.mjs';

let trusting;
let plain;
before(async () => {
  // one request per caller, then 429 for a very long time; one WebSocket session per caller
  const limits = ['--rate-limit', '0.0001', '--rate-burst', '1', '--key-max-sessions', '1'];
  trusting = await startServer(['--trusted-proxies', '127.0.0.1/32,::1', ...limits]);
  plain = await startServer(limits);
});
after(async () => {
  await trusting?.stop();
  await plain?.stop();
});

const get = (srv, xff) => fetch(`${srv.url}/v1/models`, { headers: xff ? { 'x-forwarded-for': xff } : {} }).then((r) => r.status);

test('HTTP: each forwarded client has its own rate limit; forged left entries do not matter', async () => {
  assert.equal(await get(trusting, '203.0.113.1'), 200);
  assert.equal(await get(trusting, '203.0.113.1'), 429, 'the same client again');
  assert.equal(await get(trusting, '203.0.113.2'), 200, 'another client');
  assert.equal(await get(trusting, '198.51.100.7, 203.0.113.3'), 200);
  assert.equal(await get(trusting, '9.9.9.9, 203.0.113.3'), 429, 'the client is the right-most untrusted entry');
  assert.equal(await get(trusting, '203.0.113.4, 127.0.0.1'), 200, 'a chain of trusted proxies is skipped');
  assert.equal(await get(trusting, ' 203.0.113.4 '), 429);
});

test('HTTP: without --trusted-proxies, X-Forwarded-For is ignored', async () => {
  assert.equal(await get(plain, '203.0.113.1'), 200);
  assert.equal(await get(plain, '203.0.113.2'), 429, 'every request comes from the same peer');
});

test('WebSocket: the session quota counts forwarded clients', async () => {
  const ws = (xff) => new Client(`ws://127.0.0.1:${trusting.port}/ws`, { headers: { 'x-forwarded-for': xff } });
  const a1 = ws('203.0.113.10');
  await a1.session();
  const a2 = ws('203.0.113.10');
  const closed = await a2.closedP;
  assert.equal(closed.code, 1013, 'a second session of the same client is over its quota');
  const b = ws('203.0.113.11');
  await b.session();
  await a1.close();
  await b.close();
});
