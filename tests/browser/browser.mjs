// browser.mjs — Debian's Chromium through playwright-core for the browser suites: the headless
// flags this machine needs, a fresh profile under $UNMASK_TEST_TMP, and one page whose errors and
// console warnings are collected into the caller's `problems` array (each suite asserts it empty).

import fs from 'node:fs';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { TMP } from '../protocol/harness.mjs';

export const CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync'];

// Launches Chromium (dark scheme, the given viewport) and returns { ctx, page }; close ctx when done.
export async function openPage(problems, { viewport = { width: 1360, height: 860 } } = {}) {
  const profile = fs.mkdtempSync(path.join(TMP, 'chromium-profile-'));
  const ctx = await chromium.launchPersistentContext(profile, {
    executablePath: '/usr/bin/chromium', args: CHROMIUM_ARGS, headless: true, viewport, colorScheme: 'dark',
  });
  const page = ctx.pages()[0] || (await ctx.newPage());
  page.on('pageerror', (e) => problems.push(`pageerror: ${e.message}`));
  page.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') problems.push(`console ${m.type()}: ${m.text()}`); });
  return { ctx, page };
}

// openPage, then the UI of srv: resolves once it is connected and the model is ready. With
// `frames` ({ sent, received } arrays), every `generate` the page sends and every server event it
// receives on its WebSockets are pushed there (listening starts before the page loads).
export async function openUI(srv, problems, { frames, ...opts } = {}) {
  const { ctx, page } = await openPage(problems, opts);
  if (frames) {
    page.on('websocket', (ws) => {
      ws.on('framesent', (f) => {
        const m = JSON.parse(f.payload);
        if (m.type === 'generate') frames.sent.push(m);
      });
      ws.on('framereceived', (f) => frames.received.push(JSON.parse(f.payload)));
    });
  }
  await page.goto(`${srv.base}/`);
  await page.waitForSelector('#conn[data-state="open"]');
  await page.waitForSelector('#model-pill.ready');
  return { ctx, page };
}
