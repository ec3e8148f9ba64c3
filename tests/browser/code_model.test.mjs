// code_model.test.mjs — the browser UI on the bundled trained model (models/unmask-code-13m, a base
// code model without a chat template), in headless Chromium against the real server: the page opens
// in Complete mode with a code-shaped example prompt (Chat is disabled), the completion denoises in
// the canvas after the prompt and its committed text is Python (keywords, not noise), and Infill
// fills the <FILL> marker between the prefix and the suffix. Screenshots go to $UNMASK_TEST_TMP.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { openPage } from './browser.mjs';
import { SRC, TMP, startServer } from '../protocol/harness.mjs';

const PY_WORDS = /\b(return|self|if|else|for|in|not|None|is|def|import|with|and|or|True|False)\b/g;

describe('browser UI on the bundled code model', () => {
  let srv;
  let ctx;
  let page;
  const problems = [];
  const shots = path.join(TMP, 'screenshots');

  before(async () => {
    srv = await startServer({ model: path.join(SRC, 'models', 'unmask-code-13m'), name: 'code-model' });
    fs.mkdirSync(shots, { recursive: true });
    ({ ctx, page } = await openPage(problems));
    await page.goto(`${srv.base}/`);
    await page.waitForSelector('#conn[data-state="open"]');
    await page.waitForSelector('#model-pill.ready');
  });

  after(async () => {
    if (ctx) await ctx.close();
    if (srv) await srv.stop();
  });

  test('a base model opens in Complete mode with a code example; Chat is disabled', async () => {
    await page.waitForSelector('.seg[data-mode="raw"].active');
    assert.equal(await page.locator('.seg[data-mode="chat"]').isDisabled(), true);
    const prompt = await page.inputValue('#prompt');
    assert.match(prompt, /^(import|def|class) /m, 'the composer holds a code-shaped example');
    assert.ok(await page.locator('#chips .chip.code').count() >= 1, 'the suggestions are code');
    await page.screenshot({ path: path.join(shots, 'code-model-empty.png') });
    assert.deepEqual(problems, []);
  });

  test('a completion denoises after the prompt and its text is Python', async () => {
    await page.fill('#p-gen_length', '48');
    await page.fill('#p-block_length', '16');
    await page.evaluate(() => {
      window.__events = [];
      window.unmask.addEventListener('message', (e) => window.__events.push(e.detail.msg));
    });
    const prompt = await page.inputValue('#prompt');
    await page.click('#send');
    await page.waitForSelector('.msg.bot.code[data-state="done"]', { timeout: 120000 });
    await page.screenshot({ path: path.join(shots, 'code-model-completion.png') });
    const events = await page.evaluate(() => window.__events);
    const done = events.find((m) => m.type === 'done');
    assert.ok(done && done.text.length > 0, 'a non-empty completion');
    const msg = page.locator('.msg.bot').last();
    assert.equal(await msg.locator('.canvas').evaluate((c) => c.textContent), done.text, 'the canvas shows the final text');
    assert.equal(await msg.locator('.code-view .ctx').textContent(), prompt, 'the prompt is shown before the canvas');
    const words = new Set(done.text.match(PY_WORDS) || []);
    assert.ok(words.size >= 2, `Python keywords in the committed text: ${JSON.stringify(done.text)}`);
    const steps = events.filter((m) => m.type === 'step');
    assert.ok(steps.length >= 1 && steps.length <= 48);
    assert.deepEqual(problems, []);
  });

  test('Infill fills the <FILL> marker between prefix and suffix', async () => {
    await page.click('.seg[data-mode="infill"]');
    const text = await page.inputValue('#prompt');
    assert.ok(text.includes('<FILL>'), 'the infill example has a <FILL> marker');
    await page.fill('#p-gen_length', '24');
    await page.fill('#p-block_length', '24');
    await page.click('#send');
    await page.waitForSelector('.msg.bot.code:last-of-type[data-state="done"]', { timeout: 120000 });
    await page.screenshot({ path: path.join(shots, 'code-model-infill.png') });
    const msg = page.locator('.msg.bot').last();
    const [before, after] = text.split('<FILL>');
    const ctxs = await msg.locator('.ctx').allTextContents();
    assert.deepEqual(ctxs, [before, after], 'prefix and suffix around the fill');
    const fill = await msg.locator('.fill').textContent();
    assert.ok(fill.trim().length > 0, 'the hole is filled');
    assert.deepEqual(problems, []);
  });
});
