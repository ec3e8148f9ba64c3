// tls.test.mjs — https/wss with a development certificate made at test time by
// certs/make-dev-certs.sh: a wss round trip (generation) verified against the dev CA, https
// /health; plain TCP/HTTP to the TLS port fails cleanly, old TLS versions and TLS 1.2 CBC suites
// are refused, responses carry HSTS, pipelined requests over TLS neither crash nor freeze the
// server, and the server stays up for the next TLS client.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import tls from 'node:tls';
import { after, before, describe, test } from 'node:test';
import { Client, TMP, checkGeneration, checkSeqContiguous, makeDevCerts, startServer, tinyModel } from './harness.mjs';

describe('tls', () => {
  let srv;
  let certs;
  before(async () => {
    certs = makeDevCerts(path.join(TMP, 'tls-certs'));
    srv = await startServer({ model: tinyModel('tls'), tls: certs });
  });
  after(async () => {
    const r = await srv.stop();
    assert.equal(r.code, 0, srv.stderr);
  });

  async function wssRoundTrip(id) {
    const c = new Client(srv.wsUrl, { ca: fs.readFileSync(certs.ca), servername: 'localhost' });
    await c.opened;
    await c.session();
    c.send({ type: 'generate', id, prompt: 'secure hello', gen_length: 8, block_length: 8, steps: 4 });
    await c.done(id);
    checkGeneration(assert, c.msgs, id);
    checkSeqContiguous(assert, c.msgs);
    await c.close();
  }

  test('wss round trip and https /health, verified against the development CA', async () => {
    assert.match(srv.wsUrl, /^wss:/);
    const h = await srv.get('/health');
    assert.equal(h.status, 200);
    assert.equal(JSON.parse(h.body).status, 'ok');
    await wssRoundTrip('tls1');
  });

  test('an untrusted client refuses the certificate (it really is TLS with our cert)', async () => {
    const c = new Client(srv.wsUrl); // no CA: the self-made chain must not verify
    await assert.rejects(c.opened, /self[- ]signed|unable to verify|certificate/i);
  });

  test('plain HTTP to the TLS port fails cleanly; the server stays up', async () => {
    const reply = await new Promise((resolve) => {
      const s = net.connect(srv.port, '127.0.0.1');
      let data = '';
      s.on('connect', () => s.write('GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n'));
      s.on('data', (d) => (data += d.toString('latin1')));
      s.on('close', () => resolve(data));
      s.on('error', () => resolve(data));
      s.setTimeout(10000, () => s.destroy());
    });
    assert.doesNotMatch(reply, /^HTTP\/1\.1 200/, 'no plaintext HTTP answer on the TLS port');
    assert.doesNotMatch(reply, /"status":"ok"/);
    const ws = new Client(`ws://127.0.0.1:${srv.port}/ws`); // plain ws to a wss port
    await assert.rejects(ws.opened);
    await wssRoundTrip('tls2');
  });

  test('TLS 1.1 is refused, TLS 1.2 and 1.3 are accepted', async () => {
    const hello = (opts) => new Promise((resolve, reject) => {
      const s = tls.connect({ host: '127.0.0.1', port: srv.port, ca: fs.readFileSync(certs.ca), servername: 'localhost', ...opts });
      s.on('secureConnect', () => {
        const v = s.getProtocol();
        s.end();
        resolve(v);
      });
      s.on('error', reject);
    });
    assert.equal(await hello({ minVersion: 'TLSv1.2', maxVersion: 'TLSv1.2' }), 'TLSv1.2');
    assert.equal(await hello({ minVersion: 'TLSv1.3', maxVersion: 'TLSv1.3' }), 'TLSv1.3');
    await assert.rejects(hello({ minVersion: 'TLSv1', maxVersion: 'TLSv1.1', ciphers: 'DEFAULT:@SECLEVEL=0' }));
    await wssRoundTrip('tls3');
  });
  test('TLS 1.2 offers only forward-secret AEAD suites (no CBC); HSTS on responses', async () => {
    const hello = (ciphers) => new Promise((resolve, reject) => {
      const s = tls.connect({ host: '127.0.0.1', port: srv.port, ca: fs.readFileSync(certs.ca), servername: 'localhost',
        minVersion: 'TLSv1.2', maxVersion: 'TLSv1.2', ciphers });
      s.on('secureConnect', () => {
        const c = s.getCipher().name;
        s.end();
        resolve(c);
      });
      s.on('error', reject);
    });
    // (whatever the certificate's key type: each suite is named for RSA and ECDSA)
    for (const cbc of ['ECDHE-RSA-AES128-SHA:ECDHE-ECDSA-AES128-SHA', 'ECDHE-RSA-AES256-SHA384:ECDHE-ECDSA-AES256-SHA384',
      'AES128-SHA256', 'AES256-SHA'])
      await assert.rejects(hello(cbc), `CBC suite ${cbc} refused`);
    await assert.rejects(hello('AES128-GCM-SHA256'), 'static-RSA key exchange refused');
    assert.match(await hello('ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-SHA:ECDHE-ECDSA-AES128-SHA'), /GCM/);
    const h = await srv.get('/health');
    assert.match(h.headers['strict-transport-security'] || '', /max-age=\d+/);
  });

  test('pipelined requests over TLS: the first is answered, nothing freezes', async () => {
    const body = JSON.stringify({ prompt: 'tls pipe', max_tokens: 4 });
    for (const bytes of [
      `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}GET /health HTTP/1.1\r\nHost: x\r\n\r\n`,
      `GET /health HTTP/1.1\r\nHost: x\r\n\r\nPOST /nope HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}`,
    ]) {
      const reply = await new Promise((resolve, reject) => {
        const s = tls.connect({ host: '127.0.0.1', port: srv.port, ca: fs.readFileSync(certs.ca), servername: 'localhost' });
        let data = '';
        s.on('secureConnect', () => s.write(bytes));
        s.on('data', (d) => {
          data += d.toString('latin1');
          // both answered, or the first one with Connection: close and the server closes
          if ((data.match(/HTTP\/1\.1 \d{3}/g) || []).length === 2 && /\r\n\r\n[^]*\r\n\r\n[^]+$/.test(data)) s.end();
        });
        s.on('close', () => resolve(data));
        s.on('error', reject);
        s.setTimeout(20000, () => reject(new Error(`no answer/close within 20 s: ${data.slice(0, 300)}`)));
      });
      const statuses = (reply.match(/HTTP\/1\.1 (\d{3})/g) || []).map((x) => Number(x.slice(9)));
      assert.equal(statuses[0], 200, reply.slice(0, 300));
      if (statuses.length === 1) assert.match(reply, /\r\nconnection: close\r\n/i);
    }
    await wssRoundTrip('tls4');
  });
});
