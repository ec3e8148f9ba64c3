// server.mjs — shared helpers for the HTTP API tests: a tiny make-model checkpoint, the real
// `unmask serve` on a free loopback port (--port 0, the port is read from its first stdout line),
// readiness (protocol/harness.mjs serverReady: the listening line, then /health 200), and a stop
// that always reaps the process.
import { spawn } from 'node:child_process';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { makeModelOnce, serverReady } from '../protocol/harness.mjs';

export const BIN = process.env.UNMASK_BIN;
export const TMP = process.env.UNMASK_TEST_TMP || os.tmpdir();
if (!BIN) throw new Error('UNMASK_BIN is not set (run through ctest)');

// One checkpoint per name (harness.mjs makeModelOnce: renamed into place, safe under ctest -j).
export function makeModel(name = 'http-tiny', extra = []) {
  return makeModelOnce(path.join(TMP, name), extra);
}

const until = async (what, fn, timeoutMs = 30000, everyMs = 20) => {
  const t0 = Date.now();
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() - t0 > timeoutMs) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
};
export { until };

// Start `unmask serve` with extra flags; resolves once GET /health answers 200. bin: another build
// of unmask (sanitizers.mjs: the ASan one).
// base: the flags before args (default: a memory store, model, loopback, any free port, 1 thread);
// cwd: the server's working directory.
export async function startServer(args = [], { model = makeModel(), env = {}, bin = BIN, base = null, cwd = undefined } = {}) {
  base ??= ['--store', 'memory', '--model', model, '--host', '127.0.0.1', '--port', '0', '--threads', '1'];
  const proc = spawn(bin, ['serve', ...base, ...args], {
    cwd,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let exited = null;
  const exitP = new Promise((resolve) => proc.on('exit', (code, sig) => resolve((exited = { code, sig }))));
  proc.stdout.on('data', (d) => (out += d));
  proc.stderr.on('data', (d) => (out += d));
  const srv = {
    proc,
    logs: () => out,
    exited: () => exited,
    exit: exitP,
    async stop(signal = 'SIGKILL') {
      if (!exited) proc.kill(signal);
      return exitP;
    },
  };
  try {
    const { port } = await serverReady(proc, () => out, () => out, exitP, { name: 'unmask serve' });
    srv.port = port;
    srv.url = `http://127.0.0.1:${port}`;
  } catch (e) {
    await srv.stop();
    throw e;
  }
  return srv;
}

// Parse an SSE body into records [{id, event, data}], data lines joined with '\n'.
export function parseSSE(text) {
  const recs = [];
  for (const block of text.split(/\r?\n\r?\n/)) {
    if (!block.trim()) continue;
    const r = { data: null };
    const data = [];
    for (const line of block.split(/\r?\n/)) {
      if (line.startsWith(':')) continue;
      const i = line.indexOf(':');
      const k = i < 0 ? line : line.slice(0, i);
      let v = i < 0 ? '' : line.slice(i + 1);
      if (v.startsWith(' ')) v = v.slice(1);
      if (k === 'data') data.push(v);
      else r[k] = v;
    }
    if (data.length) r.data = data.join('\n');
    if (r.data !== null || r.id !== undefined) recs.push(r);
  }
  return recs;
}

// A webhook receiver on a free loopback port: every delivery is pushed to `deliveries` as
// {id (X-Unmask-Delivery), job, status} and answered 204. Returns {url, close()}.
export async function startWebhookReceiver(deliveries) {
  const srv = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d) => (body += d));
    req.on('end', () => {
      const o = JSON.parse(body);
      deliveries.push({ id: req.headers['x-unmask-delivery'], job: o.id, status: o.status });
      res.writeHead(204).end();
    });
  });
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${srv.address().port}/hook`, close: () => srv.close() };
}

// POST JSON and return {status, headers, body(text), json()}.
export async function post(url, body, headers = {}) {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, statusText: res.statusText, headers: res.headers, text, json: () => JSON.parse(text) };
}
