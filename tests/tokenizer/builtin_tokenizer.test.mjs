// builtin_tokenizer.test.mjs — the tokenizer `unmask make-model` writes: HF tokenizers (npm) must
// load its tokenizer.json and agree with `unmask tokenize` on the shared corpus; special ids in
// config.json must be the tokenizer's; the chat template must be LLaDA-8B-Instruct's verbatim.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import tk from 'tokenizers';
import { corpus } from './corpus.mjs';
import { fixturesDir, run, tmpDir, unmaskDetokenize, unmaskTokenize } from './helpers.mjs';

const { Tokenizer } = tk;

function makeModel() {
  const dir = path.join(tmpDir('builtin'), 'model');
  const r = run(['make-model', '--out', dir, '--preset', 'tiny', '--quiet']);
  assert.equal(r.code, 0, r.stderr);
  return dir;
}

test('built-in tokenizer.json loads in HF tokenizers and matches unmask', async () => {
  const dir = makeModel();
  const hf = Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
  const texts = [
    ...corpus,
    '<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n',
    'mask<|mdm_mask|><|mdm_mask|>end<|endoftext|><|endoftext|>',
    '<role>HUMAN</role>hello[gMASK][CLS]',
  ];
  const ours = unmaskTokenize(dir, texts);
  for (let i = 0; i < texts.length; i++) {
    const golden = (await hf.encode(texts[i], null, { addSpecialTokens: false })).getIds();
    assert.deepEqual(ours[i], golden, `ids differ for ${JSON.stringify(texts[i]).slice(0, 80)}`);
  }
  const back = unmaskDetokenize(dir, ours);
  for (let i = 0; i < texts.length; i++) {
    assert.equal(back[i], texts[i], 'round trip');
    assert.equal(back[i], await hf.decode(ours[i], false));
  }
  const skipped = unmaskDetokenize(dir, ours, true);
  for (let i = corpus.length; i < texts.length; i++) assert.equal(skipped[i], await hf.decode(ours[i], true));
});

test('built-in tokenizer: config ids, special tokens and the real LLaDA chat template', () => {
  const dir = makeModel();
  const cfg = JSON.parse(fs.readFileSync(path.join(dir, 'config.json'), 'utf8'));
  const tcfg = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8'));
  const hf = Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
  assert.equal(hf.tokenToId('<|mdm_mask|>'), cfg.mask_token_id);
  assert.equal(hf.tokenToId('<|endoftext|>'), cfg.eos_token_id);
  assert.ok(hf.getVocabSize(true) <= cfg.vocab_size, 'embedding rows cover every id');
  const real = JSON.parse(fs.readFileSync(path.join(fixturesDir('llada-8b-instruct'), 'tokenizer_config.json'), 'utf8'));
  assert.equal(tcfg.chat_template, real.chat_template);
  assert.equal(tcfg.bos_token, real.bos_token);
  assert.equal(tcfg.eos_token, real.eos_token);
  for (const name of ['<|startoftext|>', '<|endoftext|>', '<|eot_id|>', '<|start_header_id|>', '<role>']) {
    const id = hf.tokenToId(name);
    assert.ok(id !== null && tcfg.added_tokens_decoder[String(id)].special, `${name} is a special token`);
  }
  const merges = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8')).model.merges.length;
  assert.ok(merges >= 300 && merges <= 2000, `${merges} merges`);
  // deterministic: a second make-model writes the same tokenizer
  const dir2 = makeModel();
  assert.equal(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8'), fs.readFileSync(path.join(dir2, 'tokenizer.json'), 'utf8'));
});
