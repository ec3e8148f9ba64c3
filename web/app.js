// app.js — the unmask browser UI: a chat whose answers visibly denoise. Wires the protocol client
// (client.js) to the transcript, the composer and the decoding settings. A base checkpoint (no chat
// template, e.g. the bundled code model) opens in Complete mode with a code-shaped example prompt;
// Infill fills a <FILL> marker through the HTTP FIM endpoint (the WebSocket protocol has no
// suffix). Not here: protocol details (client.js), canvas rendering (canvas.js).

import { UnmaskClient } from './client.js';
import { GenCanvas, heroAnimation } from './canvas.js';

const $ = (id) => document.getElementById(id);
const PARAMS = ['gen_length', 'block_length', 'steps', 'decoder', 'threshold', 'temperature', 'seed', 'cache', 'cache_refresh', 'prefix_look', 'after_look', 'drafts', 'draft_every', 'every'];
const FALLBACK = { gen_length: 128, block_length: 32, steps: 0, decoder: 'low_confidence', threshold: 0.9, temperature: 0, seed: 0, cache: 'dual', cache_refresh: 0, prefix_look: 0, after_look: 0, drafts: true, draft_every: 1, every: 1 };
const STORE = 'unmask.settings.v1';
const FILL = '<FILL>';
const CODE_EXAMPLES = [
  'class Stack:\n    """A last-in, first-out stack."""\n\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n',
  'import os\n\n\ndef list_python_files(root):\n    """Return the paths of all Python files under root."""\n    paths = []\n',
  'def fibonacci(n):\n    """Return the first n Fibonacci numbers."""\n    numbers = [0, 1]\n',
];
const INFILL_EXAMPLE = 'class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n<FILL>\n\n    def pop(self):\n        return self.items.pop()\n';

const state = {
  client: null,
  model: null,            // session.created.model
  defaults: { ...FALLBACK },
  mode: 'chat',
  base: false,            // the model has no chat template: completion / infill only
  history: [],            // chat messages [{role, content}]
  gens: new Map(),        // id -> generation view
  counter: 0,
  heroTimer: null,
};

// ---------------------------------------------------------------- theme

function initTheme() {
  const saved = localStorage.getItem('unmask.theme');
  const prefersLight = window.matchMedia && window.matchMedia('(prefers-color-scheme: light)').matches;
  document.documentElement.dataset.theme = saved || (prefersLight ? 'light' : 'dark');
  $('theme-toggle').addEventListener('click', () => {
    const next = document.documentElement.dataset.theme === 'dark' ? 'light' : 'dark';
    document.documentElement.dataset.theme = next;
    localStorage.setItem('unmask.theme', next);
  });
}

// ---------------------------------------------------------------- settings

function readSettings() {
  try {
    return JSON.parse(localStorage.getItem(STORE)) || {};
  } catch {
    return {};
  }
}

function applySettingsToForm(values) {
  for (const k of PARAMS) {
    const el = $(`p-${k}`);
    if (!el || values[k] === undefined) continue;
    if (el.type === 'checkbox') el.checked = !!values[k];
    else el.value = values[k];
  }
  syncOutputs();
}

function formSettings() {
  const v = {};
  for (const k of PARAMS) {
    const el = $(`p-${k}`);
    if (!el) continue;
    if (el.type === 'checkbox') v[k] = el.checked;
    else if (el.tagName === 'SELECT') v[k] = el.value;
    else v[k] = el.value === '' ? undefined : Number(el.value);
  }
  return v;
}

function syncOutputs() {
  $('o-threshold').textContent = Number($('p-threshold').value).toFixed(2);
  $('o-temperature').textContent = Number($('p-temperature').value).toFixed(2);
  const dec = $('p-decoder').value;
  $('f-threshold').classList.toggle('dim', dec !== 'threshold');
  const cache = $('p-cache').value;
  $('f-cache_refresh').classList.toggle('dim', cache === 'none');
  $('f-prefix_look').classList.toggle('dim', cache !== 'vicinity');
  $('f-after_look').classList.toggle('dim', cache !== 'vicinity');
}

function initSettings() {
  applySettingsToForm({ ...FALLBACK, ...readSettings() });
  $('panel').addEventListener('input', () => {
    syncOutputs();
    localStorage.setItem(STORE, JSON.stringify(formSettings()));
  });
  $('reset-params').addEventListener('click', () => {
    localStorage.removeItem(STORE);
    applySettingsToForm(state.defaults);
  });
  $('panel-toggle').addEventListener('click', () => {
    const hidden = document.body.classList.toggle('panel-hidden');
    $('panel-toggle').setAttribute('aria-expanded', String(!hidden));
  });
  if (window.innerWidth < 900) document.body.classList.add('panel-hidden');
}

// ---------------------------------------------------------------- connection

function setConn(st, text) {
  $('conn').dataset.state = st;
  $('conn-text').textContent = text;
  $('send').disabled = false;
}

function initClient() {
  const proto = location.protocol === 'https:' ? 'wss' : 'ws';
  const client = new UnmaskClient(`${proto}://${location.host}/ws`, localStorage.getItem('unmask.apiKey') || '');
  state.client = client;
  window.unmask = client; // handy in devtools and for tests
  client.addEventListener('status', (e) => {
    const d = e.detail;
    if (d.state === 'open') setConn('open', d.resumed ? `resumed · ${d.replayed} replayed` : 'connected');
    else if (d.state === 'connecting') setConn('connecting', 'connecting…');
    else if (d.state === 'reconnecting') setConn('connecting', `reconnecting (try ${d.attempt})…`);
    else if (d.state === 'offline') {
      setConn('offline', d.refused ? 'refused · API key?' : `offline · retry in ${(d.retryIn / 1000).toFixed(1)} s`);
      if (d.refused && !state.askedForKey) {
        state.askedForKey = true;
        document.body.classList.remove('panel-hidden');
        $('api-key').scrollIntoView({ block: 'center' });
        $('api-key').focus();
      }
    }
    else setConn('offline', 'closed');
    updateStats();
  });
  client.addEventListener('session', (e) => {
    const s = e.detail;
    if (s.pending) return;
    state.model = s.model;
    $('model-name').textContent = s.model ? s.model.name : '—';
    $('model-pill').classList.toggle('ready', !!(s.model && s.model.ready));
    $('model-pill').title = s.model && s.model.ready
      ? `${s.model.architecture || 'model'} · vocab ${s.model.vocab_size} · context ${s.model.max_seq}`
      : 'model loading…';
    if (s.defaults) {
      state.defaults = {
        ...FALLBACK,
        gen_length: Math.min(s.defaults.gen_length, 256),
        block_length: s.defaults.block_length,
        steps: s.defaults.steps,
        decoder: s.defaults.decoder,
        threshold: s.defaults.threshold,
        temperature: s.defaults.temperature,
        cache: s.defaults.cache ?? FALLBACK.cache,
        cache_refresh: s.defaults.cache_refresh ?? 0,
        prefix_look: s.defaults.prefix_look ?? 0,
        after_look: s.defaults.after_look ?? 0,
      };
      if (!localStorage.getItem(STORE)) applySettingsToForm(state.defaults);
    }
    if (s.model && s.model.ready) setBaseModel(!s.model.chat_template);
    updateStats();
  });
  client.addEventListener('message', (e) => onServerEvent(e.detail.msg));
  client.addEventListener('lost', (e) => {
    for (const g of state.gens.values()) {
      if (!g.finished) failGen(g, 'connection lost and the session could not be resumed', 'lost');
    }
    toast(`Session could not be resumed: ${e.detail.reason}`);
  });
  client.connect();
  $('drop').addEventListener('click', () => client.dropConnection());
  const key = $('api-key');
  key.value = client.apiKey;
  key.addEventListener('change', () => {
    const v = key.value.trim();
    if (v) localStorage.setItem('unmask.apiKey', v);
    else localStorage.removeItem('unmask.apiKey');
    client.apiKey = v;
    client.dropConnection(); // reconnect (and resume) with the new key
  });
}

function updateStats() {
  const c = state.client;
  $('s-session').textContent = c.token ? `${c.token.slice(0, 8)}…` : '—';
  $('s-events').textContent = String(c.stats.events);
  $('s-reconnects').textContent = String(c.stats.reconnects);
  $('s-replayed').textContent = String(c.stats.replayed);
}

// ---------------------------------------------------------------- transcript

function scrollToEnd(force) {
  const t = $('transcript');
  const near = t.scrollHeight - t.scrollTop - t.clientHeight < 160;
  if (force || near) t.scrollTop = t.scrollHeight;
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function hideHero() {
  const hero = $('hero');
  if (hero) {
    clearInterval(state.heroTimer);
    hero.remove();
  }
}

function addUserMessage(text, raw) {
  const art = el('article', 'msg user');
  const bubble = el('div', raw ? 'bubble code' : 'bubble', text);
  if (raw) bubble.appendChild(el('span', 'raw-tag', 'raw'));
  art.appendChild(bubble);
  $('transcript').appendChild(art);
}

// settings: { mode, context (Complete: the prompt, shown dimmed before the canvas), onCancel }
function newGenView(id, settings) {
  const art = el('article', settings.mode === 'chat' ? 'msg bot' : 'msg bot code');
  art.dataset.id = id;
  art.dataset.state = 'queued';
  const head = el('div', 'msg-head');
  const badge = el('span', 'badge', 'queued');
  const meta = el('span', 'meta', 'waiting for a batch slot…');
  const spacer = el('span', 'spacer');
  const cancel = el('button', 'cancel', 'Stop');
  cancel.type = 'button';
  cancel.title = 'Cancel this generation';
  head.append(badge, meta, spacer, cancel);
  const progress = el('div', 'progress');
  const bar = el('div', 'bar');
  progress.appendChild(bar);
  const canvas = el('div', 'canvas');
  const foot = el('div', 'msg-foot');
  if (settings.context !== undefined) {
    const view = el('div', 'code-view');
    view.append(el('span', 'ctx', settings.context), canvas);
    art.append(head, progress, view, foot);
  } else {
    art.append(head, progress, canvas, foot);
  }
  $('transcript').appendChild(art);
  const g = { id, art, badge, meta, bar, canvasEl: canvas, foot, cancel, canvas: null, settings, finished: false, t0: performance.now(), tFirst: 0, step: 0, text: '' };
  cancel.addEventListener('click', () => {
    if (settings.onCancel) settings.onCancel();
    else state.client.cancel(id);
    cancel.disabled = true;
    cancel.textContent = 'Stopping…';
  });
  state.gens.set(id, g);
  scrollToEnd(true);
  return g;
}

function setBadge(g, st, label) {
  g.art.dataset.state = st;
  g.badge.textContent = label || st;
}

function failGen(g, message, st = 'error') {
  g.finished = true;
  setBadge(g, st, st === 'lost' ? 'lost' : 'error');
  g.cancel.remove();
  if (g.canvas) g.canvas.finish({ finish_reason: 'error' });
  g.meta.textContent = message;
  g.art.classList.add('failed');
}

function onServerEvent(m) {
  updateStats();
  if (m.type === 'error' && !m.id) {
    toast(m.error ? m.error.message : 'error');
    return;
  }
  const g = m.id ? state.gens.get(m.id) : null;
  if (!g) return;
  switch (m.type) {
    case 'accepted': {
      const p = m.params || {};
      g.params = p;
      g.canvas = new GenCanvas(g.canvasEl, {
        genLength: p.gen_length,
        blockLength: p.block_length,
        nPrompt: m.prompt_tokens,
        layout: p.block_layout,
        showIds: state.model && !state.model.tokenizer,
      });
      if (m.queue_position > 0) {
        setBadge(g, 'queued', `queued #${m.queue_position}`);
        g.meta.textContent = `${m.prompt_tokens} prompt tokens · waiting for a batch slot`;
      } else {
        setBadge(g, 'queued', 'starting');
        g.meta.textContent = `${m.prompt_tokens} prompt tokens · ${p.gen_length} masks · ${p.decoder.replace('_', ' ')}`;
      }
      scrollToEnd();
      break;
    }
    case 'step': {
      if (!g.canvas) break;
      if (!g.tFirst) g.tFirst = performance.now();
      if (g.art.dataset.state !== 'running') setBadge(g, 'running', 'denoising');
      g.canvas.applyStep(m);
      const pr = m.progress || {};
      g.step = pr.steps ?? m.step + 1;
      const secs = (performance.now() - g.tFirst) / 1000;
      const tps = secs > 0.05 ? g.canvas.textTokens / secs : 0;
      g.meta.textContent = `step ${g.step} · block ${m.block + 1}/${m.n_blocks} · ${pr.masks_left ?? '?'} masks left${tps ? ` · ${tps.toFixed(0)} tok/s` : ''}${m.merged ? ` · ${m.merged} steps merged` : ''}`;
      g.bar.style.width = `${(g.canvas.progress * 100).toFixed(1)}%`;
      scrollToEnd();
      break;
    }
    case 'block':
      if (g.canvas) g.canvas.applyBlock(m);
      g.text += m.text;
      break;
    case 'done': {
      g.finished = true;
      g.cancel.remove();
      if (g.canvas) g.canvas.finish(m);
      const reason = m.finish_reason;
      setBadge(g, reason === 'cancelled' ? 'cancelled' : reason === 'error' ? 'error' : 'done', reason === 'stop' || reason === 'length' ? 'done' : reason);
      g.bar.style.width = '100%';
      const u = m.usage || {};
      const t = m.timings || {};
      const parts = [];
      parts.push(reason === 'length' ? 'hit the length limit' : reason === 'stop' ? 'finished' : reason);
      if (reason === 'cancelled' && g.canvas) parts.push(`${g.canvas.committed} of ${g.canvas.n} positions committed`);
      else if (u.completion_tokens !== undefined) parts.push(`${u.completion_tokens} tokens`);
      if (u.steps !== undefined) parts.push(`${u.steps} steps`);
      if (t.total_ms !== undefined && t.total_ms !== null) parts.push(`${(t.total_ms / 1000).toFixed(2)} s`);
      if (t.tokens_per_s) parts.push(`${t.tokens_per_s.toFixed(0)} tok/s`);
      if (t.queue_ms > 1) parts.push(`queued ${t.queue_ms.toFixed(0)} ms`);
      g.meta.textContent = parts.join(' · ');
      if (m.error) g.meta.textContent += ` · ${m.error}`;
      if (g.settings.mode === 'chat' && reason !== 'error') {
        state.history.push({ role: 'assistant', content: m.text });
      }
      if (!m.text && (reason === 'stop' || reason === 'length')) g.foot.textContent = '(empty answer)';
      break;
    }
    case 'error': {
      failGen(g, m.error ? m.error.message : 'error');
      if (g.settings.mode === 'chat') state.history.pop(); // the user turn that failed
      break;
    }
    default:
      break;
  }
}

// ---------------------------------------------------------------- composer

function setMode(mode) {
  const t = $('prompt');
  if (mode === 'infill' && state.mode !== 'infill' && !t.value.includes(FILL) &&
      (!t.value.trim() || CODE_EXAMPLES.includes(t.value))) {
    t.value = INFILL_EXAMPLE;
  } else if (mode === 'raw' && state.mode === 'infill' && t.value === INFILL_EXAMPLE) {
    t.value = CODE_EXAMPLES[0];
  }
  state.mode = mode;
  for (const b of document.querySelectorAll('.mode-switch .seg')) b.classList.toggle('active', b.dataset.mode === mode);
  t.placeholder = mode === 'chat' ? 'Ask something…'
    : mode === 'infill' ? `Code with ${FILL} where the missing part goes…` : 'Text or code to continue (no chat template)…';
  $('composer').classList.toggle('code', mode !== 'chat');
  autosize();
}

// A base checkpoint (no chat template): Chat is off, Complete is the default with a code example,
// and the hero's suggestions are code. A chat checkpoint keeps the chat UI.
function setBaseModel(base) {
  if (base === state.base) return;
  state.base = base;
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
  const t = $('prompt');
  if (state.mode === 'chat') setMode('raw');
  if (!t.value) {
    t.value = CODE_EXAMPLES[0];
    autosize();
  }
}

function autosize() {
  const t = $('prompt');
  t.style.height = 'auto';
  t.style.height = `${Math.min(t.scrollHeight, 220)}px`;
}

function submit(text) {
  if (state.mode === 'chat') text = text.trim();   // code keeps its trailing newline / indentation
  if (!text.trim()) return;
  if (state.mode === 'infill' && !text.includes(FILL)) {
    toast(`Infill: put ${FILL} where the missing code goes`);
    return;
  }
  hideHero();
  const s = formSettings();
  const id = `g${Date.now().toString(36)}${(++state.counter).toString(36)}`;
  const body = {
    gen_length: s.gen_length,
    block_length: s.block_length,
    steps: s.steps,
    decoder: s.decoder,
    threshold: s.threshold,
    temperature: s.temperature,
    seed: s.seed,
    cache: s.cache,
    cache_refresh: s.cache_refresh,
    prefix_look: s.prefix_look,
    after_look: s.after_look,
    stream: { drafts: !!s.drafts, draft_every: s.draft_every || 1, every: s.every || 1 },
  };
  for (const k of Object.keys(body)) if (body[k] === undefined || Number.isNaN(body[k])) delete body[k];
  const mode = state.mode;
  if (mode === 'infill') {
    submitInfill(id, text, body);
    return;
  }
  if (mode === 'chat') {
    state.history.push({ role: 'user', content: text });
    body.messages = state.history.slice();
    addUserMessage(text, false);
    newGenView(id, { mode });
  } else {
    body.prompt = text;
    newGenView(id, { mode, context: text });
  }
  state.client.generate(id, body);
}

// Infill through POST /v1/fim/completions (prompt = the text before <FILL>, suffix = after it):
// the server fills the hole natively with both sides in view; the answer arrives whole.
async function submitInfill(id, text, body) {
  const at = text.indexOf(FILL);
  const prefix = text.slice(0, at);
  const suffix = text.slice(at + FILL.length);
  const ctrl = new AbortController();
  const g = newGenView(id, { mode: 'infill', onCancel: () => ctrl.abort() });
  const { stream: _frames, gen_length: maxTokens, ...params } = body;   // stream: the WebSocket's frame settings
  const req = { ...params, prompt: prefix, suffix, max_tokens: maxTokens };
  if (!req.steps) delete req.steps;   // the HTTP APIs take 1 … 1024 or nothing (= one per token)
  setBadge(g, 'running', 'filling');
  g.meta.textContent = `${body.gen_length} masks between prefix and suffix · ${(body.decoder || '').replace('_', ' ')}`;
  const headers = { 'content-type': 'application/json' };
  if (state.client.apiKey) headers.authorization = `Bearer ${state.client.apiKey}`;
  const t0 = performance.now();
  try {
    const r = await fetch('/v1/fim/completions', { method: 'POST', headers, body: JSON.stringify(req), signal: ctrl.signal });
    const j = await r.json();
    if (!r.ok) throw new Error(j.error ? j.error.message : `HTTP ${r.status}`);
    const c = j.choices[0];
    const fill = el('span', 'fill', c.text);
    fill.title = 'generated';
    g.canvasEl.replaceChildren(el('span', 'ctx', prefix), fill, el('span', 'ctx', suffix));
    g.canvasEl.dataset.fill = c.text;
    g.finished = true;
    g.cancel.remove();
    setBadge(g, 'done', 'done');
    g.bar.style.width = '100%';
    const u = j.usage || {};
    g.meta.textContent = [c.finish_reason === 'length' ? 'hit the length limit' : 'finished',
      `${u.completion_tokens ?? '?'} tokens`, `${((performance.now() - t0) / 1000).toFixed(2)} s`].join(' · ');
  } catch (e) {
    if (ctrl.signal.aborted) {
      g.finished = true;
      g.cancel.remove();
      setBadge(g, 'cancelled', 'cancelled');
      g.meta.textContent = 'cancelled';
    } else {
      failGen(g, `infill failed: ${e.message}`);
    }
  }
}

function initComposer() {
  const t = $('prompt');
  t.addEventListener('input', autosize);
  t.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $('composer').requestSubmit();
    }
  });
  $('composer').addEventListener('submit', (e) => {
    e.preventDefault();
    const text = t.value;
    t.value = '';
    autosize();
    submit(text);
    t.focus();
  });
  for (const b of document.querySelectorAll('.mode-switch .seg')) b.addEventListener('click', () => setMode(b.dataset.mode));
  for (const c of document.querySelectorAll('#chips .chip')) c.addEventListener('click', () => submit(c.textContent));
}

// ---------------------------------------------------------------- toast

let toastTimer = null;
function toast(text) {
  let t = document.querySelector('.toast');
  if (!t) {
    t = el('div', 'toast');
    t.setAttribute('role', 'alert');
    document.body.appendChild(t);
  }
  t.textContent = text;
  t.classList.add('show');
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => t.classList.remove('show'), 4200);
}

// ---------------------------------------------------------------- start

initTheme();
initSettings();
initComposer();
state.heroTimer = heroAnimation($('hero-canvas'));
initClient();
$('prompt').focus();
