// tokenizer_golden.test.mjs — `unmask tokenize` / `detokenize` against HF tokenizers (npm
// `tokenizers`, the Rust implementation) on: the Dream-7B vocab.json + merges.txt fixture (NFC +
// Qwen2 regex), BPE tokenizers trained at test time by HF's trainer (Bailing regex with added
// tokens using every flag; Llama-3 regex + ignore_merges + Sequence[NFC]; GPT-2 ByteLevel regex with
// add_prefix_space and string merges), and strings of random code points (Unicode 16 categories)
// under each regex. Goldens are computed here, never stored.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import tk from 'tokenizers';
import { corpus, invalidUtf8 } from './corpus.mjs';
import {
  REGEX, addedToken, dreamTokenizerJson, run, splitByteLevel, tmpDir, tokenizerJson, unmaskDetokenize,
  unmaskTokenize,
} from './helpers.mjs';

const { Tokenizer, byteLevelAlphabet } = tk;

async function hfEncode(hf, texts) {
  const out = [];
  for (const t of texts) out.push((await hf.encode(t, null, { addSpecialTokens: false })).getIds());
  return out;
}

function assertSameIds(ours, golden, texts, label) {
  for (let i = 0; i < texts.length; i++) {
    assert.deepEqual(ours[i], golden[i], `${label}: ids differ for ${JSON.stringify(texts[i]).slice(0, 120)}`);
  }
}

async function checkDecode(hf, dir, idLists, label) {
  for (const skip of [false, true]) {
    const ours = unmaskDetokenize(dir, idLists, skip);
    for (let i = 0; i < idLists.length; i++) {
      const golden = await hf.decode(idLists[i], skip);
      assert.equal(ours[i], golden, `${label}: decode(skip_special=${skip}) differs for case ${i}`);
    }
  }
}

function checkInvalidUtf8(dir, label, cases = invalidUtf8) {
  // Invalid bytes: --lossy replaces maximal subparts by U+FFFD exactly as TextDecoder does.
  return async (hf) => {
    for (const bytes of cases) {
      const d = tmpDir('bad');
      const f = path.join(d, 'bad.txt');
      fs.writeFileSync(f, Buffer.from(bytes));
      const strict = run(['tokenize', '--model', dir, '--file', f]);
      assert.notEqual(strict.code, 0, `${label}: invalid UTF-8 must be rejected without --lossy`);
      assert.match(strict.stderr, /not valid UTF-8/);
      const r = run(['tokenize', '--model', dir, '--file', f, '--lossy']);
      assert.equal(r.code, 0, r.stderr);
      const ours = r.stdout.toString().trim();
      const text = new TextDecoder('utf-8').decode(Buffer.from(bytes));
      const golden = (await hf.encode(text, null, { addSpecialTokens: false })).getIds().join(',');
      assert.equal(ours, golden, `${label}: lossy ids differ for bytes ${bytes}`);
    }
  };
}

// ------------------------------------------------------------------ Dream (vocab.json + merges.txt)

test('Dream-7B vocab.json + merges.txt matches HF (NFC + Qwen2 regex)', async () => {
  const { dir, json } = dreamTokenizerJson();
  const hf = Tokenizer.fromString(JSON.stringify(json));
  const specials = [
    '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n',
    '<|endoftext|><|endoftext|><|mask|><|mask|>',
    'x<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>',
    'glued<|im_end|>text <|im_start| partial <tool_call>{"a": 1}</tool_call>',
    '<|im_start|><|im_start|>user',
  ];
  const texts = [...corpus, ...specials];
  const ours = unmaskTokenize(dir, texts);
  assertSameIds(ours, await hfEncode(hf, texts), texts, 'dream');
  await checkDecode(hf, dir, ours, 'dream');
  // round trip: decode(encode(x)) == NFC(x)
  const back = unmaskDetokenize(dir, ours);
  for (let i = 0; i < texts.length; i++) assert.equal(back[i], texts[i].normalize('NFC'), `round trip ${i}`);
  await checkInvalidUtf8(dir, 'dream', invalidUtf8.slice(0, 2))(hf);
});

// ------------------------------------------------------------------ trained tokenizers

const TRAIN_TEXT = [
  ...corpus,
  'The model denoises a canvas of masked tokens step by step. Each step commits the most confident tokens.\n',
  'Diffusion language models predict every masked position at once; a scheduler decides which to keep.\n',
  'static int encode(const char *text, size_t len) {\n    for (size_t i = 0; i < len; i++) count[text[i]]++;\n}\n',
  'function tokenize(s) { return s.split(/\\s+/).map((w) => w.toLowerCase()); }\n',
  'She said: "we\'ll see". They\'re here; I\'ve been there, it\'s fine, you\'d know.\n',
  '扩散语言模型逐步去噪。日本語の文章も少し。\n',
].join('\n').repeat(20);

let trainedCache = null;
function trainBailing() {
  if (trainedCache) return trainedCache;
  const d = tmpDir('train');
  const corpusFile = path.join(d, 'corpus.txt');
  fs.writeFileSync(corpusFile, TRAIN_TEXT);
  const t = Tokenizer.fromString(JSON.stringify(tokenizerJson({ vocab: {}, merges: [], preTokenizer: splitByteLevel(REGEX.bailing) })));
  t.train([corpusFile]);
  const out = path.join(d, 'trained.json');
  t.save(out, false);
  const json = JSON.parse(fs.readFileSync(out, 'utf8'));
  // every byte gets a token, so no input character is dropped
  let next = Object.keys(json.model.vocab).length;
  for (const ch of byteLevelAlphabet()) if (!(ch in json.model.vocab)) json.model.vocab[ch] = next++;
  trainedCache = { json, next };
  return trainedCache;
}

function writeTokenizer(json, name) {
  const d = tmpDir(name);
  fs.writeFileSync(path.join(d, 'tokenizer.json'), JSON.stringify(json));
  return d;
}

test('trained BPE, Bailing regex, added tokens with every flag, matches HF', async () => {
  const { json: base, next } = trainBailing();
  const json = structuredClone(base);
  let id = next;
  json.added_tokens = [
    addedToken(id++, '<|endoftext|>'),
    addedToken(id++, '<|end|>'),
    addedToken(id++, '<|start_header_id|>'),
    addedToken(id++, '<|eot_id|>'),
    addedToken(id++, '<mask>', { lstrip: true, rstrip: true }),
    addedToken(id++, '[gMASK]', { singleWord: true }),
    addedToken(id++, '<tool>', { special: false }),
    addedToken(id++, 'café', { special: false, normalized: true }),
  ];
  json.normalizer = { type: 'NFC' };
  const dir = writeTokenizer(json, 'bailing');
  const hf = Tokenizer.fromString(JSON.stringify(json));
  const specials = [
    '<|endoftext|>', '<|end|><|endoftext|><|end|>', 'hello<|eot_id|>world', 'a <mask>  b', '  <mask>\n\nx',
    '<mask><mask>', 'x[gMASK]y', 'x [gMASK] y', '[gMASK]', 'é[gMASK]', '<tool>call</tool>', 'cafe\u0301 café',
    '<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>', '<|endoftext', '<|end|',
  ];
  const texts = [...corpus, ...specials];
  const ours = unmaskTokenize(dir, texts);
  assertSameIds(ours, await hfEncode(hf, texts), texts, 'bailing');
  await checkDecode(hf, dir, ours, 'bailing');
  // round trip (strings with the added token "café" excepted: its 'é' decodes through the
  // ByteLevel map to the lone byte 0xE9, in HF too)
  const back = unmaskDetokenize(dir, ours.slice(0, corpus.length));
  for (let i = 0; i < corpus.length; i++) {
    if (corpus[i].normalize('NFC').includes('café')) continue;
    assert.equal(back[i], corpus[i].normalize('NFC'), `round trip ${JSON.stringify(corpus[i]).slice(0, 60)}`);
  }
  await checkInvalidUtf8(dir, 'bailing')(hf);

  // --no-special: special tokens are plain text, non-special added tokens still match; the golden
  // is the same tokenizer with its special tokens renamed to strings that never occur (HF renumbers
  // added tokens on load, so they cannot simply be dropped).
  const plain = structuredClone(json);
  plain.added_tokens.forEach((a, i) => { if (a.special) a.content = `\u0001never${i}\u0001`; });
  const hfPlain = Tokenizer.fromString(JSON.stringify(plain));
  const ns = ['<|endoftext|>', 'hello<|eot_id|>world <tool>', 'a <mask> b'];
  assertSameIds(unmaskTokenize(dir, ns, ['--no-special']), await hfEncode(hfPlain, ns), ns, 'no-special');
});

test('trained BPE, Llama-3 regex + ignore_merges + Sequence[NFC], matches HF', async () => {
  const { json: base } = trainBailing();
  const json = structuredClone(base);
  json.pre_tokenizer = splitByteLevel(REGEX.llama3);
  json.normalizer = { type: 'Sequence', normalizers: [{ type: 'NFC' }] };
  json.model.ignore_merges = true;
  const dir = writeTokenizer(json, 'llama3');
  const hf = Tokenizer.fromString(JSON.stringify(json));
  const ours = unmaskTokenize(dir, corpus);
  assertSameIds(ours, await hfEncode(hf, corpus), corpus, 'llama3');
  await checkDecode(hf, dir, ours, 'llama3');
});

test('trained BPE, GPT-2 ByteLevel regex with add_prefix_space and "a b" merges, matches HF', async () => {
  const { json: base } = trainBailing();
  const json = structuredClone(base);
  json.pre_tokenizer = { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true };
  json.model.merges = json.model.merges.map((m) => (Array.isArray(m) ? m.join(' ') : m));
  json.added_tokens = [addedToken(base.next ?? 100000, '<|sep|>')];
  json.added_tokens[0].id = Object.keys(json.model.vocab).length;
  const dir = writeTokenizer(json, 'gpt2');
  const hf = Tokenizer.fromString(JSON.stringify(json));
  const texts = [...corpus, 'a<|sep|>b', '<|sep|> x'];
  const ours = unmaskTokenize(dir, texts);
  assertSameIds(ours, await hfEncode(hf, texts), texts, 'gpt2');
  await checkDecode(hf, dir, ours, 'gpt2');
});

test('Split behaviours (Removed, MergedWithPrevious, MergedWithNext, Contiguous, invert) and Digits', async () => {
  const { json: base } = trainBailing();
  const texts = corpus.filter((t) => t.length < 2000);
  for (const [name, pre] of [
    ['removed', { type: 'Split', pattern: { String: ' ' }, behavior: 'Removed', invert: false }],
    ['merged-prev', { type: 'Split', pattern: { Regex: '\\s+' }, behavior: 'MergedWithPrevious', invert: false }],
    ['merged-next', { type: 'Split', pattern: { Regex: '[,.;:!?]' }, behavior: 'MergedWithNext', invert: false }],
    ['contiguous', { type: 'Split', pattern: { Regex: '\\p{P}' }, behavior: 'Contiguous', invert: false }],
    ['invert', { type: 'Split', pattern: { Regex: '\\p{L}+' }, behavior: 'Isolated', invert: true }],
    ['digits', { type: 'Digits', individual_digits: true }],
    ['digits-runs', { type: 'Digits', individual_digits: false }],
  ]) {
    const json = structuredClone(base);
    json.pre_tokenizer = {
      type: 'Sequence',
      pretokenizers: [pre, { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false }],
    };
    const dir = writeTokenizer(json, name);
    const hf = Tokenizer.fromString(JSON.stringify(json));
    assertSameIds(unmaskTokenize(dir, texts), await hfEncode(hf, texts), texts, name);
  }
});

// ------------------------------------------------------------------ Unicode categories

// Strings of random code points from every plane (mostly unassigned ones, and characters assigned
// in Unicode 15 and 16 such as U+13E0F, Egyptian Hieroglyphs Extended-A), between ASCII letters,
// digits, spaces and punctuation, so every category boundary a pre-tokenizer regex looks at is
// crossed. HF classifies \p{..} by Unicode 16.0: tables of another version split some of these
// strings elsewhere. No normalizer here (HF's NFC data is older than ours: docs in
// tools/gen_unicode_tables.py).
function randomCodepointTexts() {
  const recent = [0x13E0F, 0x13460, 0x1C89, 0x1C8A, 0x0897, 0x1B4E, 0x1B7F, 0x10D50, 0x10D70, 0x10D4E, 0x16D40,
    0x16D70, 0x11F00, 0x11F50, 0x1E4D0, 0x1E4F0, 0x31350, 0x2EBF0, 0x1CC00, 0x1CCF0, 0x105C0, 0x11BC0, 0x1E5D0,
    0x1E5F1, 0x1F8B2, 0x2FFC, 0x31EF, 0xA7CB, 0xA7DC, 0x10EC2, 0x116D0, 0x11380, 0x16100, 0x16139];
  const ascii = ['a', 'Z', '7', ' ', '  ', '.', "'", '\n', 'x1', '-'];
  const r = (() => { let s = 12345; return () => (s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 4294967296; })();
  const pick = (v) => v[Math.floor(r() * v.length)];
  const randomCp = () => {
    for (;;) {
      const plane = r() < 0.5 ? 1 : Math.floor(r() * 4);   // planes 0-3 hold nearly every assignment
      const cp = plane * 0x10000 + Math.floor(r() * 0x10000);
      if (!(cp >= 0xD800 && cp < 0xE000)) return cp;
    }
  };
  const texts = [recent.map((cp) => String.fromCodePoint(cp)).join(' '), recent.map((cp) => `a${String.fromCodePoint(cp)}1`).join('')];
  for (let i = 0; i < 300; i++) {
    let t = '';
    for (let j = 0; j < 24; j++) {
      const u = r();
      t += u < 0.4 ? String.fromCodePoint(randomCp()) : u < 0.6 ? String.fromCodePoint(pick(recent)) : pick(ascii);
    }
    texts.push(t);
  }
  return texts;
}

test('random code points (Unicode 16 categories) split as HF does', async () => {
  const { json: base } = trainBailing();
  const texts = randomCodepointTexts();
  const byteLevel = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false };
  const splits = [
    ...Object.entries(REGEX).map(([name, re]) => [name, splitByteLevel(re)]),
    ...['\\p{M}+', '\\p{P}|\\p{S}', '\\p{Lu}\\p{Ll}*|\\p{Lo}+|\\p{Lm}', '\\w+', '\\p{Nd}|\\p{No}|\\p{Nl}'].map((re) => [re, {
      type: 'Sequence',
      pretokenizers: [{ type: 'Split', pattern: { Regex: re }, behavior: 'Isolated', invert: false }, byteLevel],
    }]),
  ];
  for (const [name, pre] of splits) {
    const json = structuredClone(base);
    json.normalizer = null;
    json.pre_tokenizer = pre;
    const dir = writeTokenizer(json, 'ucat');
    const hf = Tokenizer.fromString(JSON.stringify(json));
    const ours = unmaskTokenize(dir, texts);
    assertSameIds(ours, await hfEncode(hf, texts), texts, `categories ${name}`);
    const back = unmaskDetokenize(dir, ours);
    for (let i = 0; i < texts.length; i++) assert.equal(back[i], texts[i], `round trip ${name} ${i}`);
  }
});
