// ide.test.mjs — the IDE demo page (web/ide.html) on the bundled code model, in headless Chromium
// against the real server: Ctrl+Space at the cursor asks for an infill suggestion, the ghost text
// appears at the cursor (between the prefix and the suffix) and denoises in place (frames with
// masks still open, then final), the suggestion is exactly what the server answers for that prefix
// and suffix (a leading space the indentation at the cursor already provides is not doubled, a word's
// space is kept), Tab inserts exactly it between prefix and suffix, Esc dismisses without changing
// the code; both routes (/v1/fim/completions with denoising frames, llama.cpp /infill); the editor
// does not move when the status line changes.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { openPage } from './browser.mjs';
import { SRC, TMP, startServer } from '../protocol/harness.mjs';

const PREFIX = 'class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n        ';
const SUFFIX = '\n\n    def pop(self):\n        return self.items.pop()\n';

function postJson(base, p, body) {
  return new Promise((resolve, reject) => {
    const data = JSON.stringify(body);
    const req = http.request(`${base}${p}`, { method: 'POST', agent: false, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) } }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => (text += d));
      res.on('end', () => resolve({ status: res.statusCode, json: JSON.parse(text) }));
    });
    req.on('error', reject);
    req.end(data);
  });
}

describe('IDE demo page', () => {
  let srv;
  let ctx;
  let page;
  const problems = [];
  const shots = path.join(TMP, 'screenshots');

  before(async () => {
    srv = await startServer({ model: path.join(SRC, 'models', 'unmask-code-13m'), name: 'ide' });
    fs.mkdirSync(shots, { recursive: true });
    ({ ctx, page } = await openPage(problems, { viewport: { width: 1280, height: 800 } }));
  });

  after(async () => {
    if (ctx) await ctx.close();
    if (srv) await srv.stop();
  });

  // Put PREFIX|SUFFIX in the editor with the cursor at the bar, and record the ghost layer's
  // states (every mutation) from now on.
  async function setCode(prefix, suffix) {
    await page.evaluate(([p, s]) => {
      const ed = document.getElementById('editor');
      ed.value = p + s;
      ed.focus();
      ed.setSelectionRange(p.length, p.length);
      window.__ghost = [];
      if (window.__watching) return;
      window.__watching = true;
      const layer = document.getElementById('ghost-layer');
      new MutationObserver(() => {
        if (layer.hidden) return;
        window.__ghost.push({ state: layer.dataset.state, text: document.getElementById('ghost').textContent,
          masks: document.getElementById('ghost-masks').textContent.length });
      }).observe(layer, { subtree: true, childList: true, attributes: true, characterData: true });
    }, [prefix, suffix]);
  }

  const layerParts = () => page.evaluate(() => ({
    prefix: document.getElementById('ghost-prefix').textContent,
    ghost: document.getElementById('ghost').textContent,
    suffix: document.getElementById('ghost-suffix').textContent,
    visible: !document.getElementById('ghost-layer').hidden,
  }));

  test('the chat UI links to the IDE page, which loads without errors', async () => {
    await page.goto(`${srv.base}/`);
    assert.equal(await page.locator('#ide-link').getAttribute('href'), 'ide.html');
    await page.click('#ide-link');
    await page.waitForSelector('#editor');
    assert.equal(new URL(page.url()).pathname, '/ide.html');
    assert.equal(await page.locator('#ghost-layer').isVisible(), false, 'no suggestion before one is asked for');
    assert.deepEqual(problems, []);
  });

  test('Ctrl+Space: ghost text denoises at the cursor; Tab inserts exactly it between prefix and suffix', async () => {
    await page.fill('#ide-n', '16');
    await page.selectOption('#route', 'fim');
    await setCode(PREFIX, SUFFIX);
    await page.keyboard.press('Control+Space');
    await page.waitForSelector('#ghost-layer[data-state="ready"]', { timeout: 60000 });
    await page.screenshot({ path: path.join(shots, 'ide-suggestion.png') });
    const parts = await layerParts();
    assert.equal(parts.visible, true);
    assert.equal(parts.prefix, PREFIX, 'the ghost text sits right after the text before the cursor');
    assert.equal(parts.suffix, SUFFIX, '... and before the text after it');
    const frames = await page.evaluate(() => window.__ghost);
    assert.ok(frames.some((f) => f.state === 'denoising' && f.masks > 0), 'the suggestion was drawn while masks were still open');
    // the same request to the server, outside the page: the suggestion is exactly its answer
    const ref = await postJson(srv.base, '/v1/fim/completions', { prompt: PREFIX, suffix: SUFFIX, max_tokens: 16 });
    assert.equal(ref.status, 200);
    const expected = ref.json.choices[0].text;
    assert.ok(expected.length > 0, 'the model fills this gap with something');
    // PREFIX ends in the method body's indentation and the fill starts with a word's space: the
    // suggestion is the fill without that space, which the indentation already provides
    assert.ok(expected.startsWith(' ') && !expected.startsWith('  '), `the fill starts with one space: ${JSON.stringify(expected)}`);
    const shown = expected.slice(1);
    assert.equal(parts.ghost, shown, 'the ghost text is the server\'s fill, its space not doubled');
    // the editor itself is unchanged until Tab
    assert.equal(await page.inputValue('#editor'), PREFIX + SUFFIX);
    await page.keyboard.press('Tab');
    const code = await page.inputValue('#editor');
    assert.equal(code, PREFIX + shown + SUFFIX, 'Tab inserts exactly the suggestion at the cursor');
    const line = code.split('\n')[PREFIX.split('\n').length - 1];
    assert.match(line, /^ {8}\S/, `the method body's first line is indented by 8 spaces: ${JSON.stringify(line)}`);
    const caret = await page.evaluate(() => document.getElementById('editor').selectionStart);
    assert.equal(caret, PREFIX.length + shown.length, 'the cursor ends after the inserted text');
    assert.equal(await page.locator('#ghost-layer').isVisible(), false, 'the ghost is gone');
    assert.deepEqual(problems, []);
  });

  test('Esc dismisses a suggestion without changing the code', async () => {
    await setCode(PREFIX, SUFFIX);
    await page.click('#suggest');
    await page.waitForSelector('#ghost-layer[data-state="ready"]', { timeout: 60000 });
    assert.ok((await layerParts()).ghost.length > 0);
    await page.keyboard.press('Escape');
    assert.equal(await page.locator('#ghost-layer').isVisible(), false);
    assert.equal(await page.inputValue('#editor'), PREFIX + SUFFIX, 'nothing inserted');
    // Tab without a suggestion indents (it does not accept a dismissed suggestion)
    await page.keyboard.press('Tab');
    assert.equal(await page.inputValue('#editor'), `${PREFIX}    ${SUFFIX}`);
    assert.deepEqual(problems, []);
  });

  test('the llama.cpp /infill route: streamed deltas, Tab inserts the same fill', async () => {
    await page.selectOption('#route', 'infill');
    await setCode(PREFIX, SUFFIX);
    await page.keyboard.press('Control+Space');
    await page.waitForSelector('#ghost-layer[data-state="ready"]', { timeout: 60000 });
    const parts = await layerParts();
    const ref = await postJson(srv.base, '/infill', { input_prefix: PREFIX, input_suffix: SUFFIX, n_predict: 16 });
    assert.equal(ref.status, 200);
    const fill = ref.json.content;
    assert.ok(fill.startsWith(' ') && !fill.startsWith('  '), `the fill starts with one space: ${JSON.stringify(fill)}`);
    assert.equal(parts.ghost, fill.slice(1), 'the streamed fill, its space not doubled after the indentation');
    await page.keyboard.press('Tab');
    assert.equal(await page.inputValue('#editor'), PREFIX + fill.slice(1) + SUFFIX);
    assert.deepEqual(problems, []);
  });

  test('a suggestion keeps its leading space after a word: only a space the cursor already has is dropped', async () => {
    await page.selectOption('#route', 'fim');
    const prefix = `${PREFIX}self.items.append(item)\n\n    def size(self):\n        return`;
    await setCode(prefix, SUFFIX);
    await page.keyboard.press('Control+Space');
    await page.waitForSelector('#ghost-layer[data-state="ready"]', { timeout: 60000 });
    const ref = await postJson(srv.base, '/v1/fim/completions', { prompt: prefix, suffix: SUFFIX, max_tokens: 16 });
    const fill = ref.json.choices[0].text;
    assert.ok(fill.startsWith(' '), `the fill starts with a space: ${JSON.stringify(fill)}`);
    assert.equal((await layerParts()).ghost, fill);
    await page.keyboard.press('Tab');
    const code = await page.inputValue('#editor');
    assert.equal(code, prefix + fill + SUFFIX, 'after "return" the space is the word\'s own: kept');
    assert.match(code, /return \S/);
    assert.deepEqual(problems, []);
  });

  test('the editor does not move when the status line changes', async () => {
    await page.selectOption('#route', 'fim');
    await setCode(PREFIX, SUFFIX);
    // the editor's top at every change of the status line, from now on
    await page.evaluate(() => {
      const ed = document.getElementById('ide-editor');
      const st = document.getElementById('ide-status');
      window.__tops = [{ text: st.textContent, top: ed.getBoundingClientRect().top }];
      new MutationObserver(() => window.__tops.push({ text: st.textContent, top: ed.getBoundingClientRect().top }))
        .observe(st, { childList: true, characterData: true, subtree: true });
    });
    await page.keyboard.press('Control+Space');
    await page.waitForSelector('#ghost-layer[data-state="ready"]', { timeout: 60000 });
    await page.waitForFunction(() => /ready|nothing/.test(document.getElementById('ide-status').textContent));
    await page.keyboard.press('Escape');
    await page.waitForFunction(() => document.getElementById('ide-status').textContent === 'Dismissed.');
    const tops = await page.evaluate(() => window.__tops);
    assert.ok(new Set(tops.map((t) => t.text)).size >= 3, `the status changed: ${JSON.stringify(tops)}`);
    for (const t of tops) assert.equal(t.top, tops[0].top, `the editor stays at ${tops[0].top} px; with "${t.text}" it was at ${t.top} px`);
    assert.deepEqual(problems, []);
  });
});
