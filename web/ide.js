// ide.js — the IDE-shaped demo page (ide.html): a code editor (textarea) where Ctrl+Space (or the
// Suggest button) asks the server to fill the gap at the cursor, with the text before the cursor as
// the prefix and the text after it as the suffix (native infilling, docs/http-api.md). The
// suggestion is drawn as ghost text at the cursor while it denoises: the /v1/fim/completions route
// streams whole-canvas frames ("diffusing": true), the llama.cpp /infill route streams committed
// deltas. Tab inserts exactly the suggested text between prefix and suffix (a leading space the
// cursor's indentation already provides is not doubled), Esc (or typing, clicking) dismisses it.
// Not here: the chat UI (app.js), the API key and authenticated fetch (api.js).

import { initTheme } from './theme.js';
import { postJson } from './api.js';
import { $ } from './dom.js';

const editor = $('editor');
const layer = $('ghost-layer');
const status = $('ide-status');

// the suggestion on screen: {prefix, suffix, at, text, ready, ctrl}
let sug = null;


function setStatus(text) {
  status.textContent = text;
}

// Draw the suggestion: the layer under the (then transparent) textarea shows prefix, ghost text,
// the masks still open, and the suffix, in the textarea's own font and wrapping.
function draw(masks = 0) {
  if (!sug) {
    layer.hidden = true;
    delete layer.dataset.state;
    editor.classList.remove('suggesting');
    return;
  }
  $('ghost-prefix').textContent = sug.prefix;
  $('ghost').textContent = insertion(sug);
  $('ghost-masks').textContent = '·'.repeat(Math.max(0, masks));
  $('ghost-suffix').textContent = sug.suffix;
  layer.dataset.state = sug.error ? 'error' : sug.ready ? 'ready' : 'denoising';
  layer.dataset.frames = String(sug.frames);
  layer.hidden = false;
  editor.classList.add('suggesting');
  layer.scrollTop = editor.scrollTop;
}

// What Tab inserts: the suggestion, less its first space when the text before the cursor already
// ends in one (the cursor sits in indentation or after a space, and the model's first token carries
// a word's leading space: " return" after 8 spaces would indent by 9).
function insertion(s) {
  return /[ \t]$/.test(s.prefix) && s.text.startsWith(' ') ? s.text.slice(1) : s.text;
}

function dismiss(why) {
  if (!sug) return;
  if (sug.ctrl) sug.ctrl.abort();
  sug = null;
  draw();
  if (why) setStatus(why);
}

function accept() {
  const s = sug;
  if (!s || !s.ready) return false;
  sug = null;
  draw();
  const text = insertion(s);
  editor.value = s.prefix + text + s.suffix;
  const at = s.prefix.length + text.length;
  editor.focus();
  editor.setSelectionRange(at, at);
  setStatus(`Inserted ${text.length} characters.`);
  return true;
}

// Server-Sent Events from a fetch response: calls onData(json) for every `data:` record.
async function readSSE(resp, onData) {
  const reader = resp.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf('\n\n')) >= 0) {
      const rec = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const data = rec.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trimStart()).join('\n');
      if (!data || data === '[DONE]') continue;
      onData(JSON.parse(data));
    }
  }
}

async function suggest() {
  dismiss();
  const at = editor.selectionStart;
  const value = editor.value;
  const s = { prefix: value.slice(0, at), suffix: value.slice(editor.selectionEnd), at, text: '', ready: false, error: null, frames: 0, ctrl: new AbortController() };
  sug = s;
  const n = Math.max(1, Math.min(256, Number($('ide-n').value) || 16));
  const route = $('route').value;
  layer.dataset.route = route;
  draw(n);
  setStatus('denoising…');
  const url = route === 'fim' ? '/v1/fim/completions' : '/infill';
  const body = route === 'fim'
    ? { prompt: s.prefix, suffix: s.suffix, max_tokens: n, stream: true, diffusing: true }
    : { input_prefix: s.prefix, input_suffix: s.suffix, n_predict: n, stream: true };
  const t0 = performance.now();
  try {
    const r = await postJson(url, body, s.ctrl.signal);
    if (!r.ok) {
      const j = await r.json().catch(() => ({}));
      throw new Error(j.error ? j.error.message : `HTTP ${r.status}`);
    }
    let masks = n;
    await readSSE(r, (j) => {
      if (sug !== s) return;
      if (j.error) throw new Error(j.error.message || 'generation failed');
      if (route === 'fim') {
        const c = j.choices && j.choices[0];
        if (!c) return;
        s.text = c.text;   // whole canvas: replace
        const meta = j.diffusion_meta;
        masks = meta ? meta.masks_left : 0;
        if (c.finish_reason) {
          s.ready = true;
          masks = 0;
        }
      } else {
        if (j.stop) {
          s.ready = true;
          masks = 0;
        } else {
          s.text += j.content || '';   // committed deltas: append
          masks = Math.max(0, n - (j.tokens_predicted || 0));
        }
      }
      s.frames++;
      draw(masks);
    });
    if (sug !== s) return;
    s.ready = true;
    s.ctrl = null;
    draw(0);
    const ms = performance.now() - t0;
    setStatus(s.text ? `Suggestion ready in ${ms.toFixed(0)} ms (${s.frames} frames) — Tab accepts, Esc dismisses.`
      : 'The model suggests nothing here (end of sequence). Esc dismisses.');
  } catch (e) {
    if (sug !== s || s.ctrl?.signal.aborted) return;
    s.error = e.message;
    s.ctrl = null;
    draw(0);
    setStatus(`Suggestion failed: ${e.message}`);
  }
}

function init() {
  initTheme();
  editor.addEventListener('keydown', (e) => {
    if ((e.ctrlKey || e.metaKey) && (e.code === 'Space' || e.key === ' ')) {
      e.preventDefault();
      suggest();
      return;
    }
    if (!sug) return;
    if (e.key === 'Tab' && !e.shiftKey) {
      e.preventDefault();
      if (!accept()) setStatus('Still denoising… Tab accepts once the suggestion is final.');
      return;
    }
    if (e.key === 'Escape') {
      e.preventDefault();
      dismiss('Dismissed.');
      return;
    }
    if (['Shift', 'Control', 'Alt', 'Meta'].includes(e.key)) return;
    dismiss();   // typing or moving the cursor: the suggestion no longer fits
  });
  editor.addEventListener('keydown', (e) => {
    // a plain Tab without a suggestion indents instead of leaving the editor
    if (e.key === 'Tab' && !sug && !e.defaultPrevented && !e.shiftKey) {
      e.preventDefault();
      editor.setRangeText('    ', editor.selectionStart, editor.selectionEnd, 'end');
    }
  });
  editor.addEventListener('mousedown', () => dismiss());
  editor.addEventListener('scroll', () => { layer.scrollTop = editor.scrollTop; });
  $('suggest').addEventListener('click', () => {
    editor.focus();
    suggest();
  });
  // start with the cursor in the empty method body
  const at = editor.value.indexOf('def push(self, item):\n') + 'def push(self, item):\n        '.length;
  editor.focus();
  editor.setSelectionRange(at, at);
  window.unmaskIDE = { suggest, accept, dismiss, get suggestion() { return sug && { ...sug, ctrl: undefined }; } };
}

init();
