// infill_indent.test.mjs — llama.cpp's `n_indent` on /infill, with the bundled trained code model
// (models/unmask-code-13m, greedy): a suggestion ends where the first line after a newline whose
// content is indented less than n_indent starts (what llama.vim / llama.vscode send: the cursor's
// indentation), and that line is cut where its content starts, as llama.cpp does; the text before the
// cut is exactly the uncut suggestion's; a bad n_indent is a 400 naming it.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startServer, post } from './server.mjs';

const MODEL = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', '..', 'models', 'unmask-code-13m');
let srv;
before(async () => {
  srv = await startServer([], { model: MODEL });
});
after(async () => {
  await srv.stop();
});

const BODY = { input_prefix: '    def run(self):\n        ', input_suffix: '', n_predict: 96, temperature: 0 };

// The first line after a newline that has content: [its indentation, where its content starts].
function firstContentLine(text) {
  for (let nl = text.indexOf('\n'); nl >= 0; nl = text.indexOf('\n', nl + 1)) {
    let pos = nl + 1;
    while (pos < text.length && (text[pos] === ' ' || text[pos] === '\t')) pos++;
    if (pos < text.length) return [pos - nl - 1, pos];
  }
  return null;
}

test('n_indent ends the suggestion at the first line indented less, cut where its content starts', async () => {
  const full = (await post(`${srv.url}/infill`, BODY)).json();
  const line = firstContentLine(full.content);
  assert.ok(line, `the uncut suggestion has a second line: ${JSON.stringify(full.content)}`);
  const [ind, pos] = line;
  assert.ok(ind > 0, 'that line is indented');
  const cut = (await post(`${srv.url}/infill`, { ...BODY, n_indent: ind + 1 })).json();
  assert.equal(cut.content, full.content.slice(0, pos), 'the text up to where the less-indented content starts');
  assert.equal(cut.stop_type, 'limit', 'llama.cpp reports it as a limit');
  assert.ok(cut.tokens_predicted <= full.tokens_predicted);
  const same = (await post(`${srv.url}/infill`, { ...BODY, n_indent: ind })).json();
  assert.equal(same.content.slice(0, pos + 1), full.content.slice(0, pos + 1), 'a line at the cursor indentation is kept');
  // streamed: the deltas add up to the same cut text
  const s = await post(`${srv.url}/infill`, { ...BODY, n_indent: ind + 1, stream: true });
  const recs = s.text.split('\n\n').filter((x) => x.startsWith('data: ')).map((x) => JSON.parse(x.slice(6)));
  assert.equal(recs.slice(0, -1).map((x) => x.content).join(''), cut.content);
  for (const bad of [-1, 'x', 1.5]) {
    const r = await post(`${srv.url}/infill`, { ...BODY, n_indent: bad });
    assert.equal(r.status, 400, `n_indent ${JSON.stringify(bad)}`);
    assert.equal(r.json().error.param, 'n_indent');
  }
});
