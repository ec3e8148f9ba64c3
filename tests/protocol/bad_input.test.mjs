// bad_input.test.mjs — hostile or broken input gets a clear error event or close code, the server
// stays up, and a bystander session generating at the same time is unaffected: non-JSON, wrong
// types, unknown type, a 10 MB message, binary frames, invalid UTF-8, forged resume token, cancel
// of an unknown id, bad decode parameters, WebSocket on a wrong path, path traversal in static URLs.

import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, describe, test } from 'node:test';
import { Client, checkGeneration, checkSeqContiguous, startServer, tinyModel } from './harness.mjs';

// One raw HTTP/1.1 request line exactly as given (no URL normalisation by a client library).
function rawGet(port, target) {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1');
    let data = '';
    s.setEncoding('latin1');
    s.on('connect', () => s.write(`GET ${target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`));
    s.on('data', (d) => (data += d));
    s.on('end', () => resolve({ status: Number((data.match(/^HTTP\/1\.\d (\d{3})/) || [])[1] || 0), text: data }));
    s.on('error', reject);
    s.setTimeout(10000, () => s.destroy(new Error('raw GET timed out')));
  });
}

describe('bad input', () => {
  let srv;
  let bystander;
  before(async () => {
    srv = await startServer({ model: tinyModel('bad-input') });
    // a well-behaved session generating throughout the whole suite
    bystander = new Client(srv.wsUrl);
    await bystander.session();
    bystander.send({ type: 'generate', id: 'steady', prompt_ids: [1, 2, 3], gen_length: 64, block_length: 16, steps: 64 });
    await bystander.wait((m) => m.type === 'accepted' && m.id === 'steady');
  });
  after(async () => {
    // the bystander finished normally, seq intact, and the server is healthy
    await bystander.done('steady');
    checkGeneration(assert, bystander.msgs, 'steady');
    checkSeqContiguous(assert, bystander.msgs);
    assert.equal((await srv.get('/health')).status, 200);
    await bystander.close();
    const r = await srv.stop();
    assert.equal(r.code, 0, `clean exit after all that; stderr: ${srv.stderr}`);
  });

  async function errorFor(c, raw) {
    const before = c.msgs.length;
    c.send(raw);
    return c.wait((m) => m.type === 'error' && c.msgs.indexOf(m) >= before, `error for ${String(raw).slice(0, 40)}`);
  }

  test('malformed messages: each gets an error event, the connection stays usable', async () => {
    const c = new Client(srv.wsUrl);
    await c.session();
    assert.equal((await errorFor(c, 'this is not json')).error.code, 'invalid_json');
    assert.equal((await errorFor(c, '{"type":"generate",')).error.code, 'invalid_json');
    assert.equal((await errorFor(c, '[1,2,3]')).error.code, 'invalid_message');
    assert.equal((await errorFor(c, '{"no_type":1}')).error.code, 'invalid_message');
    assert.equal((await errorFor(c, '{"type":5}')).error.code, 'invalid_message');
    const unk = await errorFor(c, JSON.stringify({ type: 'fly', event_id: 'u1' }));
    assert.equal(unk.error.code, 'unknown_type');
    assert.equal(unk.event_id, 'u1');
    const utf = await errorFor(c, JSON.stringify({ type: `a${'é'.repeat(40)}`, event_id: 'u2' })); // quoted, cut at 64 bytes
    assert.equal(utf.error.code, 'unknown_type');
    assert.equal(utf.event_id, 'u2');
    const dup = await errorFor(c, '{"type":"ping","type":"ping"}');
    assert.equal(dup.error.code, 'invalid_json');
    const longEv = await errorFor(c, JSON.stringify({ type: 'ping', event_id: 'x'.repeat(200) }));
    assert.equal(longEv.error.param, 'event_id');
    c.send({ type: 'ping', event_id: 'alive' });
    await c.wait((m) => m.type === 'pong' && m.event_id === 'alive');
    checkSeqContiguous(assert, c.msgs);
    await c.close();
  });

  test('bad generate requests name the offending parameter', async () => {
    const c = new Client(srv.wsUrl);
    await c.session();
    const cases = [
      [{ prompt_ids: [1], gen_length: 'many' }, 'gen_length'],
      [{ prompt_ids: [1], gen_length: -4 }, 'gen_length'],
      [{ prompt_ids: 'abc' }, 'prompt_ids'],
      [{ prompt_ids: [1, -2] }, 'prompt_ids'],
      [{ prompt_ids: [999999] }, null],
      [{ prompt: 42 }, 'prompt'],
      [{}, 'prompt'],
      [{ prompt: 'a', prompt_ids: [1] }, 'prompt'],
      [{ prompt_ids: [1], decoder: 'teleport' }, 'decoder'],
      [{ prompt_ids: [1], temperature: -1 }, 'temperature'],
      [{ prompt_ids: [1], stream: { drafts: 'yes' } }, 'stream.drafts'],
      [{ prompt_ids: [1], stream: 7 }, 'stream'],
      [{ prompt_ids: [1], id: 'bad id with spaces' }, 'id'],
      [{ prompt_ids: [1], gen_length: 100000 }, null],
    ];
    for (const [body, param] of cases) {
      const ev = `bad-${cases.indexOf(cases.find((x) => x[0] === body))}`;
      const e = await errorFor(c, JSON.stringify({ type: 'generate', event_id: ev, ...body }));
      assert.ok(['invalid_request', 'unsupported'].includes(e.error.code), `${JSON.stringify(body)} -> ${e.error.code}`);
      assert.equal(e.event_id, ev);
      assert.ok(e.error.message.length > 5);
      if (param) assert.equal(e.error.param, param, `${JSON.stringify(body)}: ${e.error.message}`);
    }
    // unknown fields are accepted but reported back
    c.send({ type: 'generate', id: 'ok', prompt_ids: [1], gen_length: 8, block_length: 8, steps: 4, temprature: 0.5 });
    const acc = await c.wait((m) => m.type === 'accepted' && m.id === 'ok');
    assert.deepEqual(acc.ignored_fields, ['temprature']);
    await c.done('ok');
    await c.close();
  });

  test('cancel of an unknown id; forged resume token', async () => {
    const c = new Client(srv.wsUrl);
    await c.session();
    const e1 = await errorFor(c, JSON.stringify({ type: 'cancel', event_id: 'c', id: 'nope' }));
    assert.equal(e1.error.code, 'unknown_generation');
    assert.equal(e1.id, 'nope');
    const e2 = await errorFor(c, JSON.stringify({ type: 'cancel', id: 5 }));
    assert.equal(e2.error.code, 'invalid_request');
    const e3 = await errorFor(c, JSON.stringify({ type: 'session.resume', session: '0'.repeat(64), last_seq: 0 }));
    assert.equal(e3.error.code, 'unknown_session');
    // the bystander's real token with a forged last_seq is refused too (no state change)
    const e4 = await errorFor(c, JSON.stringify({ type: 'session.resume', session: bystander.msgs[0].session, last_seq: -1 }));
    assert.equal(e4.error.code, 'invalid_request');
    await c.close();
  });

  test('binary frames get an error event', async () => {
    const c = new Client(srv.wsUrl);
    await c.session();
    c.ws.send(Buffer.from([1, 2, 3, 4]), { binary: true });
    const e = await c.wait((m) => m.type === 'error');
    assert.equal(e.error.code, 'binary_not_supported');
    c.send({ type: 'ping', event_id: 'still' });
    await c.wait((m) => m.type === 'pong' && m.event_id === 'still');
    await c.close();
  });

  test('invalid UTF-8 in a text frame closes with 1007', async () => {
    const c = new Client(srv.wsUrl);
    await c.session();
    c.ws.send(Buffer.from([0x7b, 0x22, 0xff, 0xfe, 0x22, 0x7d]), { binary: false });
    const closed = await c.closedP;
    assert.equal(closed.code, 1007);
  });

  test('a 10 MB message closes with 1009', async () => {
    const c = new Client(srv.wsUrl);
    await c.session();
    const big = JSON.stringify({ type: 'generate', prompt: 'x'.repeat(10 * 1024 * 1024) });
    c.send(big);
    const closed = await c.closedP;
    assert.equal(closed.code, 1009);
    assert.match(closed.reason, /larger than/);
  });

  test('WebSocket upgrades on other paths are refused', async () => {
    const c = new Client(`ws://127.0.0.1:${srv.port}/not-ws`);
    await assert.rejects(c.opened, /404|Unexpected server response/);
  });

  test('static files: served from web/, traversal refused', async () => {
    const ok = await rawGet(srv.port, '/index.html');
    assert.equal(ok.status, 200);
    assert.match(ok.text, /content-security-policy: default-src 'none'/i);
    const root = await rawGet(srv.port, '/');
    assert.equal(root.status, 200);
    assert.match(root.text, /<title>unmask/);
    for (const target of ['/../../../../etc/passwd', '/%2e%2e/%2e%2e/%2e%2e/etc/passwd', '/..%2f..%2f..%2fetc%2fpasswd',
      '/%252e%252e/%252e%252e/etc/passwd', '/.%2e/.%2e/etc/passwd', '/..\\..\\etc\\passwd', '/app.js/../../../etc/passwd',
      '/.git/config', '/%00index.html']) {
      const r = await rawGet(srv.port, target);
      assert.ok(r.status >= 400 && r.status < 500 || r.status === 0, `${target} -> ${r.status}`);
      assert.doesNotMatch(r.text, /root:.*:0:0:/, `${target} leaked /etc/passwd`);
    }
    const nf = await srv.get('/no-such-file.js');
    assert.equal(nf.status, 404);
    assert.equal(JSON.parse(nf.body).error.code, 'not_found');
    const post = await new Promise((resolve, reject) => {
      const s = net.connect(srv.port, '127.0.0.1');
      let d = '';
      s.on('connect', () => s.write('POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}'));
      s.on('data', (x) => (d += x));
      s.on('end', () => resolve(d));
      s.on('error', reject);
    });
    assert.match(post, /^HTTP\/1\.1 405/);
  });
});
