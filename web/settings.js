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

// Why the chosen decoder or cache mode does not read field k (a sentence for its tooltip), or null
// when it does. With the server's map (session.created.decoder_fields) a parameter some decoder
// reads is ignored when the chosen one does not read it; without it, a built-in rule for the
// decoder-specific fields. The cache-window fields depend on the cache mode.
function ignoredReason(k, dec, cache) {
  const reads = decoderFields && decoderFields[dec];
  const mapped = Array.isArray(reads) && Object.values(decoderFields).some((names) => Array.isArray(names) && names.includes(k));
  const byDecoder = mapped ? !reads.includes(k)
    : (k === 'threshold' && !['threshold', 'joint_threshold', 'hierarchy_block'].includes(dec)) ||
      (k === 'sub_block_length' && dec !== 'hierarchy_block');
  if (byDecoder) return `the ${dec.replace(/_/g, ' ')} decoder ignores this parameter on this model: it is not sent`;
  if (k === 'cache_refresh' && cache === 'none') return 'no KV cache: nothing to refresh; not sent';
  if ((k === 'prefix_look' || k === 'after_look') && cache !== 'vicinity') return 'only the vicinity cache reads this; not sent';
  return null;
}

// Grey out (disable, with a tooltip saying why) the fields the chosen decoder or cache mode does
// not read; requestParams leaves them out.
function syncOutputs() {
  $('o-threshold').textContent = known.has('threshold') ? Number($('p-threshold').value).toFixed(2) : '—';
  $('o-temperature').textContent = known.has('temperature') ? Number($('p-temperature').value).toFixed(2) : '—';
  const dec = $('p-decoder').value;
  const cache = $('p-cache').value;
  for (const [k, e] of fields) {
    if (isStream(e)) continue;
    const why = ignoredReason(k, dec, cache);
    const f = e.closest('.field');
    e.disabled = !!why;
    f.classList.toggle('dim', !!why);
    if (why) f.title = why;
    else f.removeAttribute('title');
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

// session.created.decoder_fields (decoder name -> the parameter names it reads on this model), when
// the server sends it: the fields the chosen decoder ignores are greyed out (and not sent) by that
// map instead of the built-in rule.
export function setDecoderFields(map) {
  decoderFields = map && typeof map === 'object' ? map : null;
  syncOutputs();
}

// The request body (decode parameters + stream settings) from the form; greyed-out fields (the
// chosen decoder or cache mode ignores them) are left out.
export function requestParams() {
  const body = { stream: {} };
  for (const [k, v] of Object.entries(formValues())) {
    if (v === undefined || Number.isNaN(v) || fields.get(k).disabled) continue;
    if (isStream(fields.get(k))) {
      if (v !== 0) body.stream[k] = v;   // an "every 0 steps" means the default (1)
      continue;
    }
    body[k] = v;
  }
  return body;
}
