// composer.js — the prompt box and its modes: Chat, Complete (raw prompt, no chat template) and
// Infill (code with a <FILL> marker); Enter sends, Shift+Enter is a new line; the box grows with its
// text, which is kept as a draft in localStorage (a reload shows what was typed, an empty box
// stays empty). A base checkpoint (no chat template, e.g. the bundled code model) turns Chat off and
// opens in Complete with code suggestions, and on a first visit (no draft yet) a code-shaped example
// in the box. Not here: what a send does (runs.js).

import { $, el, toast } from './dom.js';
import { FILL } from './transcript.js';

const CODE_EXAMPLES = [
  'class Stack:\n    """A last-in, first-out stack."""\n\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n',
  'import os\n\n\ndef list_python_files(root):\n    """Return the paths of all Python files under root."""\n    paths = []\n',
  'def fibonacci(n):\n    """Return the first n Fibonacci numbers."""\n    numbers = [0, 1]\n',
];
const INFILL_EXAMPLE = 'class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n<FILL>\n\n    def pop(self):\n        return self.items.pop()\n';

const DRAFT_KEY = 'unmask.draft';

let mode = 'chat';
let base = false;          // the model has no chat template: completion / infill only
let onSend = null;         // (text, mode) -> void

// The text in the box (trimmed in Chat mode: code keeps its trailing newline / indentation) is sent
// unless it is empty or an Infill prompt without the marker.
function submit(text) {
  if (mode === 'chat') text = text.trim();
  if (!text.trim()) return false;
  if (mode === 'infill' && !text.includes(FILL)) {
    toast(`Infill: put ${FILL} where the missing code goes`);
    return false;
  }
  onSend(text, mode);
  return true;
}

// Put text in the box (and keep it as the draft).
function setText(text) {
  $('prompt').value = text;
  saveDraft();
  autosize();
}

function saveDraft() {
  localStorage.setItem(DRAFT_KEY, $('prompt').value);
}

export function setMode(m) {
  const t = $('prompt');
  if (m === 'infill' && mode !== 'infill' && !t.value.includes(FILL) &&
      (!t.value.trim() || CODE_EXAMPLES.includes(t.value))) {
    setText(INFILL_EXAMPLE);
  } else if (m === 'raw' && mode === 'infill' && t.value === INFILL_EXAMPLE) {
    setText(CODE_EXAMPLES[0]);
  }
  mode = m;
  for (const b of document.querySelectorAll('.mode-switch .seg')) b.classList.toggle('active', b.dataset.mode === m);
  t.placeholder = m === 'chat' ? 'Ask something…'
    : m === 'infill' ? `Code with ${FILL} where the missing part goes…` : 'Text or code to continue (no chat template)…';
  $('composer').classList.toggle('code', m !== 'chat');
  autosize();
}

// A base checkpoint (no chat template): Chat is off, Complete is the default with a code example,
// and the hero's suggestions are code. A chat checkpoint keeps the chat UI.
export function setBaseModel(isBase) {
  if (isBase === base) return;
  base = isBase;
  document.body.classList.toggle('base-model', base);
  const chat = document.querySelector('.seg[data-mode="chat"]');
  chat.disabled = base;
  chat.title = base ? 'This checkpoint has no chat template (a base model): use Complete or Infill' : '';
  if (!base) return;
  const chips = $('chips');
  if (chips) {
    chips.replaceChildren(...CODE_EXAMPLES.map((code) => {
      const c = el('button', 'chip code', `${code.split('\n').find((l) => l.startsWith('def ') || l.startsWith('class ')) || code.split('\n')[0]} …`);
      c.type = 'button';
      c.addEventListener('click', () => { setMode('raw'); submit(code); });
      return c;
    }));
  }
  if (mode === 'chat') setMode('raw');
  if (!$('prompt').value && localStorage.getItem(DRAFT_KEY) === null) setText(CODE_EXAMPLES[0]);   // a first visit
}

// The prompt box as tall as its text (at most 220 px). Measuring collapses the box to 'auto' for a
// moment; the composer keeps its height meanwhile, so that forced layout does not grow the
// transcript above it and clamp its scroll position (which, with no net size change to follow,
// left the last answer behind the composer).
function autosize() {
  const t = $('prompt');
  const box = $('composer');
  box.style.minHeight = `${box.offsetHeight}px`;
  t.style.height = 'auto';
  t.style.height = `${Math.min(t.scrollHeight, 220)}px`;
  box.style.minHeight = '';
}

export function initComposer(send) {
  onSend = send;
  const t = $('prompt');
  t.value = localStorage.getItem(DRAFT_KEY) || '';
  autosize();
  t.addEventListener('input', () => {
    autosize();
    saveDraft();
  });
  t.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $('composer').requestSubmit();
    }
  });
  $('composer').addEventListener('submit', (e) => {
    e.preventDefault();
    const text = t.value;
    setText('');
    submit(text);
    t.focus();
  });
  for (const b of document.querySelectorAll('.mode-switch .seg')) b.addEventListener('click', () => setMode(b.dataset.mode));
  for (const c of document.querySelectorAll('#chips .chip')) c.addEventListener('click', () => submit(c.textContent));
}
