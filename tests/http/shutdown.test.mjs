// shutdown.test.mjs — graceful shutdown: on SIGTERM the server stops admitting work (503 +
// Retry-After on the APIs, /health 503 "draining"), finishes the streams that are running and
// queued, then exits 0; a second signal would stop at once. With too little grace, jobs that did not
// finish end failed and their webhooks are sent before the process exits.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { startServer, makeModel, parseSSE, post, until } from './server.mjs';

test('SIGTERM drains: running work completes, new work gets 503, exit code 0', async () => {
  const model = makeModel('http-slow', ['--d-model', '512', '--n-layers', '8']);
  const srv = await startServer(['--max-batch', '1', '--shutdown-grace', '60'], { model });
  try {
    // 160 tokens each (160 steps): the three streams must outlast the checks made while draining
    // below (a few requests); with 16 tokens an idle machine finished them first and exited, and the
    // /health/live request met a closed socket
    const body = { prompt: 'Tell me a story', max_tokens: 160, block_length: 8, stream: true };
    // three streams, one at a time on the engine (max-batch 1): two wait in the queue
    let firstChunk;
    const gotFirst = new Promise((r) => (firstChunk = r));
    const streams = [0, 1, 2].map(async (i) => {
      const res = await fetch(`${srv.url}/v1/completions`, {
        method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...body, seed: i }),
      });
      assert.equal(res.status, 200);
      let text = '';
      const dec = new TextDecoder();
      for await (const chunk of res.body) {
        text += dec.decode(chunk, { stream: true });
        if (text.includes('"text":') ) firstChunk();
      }
      return text;
    });
    await gotFirst;
    srv.proc.kill('SIGTERM');
    // while draining: refuse new work, report it on /health; reads still work
    const refused = await post(`${srv.url}/v1/completions`, { prompt: 'x', max_tokens: 2 });
    assert.equal(refused.status, 503);
    assert.equal(refused.json().error.code, 'shutting_down');
    assert.ok(Number(refused.headers.get('retry-after')) >= 1);
    assert.equal(refused.headers.get('x-should-retry'), 'true');
    const health = await fetch(`${srv.url}/health`);
    assert.equal(health.status, 503);
    assert.equal((await health.json()).status, 'draining');
    // liveness is not readiness: the process still answers (a probe must not restart it now)
    const live = await fetch(`${srv.url}/health/live`);
    assert.equal(live.status, 200);
    assert.equal((await live.json()).status, 'live');
    assert.equal((await fetch(`${srv.url}/v1/models`)).status, 200);
    assert.equal(srv.exited(), null, 'still running while work remains');
    // every accepted stream completes normally
    const texts = await Promise.all(streams);
    for (const t of texts) {
      const recs = parseSSE(t);
      assert.equal(recs.at(-1).data, '[DONE]', 'stream finished with [DONE]');
      const chunks = recs.slice(0, -1).map((r) => JSON.parse(r.data));
      assert.ok(chunks.some((c) => c.choices[0]?.finish_reason), 'a finish chunk, not a cancellation');
      assert.ok(!chunks.some((c) => c.error));
    }
    const ex = await srv.exit;
    assert.equal(ex.code, 0, `exit ${JSON.stringify(ex)}\n${srv.logs()}`);
    assert.match(srv.logs(), /drained/);
  } finally {
    await srv.stop();
  }
});

test('a shutdown with too little grace fails unfinished jobs, and their webhooks say so', async () => {
  const model = makeModel('http-slow', ['--d-model', '512', '--n-layers', '8']);
  const received = [];
  let gotAll;
  const allIn = new Promise((r) => (gotAll = r));
  const hook = http.createServer((req, res) => {
    let b = '';
    req.on('data', (d) => (b += d));
    req.on('end', () => {
      received.push({ event: req.headers['x-unmask-event'], body: JSON.parse(b) });
      res.end('ok');
      if (received.length === 3) gotAll();
    });
  });
  await new Promise((r) => hook.listen(0, '127.0.0.1', r));
  const srv = await startServer(['--max-batch', '1', '--shutdown-grace', '0.2', '--webhook-secret', 'shutdown-secret',
    '--webhook-allow', '127.0.0.1'], { model });
  try {
    const webhook = `http://127.0.0.1:${hook.address().port}/done`;
    const ids = [];
    for (let i = 0; i < 3; i++) {
      const r = await post(`${srv.url}/v1/jobs`, { prompt: 'Tell me a story', max_tokens: 64, block_length: 8, steps: 64,
        stop_at_eos: false, seed: i, webhook });
      assert.equal(r.status, 202, r.text);
      ids.push(r.json().id);
    }
    await until('a job running', async () => (await (await fetch(`${srv.url}/v1/jobs/${ids[0]}`)).json()).status === 'running');
    srv.proc.kill('SIGTERM');
    const ex = await srv.exit;
    assert.equal(ex.code, 0, `exit ${JSON.stringify(ex)}\n${srv.logs()}`);
    // every job's terminal webhook was delivered before the process ended (it has exited already)
    let timer;
    await Promise.race([allIn, new Promise((_, rej) => (timer = setTimeout(() => rej(new Error(
      `${received.length} of 3 webhooks arrived: ${JSON.stringify(received.map((x) => x.event))}`)), 5000)))]);
    clearTimeout(timer);
    const byId = new Map(received.map((x) => [x.body.id, x]));
    assert.deepEqual([...byId.keys()].sort(), [...ids].sort(), 'one terminal webhook per job');
    for (const x of received) {
      assert.ok(['job.failed', 'job.succeeded'].includes(x.event), x.event);
      if (x.event === 'job.failed') {
        assert.equal(x.body.status, 'failed');
        assert.match(x.body.error.message ?? x.body.error, /shut down/);
      }
    }
    assert.ok(received.some((x) => x.event === 'job.failed'), 'the queued jobs failed');
    assert.match(srv.logs(), /unfinished jobs? failed/);
  } finally {
    await srv.stop();
    hook.close();
  }
});
