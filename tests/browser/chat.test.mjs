// chat.test.mjs — the browser UI's conversations, in headless Chromium against the real server
// (tiny chat model): a send while a reply runs is queued and every request carries the ordered
// history (user, assistant, user); Copy and Regenerate; the history survives a reload, New chat
// starts an empty conversation whose requests carry only its own turns, delete and Clear all;
// Markdown answers are rendered without letting text inject elements (history loaded from
// localStorage with <img onerror> / <script>); the denoising replay shows, at any step k, exactly
// the canvas rebuilt here from the raw step events, also after a reload (compact persisted trace);
// the Debug toggle hides developer controls; the model pill turns red while the server is down and
// green again when it is back; the "resumed" notice clears by itself.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { openUI } from './browser.mjs';
import { TMP, startServer, tinyModel } from '../protocol/harness.mjs';


// The canvas after the first k step events of generation id (and the block events before the next
// step), rebuilt from the raw protocol events with the protocol's rules: commits are final, a step
// with `drafts` replaces the drafts shown, masks everywhere else.
function reconstruct(events, id, k, n) {
  const st = Array.from({ length: n }, () => ({ kind: 'mask', text: '' }));
  let drafted = new Set();
  let steps = 0;
  let finals = 0;
  for (const m of events) {
    if (m.id !== id) continue;
    if (m.type === 'step') {
      if (steps === k) break;
      for (const c of m.commits || []) {
        st[c.index] = { kind: 'done', text: c.special ? '' : c.text };
        drafted.delete(c.index);
      }
      if (Array.isArray(m.drafts)) {
        const now = new Set();
        for (const d of m.drafts) {
          if (st[d.index].kind === 'done') continue;
          now.add(d.index);
          st[d.index] = { kind: 'draft', text: d.special ? '' : d.text };
        }
        for (const i of drafted) if (!now.has(i) && st[i].kind === 'draft') st[i] = { kind: 'mask', text: '' };
        drafted = now;
      }
      steps++;
    } else if (m.type === 'block') {
      finals++;
    }
  }
  return { st, finals };
}

describe('browser UI: conversations, Markdown, replay, connection state', () => {
  let srv;
  let ctx;
  let page;
  const problems = [];
  const sent = [];       // every generate message the page sent
  const received = [];   // every server event the page received
  const shots = path.join(TMP, 'screenshots');
  const model = tinyModel('browser-chat');

  before(async () => {
    srv = await startServer({ model });
    fs.mkdirSync(shots, { recursive: true });
    ({ ctx, page } = await openUI(srv, problems, { frames: { sent, received } }));
    await ctx.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: srv.base });
    await setParams({ gen_length: 32, block_length: 16, steps: 32, drafts: true, draft_every: 1, every: 1 });
  });

  after(async () => {
    if (ctx) await ctx.close();
    if (srv) await srv.stop();
  });

  async function setParams(p) {
    for (const [k, v] of Object.entries(p)) {
      const sel = `#p-${k}`;
      if (typeof v === 'boolean') await page.setChecked(sel, v, { force: true });
      else await page.fill(sel, String(v));
    }
  }

  const doneOf = (id) => received.find((m) => m.type === 'done' && m.id === id);
  const untilDone = (n) => page.waitForFunction((k) => document.querySelectorAll('.msg.bot[data-state="done"]').length === k, n, { timeout: 120000 });
  const mdText = (text) => page.evaluate((t) => {
    const d = document.createElement('div');
    d.appendChild(window.unmaskUI.renderMarkdown(t));
    return d.textContent;
  }, text);
  // [{role, text}] of the transcript in DOM order (answers: their Markdown view)
  const transcript = () => page.evaluate(() => [...document.querySelectorAll('#transcript .msg')].map((m) => ({
    role: m.classList.contains('user') ? 'user' : 'assistant',
    text: m.classList.contains('user') ? m.querySelector('.bubble').firstChild.textContent : (m.querySelector('.md')?.textContent ?? null),
  })));

  test('a send while a reply runs is queued; each request carries the ordered history', async () => {
    // two sends in one task: the first answer cannot have finished before the second send
    const queued = await page.evaluate(() => {
      const t = document.getElementById('prompt');
      const f = document.getElementById('composer');
      t.value = 'first question';
      f.requestSubmit();
      t.value = 'second question';
      f.requestSubmit();
      return [...document.querySelectorAll('.msg.user')].map((m) => m.dataset.queued === 'true');
    });
    assert.deepEqual(queued, [false, true], 'the second message waits, visibly');
    assert.equal(sent.length === 0 || sent.length === 1, true);
    await untilDone(2);
    assert.equal(await page.locator('.msg.user[data-queued]').count(), 0, 'nothing left queued');
    assert.equal(sent.length, 2);
    const a1 = doneOf(sent[0].id);
    assert.ok(a1, 'the first answer finished');
    assert.deepEqual(sent[0].messages, [{ role: 'user', content: 'first question' }]);
    assert.deepEqual(sent[1].messages, [
      { role: 'user', content: 'first question' },
      { role: 'assistant', content: a1.text },
      { role: 'user', content: 'second question' },
    ], 'the second request carries the first exchange, in order');
    const a2 = doneOf(sent[1].id);
    assert.deepEqual(await transcript(), [
      { role: 'user', text: 'first question' },
      { role: 'assistant', text: await mdText(a1.text) },
      { role: 'user', text: 'second question' },
      { role: 'assistant', text: await mdText(a2.text) },
    ]);
    assert.deepEqual(await page.locator('#conv-list .conv-open').allTextContents(), ['first question']);
    assert.deepEqual(problems, []);
  });

  test('Copy puts the answer on the clipboard; Regenerate replaces it in place with the same history', async () => {
    const a2 = doneOf(sent[1].id);
    const last = page.locator('.msg.bot').last();
    await last.locator('.act.copy').click();
    await last.locator('.act.copy[data-copied="true"]').waitFor();
    assert.equal(await page.evaluate(() => navigator.clipboard.readText()), a2.text);
    await last.locator('.act.regen').click();
    await page.waitForFunction(() => document.querySelectorAll('.msg.bot').length === 2 &&
      document.querySelector('.msg.bot:last-of-type')?.dataset.state === 'done' &&
      document.querySelectorAll('.msg.bot[data-state="done"]').length === 2, null, { timeout: 120000 });
    assert.equal(sent.length, 3);
    assert.deepEqual(sent[2].messages, sent[1].messages, 'the regenerated answer gets the same history');
    assert.equal(await page.locator('.msg.bot').last().getAttribute('data-id'), sent[2].id, 'the answer shown is the new one');
    assert.equal(await page.locator('.msg').count(), 4, 'replaced, not appended');
    assert.deepEqual(problems, []);
  });

  test('history survives a reload; New chat is separate; delete and Clear all', async () => {
    const before = await transcript();
    await page.reload();
    await page.waitForSelector('#conn[data-state="open"]');
    assert.deepEqual(await transcript(), before, 'the same turns, in the same order, after a reload');
    await page.click('#new-chat');
    assert.equal(await page.locator('#transcript .msg').count(), 0, 'a new chat is empty');
    assert.equal(await page.locator('#hero').isVisible(), true);
    await page.fill('#prompt', 'a new topic');
    await page.keyboard.press('Enter');
    await untilDone(1);
    assert.deepEqual(sent.at(-1).messages, [{ role: 'user', content: 'a new topic' }], 'no turns of the other conversation');
    assert.deepEqual(await page.locator('#conv-list .conv-open').allTextContents(), ['a new topic', 'first question']);
    await page.click('#conv-list .conv-item:nth-child(2) .conv-open');
    assert.deepEqual(await transcript(), before, 'switching back shows the first conversation');
    await page.click('#conv-list .conv-item:nth-child(1) .conv-del');
    assert.deepEqual(await page.locator('#conv-list .conv-open').allTextContents(), ['first question']);
    await page.reload();
    await page.waitForSelector('#conn[data-state="open"]');
    assert.deepEqual(await page.locator('#conv-list .conv-open').allTextContents(), ['first question'], 'the deletion persists');
    await page.click('#clear-convs');
    assert.equal(await page.locator('#conv-list .conv-item').count(), 1, 'the first click only asks');
    await page.click('#clear-convs');
    assert.equal(await page.locator('#conv-list .conv-item').count(), 0);
    assert.equal(await page.locator('#transcript .msg').count(), 0);
    assert.deepEqual(await page.evaluate(() => JSON.parse(localStorage.getItem('unmask.conversations.v1'))), []);
    assert.deepEqual(problems, []);
  });

  test('Markdown is rendered from history without letting the text inject elements', async () => {
    const evil = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>';
    const answer = [
      '## Title with <b>tags</b>',
      '',
      `Some **bold**, *emphasis* and \`inline <i>code</i>\` ${evil}`,
      '',
      '- one <iframe src="javascript:window.__xss=3"></iframe>',
      '- two',
      '',
      '1. first',
      '2. second',
      '',
      '```html',
      `<script>window.__xss=4</script>${evil}`,
      '```',
    ].join('\n');
    const conv = { id: 'cx', title: `t ${evil}`, created: 1, updated: 1, turns: [
      { id: 'u1', role: 'user', mode: 'chat', content: `question ${evil}` },
      { id: 'a1', role: 'assistant', mode: 'chat', replyTo: 'u1', status: 'stop', content: answer, meta: `m ${evil}` },
    ] };
    await page.evaluate((c) => {
      localStorage.setItem('unmask.conversations.v1', JSON.stringify([c]));
      localStorage.setItem('unmask.currentConversation', c.id);
    }, conv);
    await page.reload();
    await page.waitForSelector('.msg.bot .md');
    const md = page.locator('.msg.bot .md');
    assert.equal(await md.locator('h2').textContent(), 'Title with <b>tags</b>');
    assert.equal(await md.locator('strong').first().textContent(), 'bold');
    assert.equal(await md.locator('em').first().textContent(), 'emphasis');
    assert.equal(await md.locator('p code').first().textContent(), 'inline <i>code</i>');
    assert.deepEqual(await md.locator('ul > li').allTextContents(), ['one <iframe src="javascript:window.__xss=3"></iframe>', 'two']);
    assert.deepEqual(await md.locator('ol > li').allTextContents(), ['first', 'second']);
    assert.equal(await md.locator('pre > code').textContent(), `<script>window.__xss=4</script>${evil}`);
    assert.equal(await md.locator('pre > code').getAttribute('data-lang'), 'html');
    assert.match(await md.locator('p').first().textContent(), /<img src=x onerror="window.__xss=1"><script>/, 'the tags are shown as text');
    assert.equal(await page.locator('.msg.user .bubble').first().evaluate((b) => b.firstChild.textContent), `question ${evil}`);
    // no element came out of the text anywhere on the page
    const injected = await page.evaluate(() => ({
      elements: document.querySelectorAll('#transcript img, #transcript script, #transcript iframe, #transcript b, #transcript i, #conv-list img, #conv-list script, body script:not([src])').length,
      handlers: document.querySelectorAll('[onerror], [onload]').length,
      xss: window.__xss,
      mdTags: [...new Set([...document.querySelectorAll('.md *')].map((e) => e.tagName.toLowerCase()))].sort(),
    }));
    assert.deepEqual(injected, { elements: 0, handlers: 0, xss: undefined, mdTags: ['code', 'em', 'h2', 'li', 'ol', 'p', 'pre', 'strong', 'ul'] });
    await page.screenshot({ path: path.join(shots, 'chat-markdown.png') });
    await page.click('#clear-convs');
    await page.click('#clear-convs');
    assert.deepEqual(problems, []);
  });

  test('replay: at every chosen step the canvas equals the one rebuilt from the raw step events', async () => {
    await setParams({ gen_length: 48, block_length: 16, steps: 48, drafts: true, draft_every: 1, every: 1 });
    // A step frame not yet written absorbs the next steps (merged); on a loaded machine a whole
    // block can fold into one frame, whose drafts are those of the block's last step: none. The
    // mid-way check below needs a frame that carried drafts while a later block was still all
    // masks, so a generation without one (timing, not a fault) is asked again, at most 3 times.
    let gen;
    let events;
    let stepEvents;
    // the first step k whose rebuilt canvas has committed tokens, drafts and masks (0: none)
    const midStep = () => {
      const n = events.find((m) => m.type === 'accepted').params.gen_length;
      for (let i = 0; i < stepEvents.length - 1; i++) {
        if (!(stepEvents[i].drafts || []).length) continue;
        const kinds = new Set(reconstruct(events, gen.id, i + 1, n).st.map((s) => s.kind));
        if (kinds.has('done') && kinds.has('draft') && kinds.has('mask')) return i + 1;
      }
      return 0;
    };
    for (let attempt = 0; attempt < 3; attempt++) {
      const before = sent.length;
      const bots = await page.locator('.msg.bot').count();
      await page.fill('#prompt', 'replay this answer');
      await page.keyboard.press('Enter');
      await page.waitForFunction((n) => document.querySelectorAll('.msg.bot').length === n + 1 &&
        document.querySelector('.msg.bot:last-of-type')?.dataset.state === 'done', bots, { timeout: 120000 });
      gen = sent.at(-1);
      assert.equal(sent.length, before + 1, 'one request per send');
      events = received.filter((m) => m.id === gen.id);
      stepEvents = events.filter((m) => m.type === 'step');
      if (midStep() > 0) break;
    }
    const blocks = events.filter((m) => m.type === 'block');
    assert.ok(stepEvents.length >= 3 && blocks.length >= 2, `a generation with several steps and blocks: ${JSON.stringify(events.map((m) => [m.type, m.step, m.block, m.merged]))}`);
    const n = events.find((m) => m.type === 'accepted').params.gen_length;
    const answer = page.locator('.msg.bot').last();
    await answer.locator('.act.replay-btn').click();
    const scrub = answer.locator('.replay .rp-scrub');
    assert.equal(Number(await scrub.getAttribute('max')), stepEvents.length, 'one scrubber position per step frame');
    // the first step where block 0 is final, and points before and inside it
    const firstBlockEnd = events.filter((m) => m.type === 'step' || m.type === 'block')
      .findIndex((m) => m.type === 'block');
    const kBlock = events.filter((m) => m.type === 'step' || m.type === 'block').slice(0, firstBlockEnd).filter((m) => m.type === 'step').length;
    const shown = () => answer.locator('.replay').evaluate((r) => ({
      st: [...r.querySelectorAll('.rp-canvas .tok')].map((s) => ({
        kind: s.classList.contains('done') ? 'done' : s.classList.contains('draft') ? 'draft' : 'mask', text: s.textContent })),
      finals: r.querySelectorAll('.rp-canvas .blk.final').length,
    }));
    const checkAt = async (k) => {
      await scrub.fill(String(k));
      await answer.locator(`.replay[data-step="${k}"]`).waitFor();
      const got = await shown();
      const want = reconstruct(events, gen.id, k, n);
      assert.deepEqual(got, want, `the replay canvas at step ${k}`);
      return got;
    };
    // a step frame that carried drafts (frames may merge steps, so which ones do varies)
    const kDraft = midStep();
    assert.ok(kDraft > 0, `some step frame carried drafts before the last block: ${JSON.stringify(events.map((m) => [m.type, m.step, m.block, m.merged, (m.drafts || []).length]))}`);
    const mid = await checkAt(kDraft);
    assert.ok(mid.st.some((s) => s.kind === 'mask') && mid.st.some((s) => s.kind === 'done'), 'mid-way: masks and committed tokens');
    assert.ok(mid.st.some((s) => s.kind === 'draft'), 'mid-way: drafts');
    if (kBlock > 1) await checkAt(kBlock - 1);
    const atBlock = await checkAt(kBlock);
    assert.equal(atBlock.finals, 1, 'the first block boundary is shown when its block is final');
    await checkAt(0);
    await checkAt(stepEvents.length);
    await page.screenshot({ path: path.join(shots, 'chat-replay.png') });
    // per-block timeline: one row per block, its steps from the block event, milliseconds measured
    const rows = await answer.locator('.rp-blk').evaluateAll((rs) => rs.map((r) => ({ block: Number(r.dataset.block), steps: Number(r.dataset.steps), ms: Number(r.dataset.ms) })));
    // (block events count steps from the start of the generation)
    assert.deepEqual(rows.map((r) => [r.block, r.steps]), blocks.map((b, i) => [b.block, b.steps - (i ? blocks[i - 1].steps : 0)]));
    assert.equal(rows.reduce((a, r) => a + r.steps, 0), blocks.at(-1).steps, 'the blocks\' steps add up to the whole');
    assert.ok(rows.every((r) => Number.isFinite(r.ms) && r.ms >= 0));
    // play runs to the end at the chosen speed
    await checkAt(1);
    await answer.locator('.rp-speed').selectOption('8');
    await answer.locator('.rp-play').click();
    await answer.locator('.replay[data-playing="true"]').waitFor({ state: 'attached' });
    await page.waitForFunction(() => {
      const r = document.querySelector('.msg.bot:last-of-type .replay');
      return r && r.dataset.step === r.querySelector('.rp-scrub').max && !r.dataset.playing;
    }, null, { timeout: 30000 });
    // the trace is kept with the turn: after a reload the replay is the same
    await page.reload();
    await page.waitForSelector('#conn[data-state="open"]');
    await answer.locator('.act.replay-btn').click();
    await checkAt(kDraft);
    await checkAt(kBlock);
    assert.deepEqual(problems, []);
  });

  test('Debug toggle: developer controls hidden by default, shown when on, remembered', async () => {
    assert.equal(await page.locator('#drop').isVisible(), false);
    assert.equal(await page.locator('#s-events').isVisible(), false);
    assert.equal(await page.locator('#debug-toggle').isChecked(), false);
    await page.setChecked('#debug-toggle', true, { force: true });
    assert.equal(await page.locator('#drop').isVisible(), true);
    assert.equal(await page.locator('#s-events').isVisible(), true);
    await page.reload();
    await page.waitForSelector('#conn[data-state="open"]');
    assert.equal(await page.locator('#drop').isVisible(), true, 'still on after a reload');
    // the resume notice goes away by itself
    await page.click('#drop');
    await page.waitForSelector('#conn[data-state="open"] >> text=/resumed/', { timeout: 30000 });
    await page.waitForFunction(() => document.getElementById('conn-text').textContent === 'connected', null, { timeout: 15000 });
    await page.setChecked('#debug-toggle', false, { force: true });
    assert.equal(await page.locator('#drop').isVisible(), false);
    assert.deepEqual(problems.filter((p) => !/WebSocket/.test(p)), []);
  });

  test('the model pill turns red when the server goes away and green when it is back', async () => {
    assert.equal(await page.locator('#model-pill').getAttribute('data-state'), 'ready');
    const port = srv.port;
    await srv.stop();
    await page.waitForSelector('#model-pill[data-state="offline"]', { timeout: 30000 });
    assert.equal(await page.locator('#model-pill.ready').count(), 0, 'not green while disconnected');
    assert.equal(await page.locator('#conn').getAttribute('data-state'), 'offline');
    await page.screenshot({ path: path.join(shots, 'chat-offline.png') });
    srv = await startServer({ model, extra: ['--port', String(port)] });
    assert.equal(srv.port, port);
    try {
      await page.waitForSelector('#model-pill.ready[data-state="ready"]', { timeout: 60000 });
    } catch (e) {
      const conn = await page.locator('#conn-text').textContent();
      const pill = await page.locator('#model-pill').evaluate((p) => `${p.className} ${p.dataset.state} ${p.title}`);
      throw new Error(`${e.message}\nconnection: ${conn}\nmodel pill: ${pill}\nserver log: ${srv.stderr.slice(-2000)}`);
    }
    assert.equal(await page.locator('#conn').getAttribute('data-state'), 'open');
    // and it works: a new answer completes
    await page.fill('#prompt', 'after the restart');
    await page.keyboard.press('Enter');
    await page.waitForSelector('.msg.bot:last-of-type[data-state="done"]', { timeout: 120000 });
    assert.deepEqual(problems.filter((p) => !/WebSocket|ERR_CONNECTION_REFUSED|Failed to load resource/.test(p)), []);
  });
});
