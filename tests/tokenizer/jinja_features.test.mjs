// jinja_features.test.mjs — small templates exercising the Jinja subset (expressions, filters,
// tests, loops, scoping, whitespace control, methods), rendered by `unmask tokenize --render` and
// by @huggingface/jinja; outputs must be identical.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { Template } from '@huggingface/jinja';
import { run, tmpDir } from './helpers.mjs';

const messages = [
  { role: 'system', content: '  sys  ' },
  { role: 'user', content: 'Hello, World' },
  { role: 'assistant', content: 'a,b,c', tool_calls: [{ function: { name: 'f', arguments: { x: 1, y: [true, null, 'z'] } } }] },
  { role: 'user', content: '' },
];

// Python Jinja2 (what transformers runs) and @huggingface/jinja print booleans, None and lists
// differently ("True" vs "true"), so values are printed through tojson or conditionals here; the
// Python forms are checked in tests/unit/test_chat_template.c.
const B = (e) => `{{ 'T' if ${e} else 'F' }}`;
const cases = [
  "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }}",
  "{{ 'a' ~ 1 ~ 'b' }} {{ 'ab' + 'cd' }} {{ 1.5 + 1 }}",
  `${B('1 < 2')} ${B('1 == 1.0')} ${B("'a' != 'b'")} ${B('2 >= 3')}`,
  `${B("'ell' in 'hello'")} ${B('2 in [1, 2]')} ${B("'role' in messages[0]")} ${B('3 not in [1]')}`,
  `${B('not true')} {{ true and 'x' }} {{ '' or 'fallback' }} {{ 0 or none or 'z' }}`,
  "{{ 'yes' if messages else 'no' }}|{{ 'a' if false }}|",
  `{% for m in messages %}{{ loop.index }}/{{ loop.length }}:{{ loop.index0 }}${B('loop.first')}${B('loop.last')}{{ loop.revindex }} {% endfor %}`,
  "{% for m in messages if m.role != 'system' %}{{ m.role }}{{ loop.index }},{% endfor %}",
  "{% for m in [] %}x{% else %}empty{% endfor %}",
  "{% for k, v in messages[2].tool_calls[0].function.arguments.items() %}{{ k }}={{ v | tojson }};{% endfor %}",
  "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}",
  "{% for i in range(1, 10, 3) %}{{ i }},{% endfor %}{% for i in range(3, 0, -1) %}{{ i }}{% endfor %}",
  "{% set x = 1 %}{% for m in messages %}{% set x = x + 1 %}{% endfor %}{{ x }}",
  "{% set ns = namespace(n=0, last='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% set ns.last = m.role %}{% endfor %}{{ ns.n }} {{ ns.last }}",
  "{% set block %}inner {{ messages | length }}{% endset %}[{{ block }}]",
  "{{ messages[0].content | trim }}|{{ messages[1].content | upper }}|{{ messages[1].content | lower }}|{{ 'hello world' | title }}|{{ 'hello' | capitalize }}",
  "{{ messages | length }} {{ 'héllo' | length }} {{ messages[0] | length }}",
  "{{ undefined_var | default('dflt') }} {{ '' | default('d2', true) }} {{ 'v' | default('x') }}",
  `${B('(messages | first).attr_missing is defined')} {{ (messages | last).role }} {{ [3, 1, 2] | join('-') }} {{ ['a'] | list | tojson }}`,
  "{{ messages | map(attribute='role') | join(',') }} {{ messages | selectattr('role', 'equalto', 'user') | list | length }}",
  `{{ 'a,b,,c'.split(',') | tojson }} {{ ' x y  '.split() | tojson }} ${B("'abc'.startswith('ab')")} {{ 'aXa'.replace('a', 'b') }}`,
  "{{ '  pad  '.strip() }}|{{ '  l'.lstrip() }}|{{ 'r  '.rstrip() }}|{{ 'ABC'.lower() }}{{ 'abc'.upper() }}",
  "{{ messages[0]['role'] }} {{ messages[-1].role }} {{ messages[1:3] | length }} {{ messages[::-1][0].role }} {{ 'hello'[1:4] }} {{ 'hello'[::-1] }} {{ 'héllo'[1] }}",
  "{{ messages[0].get('role') }} {{ messages[0].get('nope', 'dv') }} {{ messages[0].keys() | list | tojson }} {{ messages[2].tool_calls[0].function.arguments | tojson }}",
  "{{ {'b': 1, 'a': [1, 2.5, 'x\"y']} | tojson }} {{ 'uni é \\n' | tojson }}",
  `{% if x is not defined %}undef{% endif %} ${B('1 is number')} ${B("'a' is string")} ${B('messages is iterable')} ${B('messages[0] is mapping')} ${B('none is none')} ${B('4 is even')} ${B('3 is odd')}`,
  "{{ 42 }} {{ -3 }} {{ 2.5 }}",
  "  {%- if true %}\n    stripped\n  {%- endif %}\n\n{{- ' end' }}",
  "line1\n  {% if true %}\n  kept indent\n  {% endif %}\nline2\n{# a comment #}\nline3",
  "a {{- ' b ' -}} c {#- comment -#} d",
  "{% for m in messages %}\n{{ m.role }}\n{% endfor %}\n",
  "{{ \"double\" }} {{ 'it\\'s' }} {{ 'tab\\there' }}",
  "{% if messages[0].role == 'system' %}{% set sys = messages[0].content %}{% set rest = messages[1:] %}{% else %}{% set rest = messages %}{% endif %}{{ sys | default('none') }}:{{ rest | length }}",
  "{{ 10 / 4 }} {{ '42' | int + 1 }} {{ -3 | abs }} {{ 2.5 | int }}",
  "{% for m in messages %}{% if loop.index0 > 0 and messages[loop.index0 - 1].role == 'user' %}after-user:{{ m.role }} {% endif %}{% endfor %}",
  "{{ bos_token }}{% for m in messages %}{{ m.role | upper }}{% if not loop.last %}, {% endif %}{% endfor %}{{ eos_token }}",
];

test('Jinja features render exactly as @huggingface/jinja', () => {
  const vars = { messages, add_generation_prompt: true, bos_token: '<s>', eos_token: '</s>' };
  const mismatches = [];
  for (const source of cases) {
    let golden;
    try {
      golden = new Template(source).render(vars);
    } catch (e) {
      mismatches.push(`${source}\n  @huggingface/jinja cannot render it: ${e.message}`);
      continue;
    }
    const d = tmpDir('jinja');
    fs.writeFileSync(path.join(d, 'tokenizer_config.json'), JSON.stringify({ chat_template: source, bos_token: '<s>', eos_token: '</s>' }));
    const f = path.join(d, 'messages.json');
    fs.writeFileSync(f, JSON.stringify(messages));
    const r = run(['tokenize', '--model', d, '--chat', f, '--render']);
    if (r.code !== 0) mismatches.push(`${source}\n  error: ${r.stderr}`);
    else if (r.stdout.toString() !== golden) mismatches.push(`${source}\n  ours:   ${JSON.stringify(r.stdout.toString())}\n  golden: ${JSON.stringify(golden)}`);
  }
  assert.equal(mismatches.length, 0, mismatches.join('\n'));
});
