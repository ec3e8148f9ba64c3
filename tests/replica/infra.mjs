// infra.mjs — the real services the replica tests run unmask against: a redis-server on a free
// loopback port (no persistence: --save "" --appendonly no; its data dir a temp dir), a tiny RESP
// client to talk to it, and nginx (nginx-light) with a config generated from
// config/nginx/unmask.conf (upstreams = the test's replicas, a free loopback port instead of TLS
// on 443). Each start returns an object whose stop() always reaps the process. Missing binaries
// are an error naming scripts/install-deps.sh, never a skip.
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';

const SRC = process.env.UNMASK_SOURCE_DIR || path.resolve(path.dirname(new URL(import.meta.url).pathname), '../..');

function need(bin, args = ['-v']) {
  const r = spawnSync(bin, args, { encoding: 'utf8' });
  if (r.error) throw new Error(`${bin} is not installed: run scripts/install-deps.sh (it installs redis-server and nginx-light)`);
}

export async function freePort() {
  const s = net.createServer();
  await new Promise((r) => s.listen(0, '127.0.0.1', r));
  const { port } = s.address();
  await new Promise((r) => s.close(r));
  return port;
}

async function waitFor(what, cond, timeoutMs = 15000) {
  const t0 = Date.now();
  while (!(await cond())) {
    if (Date.now() - t0 > timeoutMs) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

// One RESP command on a fresh connection: resolves with the reply (string, number, array, null)
// or rejects on an error reply / connection failure.
export function redisCmd(port, ...args) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1');
    let buf = Buffer.alloc(0);
    sock.on('error', reject);
    sock.on('close', () => reject(new Error('the connection closed without a reply')));
    sock.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      const r = parse(buf, 0);
      if (r) {
        sock.end();
        if (r.value instanceof Error) reject(r.value);
        else resolve(r.value);
      }
    });
    sock.on('connect', () => {
      let s = `*${args.length}\r\n`;
      for (const a of args.map(String)) s += `$${Buffer.byteLength(a)}\r\n${a}\r\n`;
      sock.write(s);
    });
  });
}

function parse(buf, i) {
  const nl = buf.indexOf('\r\n', i);
  if (nl < 0) return null;
  const t = String.fromCharCode(buf[i]);
  const line = buf.toString('utf8', i + 1, nl);
  if (t === '+') return { value: line, end: nl + 2 };
  if (t === '-') return { value: new Error(line), end: nl + 2 };
  if (t === ':') return { value: Number(line), end: nl + 2 };
  if (t === '$') {
    const n = Number(line);
    if (n < 0) return { value: null, end: nl + 2 };
    if (buf.length < nl + 2 + n + 2) return null;
    return { value: buf.toString('utf8', nl + 2, nl + 2 + n), end: nl + 2 + n + 2 };
  }
  if (t === '*') {
    const n = Number(line);
    if (n < 0) return { value: null, end: nl + 2 };
    const out = [];
    let at = nl + 2;
    for (let k = 0; k < n; k++) {
      const r = parse(buf, at);
      if (!r) return null;
      out.push(r.value);
      at = r.end;
    }
    return { value: out, end: at };
  }
  throw new Error(`bad RESP type ${t}`);
}

// redis-server on a free loopback port in dir. restart(): SHUTDOWN SAVE (an RDB snapshot in dir,
// as a Redis with persistence keeps its data over a restart), then the same port again.
export async function startRedis(dir) {
  need('redis-server', ['--version']);
  fs.mkdirSync(dir, { recursive: true });
  const port = await freePort();
  const r = { port, url: `redis://127.0.0.1:${port}`, proc: null, out: '' };
  r.start = async () => {
    const proc = spawn('redis-server', ['--save', '', '--appendonly', 'no', '--port', String(port), '--bind', '127.0.0.1',
      '--dir', dir, '--dbfilename', 'dump.rdb'], { stdio: ['ignore', 'pipe', 'pipe'] });
    r.proc = proc;
    r.exit = new Promise((res) => proc.on('exit', res));
    proc.stdout.on('data', (d) => (r.out += d));
    proc.stderr.on('data', (d) => (r.out += d));
    await waitFor('redis-server to answer PING', async () => {
      if (proc.exitCode !== null) throw new Error(`redis-server exited: ${r.out}`);
      return (await redisCmd(port, 'PING').catch(() => null)) === 'PONG';
    });
  };
  r.shutdownSave = async () => {
    await redisCmd(port, 'SHUTDOWN', 'SAVE').catch(() => {}); // the connection closes as it exits
    await r.exit;
  };
  r.stop = async () => {
    if (r.proc && r.proc.exitCode === null && r.proc.signalCode === null) {
      r.proc.kill('SIGKILL');
      await r.exit;
    }
  };
  await r.start();
  return r;
}

// config/nginx/unmask.conf for a test: the upstream servers are `upstreams` (host:port), it listens
// on a free loopback port without TLS (the ssl_* lines dropped), logs and temp files under dir.
export function nginxConfig(dir, port, upstreams) {
  let conf = fs.readFileSync(path.join(SRC, 'config/nginx/unmask.conf'), 'utf8');
  const servers = upstreams.map((u) => `    server ${u} max_fails=3 fail_timeout=10s;`).join('\n');
  const up = /(upstream unmask \{\n)((?:\s*server [^\n]*\n)+)/;
  if (!up.test(conf)) throw new Error('config/nginx/unmask.conf: no "upstream unmask { server ...; }" block');
  conf = conf.replace(up, `$1${servers}\n`);
  if (!/listen 443 ssl http2;/.test(conf)) throw new Error('config/nginx/unmask.conf: no "listen 443 ssl http2;"');
  conf = conf.replace(/listen 443 ssl http2;/, `listen 127.0.0.1:${port};`).replace(/^\s*ssl_[^\n]*\n/gm, '');
  const tmp = (n) => path.join(dir, n);
  return `pid ${tmp('nginx.pid')};
error_log ${tmp('error.log')} info;
worker_processes 1;
events { worker_connections 1024; }
http {
  access_log ${tmp('access.log')};
  client_body_temp_path ${tmp('body')};
  proxy_temp_path ${tmp('proxy')};
  fastcgi_temp_path ${tmp('fastcgi')};
  uwsgi_temp_path ${tmp('uwsgi')};
  scgi_temp_path ${tmp('scgi')};
${conf}
}
`;
}

// nginx -p dir -c conf -g 'daemon off;' in front of upstreams; resolves once it proxies /health/live.
export async function startNginx(dir, upstreams) {
  need('nginx');
  fs.mkdirSync(dir, { recursive: true });
  const port = await freePort();
  const conf = path.join(dir, 'nginx.conf');
  fs.writeFileSync(conf, nginxConfig(dir, port, upstreams));
  const t = spawnSync('nginx', ['-t', '-p', dir, '-e', path.join(dir, 'error.log'), '-c', conf], { encoding: 'utf8' });
  if (t.status !== 0) throw new Error(`nginx -t refused the generated config:\n${t.stderr}`);
  const proc = spawn('nginx', ['-p', dir, '-e', path.join(dir, 'error.log'), '-c', conf, '-g', 'daemon off;'],
    { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  proc.stdout.on('data', (d) => (out += d));
  proc.stderr.on('data', (d) => (out += d));
  const exit = new Promise((res) => proc.on('exit', res));
  const n = {
    port, url: `http://127.0.0.1:${port}`, proc, conf,
    logs: () => out,
    async stop() { // SIGTERM: the master stops its workers (SIGKILL would orphan them on the port)
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.kill('SIGTERM');
        const t = setTimeout(() => proc.kill('SIGKILL'), 5000);
        await exit;
        clearTimeout(t);
      }
    },
  };
  await waitFor('nginx to proxy /health/live', async () => {
    if (proc.exitCode !== null) throw new Error(`nginx exited: ${out}`);
    const r = await fetch(`${n.url}/health/live`).catch(() => null);
    return r && r.status === 200;
  });
  return n;
}
