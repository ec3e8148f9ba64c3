// cache.test.mjs — the KV cache parameters on every HTTP transport and in the serve settings:
// /v1/models reports the modes and the server's decode defaults (dual unless configured);
// OpenAI chat/completions, FIM, SGLang /generate (sampling_params), llama.cpp /infill and async jobs
// each apply `cache` (observable: GET /stats kv_cache.opened moves only when a request runs with a
// cache) and refuse bad values (unknown mode, negative looks / refresh, wrong types) with 400 and the
// field named; serve --cache, the config file's "cache" and --algorithm-config's cache keys set the
// defaults, and bad values there stop the server at startup with a message.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { BIN, TMP, makeModel, post, startServer, until } from './server.mjs';

let dflt; // serve defaults (cache auto -> dual)
let off; // serve --cache none
before(async () => {
  [dflt, off] = await Promise.all([startServer(), startServer(['--cache', 'none'])]);
});
after(async () => {
  await Promise.all([dflt?.stop(), off?.stop()]);
});

const stats = async (srv) => (await fetch(`${srv.url}/stats`)).json();
const models = async (srv) => (await fetch(`${srv.url}/v1/models`)).json();

// route -> body builder: params go where that API takes them
const routes = {
  '/v1/chat/completions': (p) => ({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 8, ...p }),
  '/v1/completions': (p) => ({ prompt: 'hi', max_tokens: 8, ...p }),
  '/v1/fim/completions': (p) => ({ prompt: 'a', suffix: 'b', max_tokens: 8, ...p }),
  '/generate': (p) => ({ text: 'hi', sampling_params: { max_new_tokens: 8, ...p } }),
  '/infill': (p) => ({ input_prefix: 'a', input_suffix: 'b', n_predict: 8, ...p }),
  '/v1/jobs': (p) => ({ prompt: 'hi', max_tokens: 8, ...p }),
};
const paramName = (route, k) => (route === '/generate' ? `sampling_params.${k}` : k);

// Run one request to completion (jobs: poll until terminal). Returns the HTTP status of the POST.
async function run(srv, route, params) {
  const r = await post(`${srv.url}${route}`, routes[route](params));
  if (route === '/v1/jobs' && r.status === 202) {
    const id = r.json().id;
    const j = await until('job done', async () => {
      const s = await (await fetch(`${srv.url}/v1/jobs/${id}`)).json();
      return ['succeeded', 'failed', 'cancelled'].includes(s.status) && s;
    });
    assert.equal(j.status, 'succeeded', JSON.stringify(j));
  }
  return r;
}

test('/v1/models: cache modes and the server decode defaults', async () => {
  const m = (await models(dflt)).data[0];
  assert.deepEqual(m.meta.cache_modes, ['none', 'prefix', 'dual', 'vicinity']);
  assert.equal(m.meta.decode_defaults.cache, 'dual', 'serving default');
  assert.equal(m.meta.decode_defaults.cache_refresh, 0);
  assert.equal((await models(off)).data[0].meta.decode_defaults.cache, 'none');
});

for (const route of Object.keys(routes)) {
  test(`${route}: cache parameters applied, bad ones refused`, async () => {
    // --cache none server: a request asking for a cache runs with one, one that does not runs without
    let before = (await stats(off)).kv_cache;
    let r = await run(off, route, {});
    assert.ok(r.status < 300, r.text);
    let st = (await stats(off)).kv_cache;
    assert.equal(st.opened, before.opened, 'server default none: no cache');
    for (const p of [{ cache: 'dual' }, { cache: 'vicinity', prefix_look: 2, after_look: 3, warmup_steps: 1 },
      { cache: 'prefix', cache_refresh: 2 }]) {
      before = st;
      r = await run(off, route, p);
      assert.ok(r.status < 300, `${JSON.stringify(p)}: ${r.text}`);
      st = (await stats(off)).kv_cache;
      assert.ok(st.opened > before.opened, `${JSON.stringify(p)} runs with a cache`);
      assert.equal(st.slots, 0, 'the cache is gone once the request finished');
      assert.equal(st.bytes, 0);
    }
    // default server (dual): the request's none wins
    before = (await stats(dflt)).kv_cache;
    r = await run(dflt, route, { cache: 'none' });
    assert.ok(r.status < 300, r.text);
    assert.equal((await stats(dflt)).kv_cache.opened, before.opened, 'cache none on a dual server: no cache');
    r = await run(dflt, route, {});
    assert.ok((await stats(dflt)).kv_cache.opened > before.opened, 'default: dual');
    // bad values: 400 naming the field
    const bad = [
      [{ cache: 'quad' }, 'cache', /none, prefix, dual, vicinity/],
      [{ cache: true }, 'cache', /none, prefix, dual, vicinity/],
      [{ prefix_look: -1 }, 'prefix_look', /prefix_look must be between 0 and \d+.*got -1/],
      [{ after_look: -2, cache: 'vicinity' }, 'after_look', /got -2/],
      [{ cache_refresh: -3 }, 'cache_refresh', /got -3/],
      [{ warmup_steps: 1.5 }, 'warmup_steps', /integer/],
    ];
    for (const [p, k, msg] of bad) {
      const e = await post(`${dflt.url}${route}`, routes[route](p));
      assert.equal(e.status, 400, `${route} ${JSON.stringify(p)}: ${e.text}`);
      const err = e.json().error;
      assert.equal(err.param, paramName(route, k), `${route} ${JSON.stringify(p)}: ${e.text}`);
      assert.match(err.message, msg, `${route} ${JSON.stringify(p)}`);
    }
  });
}

test('serve settings: config file "cache", --algorithm-config cache keys, bad values at startup', async () => {
  const model = makeModel();
  const cfg = path.join(TMP, 'cache-serve.json');
  fs.writeFileSync(cfg, JSON.stringify({ cache: 'prefix' }));
  const algo = path.join(TMP, 'cache-algo.yaml');
  fs.writeFileSync(algo, 'algorithm: LowConfidence\ncache_type: vicinity\nprefix_look: 8\ncache_update_freq: 4\n');
  const a = await startServer(['--config', cfg], { model });
  const b = await startServer(['--config', cfg, '--algorithm-config', algo], { model });
  try {
    assert.equal((await models(a)).data[0].meta.decode_defaults.cache, 'prefix', 'config file "cache"');
    const d = (await models(b)).data[0].meta.decode_defaults;
    assert.deepEqual([d.cache, d.prefix_look, d.cache_refresh, d.decoder], ['vicinity', 8, 4, 'threshold'],
      'the algorithm config wins over the config file');
  } finally {
    await Promise.all([a.stop(), b.stop()]);
  }
  const runServe = (args) => spawnSync(BIN, ['serve', '--store', 'memory', '--model', model, '--port', '0', ...args],
    { encoding: 'utf8', timeout: 30000 });
  let r = runServe(['--cache', 'quad']);
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /--cache must be auto, none, prefix, dual or vicinity, got 'quad'/);
  fs.writeFileSync(cfg, JSON.stringify({ cache: 5 }));
  r = runServe(['--config', cfg]);
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /"cache" must be a string/);
  fs.writeFileSync(algo, 'cache: sometimes\n');
  r = runServe(['--algorithm-config', algo]);
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /cache-algo\.yaml:1: 'cache' must be one of none, prefix, dual, vicinity/);
});
