// app.js — the unmask browser UI: conversations whose answers visibly denoise. Wires the protocol
// client (client.js) to the transcript, the composer, the conversations list (store.js, kept in
// localStorage), the decoding settings and the debug controls. A conversation is an ordered list of
// turns; a send while a reply is running is queued (visibly) and dispatched when that reply is done,
// so every chat request carries the full history (user, assistant, user, ...). Finished chat answers
// are shown as safe Markdown (markdown.js), can be copied, regenerated and replayed step by step
// (replay.js). A base checkpoint (no chat template, e.g. the bundled code model) opens in Complete
// mode with a code-shaped example prompt; Infill fills a <FILL> marker through the HTTP FIM endpoint
// (the WebSocket protocol has no suffix). Not here: protocol details (client.js), canvas rendering
// (canvas.js).

import { UnmaskClient } from './client.js';
import { initTheme } from './theme.js';
import { GenCanvas, heroAnimation } from './canvas.js';
import { renderMarkdown } from './markdown.js';
import { ConversationStore } from './store.js';
import { Replay, TraceRecorder, traceSteps } from './replay.js';

const $ = (id) => document.getElementById(id);
const PARAMS = ['gen_length', 'block_length', 'steps', 'decoder', 'threshold', 'sub_block_length', 'temperature', 'seed', 'cache', 'cache_refresh', 'prefix_look', 'after_look', 'drafts', 'draft_every', 'every'];
const FALLBACK = { gen_length: 128, block_length: 32, steps: 0, decoder: 'low_confidence', threshold: 0.9, sub_block_length: 8, temperature: 0, seed: 0, cache: 'dual', cache_refresh: 0, prefix_look: 0, after_look: 0, drafts: true, draft_every: 1, every: 1 };
const STORE = 'unmask.settings.v1';
const DEBUG_KEY = 'unmask.debug';
const FILL = '<FILL>';
const RESUMED_NOTICE_MS = 4000;
const CODE_EXAMPLES = [
  'class Stack:\n    """A last-in, first-out stack."""\n\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n',
  'import os\n\n\ndef list_python_files(root):\n    """Return the paths of all Python files under root."""\n    paths = []\n',
  'def fibonacci(n):\n    """Return the first n Fibonacci numbers."""\n    numbers = [0, 1]\n',
];
const INFILL_EXAMPLE = 'class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n<FILL>\n\n    def pop(self):\n        return self.items.pop()\n';
const OK_REASONS = new Set(['stop', 'length']);

const state = {
  client: null,
  model: null,            // session.created.model
  defaults: { ...FALLBACK },
  mode: 'chat',
  base: false,            // the model has no chat template: completion / infill only
  store: null,            // ConversationStore
  runs: new Map(),        // generation id -> run {id, convId, turn, mode, rec, events, view, finished, abort}
  views: new Map(),       // turn id -> DOM view (the conversation on screen)
  counter: 0,
  heroTimer: null,
  resumedTimer: null,
};

// ---------------------------------------------------------------- small helpers

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function button(cls, text, title) {
  const b = el('button', cls, text);
  b.type = 'button';
  if (title) b.title = title;
  return b;
}

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

// ---------------------------------------------------------------- theme, debug


// Developer controls (network drop, event counters) only with Debug on; off by default, remembered.
function initDebug() {
  const t = $('debug-toggle');
  const apply = (on) => {
    document.body.classList.toggle('debug', on);
    t.checked = on;
  };
  apply(localStorage.getItem(DEBUG_KEY) === '1');
  t.addEventListener('change', () => {
    if (t.checked) localStorage.setItem(DEBUG_KEY, '1');
    else localStorage.removeItem(DEBUG_KEY);
    apply(t.checked);
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
    const e = $(`p-${k}`);
    if (!e || values[k] === undefined) continue;
    if (e.type === 'checkbox') e.checked = !!values[k];
    else e.value = values[k];
  }
  syncOutputs();
}

function formSettings() {
  const v = {};
  for (const k of PARAMS) {
    const e = $(`p-${k}`);
    if (!e) continue;
    if (e.type === 'checkbox') v[k] = e.checked;
    else if (e.tagName === 'SELECT') v[k] = e.value;
    else v[k] = e.value === '' ? undefined : Number(e.value);
  }
  return v;
}

function syncOutputs() {
  $('o-threshold').textContent = Number($('p-threshold').value).toFixed(2);
  $('o-temperature').textContent = Number($('p-temperature').value).toFixed(2);
  const dec = $('p-decoder').value;
  $('f-threshold').classList.toggle('dim', !['threshold', 'joint_threshold', 'hierarchy_block'].includes(dec));
  $('f-sub_block_length').classList.toggle('dim', dec !== 'hierarchy_block');
  const cache = $('p-cache').value;
  $('f-cache_refresh').classList.toggle('dim', cache === 'none');
  $('f-prefix_look').classList.toggle('dim', cache !== 'vicinity');
  $('f-after_look').classList.toggle('dim', cache !== 'vicinity');
}

function initSettings() {
  applySettingsToForm({ ...FALLBACK, ...readSettings() });
  $('panel').addEventListener('input', (e) => {
    if (e.target.id === 'debug-toggle' || e.target.id === 'api-key') return;
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
  $('convs-toggle').addEventListener('click', () => {
    const hidden = document.body.classList.toggle('convs-hidden');
    $('convs-toggle').setAttribute('aria-expanded', String(!hidden));
  });
  if (window.innerWidth < 900) document.body.classList.add('panel-hidden', 'convs-hidden');
}

// The request body (decode parameters + stream settings) from the settings form.
function requestParams() {
  const s = formSettings();
  const body = {
    gen_length: s.gen_length,
    block_length: s.block_length,
    steps: s.steps,
    decoder: s.decoder,
    threshold: s.threshold,
    sub_block_length: s.sub_block_length,
    temperature: s.temperature,
    seed: s.seed,
    cache: s.cache,
    cache_refresh: s.cache_refresh,
    prefix_look: s.prefix_look,
    after_look: s.after_look,
    stream: { drafts: !!s.drafts, draft_every: s.draft_every || 1, every: s.every || 1 },
  };
  for (const k of Object.keys(body)) if (body[k] === undefined || Number.isNaN(body[k])) delete body[k];
  return body;
}

// ---------------------------------------------------------------- connection

function setConn(st, text) {
  $('conn').dataset.state = st;
  $('conn-text').textContent = text;
  updateModelPill();
}

// The model pill: green only while connected to a server whose model is ready; red while the
// connection is down (the server may be gone), amber while the model loads.
function updateModelPill() {
  const pill = $('model-pill');
  const open = $('conn').dataset.state === 'open';
  const ready = open && !!(state.model && state.model.ready);
  const st = !open ? 'offline' : ready ? 'ready' : 'loading';
  pill.dataset.state = st;
  pill.classList.toggle('ready', ready);
  pill.classList.toggle('offline', st === 'offline');
  watchModelLoading(st === 'loading');
  if (st === 'offline') pill.title = 'disconnected from the server';
  else if (ready) pill.title = `${state.model.family || 'model'} (${state.model.architecture || '?'}) · vocab ${state.model.vocab_size} · context ${state.model.max_seq}`;
  else pill.title = 'model loading…';
}

// Connected while the server's model is still loading: the protocol sends no event when it is
// ready, so poll GET /health (200 once loaded) and then reconnect, which resumes the session and
// brings the model's description (session.created) with it.
let loadingPoll = null;
function watchModelLoading(on) {
  if (!on) {
    clearTimeout(loadingPoll);
    loadingPoll = null;
    return;
  }
  if (loadingPoll) return;
  const check = async () => {
    let ok = false;
    try {
      ok = (await fetch('/health', { cache: 'no-store' })).ok;
    } catch {
      ok = false;
    }
    if (!loadingPoll) return;   // the state changed meanwhile
    if (ok) {
      loadingPoll = null;
      state.client.dropConnection();
    } else {
      loadingPoll = setTimeout(check, 1000);
    }
  };
  loadingPoll = setTimeout(check, 500);
}

function clearResumedNotice() {
  clearTimeout(state.resumedTimer);
  state.resumedTimer = null;
  if ($('conn').dataset.state === 'open' && /resumed/.test($('conn-text').textContent)) setConn('open', 'connected');
}

function initClient() {
  const proto = location.protocol === 'https:' ? 'wss' : 'ws';
  const client = new UnmaskClient(`${proto}://${location.host}/ws`, localStorage.getItem('unmask.apiKey') || '');
  state.client = client;
  window.unmask = client; // handy in devtools and for tests
  client.addEventListener('status', (e) => {
    const d = e.detail;
    clearTimeout(state.resumedTimer);
    state.resumedTimer = null;
    if (d.state === 'open') {
      if (d.resumed) {
        setConn('open', `resumed · ${d.replayed} replayed`);
        state.resumedTimer = setTimeout(clearResumedNotice, RESUMED_NOTICE_MS);
      } else {
        setConn('open', 'connected');
      }
    } else if (d.state === 'connecting') setConn('connecting', 'connecting…');
    else if (d.state === 'reconnecting') setConn('connecting', `reconnecting (try ${d.attempt})…`);
    else if (d.state === 'offline') {
      setConn('offline', d.refused ? 'refused · API key?' : `offline · retry in ${(d.retryIn / 1000).toFixed(1)} s`);
      if (d.refused && !state.askedForKey) {
        state.askedForKey = true;
        document.body.classList.remove('panel-hidden');
        $('api-key').scrollIntoView({ block: 'center' });
        $('api-key').focus();
      }
    } else setConn('offline', 'closed');
    updateStats();
  });
  client.addEventListener('session', (e) => {
    const s = e.detail;
    // a reconnect's own session (pending: a resume follows) describes the same server's model
    state.model = s.model;
    $('model-name').textContent = s.model ? s.model.name : '—';
    updateModelPill();
    if (s.defaults) {
      state.defaults = {
        ...FALLBACK,
        gen_length: Math.min(s.defaults.gen_length, 256),
        block_length: s.defaults.block_length,
        steps: s.defaults.steps,
        decoder: s.defaults.decoder,
        threshold: s.defaults.threshold,
        sub_block_length: s.defaults.sub_block_length ?? FALLBACK.sub_block_length,
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
    for (const run of [...state.runs.values()]) {
      if (!run.finished && !run.abort) failRun(run, 'connection lost and the session could not be resumed', 'lost');
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

// ---------------------------------------------------------------- conversations list

function renderConvList() {
  const list = $('conv-list');
  const items = state.store.convs.map((c) => {
    const li = el('li', 'conv-item');
    li.dataset.conv = c.id;
    if (c.id === state.store.currentId) li.setAttribute('aria-current', 'true');
    const open = button('conv-open', c.title || 'New chat', c.title || 'New chat');
    open.addEventListener('click', () => selectConversation(c.id));
    const del = button('conv-del', '×', 'Delete this conversation');
    del.setAttribute('aria-label', `Delete conversation ${c.title || ''}`.trim());
    del.addEventListener('click', () => deleteConversation(c.id));
    li.append(open, del);
    return li;
  });
  list.replaceChildren(...items);
  $('conv-empty').hidden = items.length > 0;
}

function selectConversation(id) {
  if (window.innerWidth < 900) document.body.classList.add('convs-hidden');   // the list is a drawer there
  if (id !== state.store.currentId) {
    state.store.select(id);
    renderConversation();
  }
  renderConvList();
}

function newConversation() {
  const cur = state.store.current;
  if (cur && cur.turns.length === 0) {
    renderConversation();   // already an empty one
  } else {
    state.store.create();
    renderConversation();
  }
  renderConvList();
  $('prompt').focus();
}

function stopRunsOf(convId) {
  for (const run of [...state.runs.values()]) {
    if (run.convId !== convId) continue;
    if (run.abort) run.abort.abort();
    else if (!run.finished) state.client.cancel(run.id);
    state.runs.delete(run.id);
  }
}

function deleteConversation(id) {
  stopRunsOf(id);
  state.store.remove(id);
  renderConversation();
  renderConvList();
}

function initConversations() {
  heroEl = $('hero');
  state.store = new ConversationStore();
  // a reload or a closed tab inside the save debounce must not lose the last change
  window.addEventListener('pagehide', () => state.store.flush());
  $('new-chat').addEventListener('click', newConversation);
  const clear = $('clear-convs');
  let armed = null;
  clear.addEventListener('click', () => {
    if (!armed) {   // two clicks: the first one asks
      clear.textContent = 'Click again to delete all';
      clear.classList.add('armed');
      armed = setTimeout(() => {
        armed = null;
        clear.textContent = 'Clear all';
        clear.classList.remove('armed');
      }, 4000);
      return;
    }
    clearTimeout(armed);
    armed = null;
    clear.textContent = 'Clear all';
    clear.classList.remove('armed');
    for (const c of state.store.convs) stopRunsOf(c.id);
    state.store.clear();
    renderConversation();
    renderConvList();
  });
  renderConvList();
  renderConversation();
}

// ---------------------------------------------------------------- transcript

// Keep the newest text in view (unless the reader scrolled up). Once per animation frame: reading
// the layout on every step event of a long canvas would force a layout per event.
let scrollPending = null;
function scrollToEnd(force) {
  if (scrollPending !== null) {
    scrollPending = scrollPending || !!force;
    return;
  }
  scrollPending = !!force;
  requestAnimationFrame(() => {
    const t = $('transcript');
    const near = t.scrollHeight - t.scrollTop - t.clientHeight < 160;
    if (scrollPending || near) t.scrollTop = t.scrollHeight;
    scrollPending = null;
  });
}

let heroEl = null;
function showHero(on) {
  if (!heroEl) heroEl = $('hero');
  if (on) {
    if (!heroEl.isConnected) $('transcript').appendChild(heroEl);
    if (!state.heroTimer) state.heroTimer = heroAnimation($('hero-canvas'));
  } else {
    clearInterval(state.heroTimer);
    state.heroTimer = null;
    heroEl.remove();
  }
}

// Draw the current conversation from its stored turns (running ones from their events so far).
function renderConversation() {
  for (const v of state.views.values()) if (v.replay) v.replay.destroy();
  state.views.clear();
  for (const run of state.runs.values()) run.view = null;
  const t = $('transcript');
  t.replaceChildren();
  const conv = state.store.current;
  if (!conv || conv.turns.length === 0) {
    showHero(true);
    return;
  }
  showHero(false);
  for (const turn of conv.turns) t.appendChild(renderTurn(turn));
  for (const run of state.runs.values()) if (run.convId === conv.id) attachRunView(run);
  scrollToEnd(true);
}

function renderTurn(turn) {
  return turn.role === 'user' ? renderUserTurn(turn) : renderAssistantTurn(turn);
}

function renderUserTurn(turn) {
  const art = el('article', 'msg user');
  art.dataset.turn = turn.id;
  const raw = turn.mode !== 'chat';
  const bubble = el('div', raw ? 'bubble code' : 'bubble', turn.content);
  if (raw) bubble.appendChild(el('span', 'raw-tag', turn.mode === 'infill' ? 'infill' : 'raw'));
  if (turn.queued) {
    art.dataset.queued = 'true';
    const q = el('div', 'queued-note');
    q.append(el('span', 'queued-tag', 'queued · sent when the answer above is done'));
    const x = button('unqueue', 'Cancel', 'Do not send this message');
    x.addEventListener('click', () => unqueue(turn));
    q.append(x);
    art.append(bubble, q);
  } else {
    art.append(bubble);
  }
  state.views.set(turn.id, { art, turn });
  return art;
}

// The view of an assistant turn. Parts: head (badge, meta, actions), progress bar, body (live
// canvas / Markdown / code view), replay area.
function renderAssistantTurn(turn) {
  const code = turn.mode !== 'chat';
  const art = el('article', code ? 'msg bot code' : 'msg bot');
  art.dataset.turn = turn.id;
  if (turn.genId) art.dataset.id = turn.genId;
  const head = el('div', 'msg-head');
  const badge = el('span', 'badge');
  const meta = el('span', 'meta');
  const actions = el('span', 'actions');
  head.append(badge, meta, el('span', 'spacer'), actions);
  const progress = el('div', 'progress');
  const bar = el('div', 'bar');
  progress.appendChild(bar);
  const body = el('div', 'msg-body');
  const foot = el('div', 'msg-foot');
  const replayBox = el('div', 'replay-box');
  art.append(head, progress, body, foot, replayBox);
  const v = { art, turn, badge, meta, actions, bar, body, foot, replayBox, canvas: null, canvasEl: null, replay: null };
  state.views.set(turn.id, v);
  if (turn.status === 'queued' || turn.status === 'running' || turn.status === 'regen') {
    setBadge(v, 'queued', 'queued');
    meta.textContent = 'waiting for a batch slot…';
  } else {
    showFinished(v);
  }
  return art;
}

function setBadge(v, st, label) {
  v.art.dataset.state = st;
  v.badge.textContent = label || st;
}

const STATUS_LABEL = { stop: 'done', length: 'done', cancelled: 'cancelled', error: 'error', lost: 'lost', interrupted: 'interrupted' };
const STATUS_STATE = { stop: 'done', length: 'done', cancelled: 'cancelled', error: 'error', lost: 'lost', interrupted: 'error' };

// A finished turn's body: chat -> Markdown of the committed text (the live canvas, when there is
// one, stays in the DOM hidden); Complete -> the prompt then the completion; Infill -> prefix, fill,
// suffix. Actions: Copy, Regenerate, Replay.
function showFinished(v) {
  const t = v.turn;
  setBadge(v, STATUS_STATE[t.status] || 'error', STATUS_LABEL[t.status] || t.status);
  v.bar.style.width = '100%';
  v.meta.textContent = t.meta || '';
  if (t.error) v.meta.textContent += `${t.meta ? ' · ' : ''}${t.error}`;
  if (t.status === 'error' || t.status === 'lost' || t.status === 'interrupted') v.art.classList.add('failed');
  if (t.mode === 'chat') {
    if (v.canvasEl && !t.content) {
      // nothing committed (error / cancelled early): the finished canvas stays
    } else {
      if (v.canvasEl) v.canvasEl.hidden = true;
      const md = el('div', 'md');
      md.appendChild(renderMarkdown(t.content));
      for (const old of v.body.querySelectorAll('.md')) old.remove();
      v.body.appendChild(md);
    }
  } else if (t.mode === 'infill') {
    const [prefix, suffix] = splitFill(userTurnOf(t)?.content || '');
    const fill = el('span', 'fill', t.content);
    fill.title = 'generated';
    v.body.replaceChildren(el('div', 'code-view'));
    v.body.firstChild.append(el('span', 'ctx', prefix), fill, el('span', 'ctx', suffix));
    v.body.firstChild.dataset.fill = t.content;
  } else if (!v.canvasEl) {
    const view = el('div', 'code-view');
    const c = el('span', 'canvas finished', t.content);
    view.append(el('span', 'ctx', userTurnOf(t)?.content || ''), c);
    v.body.replaceChildren(view);
  }
  if (OK_REASONS.has(t.status) && !t.content) v.foot.textContent = '(empty answer)';
  v.actions.replaceChildren();
  const copy = button('act copy', 'Copy', 'Copy the answer');
  copy.addEventListener('click', () => copyText(t.content, copy));
  const regen = button('act regen', 'Regenerate', 'Generate this answer again');
  regen.addEventListener('click', () => regenerate(t));
  v.actions.append(copy, regen);
  if (t.trace && traceSteps(t.trace) > 0) {
    const rp = button('act replay-btn', 'Replay', 'Replay the denoising step by step');
    rp.setAttribute('aria-expanded', 'false');
    rp.addEventListener('click', () => toggleReplay(v, rp));
    v.actions.append(rp);
  }
}

function toggleReplay(v, btn) {
  if (v.replay) {
    v.replay.destroy();
    v.replay = null;
    btn.setAttribute('aria-expanded', 'false');
    btn.classList.remove('on');
    return;
  }
  v.replay = new Replay(v.replayBox, v.turn.trace);
  btn.setAttribute('aria-expanded', 'true');
  btn.classList.add('on');
}

async function copyText(text, btn) {
  let ok = false;
  try {
    await navigator.clipboard.writeText(text);
    ok = true;
  } catch {
    const ta = el('textarea');
    ta.value = text;
    ta.setAttribute('readonly', '');
    ta.className = 'offscreen';
    document.body.appendChild(ta);
    ta.select();
    try {
      ok = document.execCommand('copy');
    } catch {
      ok = false;
    }
    ta.remove();
  }
  btn.textContent = ok ? 'Copied' : 'Copy failed';
  btn.dataset.copied = ok ? 'true' : 'false';
  setTimeout(() => {
    btn.textContent = 'Copy';
    delete btn.dataset.copied;
  }, 1500);
}

function splitFill(text) {
  const at = text.indexOf(FILL);
  return at < 0 ? [text, ''] : [text.slice(0, at), text.slice(at + FILL.length)];
}

function convOf(turn) {
  return state.store.convs.find((c) => c.turns.includes(turn)) || null;
}

function userTurnOf(assistant) {
  const conv = convOf(assistant);
  return conv ? conv.turns.find((x) => x.id === assistant.replyTo) : null;
}

// ---------------------------------------------------------------- sending: queue and dispatch

function submit(text) {
  if (state.mode === 'chat') text = text.trim();   // code keeps its trailing newline / indentation
  if (!text.trim()) return;
  if (state.mode === 'infill' && !text.includes(FILL)) {
    toast(`Infill: put ${FILL} where the missing code goes`);
    return;
  }
  clearResumedNotice();
  const conv = state.store.ensureCurrent();
  if (conv.turns.length === 0) showHero(false);
  const turn = state.store.newTurn(conv, { role: 'user', mode: state.mode, content: text, queued: true, params: requestParams() });
  $('transcript').appendChild(renderUserTurn(turn));
  renderConvList();
  scrollToEnd(true);
  pump(conv);
}

function unqueue(turn) {
  const conv = convOf(turn);
  if (!conv || !turn.queued) return;
  conv.turns.splice(conv.turns.indexOf(turn), 1);
  state.store.touch(conv);
  const v = state.views.get(turn.id);
  if (v) v.art.remove();
  state.views.delete(turn.id);
}

function busy(conv) {
  for (const run of state.runs.values()) if (run.convId === conv.id && !run.finished) return true;
  return false;
}

// Start the conversation's next pending turn (a queued user message, or an answer to regenerate)
// unless one of its answers is still running.
function pump(conv) {
  if (!conv || busy(conv)) return;
  const i = conv.turns.findIndex((t) => (t.role === 'user' && t.queued) || (t.role === 'assistant' && t.status === 'regen'));
  if (i < 0) return;
  const t = conv.turns[i];
  let user;
  let answer;
  if (t.role === 'user') {
    user = t;
    delete user.queued;
    const uv = state.views.get(user.id);
    if (uv) {
      const fresh = renderUserTurn(user);
      uv.art.replaceWith(fresh);
    }
    answer = state.store.newTurn(conv, { role: 'assistant', mode: user.mode, replyTo: user.id, content: '', status: 'queued' }, user.id);
  } else {
    answer = t;
    user = conv.turns.find((x) => x.id === answer.replyTo);
    answer.status = 'queued';
    if (!user) {
      answer.status = 'error';
      answer.error = 'its question is gone';
      return pump(conv);
    }
  }
  dispatch(conv, user, answer);
}

// The chat history a request for the answer to `user` carries: every earlier exchange that has an
// answer (user, assistant, user, assistant, ...), then this user message.
function chatHistory(conv, user) {
  const msgs = [];
  for (const t of conv.turns) {
    if (t === user) break;
    if (t.role !== 'user' || t.mode !== 'chat' || t.queued) continue;
    const a = conv.turns.find((x) => x.role === 'assistant' && x.replyTo === t.id);
    if (!a || !a.content || !(OK_REASONS.has(a.status) || a.status === 'cancelled')) continue;
    msgs.push({ role: 'user', content: t.content }, { role: 'assistant', content: a.content });
  }
  msgs.push({ role: 'user', content: user.content });
  return msgs;
}

function dispatch(conv, user, answer) {
  const id = `g${Date.now().toString(36)}${(++state.counter).toString(36)}`;
  const body = { ...(answer.regenParams || user.params || requestParams()) };
  delete answer.regenParams;
  Object.assign(answer, { genId: id, status: 'running', content: '', meta: '', error: undefined, trace: undefined });
  const run = { id, convId: conv.id, turn: answer, mode: answer.mode, rec: new TraceRecorder(), events: [], view: null, finished: false, abort: null, t0: performance.now(), tFirst: 0 };
  state.runs.set(id, run);
  state.store.touch(conv);
  if (conv.id === state.store.currentId) {
    const old = state.views.get(answer.id);
    const art = renderAssistantTurn(answer);
    if (old) old.art.replaceWith(art);
    else {
      const uv = state.views.get(user.id);
      if (uv) uv.art.after(art);
      else $('transcript').appendChild(art);
    }
    attachRunView(run);
    scrollToEnd(true);
  }
  if (answer.mode === 'infill') {
    runInfill(run, user.content, body);
    return;
  }
  if (answer.mode === 'chat') body.messages = chatHistory(conv, user);
  else body.prompt = user.content;
  state.client.generate(id, body);
}

// ---------------------------------------------------------------- live generations

// Connect a running generation to its turn's view (if on screen) and bring the view up to date
// with the events received so far.
function attachRunView(run) {
  const v = state.views.get(run.turn.id);
  if (!v) return;
  run.view = v;
  v.art.dataset.id = run.id;
  const stop = button('cancel', 'Stop', 'Cancel this generation');
  stop.addEventListener('click', () => {
    if (run.abort) run.abort.abort();
    else state.client.cancel(run.id);
    stop.disabled = true;
    stop.textContent = 'Stopping…';
  });
  v.actions.replaceChildren(stop);
  v.canvasEl = el('div', 'canvas');
  if (run.mode === 'chat') v.body.replaceChildren(v.canvasEl);
  else {
    const view = el('div', 'code-view');
    const user = userTurnOf(run.turn);
    if (run.mode === 'raw') view.append(el('span', 'ctx', user ? user.content : ''), v.canvasEl);
    else view.append(v.canvasEl);
    v.body.replaceChildren(view);
  }
  if (run.mode === 'infill') {
    setBadge(v, 'running', 'filling');
    v.meta.textContent = 'masks between prefix and suffix';
    return;
  }
  for (const m of run.events) applyToView(run, m, true);
}

function onServerEvent(m) {
  updateStats();
  if (m.type === 'error' && !m.id) {
    toast(m.error ? m.error.message : 'error');
    return;
  }
  const run = m.id ? state.runs.get(m.id) : null;
  if (!run || run.finished) return;
  run.events.push(m);
  run.rec.add(m);
  if (m.type === 'accepted' && run.rec.trace) run.rec.trace.ids = !!(state.model && !state.model.tokenizer);
  if (run.view) applyToView(run, m, false);
  if (m.type === 'done') finishRun(run, m);
  else if (m.type === 'error') failRun(run, m.error ? m.error.message : 'error');
}

function applyToView(run, m, replaying) {
  const v = run.view;
  switch (m.type) {
    case 'accepted': {
      const p = m.params || {};
      v.canvas = new GenCanvas(v.canvasEl, {
        genLength: p.gen_length,
        blockLength: p.block_length,
        nPrompt: m.prompt_tokens,
        layout: p.block_layout,
        showIds: state.model && !state.model.tokenizer,
      });
      if (m.queue_position > 0) {
        setBadge(v, 'queued', `queued #${m.queue_position}`);
        v.meta.textContent = `${m.prompt_tokens} prompt tokens · waiting for a batch slot`;
      } else {
        setBadge(v, 'queued', 'starting');
        v.meta.textContent = `${m.prompt_tokens} prompt tokens · ${p.gen_length} masks · ${String(p.decoder).replace('_', ' ')}`;
      }
      if (!replaying) scrollToEnd();
      break;
    }
    case 'step': {
      if (!v.canvas) break;
      if (!run.tFirst) run.tFirst = performance.now();
      if (v.art.dataset.state !== 'running') setBadge(v, 'running', 'denoising');
      v.canvas.applyStep(m);
      const pr = m.progress || {};
      const step = pr.steps ?? m.step + 1;
      const secs = (performance.now() - run.tFirst) / 1000;
      const tps = secs > 0.05 ? v.canvas.textTokens / secs : 0;
      v.meta.textContent = `step ${step} · block ${m.block + 1}/${m.n_blocks} · ${pr.masks_left ?? '?'} masks left${tps ? ` · ${tps.toFixed(0)} tok/s` : ''}${m.merged ? ` · ${m.merged} steps merged` : ''}`;
      v.bar.style.width = `${(v.canvas.progress * 100).toFixed(1)}%`;
      if (!replaying) scrollToEnd();
      break;
    }
    case 'block':
      if (v.canvas) v.canvas.applyBlock(m);
      break;
    default:
      break;
  }
}

function doneSummary(m, canvas) {
  const reason = m.finish_reason;
  const u = m.usage || {};
  const t = m.timings || {};
  const parts = [];
  parts.push(reason === 'length' ? 'hit the length limit' : reason === 'stop' ? 'finished' : reason);
  if (reason === 'cancelled' && canvas) parts.push(`${canvas.committed} of ${canvas.n} positions committed`);
  else if (u.completion_tokens !== undefined) parts.push(`${u.completion_tokens} tokens`);
  if (u.steps !== undefined) parts.push(`${u.steps} steps`);
  if (t.total_ms !== undefined && t.total_ms !== null) parts.push(`${(t.total_ms / 1000).toFixed(2)} s`);
  if (t.tokens_per_s) parts.push(`${t.tokens_per_s.toFixed(0)} tok/s`);
  if (t.queue_ms > 1) parts.push(`queued ${t.queue_ms.toFixed(0)} ms`);
  return parts.join(' · ');
}

function endRun(run) {
  run.finished = true;
  state.runs.delete(run.id);
  const conv = state.store.get(run.convId);
  if (conv) {
    state.store.touch(conv);
    pump(conv);
  }
  state.store.flush();   // a finished answer is written at once, not after the debounce
}

function finishRun(run, m) {
  const t = run.turn;
  const v = run.view;
  t.status = m.finish_reason;
  t.content = m.text || '';
  t.meta = doneSummary(m, v && v.canvas);
  t.error = m.error || undefined;
  t.trace = run.rec.trace || undefined;
  if (v) {
    if (v.canvas) v.canvas.finish(m);
    showFinished(v);
  }
  endRun(run);
}

function failRun(run, message, st = 'error') {
  const t = run.turn;
  const v = run.view;
  t.status = st;
  t.error = message;
  t.meta = '';
  if (v) {
    if (v.canvas) v.canvas.finish({ finish_reason: 'error' });
    showFinished(v);
  }
  endRun(run);
}

function regenerate(turn) {
  const conv = convOf(turn);
  if (!conv) return;
  turn.status = 'regen';
  turn.regenParams = requestParams();
  turn.content = '';
  const v = state.views.get(turn.id);
  if (v) {
    if (v.replay) v.replay.destroy();
    const art = renderAssistantTurn(turn);
    v.art.replaceWith(art);
    setBadge(state.views.get(turn.id), 'queued', 'queued');
  }
  state.store.touch(conv);
  pump(conv);
}

// Infill through POST /v1/fim/completions (prompt = the text before <FILL>, suffix = after it):
// the server fills the hole natively with both sides in view; the answer arrives whole.
async function runInfill(run, text, body) {
  const [prefix, suffix] = splitFill(text);
  const ctrl = new AbortController();
  run.abort = ctrl;
  const { stream: _frames, gen_length: maxTokens, ...params } = body;   // stream: the WebSocket's frame settings
  const req = { ...params, prompt: prefix, suffix, max_tokens: maxTokens };
  if (!req.steps) delete req.steps;   // the HTTP APIs take 1 … 1024 or nothing (= one per token)
  if (run.view) run.view.meta.textContent = `${maxTokens} masks between prefix and suffix · ${(body.decoder || '').replace('_', ' ')}`;
  const headers = { 'content-type': 'application/json' };
  if (state.client.apiKey) headers.authorization = `Bearer ${state.client.apiKey}`;
  const t0 = performance.now();
  try {
    const r = await fetch('/v1/fim/completions', { method: 'POST', headers, body: JSON.stringify(req), signal: ctrl.signal });
    const j = await r.json();
    if (!r.ok) throw new Error(j.error ? j.error.message : `HTTP ${r.status}`);
    const c = j.choices[0];
    const u = j.usage || {};
    const t = run.turn;
    t.status = c.finish_reason === 'length' ? 'length' : 'stop';
    t.content = c.text;
    t.meta = [c.finish_reason === 'length' ? 'hit the length limit' : 'finished', `${u.completion_tokens ?? '?'} tokens`,
      `${((performance.now() - t0) / 1000).toFixed(2)} s`].join(' · ');
    if (run.view) showFinished(run.view);
    endRun(run);
  } catch (e) {
    if (!state.runs.has(run.id)) return;   // its conversation was deleted
    if (ctrl.signal.aborted) {
      run.turn.status = 'cancelled';
      run.turn.meta = 'cancelled';
      run.turn.content = '';
      if (run.view) showFinished(run.view);
      endRun(run);
    } else {
      failRun(run, `infill failed: ${e.message}`);
    }
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

// ---------------------------------------------------------------- start

initTheme();
initDebug();
initSettings();
initComposer();
initConversations();
initClient();
window.unmaskUI = { state, renderMarkdown };   // for devtools and page-level tests
$('prompt').focus();
