// decoder_fields.test.mjs — the settings panel greys out the parameters the chosen decoder ignores
// (session.created.decoder_fields), on the bundled trained model (models/unmask-code-13m, whose
// default decoder is `threshold`), in headless Chromium against the real server: with `threshold`
// the Steps field is disabled, dimmed and says why in its tooltip, and a request sent then carries
// no `steps` (nor any other greyed field), so the server reports nothing ignored; switching to
// `low_confidence` enables Steps and the request carries it (and the server uses it); switching
// back greys it again.

import assert from 'node:assert/strict';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { openUI } from './browser.mjs';
import { SRC, startServer } from '../protocol/harness.mjs';

const CACHE_FIELDS = new Set(['cache_refresh', 'prefix_look', 'after_look']);   // also greyed by the cache mode

describe('browser UI: parameter fields the decoder ignores are greyed out and not sent', () => {
  let srv;
  let ctx;
  let page;
  const problems = [];
  const sent = [];       // every generate message the page sent
  const received = [];   // every server event the page received

  before(async () => {
    srv = await startServer({ model: path.join(SRC, 'models', 'unmask-code-13m'), name: 'decoder-fields-ui' });
    ({ ctx, page } = await openUI(srv, problems, { frames: { sent, received } }));
  });

  after(async () => {
    if (ctx) await ctx.close();
    if (srv) await srv.stop();
  });

  // The panel's decode fields: name -> {disabled, dim, title}.
  const panel = () => page.evaluate(() => Object.fromEntries([...document.querySelectorAll('#panel [id^="p-"]:not([data-stream])')]
    .map((e) => [e.id.slice(2), { disabled: e.disabled, dim: e.closest('.field').classList.contains('dim'), title: e.closest('.field').title }])));

  // Every field the map says `decoder` ignores is greyed (disabled, dim, a tooltip naming the
  // decoder); every field it reads is enabled (the cache-window ones also depend on the cache mode).
  function checkPanel(fields, map, decoder) {
    const all = new Set(Object.values(map).flat());
    for (const name of all) {
      const f = fields[name];
      if (!f) continue;   // a parameter without a field in the panel
      if (!map[decoder].includes(name)) {
        assert.ok(f.disabled && f.dim, `${name} is greyed out with ${decoder}: ${JSON.stringify(f)}`);
        assert.match(f.title, new RegExp(`${decoder.replace(/_/g, ' ')} decoder ignores`), `${name}'s tooltip says why`);
      } else if (!CACHE_FIELDS.has(name)) {
        assert.ok(!f.disabled && !f.dim, `${name} is enabled with ${decoder}: ${JSON.stringify(f)}`);
      }
    }
  }

  // Send a prompt (Complete mode) and wait for its answer; resolves with the generate message sent
  // and its accepted event.
  async function sendAndWait() {
    const n = sent.length;
    await page.fill('#prompt', 'def add(a, b):\n');
    const bots = await page.locator('.msg.bot[data-state="done"]').count();
    await page.click('#send');
    await page.waitForFunction((k) => document.querySelectorAll('.msg.bot[data-state="done"]').length > k, bots, { timeout: 120000 });
    assert.equal(sent.length, n + 1, 'one generate sent');
    const gen = sent.at(-1);
    const acc = received.find((m) => m.type === 'accepted' && m.id === gen.id);
    assert.ok(acc, 'accepted');
    return { gen, acc };
  }

  test('threshold greys Steps (not sent); low_confidence enables it (sent and used); back greys it again', async () => {
    const created = received.find((m) => m.type === 'session.created');
    assert.ok(created && created.decoder_fields, 'session.created carries decoder_fields');
    const map = created.decoder_fields;
    assert.equal(created.defaults.decoder, 'threshold', "the bundled model's default decoder");
    assert.ok(!map.threshold.includes('steps') && map.low_confidence.includes('steps'), 'threshold ignores steps, low_confidence reads it');

    await page.waitForSelector('.seg[data-mode="raw"].active');
    await page.fill('#p-gen_length', '16');
    await page.fill('#p-block_length', '16');
    assert.equal(await page.inputValue('#p-decoder'), 'threshold');
    let fields = await panel();
    assert.ok(fields.steps.disabled && fields.steps.dim, `Steps is greyed out with threshold: ${JSON.stringify(fields.steps)}`);
    checkPanel(fields, map, 'threshold');

    // a request now carries no greyed field, so nothing comes back as ignored
    let { gen, acc } = await sendAndWait();
    assert.equal(gen.decoder, 'threshold');
    for (const [name, f] of Object.entries(fields)) if (f.disabled) assert.equal(gen[name], undefined, `greyed ${name} not sent`);
    assert.equal('steps' in gen, false, 'steps is not sent with threshold');
    assert.deepEqual(acc.ignored_fields || [], [], 'the server ignored nothing');

    // low_confidence: Steps enabled, sent, used
    await page.selectOption('#p-decoder', 'low_confidence');
    fields = await panel();
    assert.ok(!fields.steps.disabled && !fields.steps.dim && fields.steps.title === '', `Steps is enabled with low_confidence: ${JSON.stringify(fields.steps)}`);
    checkPanel(fields, map, 'low_confidence');
    await page.fill('#p-steps', '8');
    ({ gen, acc } = await sendAndWait());
    assert.equal(gen.decoder, 'low_confidence');
    assert.equal(gen.steps, 8, 'steps is sent with low_confidence');
    assert.equal(acc.params.steps, 8, 'and used');
    assert.deepEqual(acc.ignored_fields || [], [], 'the server ignored nothing');

    // back to threshold: greyed again
    await page.selectOption('#p-decoder', 'threshold');
    fields = await panel();
    assert.ok(fields.steps.disabled && fields.steps.dim, 'Steps is greyed out again');
    checkPanel(fields, map, 'threshold');
    assert.deepEqual(problems, []);
  });
});
