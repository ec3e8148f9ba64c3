// infill.test.mjs — Infill mode of the browser UI over the WebSocket, on the bundled trained model
// (models/unmask-code-13m), in headless Chromium against the real server: the hole between the
// prefix and the suffix denoises live on the answer's canvas (a MutationObserver records that the
// canvas showed masked positions next to committed ones before the answer was done, and that the
// finished view has none), the request is one `generate` with `prompt` + `suffix`, the answer shown
// is the text HTTP POST /infill gives for the same parameters, and Replay opens and plays it.
// Screenshots go to $UNMASK_TEST_TMP.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { openUI } from './browser.mjs';
import { SRC, TMP, postJson, startServer } from '../protocol/harness.mjs';

const PREFIX = 'class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n';
const SUFFIX = '\n\n    def pop(self):\n        return self.items.pop()\n';
const GEN = 32;

describe('browser UI: Infill over the WebSocket on the bundled code model', () => {
  let srv;
  let ctx;
  let page;
  const problems = [];
  const sent = [];       // every generate message the page sent
  const received = [];   // every server event the page received
  const shots = path.join(TMP, 'screenshots');

  before(async () => {
    srv = await startServer({ model: path.join(SRC, 'models', 'unmask-code-13m'), name: 'infill-ui' });
    fs.mkdirSync(shots, { recursive: true });
    ({ ctx, page } = await openUI(srv, problems, { frames: { sent, received } }));
  });

  after(async () => {
    if (ctx) await ctx.close();
    if (srv) await srv.stop();
  });

  test('the hole denoises live between prefix and suffix, equals POST /infill, and replays', async () => {
    // one token per step: many frames, each with some positions still masked
    await page.selectOption('#p-decoder', 'low_confidence');
    await page.fill('#p-gen_length', String(GEN));
    await page.fill('#p-block_length', String(GEN));
    await page.fill('#p-steps', String(GEN));
    await page.setChecked('#p-drafts', true, { force: true });
    await page.click('.seg[data-mode="infill"]');
    // every DOM change of the transcript: did the newest answer's canvas show masks, and masks next
    // to committed tokens (a frame in the middle of the denoising)?
    await page.evaluate(() => {
      const t = document.getElementById('transcript');
      new MutationObserver(() => {
        const bot = [...t.querySelectorAll('.msg.bot')].at(-1);
        const c = bot && bot.querySelector('.canvas');
        if (!c) return;
        const masks = c.querySelectorAll('.tok.mask, .tok.draft').length;
        const done = c.querySelectorAll('.tok.done').length;
        if (masks > 0) window.__seen.masks++;
        if (masks > 0 && done > 0) window.__seen.partial++;
        const view = c.closest('.code-view');
        if (masks > 0 && view && view.querySelectorAll(':scope > .ctx').length === 2) window.__seen.ctxAround++;
      }).observe(t, { subtree: true, childList: true, attributes: true, characterData: true });
    });
    // A step frame not yet written absorbs the next steps (merged): on a loaded machine the whole
    // hole can fold into one frame, and then no frame in the middle is ever on screen. That is
    // timing, not a fault: such a generation is asked again, at most 3 times in all.
    let gen;
    let mine;
    let seen;
    let msg;
    for (let attempt = 0; attempt < 3; attempt++) {
      await page.evaluate(() => { window.__seen = { masks: 0, partial: 0, ctxAround: 0 }; });
      await page.fill('#prompt', `${PREFIX}<FILL>${SUFFIX}`);
      const bots = await page.locator('.msg.bot').count();
      await page.click('#send');
      await page.waitForFunction((n) => document.querySelectorAll('.msg.bot').length > n, bots);
      msg = page.locator('.msg.bot').last();
      // a committed token on the live canvas, or (every step folded into the last frame) the answer
      // already finished: the observer above has recorded what was on screen either way
      await page.waitForFunction(() => {
        const bot = [...document.querySelectorAll('.msg.bot')].at(-1);
        return bot && (bot.querySelector('.canvas .tok.done') || bot.dataset.state === 'done');
      }, null, { timeout: 120000 });
      await page.screenshot({ path: path.join(shots, 'infill-live.png') });
      await page.waitForSelector('.msg.bot.code:last-of-type[data-state="done"]', { timeout: 120000 });
      gen = sent.at(-1);
      mine = received.filter((m) => m.id === gen.id);
      seen = await page.evaluate(() => window.__seen);
      if (mine.filter((m) => m.type === 'step').length >= 3 && seen.partial > 0) break;
    }
    await page.screenshot({ path: path.join(shots, 'infill-done.png') });

    // the request: one WebSocket generate with the text before and after <FILL>
    assert.ok(gen, 'Infill sent a generate over the WebSocket');
    assert.equal(gen.prompt, PREFIX);
    assert.equal(gen.suffix, SUFFIX);
    assert.equal(gen.messages, undefined);
    const acc = mine.find((m) => m.type === 'accepted');
    const done = mine.find((m) => m.type === 'done');
    const steps = mine.filter((m) => m.type === 'step');
    assert.ok(acc && done, 'accepted and done for the infill generation');
    assert.ok(steps.length >= 2, `several step frames streamed (${steps.length})`);

    // seen live: masks while it ran, next to committed tokens, between prefix and suffix
    assert.ok(seen.masks > 0, `masked positions were on screen before done (${JSON.stringify(seen)})`);
    assert.ok(seen.partial > 0, `a frame with committed tokens and masks at once was on screen (${JSON.stringify(seen)})`);
    assert.ok(seen.ctxAround > 0, `the live canvas sat between the prefix and the suffix (${JSON.stringify(seen)})`);
    // ... and gone once done: prefix, fill, suffix
    assert.equal(await msg.locator('.tok.mask, .tok.draft').count(), 0, 'no masked position is left in the finished answer');
    assert.deepEqual(await msg.locator('.code-view > .ctx').allTextContents(), [PREFIX, SUFFIX], 'prefix and suffix around the fill');
    const fill = await msg.locator('.fill').textContent();
    assert.equal(fill, done.text, 'the fill shown is done.text');
    assert.ok(fill.length > 0, 'the hole is filled');

    // the same answer as HTTP /infill with the same (effective) parameters
    const { gen_length: n, ...params } = acc.params;
    const ref = await postJson(srv.base, '/infill', { ...params, input_prefix: PREFIX, input_suffix: SUFFIX, n_predict: n });
    assert.equal(ref.status, 200, ref.text);
    assert.equal(fill, ref.body.content, 'the UI shows what POST /infill answers for the same parameters');

    // Replay: opens under the answer, starts from all masks, plays to the final text
    await msg.locator('.act.replay-btn').click();
    const replay = msg.locator('.replay');
    await replay.waitFor();
    const total = Number(await replay.locator('.rp-scrub').getAttribute('max'));
    assert.equal(total, steps.length, 'one replay frame per step frame received');
    assert.equal(await replay.locator('.rp-canvas').textContent(), done.text, 'the replay ends on the answer');
    await replay.locator('.rp-scrub').fill('1');
    await msg.locator('.replay[data-step="1"]').waitFor({ state: 'attached' });
    assert.ok(await replay.locator('.rp-canvas .tok.mask, .rp-canvas .tok.draft').count() > 0, 'the first replay frame has masked positions');
    assert.ok(await replay.locator('.rp-canvas .tok.done').count() > 0, 'the first replay frame has committed tokens');
    await replay.locator('.rp-play').click();
    await msg.locator(`.replay[data-step="${total}"]:not([data-playing])`).waitFor({ state: 'attached', timeout: 60000 });
    assert.equal(await replay.locator('.rp-canvas').textContent(), done.text, 'played to the end: the answer');
    await page.screenshot({ path: path.join(shots, 'infill-replay.png') });
    assert.deepEqual(problems, []);
  });
});
