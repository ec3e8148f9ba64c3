// pipelining.test.mjs — one TCP connection carrying several requests, against the real server:
// every ordered pair of (GET, valid POST, invalid POST, POST to a missing route, HEAD, OPTIONS)
// sent in one write and with the second sent while the first is still running; the documented
// behaviour is checked exactly: the first request gets its own correct answer; then either the
// second gets its own correct answer on the same connection, or the first answer carried
// "Connection: close" and the connection closed right after it (never a wrong or duplicated answer,
// never a hang). Request framing (Content-Length syntax, Transfer-Encoding, missing length),
// over-long heads (414/431), keep-alive after a chunked stream, a hang-up while the server waits
// for a generation. After each case the server still answers, and it exits cleanly at the end.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { TMP, startServer } from './server.mjs';

const KEY = 'sk-pipe-test';

// ---------------------------------------------------------------- a raw HTTP/1.1 client

// Parses as many complete responses from buf as there are; HEAD answers have no body.
function parseResponses(buf, methods) {
  const out = [];
  let off = 0;
  for (;;) {
    const end = buf.indexOf('\r\n\r\n', off);
    if (end < 0) break;
    const head = buf.subarray(off, end).toString('latin1').split('\r\n');
    const m = head[0].match(/^HTTP\/1\.[01] (\d{3})/);
    assert.ok(m, `a status line, got ${JSON.stringify(head[0])}`);
    const headers = {};
    for (const line of head.slice(1)) {
      const i = line.indexOf(':');
      const k = line.slice(0, i).toLowerCase();
      const v = line.slice(i + 1).trim();
      headers[k] = k in headers ? `${headers[k]}, ${v}` : v;
    }
    let p = end + 4;
    let body = Buffer.alloc(0);
    const isHead = methods[out.length] === 'HEAD';
    if (isHead || ['204', '304'].includes(m[1])) {
      // no body
    } else if (headers['transfer-encoding'] === 'chunked') {
      const parts = [];
      for (;;) {
        const le = buf.indexOf('\r\n', p);
        if (le < 0) return { out, rest: true };
        const n = parseInt(buf.subarray(p, le).toString('latin1'), 16);
        if (buf.length < le + 2 + n + 2) return { out, rest: true };
        parts.push(buf.subarray(le + 2, le + 2 + n));
        p = le + 2 + n + 2;
        if (n === 0) break;
      }
      body = Buffer.concat(parts);
    } else if ('content-length' in headers) {
      const n = Number(headers['content-length']);
      if (buf.length < p + n) return { out, rest: true };
      body = buf.subarray(p, p + n);
      p += n;
    } else {
      body = buf.subarray(p); // close-delimited: the rest
      p = buf.length;
    }
    out.push({ status: Number(m[1]), headers, body: body.toString('utf8') });
    off = p;
  }
  return { out, rest: off < buf.length };
}

// Opens a connection, writes each step's bytes (a step may first wait for a condition on what was
// received so far, waitFor(buf), or for a promise, before()), and resolves once the server closed the connection or `until(responses)` holds
// (then it closes itself). Rejects after timeoutMs: a hang is a failure.
function exchange(port, steps, { methods, until = null, timeoutMs = 30000 } = {}) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1');
    let buf = Buffer.alloc(0);
    let done = false;
    const finish = (closedByServer) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      sock.destroy();
      const { out, rest } = parseResponses(buf, methods);
      resolve({ responses: out, closedByServer, trailing: rest });
    };
    const timer = setTimeout(() => {
      done = true;
      sock.destroy();
      reject(new Error(`no close within ${timeoutMs} ms; received: ${buf.toString('latin1').slice(0, 400)}`));
    }, timeoutMs);
    let i = 0;
    let busy = false;
    const pump = async () => {
      if (busy) return;
      busy = true;
      while (i < steps.length && !done) {
        const s = steps[i];
        if (s.waitFor && !s.waitFor(buf)) break;
        if (s.before) await s.before();
        if (!done) sock.write(s.bytes);
        i++;
      }
      busy = false;
    };
    sock.on('connect', pump);
    sock.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      pump();
      if (until && until(parseResponses(buf, methods).out)) finish(false);
    });
    sock.on('close', () => finish(true));
    sock.on('error', () => finish(true));
  });
}

function req(method, path, { body = null, headers = {} } = {}) {
  let h = `${method} ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${KEY}\r\n`;
  for (const [k, v] of Object.entries(headers)) h += `${k}: ${v}\r\n`;
  if (body !== null) h += `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n`;
  return Buffer.from(`${h}\r\n${body ?? ''}`);
}

// The requests of the pairs, and what each one's own answer is.
const GEN = JSON.stringify({ prompt: 'pipelined', max_tokens: 6, temperature: 0 });
const KINDS = {
  GET: { method: 'GET', bytes: () => req('GET', '/health'), check: (r) => { assert.equal(r.status, 200); assert.deepEqual(JSON.parse(r.body), { status: 'ok' }); } },
  POST: { method: 'POST', bytes: () => req('POST', '/v1/completions', { body: GEN }), check: null /* set from the request alone */ },
  BAD: { method: 'POST', bytes: () => req('POST', '/v1/completions', { body: '{"prompt": [' }), check: (r) => { assert.equal(r.status, 400); assert.equal(JSON.parse(r.body).error.code, 'invalid_json'); } },
  NOPE: { method: 'POST', bytes: () => req('POST', '/nope', { body: '{}' }), check: (r) => { assert.equal(r.status, 404); assert.equal(JSON.parse(r.body).error.code, 'not_found'); } },
  HEAD: { method: 'HEAD', bytes: () => req('HEAD', '/health'), check: (r) => { assert.equal(r.status, 200); assert.equal(r.body, ''); assert.equal(r.headers['content-length'], '16'); } },
  OPTIONS: { method: 'OPTIONS', bytes: () => req('OPTIONS', '/v1/models'), check: (r) => assert.equal(r.status, 204) },
};

// The documented outcome of A then B on one connection (see the file comment).
function checkPair(res, a, b, label) {
  assert.ok(res.responses.length >= 1, `${label}: the first request is answered`);
  assert.ok(res.responses.length <= 2, `${label}: no extra answers (${res.responses.length})`);
  KINDS[a].check(res.responses[0]);
  if (res.responses.length === 1) {
    assert.equal(res.responses[0].headers.connection, 'close', `${label}: an unanswered second request means Connection: close on the first`);
    assert.ok(res.closedByServer, `${label}: and the server closes`);
    assert.ok(!res.trailing, `${label}: nothing after the last answer`);
  } else {
    KINDS[b].check(res.responses[1]);
  }
}

describe('HTTP pipelining and request framing', () => {
  let srv;
  before(async () => {
    const keys = path.join(TMP, 'pipelining-keys.txt');
    fs.writeFileSync(keys, `${KEY}\n`);
    srv = await startServer(['--api-keys', keys, '--max-message-bytes', '65536']);
    // the valid POST's own answer, alone on its connection: the reference for every pair
    const alone = await exchange(srv.port, [{ bytes: KINDS.POST.bytes() }], {
      methods: ['POST'], until: (rs) => rs.length === 1,
    });
    const ref = JSON.parse(alone.responses[0].body).choices[0].text;
    KINDS.POST.check = (r) => {
      assert.equal(r.status, 200, r.body);
      assert.equal(JSON.parse(r.body).choices[0].text, ref);
    };
  });
  after(async () => {
    const r = await srv.stop('SIGTERM');
    assert.equal(r.code, 0, `clean exit after the battery: ${srv.logs().slice(-2000)}`);
  });

  const stats = async () => JSON.parse(await fetch(`${srv.url}/stats`, { headers: { authorization: `Bearer ${KEY}` } }).then((r) => r.text()));
  const untilStats = async (cond, what) => {
    const t0 = Date.now();
    for (;;) {
      const st = await stats();
      if (cond(st)) return st;
      if (Date.now() - t0 > 30000) throw new Error(`timed out waiting for ${what}: ${JSON.stringify(st.scheduler)}`);
      await new Promise((r) => setTimeout(r, 10));
    }
  };
  const untilSubmitted = (n) => untilStats((st) => st.scheduler.submitted >= n, `${n} generations submitted`);

  const alive = async () => {
    const r = await exchange(srv.port, [{ bytes: req('GET', '/health', { headers: { Connection: 'close' } }) }], { methods: ['GET'], timeoutMs: 5000 });
    assert.equal(r.responses[0]?.status, 200, 'the server still answers');
  };

  test('every ordered pair sent in one write', async () => {
    for (const a of Object.keys(KINDS)) {
      for (const b of Object.keys(KINDS)) {
        const res = await exchange(srv.port, [{ bytes: Buffer.concat([KINDS[a].bytes(), KINDS[b].bytes()]) }], {
          methods: [KINDS[a].method, KINDS[b].method], until: (rs) => rs.length === 2,
        });
        checkPair(res, a, b, `${a}+${b} in one write`);
      }
    }
    await alive();
  });

  test('each kind sent while a generation runs on the same connection', async () => {
    for (const b of Object.keys(KINDS)) {
      const st0 = await stats();
      // the second request goes out once the server is running the first (its generation was
      // submitted), before the first is answered
      const res = await exchange(srv.port, [
        { bytes: KINDS.POST.bytes() },
        { bytes: KINDS[b].bytes(), before: () => untilSubmitted(st0.scheduler.submitted + 1) },
      ], { methods: ['POST', KINDS[b].method], until: (rs) => rs.length === 2 });
      checkPair(res, 'POST', b, `POST, then ${b} while it runs`);
    }
    await alive();
  });

  test('a request sent after the previous answer arrived reuses the connection (keep-alive)', async () => {
    const order = ['POST', 'GET', 'BAD', 'HEAD', 'NOPE', 'OPTIONS', 'POST'];
    const steps = order.map((k, i) => ({
      bytes: KINDS[k].bytes(),
      waitFor: (buf) => parseResponses(buf, order.map((x) => KINDS[x].method)).out.length === i,
    }));
    const res = await exchange(srv.port, steps, { methods: order.map((k) => KINDS[k].method), until: (rs) => rs.length === order.length });
    assert.equal(res.responses.length, order.length);
    assert.equal(res.closedByServer, false, 'the connection stayed open');
    order.forEach((k, i) => KINDS[k].check(res.responses[i]));
  });

  test('keep-alive after a streamed (chunked) answer', async () => {
    const stream = req('POST', '/v1/completions', { body: JSON.stringify({ prompt: 'stream me', max_tokens: 6, stream: true }) });
    const methods = ['POST', 'GET'];
    const res = await exchange(srv.port, [
      { bytes: stream },
      { bytes: KINDS.GET.bytes(), waitFor: (buf) => parseResponses(buf, methods).out.length === 1 },
    ], { methods, until: (rs) => rs.length === 2 });
    const s = res.responses[0];
    assert.equal(s.status, 200);
    assert.equal(s.headers['transfer-encoding'], 'chunked');
    assert.notEqual(s.headers.connection, 'close');
    assert.match(s.body, /data: \[DONE\]\n\n$/, 'the whole event stream, ending with [DONE]');
    KINDS.GET.check(res.responses[1]);
    assert.equal(res.closedByServer, false);
  });

  test('an HTTP/1.0 stream is close-delimited', async () => {
    const body = JSON.stringify({ prompt: 'old client', max_tokens: 4, stream: true });
    const bytes = Buffer.from(`POST /v1/completions HTTP/1.0\r\nAuthorization: Bearer ${KEY}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
    const res = await exchange(srv.port, [{ bytes }], { methods: ['POST'] });
    assert.ok(res.closedByServer);
    assert.equal(res.responses[0].headers['transfer-encoding'], undefined);
    assert.match(res.responses[0].body, /data: \[DONE\]/);
  });

  test('request framing: bad or ambiguous lengths are refused and what follows is never run', async () => {
    const smuggled = KINDS.GET.bytes().toString('latin1');
    const head = `POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nContent-Type: application/json\r\n`;
    const cases = [
      [`Content-Length: 0x40\r\n\r\n${smuggled}`, 400, 'bad_content_length'],
      [`Content-Length: abc\r\n\r\n${smuggled}`, 400, 'bad_content_length'],
      [`Content-Length: -1\r\n\r\n${smuggled}`, 400, 'bad_content_length'],
      [`Content-Length: 5\r\nContent-Length: 40\r\n\r\n${smuggled}`, 400, 'bad_content_length'],
      [`Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n${smuggled}`, 400, 'bad_framing'],
      [`Transfer-Encoding: chunked\r\n\r\n${(smuggled.length).toString(16)}\r\n${smuggled}\r\n0\r\n\r\n`, 411, 'length_required'],
      [`Content-Length: 99999999999\r\n\r\n${smuggled}`, 413, 'body_too_large'],
    ];
    for (const [rest, status, code] of cases) {
      const res = await exchange(srv.port, [{ bytes: Buffer.from(head + rest, 'latin1') }], { methods: ['POST', 'GET'] });
      assert.equal(res.responses.length, 1, `one answer for ${JSON.stringify(rest.slice(0, 40))}`);
      assert.equal(res.responses[0].status, status, res.responses[0].body);
      assert.equal(JSON.parse(res.responses[0].body).error.code, code);
      assert.equal(res.responses[0].headers.connection, 'close');
      assert.ok(res.closedByServer);
    }
    // no length at all: an empty body (RFC 9112), answered, and the connection closes so the
    // bytes after it are never read as a request
    const res = await exchange(srv.port, [{ bytes: Buffer.from(`${head}\r\n${smuggled}`, 'latin1') }], { methods: ['POST', 'GET'] });
    assert.equal(res.responses.length, 1);
    assert.equal(res.responses[0].status, 400);
    assert.equal(JSON.parse(res.responses[0].body).error.code, 'invalid_json');
    assert.ok(res.closedByServer);
    await alive();
  });

  test('over-long request heads: 414 and 431 with a JSON error, not a dropped connection', async () => {
    const longUrl = Buffer.from(`GET /${'a'.repeat(9000)} HTTP/1.1\r\nHost: x\r\n\r\n`);
    let res = await exchange(srv.port, [{ bytes: longUrl }], { methods: ['GET'] });
    assert.equal(res.responses[0].status, 414);
    assert.equal(JSON.parse(res.responses[0].body).error.code, 'uri_too_long');
    const longPath = Buffer.from(`GET /${'b'.repeat(3000)} HTTP/1.1\r\nHost: x\r\n\r\n`);
    res = await exchange(srv.port, [{ bytes: longPath }], { methods: ['GET'] });
    assert.equal(res.responses[0].status, 414);
    const longHeader = Buffer.from(`GET /health HTTP/1.1\r\nHost: x\r\nUser-Agent: ${'u'.repeat(9000)}\r\n\r\n`);
    res = await exchange(srv.port, [{ bytes: longHeader }], { methods: ['GET'] });
    assert.equal(res.responses[0].status, 431);
    assert.equal(JSON.parse(res.responses[0].body).error.code, 'headers_too_large');
    assert.ok(res.closedByServer);
    await alive();
  });

  test('without an API key: GET + POST pipelined is answered (401) and nothing freezes', async () => {
    const bytes = Buffer.from('GET /health HTTP/1.1\r\nHost: x\r\n\r\nPOST /nope HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}');
    const res = await exchange(srv.port, [{ bytes }], { methods: ['GET', 'POST'], until: (rs) => rs.length === 2 });
    assert.equal(res.responses[0].status, 200);
    if (res.responses.length === 2) assert.equal(res.responses[1].status, 401);
    else assert.equal(res.responses[0].headers.connection, 'close');
    await alive();
  });

  test('a client that hangs up while its generation waits cancels it', async () => {
    const body = JSON.stringify({ prompt: 'abandoned', max_tokens: 768, temperature: 0 });
    const st0 = await stats();
    const sock = net.connect(srv.port, '127.0.0.1');
    await new Promise((r) => sock.on('connect', r));
    // pipelined bytes behind it too: the connection is parked while the generation runs
    sock.write(Buffer.concat([req('POST', '/v1/completions', { body }), KINDS.GET.bytes()]));
    await untilSubmitted(st0.scheduler.submitted + 1);
    sock.destroy();
    const st = await untilStats((s) => s.scheduler.active === 0 && s.scheduler.queued === 0, 'the generation to end');
    assert.equal(st.scheduler.cancelled, st0.scheduler.cancelled + 1, 'cancelled, not run to the end');
  });
  test('a client that keeps sending after an answer that closes the connection still reads all of it', async () => {
    // a body over --max-message-bytes is refused (413, connection closed) at its head; the client
    // goes on sending the body. Closing with that input unread would reset the connection and
    // destroy the answer in flight: the server half-closes and drops the rest instead.
    for (let round = 0; round < 5; round++) {
      const sock = net.connect(srv.port, '127.0.0.1');
      await new Promise((r) => sock.on('connect', r));
      let recv = Buffer.alloc(0);
      let error = null;
      sock.on('data', (d) => { recv = Buffer.concat([recv, d]); });
      const ended = new Promise((r) => { sock.on('end', () => r('end')); sock.on('close', () => r('close')); });
      sock.on('error', (e) => { error = e; });
      const size = 4 << 20;
      sock.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nContent-Type: application/json\r\nContent-Length: ${size}\r\n\r\n`);
      const chunk = Buffer.alloc(16384, 0x20);
      let sent = 0;
      let open = true;
      ended.then(() => { open = false; });
      while (open && sent < size) { // keep writing until the server's end arrives
        if (!sock.write(chunk)) await new Promise((r) => { sock.once('drain', r); ended.then(r); });
        sent += chunk.length;
      }
      assert.equal(await ended, 'end', 'the server ended the connection with a FIN, not a reset');
      assert.equal(error, null, `no socket error (${error && error.code})`);
      const { out } = parseResponses(recv, ['POST']);
      assert.equal(out.length, 1, `one whole answer (${recv.length} bytes received)`);
      assert.equal(out[0].status, 413);
      assert.equal(JSON.parse(out[0].body).error.code, 'body_too_large');
      sock.destroy();
    }
    await alive();
  });
});
