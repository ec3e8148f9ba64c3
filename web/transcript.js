// transcript.js — the conversation on screen: one view per turn (user bubbles; assistant cards with
// badge, meta, actions, progress bar, body and replay area), the finished answer's body (Markdown
// for chat, the code view for Complete / Infill) with Copy, Regenerate and Replay, the empty
// state's hero, and keeping the newest text in view (also when the composer below grows). Live
// generations draw into these views (runs.js). Not here: sending and the generation lifecycle
// (runs.js), storage (store.js).

import { $, el, button } from './dom.js';
import { heroAnimation } from './canvas.js';
import { renderMarkdown } from './markdown.js';
import { Replay, traceSteps } from './replay.js';

export const FILL = '<FILL>';
export const OK_REASONS = new Set(['stop', 'length']);
const STATUS_LABEL = { stop: 'done', length: 'done', cancelled: 'cancelled', error: 'error', lost: 'lost', interrupted: 'interrupted' };
const STATUS_STATE = { stop: 'done', length: 'done', cancelled: 'cancelled', error: 'error', lost: 'lost', interrupted: 'error' };

// turn id -> view {art, turn, ...} of the conversation on screen
export const views = new Map();
let store = null;
// what the turn buttons do: {regenerate(turn), unqueue(turn)}
let actions = null;
let heroEl = null;
let heroTimer = null;

export function initTranscript(conversationStore, turnActions) {
  store = conversationStore;
  actions = turnActions;
  heroEl = $('hero');
  followEnd($('transcript'));
}

export function splitFill(text) {
  const at = text.indexOf(FILL);
  return at < 0 ? [text, ''] : [text.slice(0, at), text.slice(at + FILL.length)];
}

const NEAR_END_PX = 160;
// The transcript shows its end and should keep doing so: it was scrolled there (by scrollToEnd or
// the reader) and the reader has not scrolled up since.
let pinned = true;

// When the transcript's box shrinks (the composer below it grows: a restored draft, the base model's
// example, a long message being typed), a transcript that showed its end scrolls along, so the last
// answer is not left behind the composer. A reader who scrolled up stays where they are.
function followEnd(t) {
  let lastTop = t.scrollTop;
  t.addEventListener('scroll', () => {
    if (t.scrollHeight - t.scrollTop - t.clientHeight < NEAR_END_PX) pinned = true;
    else if (t.scrollTop < lastTop - 1) pinned = false;   // scrolled up (a smooth scroll down only grows it)
    lastTop = t.scrollTop;
  });
  new ResizeObserver(() => {   // at once, before the frame is painted: the end stays where it was
    if (pinned) t.scrollTo({ top: t.scrollHeight, behavior: 'instant' });
  }).observe(t);
}

// Keep the newest text in view (unless the reader scrolled up). Once per animation frame: reading
// the layout on every step event of a long canvas would force a layout per event.
let scrollPending = null;
export function scrollToEnd(force) {
  if (scrollPending !== null) {
    scrollPending = scrollPending || !!force;
    return;
  }
  scrollPending = !!force;
  requestAnimationFrame(() => {
    const t = $('transcript');
    const near = t.scrollHeight - t.scrollTop - t.clientHeight < NEAR_END_PX;
    if (scrollPending || near) {
      t.scrollTop = t.scrollHeight;
      pinned = true;
    }
    scrollPending = null;
  });
}

export function showHero(on) {
  if (on) {
    if (!heroEl.isConnected) $('transcript').appendChild(heroEl);
    if (!heroTimer) heroTimer = heroAnimation($('hero-canvas'));
  } else {
    clearInterval(heroTimer);
    heroTimer = null;
    heroEl.remove();
  }
}

// Draw conv (null: the empty state) from its stored turns; running answers are attached by the
// caller (runs.js attachRunsOf).
export function renderConversation(conv) {
  for (const v of views.values()) if (v.replay) v.replay.destroy();
  views.clear();
  const t = $('transcript');
  t.replaceChildren();
  if (!conv || conv.turns.length === 0) {
    showHero(true);
    return;
  }
  showHero(false);
  for (const turn of conv.turns) t.appendChild(turn.role === 'user' ? renderUserTurn(turn) : renderAssistantTurn(turn));
  scrollToEnd(true);
}

export function renderUserTurn(turn) {
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
    x.addEventListener('click', () => actions.unqueue(turn));
    q.append(x);
    art.append(bubble, q);
  } else {
    art.append(bubble);
  }
  views.set(turn.id, { art, turn });
  return art;
}

// The view of an assistant turn. Parts: head (badge, meta, actions), progress bar, body (live
// canvas / Markdown / code view), replay area.
export function renderAssistantTurn(turn) {
  const code = turn.mode !== 'chat';
  const art = el('article', code ? 'msg bot code' : 'msg bot');
  art.dataset.turn = turn.id;
  if (turn.genId) art.dataset.id = turn.genId;
  const head = el('div', 'msg-head');
  const badge = el('span', 'badge');
  const meta = el('span', 'meta');
  const acts = el('span', 'actions');
  head.append(badge, meta, el('span', 'spacer'), acts);
  const progress = el('div', 'progress');
  const bar = el('div', 'bar');
  progress.appendChild(bar);
  const body = el('div', 'msg-body');
  const foot = el('div', 'msg-foot');
  const replayBox = el('div', 'replay-box');
  art.append(head, progress, body, foot, replayBox);
  const v = { art, turn, badge, meta, actions: acts, bar, body, foot, replayBox, canvas: null, canvasEl: null, replay: null };
  views.set(turn.id, v);
  if (turn.status === 'queued' || turn.status === 'running' || turn.status === 'regen') {
    setBadge(v, 'queued', 'queued');
    meta.textContent = 'waiting for a batch slot…';
  } else {
    showFinished(v);
  }
  return art;
}

export function setBadge(v, st, label) {
  v.art.dataset.state = st;
  v.badge.textContent = label || st;
}

// A finished turn's body: chat -> Markdown of the committed text (the live canvas, when there is
// one, stays in the DOM hidden); Complete -> the prompt then the completion; Infill -> prefix, fill,
// suffix. Actions: Copy, Regenerate, Replay.
export function showFinished(v) {
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
    const [prefix, suffix] = splitFill(store.userTurnOf(t)?.content || '');
    const fill = el('span', 'fill', t.content);
    fill.title = 'generated';
    v.body.replaceChildren(el('div', 'code-view'));
    v.body.firstChild.append(el('span', 'ctx', prefix), fill, el('span', 'ctx', suffix));
    v.body.firstChild.dataset.fill = t.content;
  } else if (!v.canvasEl) {
    const view = el('div', 'code-view');
    const c = el('span', 'canvas finished', t.content);
    view.append(el('span', 'ctx', store.userTurnOf(t)?.content || ''), c);
    v.body.replaceChildren(view);
  }
  if (OK_REASONS.has(t.status) && !t.content) v.foot.textContent = '(empty answer)';
  v.actions.replaceChildren();
  const copy = button('act copy', 'Copy', 'Copy the answer');
  copy.addEventListener('click', () => copyText(t.content, copy));
  const regen = button('act regen', 'Regenerate', 'Generate this answer again');
  regen.addEventListener('click', () => actions.regenerate(t));
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
  // it opens under the answer, below the fold when the answer is the last one: bring it into view,
  // with the card's end when the whole card fits; at once (the transcript's smooth scrolling could
  // be cut short by a later scroll of the same box, leaving the player partly below the fold)
  const fits = v.art.getBoundingClientRect().height <= $('transcript').clientHeight;
  (fits ? v.art : v.replay.root).scrollIntoView({ block: 'nearest', behavior: 'instant' });
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
