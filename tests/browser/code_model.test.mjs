// code_model.test.mjs — the browser UI on the bundled trained model (models/unmask-code-13m, a base
// code model without a chat template), in headless Chromium against the real server: the page opens
// in Complete mode with a code-shaped example prompt (Chat is disabled), the completion denoises in
// the canvas after the prompt and its committed text is Python (keywords, not noise), and Infill
// fills the <FILL> marker between the prefix and the suffix; after a reload the composer keeps the
// typed draft (the example only on a first visit) and the last answer stays in view above it.
// Screenshots go to $UNMASK_TEST_TMP.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { openUI } from './browser.mjs';
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
    ({ ctx, page } = await openUI(srv, problems));
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

  // After a reload: the composer holds what the user typed (not the example again), an emptied
  // composer stays empty (the example is for a first visit only), and the last answer is in view
  // above the composer although the composer grew to fit the restored draft.
  test('a reload keeps the typed draft, shows the example only on a first visit, and the last answer above the composer', async () => {
    const draft = 'def mean(values):\n    """Return the average of values."""\n    total = 0\n    for v in values:\n        total += v\n\n\n';
    await page.click('.seg[data-mode="raw"]');
    await page.fill('#prompt', draft);
    await page.reload();
    await page.waitForSelector('#model-pill.ready');
    await page.waitForSelector('.seg[data-mode="raw"].active');
    const geo = () => page.evaluate(() => {
      const t = document.getElementById('transcript');
      const tb = t.getBoundingClientRect();
      return { overflow: t.scrollHeight - t.clientHeight, scrollTop: t.scrollTop, transcriptBottom: tb.bottom,
        composerTop: document.getElementById('composer').getBoundingClientRect().top,
        answerBottom: [...document.querySelectorAll('.msg.bot')].at(-1).getBoundingClientRect().bottom };
    });
    // the smooth scroll to the end may still run: wait for the answer to be in view (or time out)
    await page.waitForFunction(() => {
      const t = document.getElementById('transcript').getBoundingClientRect();
      return [...document.querySelectorAll('.msg.bot')].at(-1).getBoundingClientRect().bottom <= t.bottom + 1;
    }, null, { timeout: 15000, polling: 'raf' }).catch(() => {});
    const g = await geo();
    assert.ok(g.overflow > 0, `the transcript overflows (${JSON.stringify(g)})`);
    assert.ok(g.transcriptBottom <= g.composerTop + 1, 'the transcript ends where the composer starts');
    assert.ok(g.answerBottom <= g.transcriptBottom + 1,
      `the last answer ends at ${g.answerBottom} px, behind the composer from ${g.transcriptBottom} px (scrolled ${g.scrollTop} of ${g.overflow} px)`);
    await page.screenshot({ path: path.join(shots, 'code-model-reload.png') });
    assert.equal(await page.inputValue('#prompt'), draft, 'the composer keeps what was typed');
    await page.fill('#prompt', '');
    await page.reload();
    await page.waitForSelector('#model-pill.ready');
    await page.waitForSelector('.seg[data-mode="raw"].active');
    assert.equal(await page.inputValue('#prompt'), '', 'an emptied composer stays empty: the example is only for a first visit');
    assert.deepEqual(problems, []);
  });
});
