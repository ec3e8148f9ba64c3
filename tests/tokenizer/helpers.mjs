// helpers.mjs — run `unmask tokenize` / `unmask detokenize` in batch mode and build HF tokenizers
// (npm `tokenizers`) for the golden tests. No expected output is stored: goldens come from HF at
// test time.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

export const BIN = process.env.UNMASK_BIN;
export const SRC = process.env.UNMASK_SOURCE_DIR;
export const TMP = process.env.UNMASK_TEST_TMP || '/tmp';

if (!BIN || !SRC) throw new Error('UNMASK_BIN and UNMASK_SOURCE_DIR must be set (run through ctest)');

let seq = 0;
const created = [];
process.on('exit', () => {
  for (const d of created) fs.rmSync(d, { recursive: true, force: true });
});
export function tmpDir(name) {
  const d = path.join(TMP, `tok-${name}-${process.pid}-${seq++}`);
  fs.mkdirSync(d, { recursive: true });
  created.push(d);
  return d;
}

export function run(args, opts = {}) {
  const r = spawnSync(BIN, args, { encoding: 'buffer', maxBuffer: 1 << 30, ...opts });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr.toString() };
}

// Tokenize many strings with one process; returns arrays of ids.
export function unmaskTokenize(dir, texts, extra = []) {
  const f = path.join(tmpDir('in'), 'texts.jsonl');
  fs.writeFileSync(f, texts.map((t) => JSON.stringify(t)).join('\n') + '\n');
  const r = run(['tokenize', '--model', dir, '--jsonl', f, ...extra]);
  if (r.code !== 0) throw new Error(`unmask tokenize failed (${r.code}): ${r.stderr}`);
  const lines = r.stdout.toString().split('\n');
  lines.pop();
  if (lines.length !== texts.length) throw new Error(`expected ${texts.length} lines, got ${lines.length}`);
  return lines.map((l) => (l === '' ? [] : l.split(',').map(Number)));
}

export function unmaskDetokenize(dir, idLists, skipSpecial = false) {
  const f = path.join(tmpDir('in'), 'ids.jsonl');
  fs.writeFileSync(f, idLists.map((ids) => JSON.stringify(ids)).join('\n') + '\n');
  const r = run(['detokenize', '--model', dir, '--jsonl', f, ...(skipSpecial ? ['--skip-special'] : [])]);
  if (r.code !== 0) throw new Error(`unmask detokenize failed (${r.code}): ${r.stderr}`);
  const lines = r.stdout.toString().split('\n');
  lines.pop();
  return lines.map((l) => JSON.parse(l));
}

export const REGEX = {
  bailing: "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
  llama3: "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
  qwen2: "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};

export function splitByteLevel(regex) {
  return {
    type: 'Sequence',
    pretokenizers: [
      { type: 'Split', pattern: { Regex: regex }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
    ],
  };
}

export function tokenizerJson({ vocab, merges, added = [], normalizer = null, preTokenizer, ignoreMerges = false }) {
  return {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer,
    pre_tokenizer: preTokenizer,
    post_processor: null,
    decoder: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
    model: {
      type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: ignoreMerges, vocab, merges,
    },
  };
}

export function addedToken(id, content, { special = true, lstrip = false, rstrip = false, singleWord = false, normalized = false } = {}) {
  return { id, content, single_word: singleWord, lstrip, rstrip, normalized, special };
}

// The Dream-7B tokenizer (vocab.json + merges.txt + added tokens) as an equivalent tokenizer.json:
// NFC, Qwen2 split regex, ByteLevel, as transformers' Qwen2 conversion builds it.
export function dreamTokenizerJson() {
  const fixtures = fixturesDir('dream-7b-instruct');
  const vocab = JSON.parse(fs.readFileSync(path.join(fixtures, 'vocab.json'), 'utf8'));
  const merges = fs.readFileSync(path.join(fixtures, 'merges.txt'), 'utf8').split('\n')
    .filter((l, i) => l.length && !(i === 0 && l.startsWith('#version')));
  const cfg = JSON.parse(fs.readFileSync(path.join(fixtures, 'tokenizer_config.json'), 'utf8'));
  const added = Object.entries(cfg.added_tokens_decoder).map(([id, t]) => ({ id: Number(id), ...t }));
  return {
    dir: fixtures,
    json: tokenizerJson({ vocab, merges, added, normalizer: { type: 'NFC' }, preTokenizer: splitByteLevel(REGEX.qwen2) }),
  };
}

// Real Hugging Face config / tokenizer files (no weights) kept in tests/fixtures/.
export function fixturesDir(name) {
  return path.join(SRC, 'tests', 'fixtures', name);
}
