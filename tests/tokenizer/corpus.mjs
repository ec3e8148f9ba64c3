// corpus.mjs — shared test strings for the tokenizer golden tests (see tokenizer_golden.test.mjs).
// Hand-written; every string is tokenized by HF tokenizers (npm) and by `unmask tokenize`.

function lcg(seed) {
  let s = seed >>> 0;
  return () => (s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 4294967296;
}

function randomWord(n, seed) {
  const r = lcg(seed);
  let w = '';
  for (let i = 0; i < n; i++) w += String.fromCharCode(97 + Math.floor(r() * 26));
  return w;
}

export const corpus = [
  '',
  'Hello world',
  'The quick brown fox jumps over the lazy dog. It\'s 5 o\'clock; we\'re late, aren\'t we?',
  "I'M HERE, YOU'RE THERE, THEY'LL COME, he'S, she'D, we'VE, 'll 're 't 'm 'd 's",
  "don't 'ſ 'Ｓ can'T",
  'int main(void) {\n\treturn 0;   \n}\r\n\r\n    indented\t\ttabs  \n',
  'def f(x):\n    if x:  \n        return [i**2 for i in range(10)]   # comment\n\n\n',
  'trailing spaces   ',
  '   leading spaces',
  'many          spaces          here',
  ' \t\n \r\n\u000b\u000c \u00a0\u3000\u2003x',
  '\n\n\n\n',
  '!!!???... --==>> \'\'\'\' "quoted" (parens) [brackets] {braces} <angle>',
  '12345678901234567890 3.14159 1,000,000 ١٢٣ ½ ²³ Ⅷ',
  '中文分词测试，这是一个句子。你好世界！',
  '日本語のテキストです。カタカナとひらがな、漢字。',
  '한국어 텍스트입니다',
  'Привет, мир! Ελληνικά κείμενα. עברית العربية',
  'ภาษาไทยมีวรรณยุกต์ नमस्ते दुनिया',
  '😀😃 👨‍👩‍👧‍👦 family, 🇺🇸🇯🇵 flags, 👍🏽 tone, ❤️ heart',
  'café naïve résumé Ångström',
  'cafe\u0301 nai\u0308ve A\u030angstro\u0308m \u212b \u1e9b\u0323 \u0071\u0307\u0323',
  '\u1100\u1161\u11a8 \u110b\u1173 hangul jamo',
  'e\u0301\u0301\u0301 a\u0328\u0301 \u0300leading combining',
  'ﬁ ligature ① circled ＦＵＬＬ width',
  '\u0001\u0002\u001f\u007f control \u200b\u200d\ufeff zero width',
  'x'.repeat(300),
  randomWord(10000, 7),
  'ab'.repeat(5000),
  ' '.repeat(1000) + 'x',
  '\n'.repeat(500),
  'word '.repeat(2000),
];

// Strings with the model's special tokens; {bos}/{eos}/... are replaced per tokenizer.
export const specialCorpus = [
  '{A}',
  '{A}{B}{A}',
  'hello{A}world',
  'hello {A} world',
  ' {B}  x',
  '{A}\n\n{B}',
  'partial {A_PREFIX} token',
  '{A}{A}{A}text{B}',
];

// Byte strings that are not valid UTF-8 (tokenized with --lossy, compared with TextDecoder).
export const invalidUtf8 = [
  [0xff, 0xfe, 0x20, 0x61, 0x62, 0x63],
  [0x61, 0xc3],
  [0xe4, 0xb8, 0x20, 0xe4, 0xb8, 0xad],
  [0xed, 0xa0, 0x80, 0x41],
  [0xf0, 0x9f, 0x98, 0x41, 0xc0, 0xaf],
  [0x80, 0x80, 0x80],
];
