// settings.js — the decoding settings panel: its parameter fields, the values the user set (kept in
// localStorage), the server's defaults (session.created.defaults) for what the user did not set,
// and the request body a generation carries. The parameters are the panel's fields themselves:
// every input or select with an id `p-<name>` is the request field <name>; the ones marked
// `data-stream` go into the request's `stream` object, with their defaults in the HTML. A field
// with no value yet (no stored setting, the server's defaults not received) is left out of the
// request, so the server's default applies. Not here: sending (runs.js).

import { $ } from './dom.js';

const STORE = 'unmask.settings.v1';
// The live view shows every token: longer default lengths than this are capped in the form.
const MAX_DEFAULT_GEN_LENGTH = 256;

// name -> element, in the panel's order
const fields = new Map();
// names that hold a value (stored, server default, or typed); the others are not sent
const known = new Set();
// server defaults received (session.created.defaults), for Reset
let serverDefaults = null;
// decoder name -> parameter names it reads (session.created.decoder_fields), when the server sends it
let decoderFields = null;

const isStream = (e) => 'stream' in e.dataset;

function readStored() {
  try {
    return JSON.parse(localStorage.getItem(STORE)) || {};
  } catch {
    return {};
  }
}

function fieldValue(e) {
  if (e.type === 'checkbox') return e.checked;
  if (e.tagName === 'SELECT') return e.value;
  return e.value === '' ? undefined : Number(e.value);
}

// Put values (name -> value) into the form; names without a field or without a value are skipped.
function applyToForm(values) {
  for (const [k, e] of fields) {
    const v = values[k];
    if (v === undefined || v === null) continue;
    if (e.type === 'checkbox') e.checked = !!v;
    else e.value = v;
    known.add(k);
  }
  syncOutputs();
}

// The HTML's own values of the stream fields (what Reset goes back to).
function streamDefaults() {
  const v = {};
  for (const [k, e] of fields) {
    if (!isStream(e)) continue;
    v[k] = e.type === 'checkbox' ? e.defaultChecked : (e.defaultValue === '' ? undefined : Number(e.defaultValue));
  }
  return v;
}

function formValues() {
  const v = {};
  for (const [k, e] of fields) if (known.has(k) || isStream(e)) v[k] = fieldValue(e);
  return v;
}

// Grey out the fields the chosen decoder or cache mode does not read.
function syncOutputs() {
  $('o-threshold').textContent = known.has('threshold') ? Number($('p-threshold').value).toFixed(2) : '—';
  $('o-temperature').textContent = known.has('temperature') ? Number($('p-temperature').value).toFixed(2) : '—';
  const dec = $('p-decoder').value;
  const cache = $('p-cache').value;
  const reads = decoderFields && decoderFields[dec];
  const unused = {
    threshold: !['threshold', 'joint_threshold', 'hierarchy_block'].includes(dec),
    sub_block_length: dec !== 'hierarchy_block',
    cache_refresh: cache === 'none',
    prefix_look: cache !== 'vicinity',
    after_look: cache !== 'vicinity',
  };
  for (const [k, e] of fields) {
    if (isStream(e)) continue;
    // with the server's map: a parameter some decoder reads is dimmed when the chosen one does not
    const mapped = reads && Object.values(decoderFields).some((names) => Array.isArray(names) && names.includes(k));
    const byDecoder = mapped ? !reads.includes(k) : (k === 'threshold' || k === 'sub_block_length') && unused[k];
    const byCache = (k === 'cache_refresh' || k === 'prefix_look' || k === 'after_look') && unused[k];
    e.closest('.field').classList.toggle('dim', byDecoder || byCache);
  }
}

export function initSettings() {
  for (const e of $('panel').querySelectorAll('[id^="p-"]')) fields.set(e.id.slice(2), e);
  applyToForm(readStored());
  $('panel').addEventListener('input', (e) => {
    const name = e.target.id && e.target.id.startsWith('p-') ? e.target.id.slice(2) : null;
    if (!name || !fields.has(name)) return;
    known.add(name);
    syncOutputs();
    localStorage.setItem(STORE, JSON.stringify(formValues()));
  });
  $('reset-params').addEventListener('click', () => {
    localStorage.removeItem(STORE);
    applyToForm({ ...streamDefaults(), ...(serverDefaults || {}) });
  });
}

// session.created.defaults: the value an unset field gets on this server. They fill the form unless
// the user has settings of their own.
export function applyServerDefaults(defaults) {
  serverDefaults = { ...defaults };
  if (serverDefaults.gen_length > MAX_DEFAULT_GEN_LENGTH) serverDefaults.gen_length = MAX_DEFAULT_GEN_LENGTH;
  if (!localStorage.getItem(STORE)) applyToForm(serverDefaults);
}

// session.created.decoder_fields (decoder name -> the parameter names it reads), when the server
// sends it: the fields the chosen decoder ignores are greyed out by that map instead of the
// built-in rule.
export function setDecoderFields(map) {
  decoderFields = map && typeof map === 'object' ? map : null;
  syncOutputs();
}

// The request body (decode parameters + stream settings) from the form.
export function requestParams() {
  const body = { stream: {} };
  for (const [k, v] of Object.entries(formValues())) {
    if (v === undefined || Number.isNaN(v)) continue;
    if (isStream(fields.get(k))) {
      if (v !== 0) body.stream[k] = v;   // an "every 0 steps" means the default (1)
      continue;
    }
    body[k] = v;
  }
  return body;
}
