// ui.test.mjs — the browser UI in headless Chromium (playwright-core, Debian's /usr/bin/chromium)
// against the real server: the page loads under the strict CSP without errors, a prompt's answer
// visibly denoises (DOM snapshots with masks + drafts + committed tokens, then none left), blocks
// are marked final, the canvas text equals the done text, Stop cancels a running generation (on a
// checkpoint slow enough that the click always comes first), a dropped connection is resumed and
// the generation completes. Screenshots go to $UNMASK_TEST_TMP (artifacts).

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { openUI } from './browser.mjs';
import { TMP, makeModelOnce, startServer, tinyModel } from '../protocol/harness.mjs';


async function setPageParams(page, p) {
  for (const [k, v] of Object.entries(p)) {
    const sel = `#p-${k}`;
    if (typeof v === 'boolean') await page.setChecked(sel, v, { force: true });
    else if (k === 'decoder' || k === 'cache') await page.selectOption(sel, v);
    else await page.fill(sel, String(v));
  }
}

describe('browser UI', () => {
  let srv;
  let ctx;
  let page;
  const problems = [];
  const shots = path.join(TMP, 'screenshots');

  before(async () => {
    srv = await startServer({ model: tinyModel('browser') });
    fs.mkdirSync(shots, { recursive: true });
    ({ ctx, page } = await openUI(srv, problems));
  });

  after(async () => {
    if (ctx) await ctx.close();
    if (srv) await srv.stop();
  });

  const setParams = (p) => setPageParams(page, p);

  // Record the canvas state after every DOM mutation batch of the newest answer.
  async function recordCanvas() {
    await page.evaluate(() => {
      window.__snaps = [];
      window.__events = [];
      if (window.__recording) return;
      window.__recording = true;
      window.unmask.addEventListener('message', (e) => window.__events.push(e.detail.msg));
      const t = document.getElementById('transcript');
      const snap = () => {
        const c = [...document.querySelectorAll('.msg.bot .canvas')].at(-1);
        if (!c) return;
        window.__snaps.push({
          mask: c.querySelectorAll('.tok.mask').length,
          draft: c.querySelectorAll('.tok.draft').length,
          done: c.querySelectorAll('.tok.done').length,
          final: c.querySelectorAll('.blk.final').length,
        });
      };
      new MutationObserver(snap).observe(t, { subtree: true, childList: true, attributes: true, characterData: true });
    });
  }

  // the text content of the page's Markdown rendering of text
  const mdText = (text) => page.evaluate((t) => {
    const d = document.createElement('div');
    d.appendChild(window.unmaskUI.renderMarkdown(t));
    return d.textContent;
  }, text);

  test('the page loads under the strict CSP without errors', async () => {
    const csp = (await srv.get('/')).headers['content-security-policy'];
    assert.match(csp, /script-src 'self'/);
    assert.doesNotMatch(csp, /unsafe-inline/);
    assert.equal(await page.title(), 'unmask — watch text emerge from masks');
    assert.equal(await page.locator('#hero h1').textContent(), 'Watch text emerge from noise.');
    await page.screenshot({ path: path.join(shots, 'ui-empty.png') });
    assert.deepEqual(problems, []);
  });

  test('a prompt visibly denoises: masks -> drafts -> committed text, blocks finalized', async () => {
    await setParams({ gen_length: 48, block_length: 16, steps: 48, decoder: 'low_confidence', drafts: true, draft_every: 1, every: 1 });
    // A step frame not yet written absorbs the next steps (merged); on a loaded machine whole
    // blocks can fold into one frame each, and then no drafts are ever on screen. That is timing,
    // not a fault: such a generation is asked again, at most 3 times in all.
    let snaps;
    let events;
    for (let attempt = 0; attempt < 3; attempt++) {
      await recordCanvas();
      const bots = await page.locator('.msg.bot').count();
      await page.fill('#prompt', 'Write a haiku about autumn rain.');
      await page.keyboard.press('Enter');
      // attached, not visible: a finished chat answer swaps its live canvas for the Markdown view,
      // and the tiny model may be done before this looks
      await page.waitForSelector('.msg.bot:last-of-type .tok.done', { state: 'attached' });
      await page.screenshot({ path: path.join(shots, 'ui-denoising.png') });
      await page.waitForFunction((n) => document.querySelectorAll('.msg.bot').length === n + 1 &&
        document.querySelector('.msg.bot:last-of-type')?.dataset.state === 'done', bots, { timeout: 120000 });
      await page.screenshot({ path: path.join(shots, 'ui-done.png') });
      snaps = await page.evaluate(() => window.__snaps);
      events = await page.evaluate(() => window.__events);
      if (snaps.some((s) => s.draft > 0)) break;
    }
    assert.ok(snaps.some((s) => s.mask === 48 && s.done === 0), 'starts as 48 masks');
    assert.ok(snaps.some((s) => s.mask > 0 && s.done > 0), 'intermediate state: some committed, some still masked');
    assert.ok(snaps.some((s) => s.draft > 0), 'drafts shown for masked positions');
    assert.ok(snaps.some((s) => s.final >= 1 && s.mask > 0), 'a block is marked final while later blocks still denoise');
    const last = snaps.at(-1);
    assert.equal(last.mask, 0, 'no masks left at the end');
    assert.equal(last.draft, 0, 'no drafts left at the end');
    const done = events.find((m) => m.type === 'done');
    assert.ok(done);
    const blocks = events.filter((m) => m.type === 'block');
    assert.equal(await page.locator('.msg.bot').last().locator('.blk.final').count(), blocks.length);
    const canvasText = await page.locator('.msg.bot .canvas').last().evaluate((c) => c.textContent);
    assert.equal(canvasText, done.text, 'the live canvas ends with exactly the final text');
    const answer = page.locator('.msg.bot').last();
    assert.equal(await answer.locator('.md').isVisible(), true, 'the finished answer is shown as Markdown');
    assert.equal(await answer.locator('.canvas').isVisible(), false, 'in place of the live canvas');
    assert.equal(await answer.locator('.md').evaluate((e) => e.textContent), await mdText(done.text),
      'the Markdown view shows the final text');
    assert.match(await page.locator('.msg.bot .meta').last().textContent(), /tokens/);
    assert.equal(await page.locator('.msg.bot').last().getAttribute('data-state'), 'done');
    assert.deepEqual(problems, []);
  });

  test('a dropped connection is resumed and the answer completes', async () => {
    await setParams({ gen_length: 64, block_length: 16, steps: 64 });
    await recordCanvas();
    await page.fill('#prompt', 'keep going through a network drop');
    await page.keyboard.press('Enter');
    const msg = page.locator('.msg.bot').last();
    await msg.locator('.tok.done').first().waitFor({ state: 'attached' });
    // the network-drop control is a developer tool: hidden until Debug is on
    assert.equal(await page.locator('#drop').isVisible(), false, 'hidden without Debug');
    await page.setChecked('#debug-toggle', true, { force: true });
    await page.click('#drop');
    await page.waitForSelector('#conn[data-state="open"] >> text=/resumed/', { timeout: 30000 });
    await page.waitForSelector('.msg.bot:last-of-type[data-state="done"]', { timeout: 120000 });
    const events = await page.evaluate(() => window.__events);
    const done = events.find((m) => m.type === 'done');
    assert.ok(done, 'done arrived after the resume');
    const canvasText = await msg.locator('.canvas').evaluate((c) => c.textContent);
    assert.equal(canvasText, done.text);
    assert.equal(await msg.locator('.tok.mask').count(), 0);
    assert.equal(Number(await page.locator('#s-reconnects').textContent()), 1);
    const seqs = events.map((m) => m.seq);
    assert.deepEqual(seqs, seqs.map((_, i) => seqs[0] + i), 'the page saw every seq exactly once across the drop');
    const deadline = problems.filter((p) => !/WebSocket/.test(p)); // the drop itself may log a socket warning
    assert.deepEqual(deadline, []);
  });

  test('the KV cache settings reach the server and are echoed in the accepted params', async () => {
    await page.selectOption('#p-cache', 'none');
    assert.match(await page.locator('#f-prefix_look').getAttribute('class'), /dim/, 'look fields dimmed without vicinity');
    await setParams({ gen_length: 32, block_length: 16, steps: 16, cache: 'vicinity', cache_refresh: 3, prefix_look: 4,
      after_look: 5 });
    assert.doesNotMatch(await page.locator('#f-prefix_look').getAttribute('class'), /dim/);
    await recordCanvas();
    await page.fill('#prompt', 'cached decoding');
    await page.keyboard.press('Enter');
    await page.waitForSelector('.msg.bot:last-of-type[data-state="done"]', { timeout: 120000 });
    const events = await page.evaluate(() => window.__events);
    const acc = events.find((m) => m.type === 'accepted');
    assert.ok(acc && acc.params, 'accepted carries the effective parameters');
    assert.deepEqual([acc.params.cache, acc.params.cache_refresh, acc.params.prefix_look, acc.params.after_look],
      ['vicinity', 3, 4, 5]);
    assert.ok(events.find((m) => m.type === 'done'));
    assert.deepEqual(problems, []);
  });

  test('light theme', async () => {
    await page.click('#theme-toggle');
    assert.equal(await page.evaluate(() => document.documentElement.dataset.theme), 'light');
    await page.screenshot({ path: path.join(shots, 'ui-light.png') });
  });
});

describe('browser UI: Stop', () => {
  let srv;
  let ctx;
  let page;
  const problems = [];

  before(async () => {
    // a checkpoint slow enough that its 512 steps take tens of seconds here (the tiny one does them
    // in under two, which a loaded machine's click can miss): Stop always meets a running generation
    const model = makeModelOnce(path.join(TMP, 'model-browser-slow'), ['--d-model', '512', '--n-layers', '8']);
    srv = await startServer({ model });
    ({ ctx, page } = await openUI(srv, problems));
  });

  after(async () => {
    if (ctx) await ctx.close();
    if (srv) await srv.stop();
  });

  test('Stop cancels a running generation', async () => {
    // no drafts: the page keeps up with every step, so the click is not held behind a busy page
    await setPageParams(page, { gen_length: 512, block_length: 512, steps: 512, drafts: false });
    await page.evaluate(() => {
      window.__done = null;
      window.unmask.addEventListener('message', (e) => { if (e.detail.msg.type === 'done') window.__done = e.detail.msg; });
    });
    await page.fill('#prompt', 'a long one');
    await page.keyboard.press('Enter');
    const msg = page.locator('.msg.bot').last();
    // running, not merely queued: the page shows a committed token of it
    await msg.locator('.tok.done').first().waitFor({ state: 'attached' });
    await msg.locator('.cancel').click();
    await page.waitForSelector('.msg.bot:last-of-type:is([data-state="cancelled"], [data-state="done"], [data-state="error"])', { timeout: 60000 });
    assert.equal(await msg.getAttribute('data-state'), 'cancelled', await msg.locator('.meta').textContent());
    assert.match(await msg.locator('.meta').textContent(), /cancelled/);
    const done = await page.evaluate(() => window.__done);
    assert.equal(done?.finish_reason, 'cancelled', JSON.stringify(done));
    assert.ok(done.usage.steps > 0 && done.usage.steps < 512, `stopped part-way: ${done.usage.steps} of 512 steps`);
    assert.deepEqual(problems, []);
  });
});
