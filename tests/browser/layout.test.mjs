// layout.test.mjs — where things land on the chat page, measured from the page's own layout in
// headless Chromium against the real server (tiny chat model): Replay opened under the last answer
// is scrolled into the transcript's visible box; the replay canvas keeps every block (the active
// block's highlight included) inside its box, also for code tokens that are long runs of spaces
// (which pre-wrap would let hang past the right edge); a composer that grows (a long draft) keeps
// the last answer in view above it instead of hiding its end.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { openUI } from './browser.mjs';
import { TMP, startServer, tinyModel } from '../protocol/harness.mjs';

// {top, bottom, left, right} of the element matching selector (the last one), rounded to 0.1 px
const BOX = `(sel) => {
  const e = [...document.querySelectorAll(sel)].at(-1);
  if (!e) return null;
  const b = e.getBoundingClientRect();
  const r = (x) => Math.round(x * 10) / 10;
  return { top: r(b.top), bottom: r(b.bottom), left: r(b.left), right: r(b.right) };
}`;

// Polls cond (a function evaluated in the page) until it is true or timeoutMs passed; returns
// whether it held. The caller asserts with the page's measurements, so a failure says what it saw.
async function settles(page, cond, arg, timeoutMs = 15000) {
  try {
    await page.waitForFunction(cond, arg, { timeout: timeoutMs, polling: 'raf' });
    return true;
  } catch {
    return false;
  }
}

// A conversation with `exchanges` finished answers, the last one with a denoising trace whose
// active block holds a token of 200 spaces right after a long word (an indentation run in code).
function conversation(exchanges) {
  const turns = [];
  for (let i = 0; i < exchanges; i++) {
    turns.push({ id: `u${i}`, role: 'user', mode: 'chat', content: `question ${i}` });
    turns.push({ id: `a${i}`, role: 'assistant', mode: 'chat', replyTo: `u${i}`, status: 'stop',
      content: `answer ${i}: ${'lorem ipsum dolor sit amet '.repeat(12)}`, meta: 'finished' });
  }
  const word = 'x'.repeat(70);
  const spaces = ' '.repeat(200);
  // 8 positions in blocks of 4: block 0 commits a long word and a run of spaces; block 1 stays
  // active (drafts) for one frame, then everything is committed
  const tok = (i, text) => [i, 100 + i, text, 0.9, 0];
  const trace = { v: 1, n: 8, B: 4, np: 3, layout: 'llada', ids: false, nb: 2, ev: [
    { k: 's', t: 1, s: 0, b: 0, c: [tok(0, word)], d: [tok(1, spaces), tok(2, word)] },
    { k: 's', t: 2, s: 1, b: 0, c: [tok(1, spaces), tok(2, word), tok(3, spaces)], d: [] },
    { k: 'b', t: 2, b: 0, st: 2, bs: 2 },
    { k: 's', t: 3, s: 2, b: 1, c: [tok(4, word)], d: [tok(5, spaces), tok(6, word), tok(7, spaces)] },
    { k: 's', t: 4, s: 3, b: 1, c: [tok(5, spaces), tok(6, word), tok(7, spaces)], d: [] },
    { k: 'b', t: 4, b: 1, st: 4, bs: 2 },
  ], done: { t: 5, reason: 'stop' } };
  turns.at(-1).trace = trace;
  return { id: 'layout', title: 'layout', created: 1, updated: 1, turns };
}

describe('browser UI layout', () => {
  let srv;
  let ctx;
  let page;
  const problems = [];
  const shots = path.join(TMP, 'screenshots');

  before(async () => {
    srv = await startServer({ model: tinyModel('browser-layout') });
    fs.mkdirSync(shots, { recursive: true });
    ({ ctx, page } = await openUI(srv, problems));
  });

  after(async () => {
    if (ctx) await ctx.close();
    if (srv) await srv.stop();
  });

  const box = (sel) => page.evaluate(`(${BOX})(${JSON.stringify(sel)})`);

  test('Replay opened under the last answer is scrolled into view', async () => {
    for (const [k, v] of Object.entries({ gen_length: 48, block_length: 16, steps: 48 })) await page.fill(`#p-${k}`, String(v));
    for (let i = 1; i <= 2; i++) {
      await page.fill('#prompt', `question ${i}`);
      await page.keyboard.press('Enter');
      await page.waitForFunction((k) => document.querySelectorAll('.msg.bot[data-state="done"]').length === k, i, { timeout: 120000 });
    }
    // the last answer sits at the bottom of the transcript: what opens under it is below the fold
    await page.locator('.msg.bot').last().locator('.act.replay-btn').click();
    await page.waitForSelector('.msg.bot:last-of-type .replay');
    const inView = `() => {
      const t = document.getElementById('transcript').getBoundingClientRect();
      const r = document.querySelector('.msg.bot:last-of-type .replay').getBoundingClientRect();
      return r.top >= t.top - 1 && r.bottom <= t.bottom + 1;
    }`;
    await settles(page, inView);
    const t = await box('#transcript');
    const r = await box('.msg.bot:last-of-type .replay');
    assert.ok(r.bottom - r.top < t.bottom - t.top, `the replay (${r.bottom - r.top} px) fits the transcript (${t.bottom - t.top} px)`);
    assert.ok(r.top >= t.top - 1 && r.bottom <= t.bottom + 1,
      `the whole replay is in the transcript's visible box: replay ${r.top}..${r.bottom}, transcript ${t.top}..${t.bottom}`);
    await page.screenshot({ path: path.join(shots, 'layout-replay-open.png') });
    assert.deepEqual(problems, []);
  });

  test('the replay keeps every block, the active one included, inside its box at every frame', async () => {
    await page.evaluate((c) => {
      localStorage.setItem('unmask.conversations.v1', JSON.stringify([c]));
      localStorage.setItem('unmask.currentConversation', c.id);
    }, conversation(1));
    await page.reload();
    await page.waitForSelector('#conn[data-state="open"]');
    const answer = page.locator('.msg.bot').last();
    await answer.locator('.act.replay-btn').click();
    const scrub = answer.locator('.replay .rp-scrub');
    const frames = Number(await scrub.getAttribute('max'));
    assert.equal(frames, 4);
    let sawActive = false;
    for (let k = 0; k <= frames; k++) {
      await scrub.fill(String(k));
      await answer.locator(`.replay[data-step="${k}"]`).waitFor();
      const m = await answer.evaluate((card) => {
        const c = card.querySelector('.rp-canvas').getBoundingClientRect();
        const cs = getComputedStyle(card.querySelector('.rp-canvas'));
        const right = c.right - parseFloat(cs.paddingRight);
        let most = 0;
        let active = 0;
        for (const b of card.querySelectorAll('.rp-canvas .blk')) {
          for (const r of b.getClientRects()) {
            most = Math.max(most, r.right);
            if (b.classList.contains('active')) active = Math.max(active, r.right);
          }
        }
        return { card: card.getBoundingClientRect().right, right, most, active };
      });
      if (m.active > 0) sawActive = true;
      assert.ok(m.most <= m.right + 0.5, `frame ${k}: the blocks end at ${m.most} px, past the replay canvas's content edge at ${m.right} px (card edge ${m.card} px)`);
    }
    assert.ok(sawActive, 'some frame shows an active block');
    await scrub.fill('1');
    await page.screenshot({ path: path.join(shots, 'layout-replay-active.png') });
    assert.deepEqual(problems, []);
  });

  test('a composer that grows keeps the last answer in view above it', async () => {
    await page.evaluate((c) => {
      localStorage.setItem('unmask.conversations.v1', JSON.stringify([c]));
      localStorage.setItem('unmask.currentConversation', c.id);
    }, conversation(4));
    await page.reload();
    await page.waitForSelector('#conn[data-state="open"]');
    const atEnd = `() => {
      const t = document.getElementById('transcript');
      return t.scrollHeight > t.clientHeight && t.scrollTop >= t.scrollHeight - t.clientHeight - 1;
    }`;
    assert.ok(await settles(page, atEnd), 'the transcript overflows and opens at its end');
    const before = await box('#composer');
    // a long draft (Shift+Enter lines) grows the composer and shrinks the transcript
    await page.focus('#prompt');
    for (let i = 0; i < 6; i++) {
      await page.keyboard.type(`line ${i}`);
      await page.keyboard.press('Shift+Enter');
    }
    const grown = await box('#composer');
    assert.ok(before.top - grown.top > 60, `the composer grew: its top moved from ${before.top} to ${grown.top} px`);
    const visible = `() => {
      const t = document.getElementById('transcript').getBoundingClientRect();
      const a = [...document.querySelectorAll('.msg.bot')].at(-1).getBoundingClientRect();
      return a.bottom <= t.bottom + 1;
    }`;
    await settles(page, visible);
    const t = await box('#transcript');
    const a = await box('.msg.bot');
    assert.ok(t.bottom <= grown.top + 1, 'the transcript ends where the composer starts');
    assert.ok(a.bottom <= t.bottom + 1, `the last answer ends at ${a.bottom} px, hidden behind the composer that starts at ${t.bottom} px`);
    await page.screenshot({ path: path.join(shots, 'layout-composer-grown.png') });
    assert.deepEqual(problems, []);
  });
});
