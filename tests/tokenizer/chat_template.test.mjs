// chat_template.test.mjs — `unmask tokenize --chat ... --render` against @huggingface/jinja on the
// three chat templates unmask must render: LLaDA-8B-Instruct (fixture), Dream/Qwen2.5 ChatML
// (fixture) and the Ling-2.0 role-tag template (tests/tokenizer/templates, reconstructed from
// the description in docs/model-spec.md). Then the rendered chat's ids against HF tokenizers, and errors for unsupported
// syntax. Goldens are computed here at test time.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { Template } from '@huggingface/jinja';
import tk from 'tokenizers';
import { SRC, dreamTokenizerJson, fixturesDir, run, tmpDir, unmaskTokenize } from './helpers.mjs';

const { Tokenizer } = tk;

const conversations = {
  single: [{ role: 'user', content: 'What is 2 + 2?' }],
  system: [
    { role: 'system', content: 'You are a terse assistant.' },
    { role: 'user', content: 'Hi!' },
  ],
  multiTurn: [
    { role: 'system', content: '  Be kind.  ' },
    { role: 'user', content: '  Hello there \n' },
    { role: 'assistant', content: 'Hi! How can I help?' },
    { role: 'user', content: 'Tell me a joke.' },
    { role: 'assistant', content: 'Why did the diffusion model cross the road?' },
    { role: 'user', content: 'Why?' },
  ],
  empty: [
    { role: 'user', content: '' },
    { role: 'assistant', content: '' },
    { role: 'user', content: ' ' },
  ],
  unicode: [{ role: 'user', content: '日本語で答えて 😀 — "quotes" and \'apostrophes\' <|not_special|> {{ not jinja }}' }],
  laterSystem: [
    { role: 'user', content: 'first' },
    { role: 'system', content: 'a later system message' },
    { role: 'user', content: 'second' },
  ],
  tools: [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: '', tool_calls: [{ type: 'function', function: { name: 'get_weather', arguments: { city: 'Paris', days: 3 } } }] },
    { role: 'tool', content: '{"temp": 21}' },
    { role: 'tool', content: '{"rain": false}' },
    { role: 'assistant', content: 'Sunny, 21 degrees.' },
  ],
};

function templateDir(name, config) {
  const d = tmpDir(`tmpl-${name}`);
  fs.writeFileSync(path.join(d, 'tokenizer_config.json'), JSON.stringify(config));
  return d;
}

const templates = () => {
  const llada = JSON.parse(fs.readFileSync(path.join(fixturesDir('llada-8b-instruct'), 'tokenizer_config.json'), 'utf8').replace(/: 1000000000000000019884624838656/, ': 1e30'));
  const dream = JSON.parse(fs.readFileSync(path.join(fixturesDir('dream-7b-instruct'), 'tokenizer_config.json'), 'utf8'));
  const ling = fs.readFileSync(path.join(SRC, 'tests/tokenizer/templates/ling2_chat_template.jinja'), 'utf8');
  return [
    { name: 'llada', dir: fixturesDir('llada-8b-instruct'), source: llada.chat_template, vars: { bos_token: llada.bos_token, eos_token: llada.eos_token } },
    { name: 'dream', dir: fixturesDir('dream-7b-instruct'), source: dream.chat_template, vars: { bos_token: dream.bos_token.content ?? dream.bos_token, eos_token: dream.eos_token } },
    {
      name: 'ling2',
      dir: templateDir('ling2', { chat_template: ling, bos_token: '<|startoftext|>', eos_token: '<|role_end|>' }),
      source: ling,
      vars: { bos_token: '<|startoftext|>', eos_token: '<|role_end|>' },
    },
  ];
};

function render(dir, messages, addGen) {
  const f = path.join(tmpDir('msgs'), 'messages.json');
  fs.writeFileSync(f, JSON.stringify(messages));
  const args = ['tokenize', '--model', dir, '--chat', f, '--render'];
  if (!addGen) args.push('--no-generation-prompt');
  const r = run(args);
  assert.equal(r.code, 0, `render failed: ${r.stderr}`);
  return r.stdout.toString();
}

test('chat templates render exactly as @huggingface/jinja', () => {
  for (const t of templates()) {
    const tmpl = new Template(t.source);
    for (const [cname, messages] of Object.entries(conversations)) {
      if (t.name === 'llada' && cname === 'tools') continue; // LLaDA's template has no tool support
      for (const addGen of [true, false]) {
        const golden = tmpl.render({ messages, add_generation_prompt: addGen, ...t.vars });
        const ours = render(t.dir, messages, addGen);
        assert.equal(ours, golden, `${t.name}/${cname}/add_generation_prompt=${addGen}`);
      }
    }
  }
});

test('LLaDA and Ling renderings match docs/model-spec.md', () => {
  const [llada, , ling] = templates();
  assert.equal(
    render(llada.dir, conversations.single, true),
    '<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2 + 2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n',
  );
  assert.equal(
    render(ling.dir, conversations.single, true),
    '<role>SYSTEM</role>detailed thinking off<|role_end|><role>HUMAN</role>What is 2 + 2?<|role_end|><role>ASSISTANT</role>',
  );
  assert.equal(
    render(ling.dir, conversations.system, true),
    '<role>SYSTEM</role>You are a terse assistant.\ndetailed thinking off<|role_end|><role>HUMAN</role>Hi!<|role_end|><role>ASSISTANT</role>',
  );
});

test('chat ids: rendered Dream chat tokenized like HF', async () => {
  const { dir, json } = dreamTokenizerJson();
  const hf = Tokenizer.fromString(JSON.stringify(json));
  const dream = templates()[1];
  const tmpl = new Template(dream.source);
  const f = path.join(tmpDir('msgs'), 'messages.json');
  fs.writeFileSync(f, JSON.stringify(conversations.multiTurn));
  const r = run(['tokenize', '--model', dir, '--chat', f]);
  assert.equal(r.code, 0, r.stderr);
  const text = tmpl.render({ messages: conversations.multiTurn, add_generation_prompt: true, ...dream.vars });
  const golden = (await hf.encode(text, null, { addSpecialTokens: false })).getIds();
  assert.deepEqual(r.stdout.toString().trim().split(',').map(Number), golden);
  assert.deepEqual(unmaskTokenize(dir, [text])[0], golden);
});

test('unsupported template syntax and raise_exception give clear errors', () => {
  const cases = [
    ['{% macro m() %}x{% endmacro %}{{ m() }}', /unsupported statement \{% macro %\}/],
    ['{{ messages | wordcount }}', /unsupported filter 'wordcount'/],
    ['{% if x is divisible %}{% endif %}', /unsupported test 'is divisible'/],
    ['{% for m in messages %}{{ m.content }}', /missing \{% endfor %\}/],
    ['{{ raise_exception("Conversation roles must alternate") }}', /Conversation roles must alternate/],
    ['{{ messages[0].content.nope() }}', /unsupported method 'nope'/],
    ['{% include "other.jinja" %}', /unsupported statement \{% include %\}/],
  ];
  for (const [source, re] of cases) {
    const d = templateDir('bad', { chat_template: source });
    const f = path.join(d, 'm.json');
    fs.writeFileSync(f, JSON.stringify(conversations.single));
    const r = run(['tokenize', '--model', d, '--chat', f, '--render']);
    assert.notEqual(r.code, 0, source);
    assert.match(r.stderr, re, source);
  }
});
