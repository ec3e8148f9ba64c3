// runs.js — the generation lifecycle: a send appends a user turn and its answer is generated when
// the conversation has no answer running (sends while one runs are queued, visibly, and go in
// order), so every chat request carries the full history; a generation over the WebSocket
// (client.js) draws its events into the answer's view as they arrive and records its denoising
// trace (replay.js) — chat, Complete and Infill alike (Infill is a `generate` with `prompt` = the text
// before <FILL> and `suffix` = the text after it). Stop, Regenerate, a lost session. Not here:
// drawing finished turns (transcript.js), the parameter form (settings.js).

import { button, el, toast } from './dom.js';
import { GenCanvas } from './canvas.js';
import { TraceRecorder } from './replay.js';
import { requestParams } from './settings.js';
import { OK_REASONS, renderAssistantTurn, renderUserTurn, scrollToEnd, setBadge, showFinished, showHero, splitFill, views } from './transcript.js';

// generation id -> run {id, convId, turn, mode, rec, events, view, finished, t0, tFirst}
const runs = new Map();
let counter = 0;
let client = null;
let store = null;
let modelOf = () => null;   // the server's model description (session.created.model)

export function initRuns(protocolClient, conversationStore, model) {
  client = protocolClient;
  store = conversationStore;
  modelOf = model;
  client.addEventListener('message', (e) => onServerEvent(e.detail.msg));
  client.addEventListener('lost', (e) => {
    for (const run of [...runs.values()]) {
      if (!run.finished) failRun(run, 'connection lost and the session could not be resumed', 'lost');
    }
    toast(`Session could not be resumed: ${e.detail.reason}`);
  });
}

// Append text (a user message in mode 'chat' | 'raw' | 'infill') to the current conversation and
// answer it when the conversation's running answer (if any) is done.
export function send(text, mode) {
  const conv = store.ensureCurrent();
  if (conv.turns.length === 0) showHero(false);
  const turn = store.newTurn(conv, { role: 'user', mode, content: text, queued: true, params: requestParams() });
  document.getElementById('transcript').appendChild(renderUserTurn(turn));
  scrollToEnd(true);
  pump(conv);
}

export function unqueue(turn) {
  const conv = store.convOf(turn);
  if (!conv || !turn.queued) return;
  conv.turns.splice(conv.turns.indexOf(turn), 1);
  store.touch(conv);
  const v = views.get(turn.id);
  if (v) v.art.remove();
  views.delete(turn.id);
}

function busy(conv) {
  for (const run of runs.values()) if (run.convId === conv.id && !run.finished) return true;
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
    const uv = views.get(user.id);
    if (uv) uv.art.replaceWith(renderUserTurn(user));
    answer = store.newTurn(conv, { role: 'assistant', mode: user.mode, replyTo: user.id, content: '', status: 'queued' }, user.id);
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
  const id = `g${Date.now().toString(36)}${(++counter).toString(36)}`;
  const body = { ...(answer.regenParams || user.params || requestParams()) };
  delete answer.regenParams;
  Object.assign(answer, { genId: id, status: 'running', content: '', meta: '', error: undefined, trace: undefined });
  const run = { id, convId: conv.id, turn: answer, mode: answer.mode, rec: new TraceRecorder(), events: [], view: null, finished: false, t0: performance.now(), tFirst: 0 };
  runs.set(id, run);
  store.touch(conv);
  if (conv.id === store.currentId) {
    const old = views.get(answer.id);
    const art = renderAssistantTurn(answer);
    if (old) old.art.replaceWith(art);
    else {
      const uv = views.get(user.id);
      if (uv) uv.art.after(art);
      else document.getElementById('transcript').appendChild(art);
    }
    attachRunView(run);
    scrollToEnd(true);
  }
  if (answer.mode === 'chat') body.messages = chatHistory(conv, user);
  else if (answer.mode === 'infill') [body.prompt, body.suffix] = splitFill(user.content);
  else body.prompt = user.content;
  client.generate(id, body);
}

// Connect a running generation to its turn's view (if on screen) and bring the view up to date
// with the events received so far.
function attachRunView(run) {
  const v = views.get(run.turn.id);
  if (!v) return;
  run.view = v;
  v.art.dataset.id = run.id;
  const stop = button('cancel', 'Stop', 'Cancel this generation');
  stop.addEventListener('click', () => {
    client.cancel(run.id);
    stop.disabled = true;
    stop.textContent = 'Stopping…';
  });
  v.actions.replaceChildren(stop);
  v.canvasEl = el('div', 'canvas');
  if (run.mode === 'chat') v.body.replaceChildren(v.canvasEl);
  else {
    const view = el('div', 'code-view');
    const user = store.userTurnOf(run.turn);
    if (run.mode === 'raw') view.append(el('span', 'ctx', user ? user.content : ''), v.canvasEl);
    else {
      // Infill: the hole's canvas between the prefix and the suffix
      const [prefix, suffix] = splitFill(user ? user.content : '');
      view.append(el('span', 'ctx', prefix), v.canvasEl, el('span', 'ctx', suffix));
    }
    v.body.replaceChildren(view);
  }
  for (const m of run.events) applyToView(run, m, true);
}

// The views were redrawn (transcript.renderConversation): attach the runs of the conversation now
// on screen (convId; null: none) and detach the others.
export function attachRunsOf(convId) {
  for (const run of runs.values()) {
    run.view = null;
    if (run.convId === convId) attachRunView(run);
  }
}

function onServerEvent(m) {
  if (m.type === 'error' && !m.id) {
    toast(m.error ? m.error.message : 'error');
    return;
  }
  const run = m.id ? runs.get(m.id) : null;
  if (!run || run.finished) return;
  run.events.push(m);
  run.rec.add(m);
  const model = modelOf();
  if (m.type === 'accepted' && run.rec.trace) run.rec.trace.ids = !!(model && !model.tokenizer);
  if (run.view) applyToView(run, m, false);
  if (m.type === 'done') finishRun(run, m);
  else if (m.type === 'error') failRun(run, m.error ? m.error.message : 'error');
}

function applyToView(run, m, replaying) {
  const v = run.view;
  switch (m.type) {
    case 'accepted': {
      const p = m.params || {};
      const model = modelOf();
      v.canvas = new GenCanvas(v.canvasEl, {
        genLength: p.gen_length,
        blockLength: p.block_length,
        nPrompt: m.prompt_tokens,
        layout: p.block_layout,
        showIds: model && !model.tokenizer,
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
  runs.delete(run.id);
  const conv = store.get(run.convId);
  if (conv) {
    store.touch(conv);
    pump(conv);
  }
  store.flush();   // a finished answer is written at once, not after the debounce
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

export function regenerate(turn) {
  const conv = store.convOf(turn);
  if (!conv) return;
  turn.status = 'regen';
  turn.regenParams = requestParams();
  turn.content = '';
  const v = views.get(turn.id);
  if (v) {
    if (v.replay) v.replay.destroy();
    v.art.replaceWith(renderAssistantTurn(turn));
    setBadge(views.get(turn.id), 'queued', 'queued');
  }
  store.touch(conv);
  pump(conv);
}

// Cancel and forget the generations of conversation convId (it is being deleted).
export function stopRunsOf(convId) {
  for (const run of [...runs.values()]) {
    if (run.convId !== convId) continue;
    if (!run.finished) client.cancel(run.id);
    runs.delete(run.id);
  }
}
