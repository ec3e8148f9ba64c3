// fixture.mjs — the setup the WebSocket replica suites share: a scratch directory, the slow model
// (about 0.1 s per decode step), one redis-server for the file (flushed before each test), and
// replica(): an unmask server on that store, stopped after each test. useReplicas() registers the
// node:test hooks, so a suite calls it once at the top level.
import fs from 'node:fs';
import path from 'node:path';
import { before, after, beforeEach, afterEach } from 'node:test';
import { TMP, startServer, makeModel } from '../http/server.mjs';
import { startRedis, redisCmd } from './infra.mjs';

// name: the scratch directory under TMP; setup(dir): files the servers need, before they start;
// args(dir): server flags beside --store and --session-retention 60
export function useReplicas(name, { setup = () => {}, args = () => [] } = {}) {
  const fx = { dir: path.join(TMP, name), redis: null, model: null };
  let running = [];
  before(async () => {
    fs.rmSync(fx.dir, { recursive: true, force: true });
    fs.mkdirSync(fx.dir, { recursive: true });
    setup(fx.dir);
    fx.model = makeModel('http-slow', ['--d-model', '512', '--n-layers', '8']); // about 0.1 s per step
    fx.redis = await startRedis(path.join(fx.dir, 'redis'));
  });
  after(async () => {
    for (const s of running) await s.stop();
    await fx.redis?.stop();
  });
  beforeEach(async () => {
    await redisCmd(fx.redis.port, 'FLUSHALL');
  });
  afterEach(async () => {
    for (const s of running) await s.stop();
    running = [];
  });
  fx.replica = async () => {
    const s = await startServer(['--store', fx.redis.url, ...args(fx.dir), '--session-retention', '60'], { model: fx.model });
    s.wsUrl = `ws://127.0.0.1:${s.port}/ws`;
    running.push(s);
    return s;
  };
  return fx;
}
