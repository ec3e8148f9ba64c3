// serve_cli.test.mjs — `unmask serve` as a command: --help documents every option, bad flags and
// config files exit 2 with a message naming the problem, config/unmask.json keys are applied and
// flags override them, the port in use is a clear error, /health is 503 while loading, SIGINT
// stops cleanly.

import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { test } from 'node:test';
import { BIN, SRC, TMP, startServer, tinyModel } from './harness.mjs';

const run = (args, opts = {}) => spawnSync(BIN, args, { encoding: 'utf8', timeout: 30000, ...opts });

test('--help documents every option', () => {
  const r = run(['serve', '--store', 'memory', '--help']);
  assert.equal(r.status, 0);
  for (const opt of ['--model', '--host', '--port', '--web-root', '--threads', '--max-batch', '--max-queue',
    '--session-retention', '--tls-cert', '--tls-key', '--config', '--engines', '--max-message-bytes',
    '--session-max-bytes', '--session-max-events', '--max-sessions', '--max-session-generations', '--ping-interval'])
    assert.match(r.stdout, new RegExp(`\\s${opt}\\b`), `${opt} in --help`);
  assert.match(r.stdout, /config\/unmask\.json/);
});

test('bad flags and values exit 2 naming the problem', () => {
  const model = tinyModel('serve-cli');
  const cases = [
    [['--port', '70000'], /--port/],
    [['--port', 'eighty'], /--port/],
    [['--max-batch', '0'], /--max-batch/],
    [['--session-retention', '-1'], /--session-retention/],
    [['--tls-cert', '/nonexistent.pem', '--tls-key', '/nonexistent.key'], /tls-cert/],
    [['--tls-cert', path.join(SRC, 'web', 'index.html')], /together/],
    [['--host', 'not an address'], /--host/],
    [['--frobnicate'], /unknown option/],
  ];
  for (const [flags, re] of cases) {
    const r = run(['serve', '--store', 'memory', '--model', model, '--port', '0', ...flags]);
    assert.notEqual(r.status, 0, `${flags.join(' ')} must fail`);
    assert.match(r.stderr, re, `${flags.join(' ')}: ${r.stderr}`);
  }
  const nomodel = run(['serve', '--store', 'memory', '--model', path.join(TMP, 'no-such-model'), '--port', '0']);
  assert.equal(nomodel.status, 2);
  assert.match(nomodel.stderr, /make-model/);
});

test('a wrong --model is refused before anything else, saying what to pass instead', () => {
  const model = tinyModel('serve-cli');
  const empty = path.join(TMP, 'serve-cli-empty-dir');
  fs.mkdirSync(empty, { recursive: true });
  const noWeights = path.join(TMP, 'serve-cli-no-weights');
  fs.mkdirSync(noWeights, { recursive: true });
  fs.copyFileSync(path.join(model, 'config.json'), path.join(noWeights, 'config.json'));
  const cases = [
    [path.join(model, 'config.json'), new RegExp(`is a file, not a model directory or a GGUF file; pass the directory that holds it: ${model}$`, 'm')],
    [empty, /has no config\.json; pass a Hugging Face checkpoint directory .*make-model --out NEW_DIR/],
    [noWeights, /has config\.json but no weights \(model\.safetensors/],
    [path.join(TMP, 'no-such-model'), /does not exist; .*make-model --out/],
  ];
  for (const [dir, re] of cases) {
    for (const cmd of [['serve', '--store', 'memory', '--port', '0'], ['generate', '--prompt', 'hi'], ['logits', '--tokens', '1', '--out', path.join(TMP, 'serve-cli-logits.npy')]]) {
      const r = run([...cmd, '--model', dir]);
      assert.notEqual(r.status, 0, `${cmd[0]} ${dir}`);
      assert.match(r.stderr, re, `${cmd[0]} --model ${dir}: ${r.stderr}`);
      assert.doesNotMatch(r.stdout, /listening/, `${cmd[0]} printed the URL before failing`);
      assert.doesNotMatch(r.stderr, /advise|--out .*config\.json/);
    }
  }
});

test('config file: keys applied, wrong types refused, flags override', async () => {
  const model = tinyModel('serve-cli');
  const bad = path.join(TMP, 'serve-cli-bad.json');
  fs.writeFileSync(bad, JSON.stringify({ max_batch: 'eight' }));
  const r = run(['serve', '--store', 'memory', '--config', bad, '--model', model]);
  assert.equal(r.status, 2);
  assert.match(r.stderr, /max_batch/);
  fs.writeFileSync(bad, '{ not json');
  assert.match(run(['serve', '--store', 'memory', '--config', bad, '--model', model]).stderr, /serve-cli-bad\.json/);

  const good = path.join(TMP, 'serve-cli-good.json');
  fs.writeFileSync(good, JSON.stringify({ max_batch: 3, max_queue: 7, model: '/nonexistent', port: 1 }));
  const srv = await startServer({ model, extra: ['--config', good] }); // --model/--port flags override
  try {
    const st = await srv.stats();
    assert.equal(st.scheduler.max_batch, 3);
    assert.equal(st.scheduler.max_queue, 7);
  } finally {
    await srv.stop();
  }
});

test('one settings table: --help, config keys, flags, ranges and /stats agree on every setting', async () => {
  const help = run(['serve', '--store', 'memory', '--help']).stdout;
  // every option line of --help: "--name META  help [default]"
  const opts = [...help.matchAll(/^ {2}--([a-z-]+)(?: (\S+))?\s.*?(?:\[([^\]]*)\])?$/gm)].map((m) => ({ name: m[1], meta: m[2], def: m[3] }));
  assert.ok(opts.length >= 40, `--help lists the settings (${opts.length})`);
  const model = tinyModel('serve-cli');
  // a config file sets one key, a flag overrides another key of the file
  const cfg = path.join(TMP, 'serve-cli-table.json');
  fs.writeFileSync(cfg, JSON.stringify({ prep_workers: 3, max_jobs: 77, ping_interval: 9, frobnicate: 1 }));
  const srv = await startServer({ model, extra: ['--config', cfg, '--ping-interval', '11', '--webhook-secret', 'hush'] });
  try {
    const settings = (await srv.stats()).settings;
    assert.equal(settings.prep_workers, 3, 'config file key');
    assert.equal(settings.max_jobs, 77);
    assert.equal(settings.ping_interval, 11, 'the flag overrides the config file');
    assert.equal(settings.webhook_secret, true, 'secrets are reported as set, never shown');
    assert.equal(settings.store, 'memory', 'the harness runs servers with --store memory');
    assert.doesNotMatch(JSON.stringify(settings), /hush/);
    // every setting with a plain default in --help reports that default when neither source set it
    for (const o of opts) {
      const key = o.name === 'device' ? 'devices' : o.name.replace(/-/g, '_');
      if (['config', 'help', 'gpus', 'model', 'host', 'port', 'web_root', 'threads', 'prep_workers', 'max_jobs',
        'ping_interval', 'webhook_secret', 'store'].includes(key) || o.def === undefined) continue; // (tests run --store memory)
      assert.ok(key in settings, `${key} reported in /stats settings`);
      const v = settings[key];
      if (/^-?[\d.]+$/.test(o.def)) assert.equal(Number(v), Number(o.def), `${key} default`);
      else if (o.def === 'on' || o.def === 'off') assert.equal(v, o.def === 'on', `${key} default`);
      else if (!/ /.test(o.def) && !o.def.startsWith('$')) assert.equal(v, o.def, `${key} default`);
    }
  } finally {
    await srv.stop();
  }
  assert.match(srv.stderr, /unknown key "frobnicate"/, 'an unknown config key is reported');
  // the table's ranges, for flags and config keys alike
  let r = run(['serve', '--store', 'memory', '--model', model, '--port', '0', '--prep-workers', '0']);
  assert.equal(r.status, 2);
  assert.match(r.stderr, /--prep-workers must be in \[1, 64\], got 0/);
  fs.writeFileSync(cfg, JSON.stringify({ prep_workers: 65 }));
  r = run(['serve', '--store', 'memory', '--model', model, '--port', '0', '--config', cfg]);
  assert.equal(r.status, 2);
  assert.match(r.stderr, /--prep-workers must be in \[1, 64\], got 65/);
  r = run(['serve', '--store', 'memory', '--model', model, '--port', '0', '--device-loop', 'maybe']);
  assert.match(r.stderr, /--device-loop must be on or off, got 'maybe'/);
  r = run(['serve', '--store', 'memory', '--model', model, '--port', '0', '--verbose=1']);
  assert.match(r.stderr, /--verbose takes no value/);
});

test('a port already in use is a clear startup error', async () => {
  const blocker = net.createServer();
  await new Promise((r) => blocker.listen(0, '127.0.0.1', r));
  const port = blocker.address().port;
  try {
    const r = run(['serve', '--store', 'memory', '--model', tinyModel('serve-cli'), '--port', String(port)]);
    assert.equal(r.status, 1);
    assert.match(r.stderr, new RegExp(`cannot listen on 127\\.0\\.0\\.1:${port}: the port is already in use`));
    assert.match(r.stderr, /--port/);
    // one clear line: none of libwebsockets' own "ERROR on binding fd ..." noise before it
    assert.doesNotMatch(r.stderr, /lws:|binding/);
    assert.equal(r.stderr.trim().split('\n').filter((l) => /error/i.test(l)).length, 1, r.stderr);
    assert.match(r.stderr.trim().split('\n').at(-1), /^error: cannot listen/, 'the error is the last word');
  } finally {
    blocker.close();
  }
});

test('prints the URL, serves the UI, stops cleanly on SIGINT', async () => {
  const srv = await startServer({ model: tinyModel('serve-cli') });
  const page = await srv.get('/');
  assert.equal(page.status, 200);
  assert.match(page.body, /<script type="module" src="app\.js"><\/script>/);
  assert.doesNotMatch(page.body, /<script>(?!<)/, 'no inline scripts (strict CSP)');
  assert.match(page.headers['content-security-policy'], /script-src 'self'/);
  srv.proc.kill('SIGINT');
  const r = await srv.exited;
  assert.equal(r.code, 0, srv.stderr);
});

test('/health answers 503 {"status":"loading"} until the model is loaded', async () => {
  // config.json is a FIFO: the loader blocks reading it until the test writes it, so the
  // "loading" state is observed deterministically
  const src = tinyModel('serve-cli');
  const dir = path.join(TMP, 'serve-cli-fifo');
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir);
  for (const f of fs.readdirSync(src)) if (f !== 'config.json') fs.copyFileSync(path.join(src, f), path.join(dir, f));
  assert.equal(spawnSync('mkfifo', [path.join(dir, 'config.json')]).status, 0);
  const proc = spawn(BIN, ['serve', '--store', 'memory', '--model', dir, '--port', '0'], { stdio: ['ignore', 'pipe', 'pipe'] });
  const exited = new Promise((resolve) => proc.on('exit', (code) => resolve(code)));
  try {
    let out = '';
    const port = await new Promise((resolve, reject) => {
      proc.stdout.on('data', (d) => {
        out += d;
        const m = out.match(/listening on http:\/\/127\.0\.0\.1:(\d+)\//);
        if (m) resolve(Number(m[1]));
      });
      exited.then(() => reject(new Error('exited')));
    });
    const get = (p) => new Promise((resolve, reject) => {
      const s = net.connect(port, '127.0.0.1', () => s.write(`GET ${p} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`));
      let d = '';
      s.on('data', (x) => (d += x));
      s.on('end', () => resolve(d));
      s.on('error', reject);
    });
    const loading = await get('/health');
    assert.match(loading, /^HTTP\/1\.1 503/);
    assert.match(loading, /"status":"loading"/);
    assert.match(await get('/'), /^HTTP\/1\.1 200/, 'the UI is served while loading');
    assert.match(await get('/health/live'), /^HTTP\/1\.1 200[^]*"status":"live"/, 'live (not ready) while loading');
    fs.writeFileSync(path.join(dir, 'config.json'), fs.readFileSync(path.join(src, 'config.json'))); // unblocks the loader
    let ok = '';
    for (let i = 0; i < 600 && !/^HTTP\/1\.1 200/.test(ok); i++) {
      ok = await get('/health');
      if (!/^HTTP\/1\.1 200/.test(ok)) await new Promise((r) => setTimeout(r, 25));
    }
    assert.match(ok, /"status":"ok"/);
    proc.kill('SIGTERM');
    assert.equal(await exited, 0);
  } finally {
    proc.kill('SIGKILL');
  }
});
