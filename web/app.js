// app.js — the unmask chat page (index.html): starts the parts and wires them together — the
// protocol client (client.js) and the connection and model pills, the conversations list (kept by
// store.js), the transcript (transcript.js), the generations (runs.js), the composer
// (composer.js), the decoding settings (settings.js), the panels and the Debug toggle. Not here:
// any of those parts' own work.

import { UnmaskClient } from './client.js';
import { initTheme } from './theme.js';
import { renderMarkdown } from './markdown.js';
import { ConversationStore } from './store.js';
import { $, button } from './dom.js';
import { apiKey, setApiKey } from './api.js';
import { applyServerDefaults, initSettings, setDecoderFields } from './settings.js';
import { initTranscript, renderConversation } from './transcript.js';
import { attachRunsOf, initRuns, regenerate, send, stopRunsOf, unqueue } from './runs.js';
import { initComposer, setBaseModel } from './composer.js';

const DEBUG_KEY = 'unmask.debug';
const RESUMED_NOTICE_MS = 4000;

let client = null;
let model = null;          // session.created.model
let store = null;          // ConversationStore
let resumedTimer = null;
let askedForKey = false;

// ---------------------------------------------------------------- panels, debug

function initPanels() {
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
  const ready = open && !!(model && model.ready);
  const st = !open ? 'offline' : ready ? 'ready' : 'loading';
  pill.dataset.state = st;
  pill.classList.toggle('ready', ready);
  pill.classList.toggle('offline', st === 'offline');
  watchModelLoading(st === 'loading');
  if (st === 'offline') pill.title = 'disconnected from the server';
  else if (ready) pill.title = `${model.family || 'model'} (${model.architecture || '?'}) · vocab ${model.vocab_size} · context ${model.max_seq}`;
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
      client.dropConnection();
    } else {
      loadingPoll = setTimeout(check, 1000);
    }
  };
  loadingPoll = setTimeout(check, 500);
}

function clearResumedNotice() {
  clearTimeout(resumedTimer);
  resumedTimer = null;
  if ($('conn').dataset.state === 'open' && /resumed/.test($('conn-text').textContent)) setConn('open', 'connected');
}

function updateStats() {
  $('s-session').textContent = client.token ? `${client.token.slice(0, 8)}…` : '—';
  $('s-events').textContent = String(client.stats.events);
  $('s-reconnects').textContent = String(client.stats.reconnects);
  $('s-replayed').textContent = String(client.stats.replayed);
}

function initClient() {
  const proto = location.protocol === 'https:' ? 'wss' : 'ws';
  client = new UnmaskClient(`${proto}://${location.host}/ws`, apiKey());
  window.unmask = client; // handy in devtools and for tests
  client.addEventListener('status', (e) => {
    const d = e.detail;
    clearTimeout(resumedTimer);
    resumedTimer = null;
    if (d.state === 'open') {
      if (d.resumed) {
        setConn('open', `resumed · ${d.replayed} replayed`);
        resumedTimer = setTimeout(clearResumedNotice, RESUMED_NOTICE_MS);
      } else {
        setConn('open', 'connected');
      }
    } else if (d.state === 'connecting') setConn('connecting', 'connecting…');
    else if (d.state === 'reconnecting') setConn('connecting', `reconnecting (try ${d.attempt})…`);
    else if (d.state === 'offline') {
      setConn('offline', d.refused ? 'refused · API key?' : `offline · retry in ${(d.retryIn / 1000).toFixed(1)} s`);
      if (d.refused && !askedForKey) {
        askedForKey = true;
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
    model = s.model;
    $('model-name').textContent = s.model ? s.model.name : '—';
    updateModelPill();
    if (s.defaults) applyServerDefaults(s.defaults);
    if (s.decoder_fields) setDecoderFields(s.decoder_fields);
    if (s.model && s.model.ready) setBaseModel(!s.model.chat_template);
    updateStats();
  });
  client.addEventListener('message', updateStats);
  $('drop').addEventListener('click', () => client.dropConnection());
  const key = $('api-key');
  key.value = client.apiKey;
  key.addEventListener('change', () => {
    const v = key.value.trim();
    setApiKey(v);
    client.apiKey = v;
    client.dropConnection(); // reconnect (and resume) with the new key
  });
}

// ---------------------------------------------------------------- conversations list

// Draw the current conversation and attach its running answers.
function showConversation() {
  renderConversation(store.current);
  attachRunsOf(store.currentId);
}

function renderConvList() {
  const list = $('conv-list');
  const items = store.convs.map((c) => {
    const li = document.createElement('li');
    li.className = 'conv-item';
    li.dataset.conv = c.id;
    if (c.id === store.currentId) li.setAttribute('aria-current', 'true');
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
  if (id !== store.currentId) {
    store.select(id);
    showConversation();
  }
  renderConvList();
}

function newConversation() {
  const cur = store.current;
  if (!cur || cur.turns.length > 0) store.create();
  showConversation();
  renderConvList();
  $('prompt').focus();
}

function deleteConversation(id) {
  stopRunsOf(id);
  store.remove(id);
  showConversation();
  renderConvList();
}

function initConversations() {
  store = new ConversationStore();
  // a reload or a closed tab inside the save debounce must not lose the last change
  window.addEventListener('pagehide', () => store.flush());
  $('new-chat').addEventListener('click', newConversation);
  const clear = $('clear-convs');
  let armed = null;
  const disarm = () => {
    clearTimeout(armed);
    armed = null;
    clear.textContent = 'Clear all';
    clear.classList.remove('armed');
  };
  clear.addEventListener('click', () => {
    if (!armed) {   // two clicks: the first one asks
      clear.textContent = 'Click again to delete all';
      clear.classList.add('armed');
      armed = setTimeout(disarm, 4000);
      return;
    }
    disarm();
    for (const c of store.convs) stopRunsOf(c.id);
    store.clear();
    showConversation();
    renderConvList();
  });
}

// ---------------------------------------------------------------- start

initTheme();
initDebug();
initPanels();
initSettings();
initConversations();
initTranscript(store, { regenerate, unqueue });
initComposer((text, mode) => {
  clearResumedNotice();
  send(text, mode);
  renderConvList();
});
initClient();
initRuns(client, store, () => model);
renderConvList();
showConversation();
client.connect();
window.unmaskUI = { renderMarkdown };   // for page-level tests
$('prompt').focus();
