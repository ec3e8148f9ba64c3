// replay.js — denoising replay of a finished answer. TraceRecorder turns the protocol events the
// page received for one generation (accepted, step, block, done) into a compact trace that is kept
// with the turn (and persisted); Replay renders that trace: a scrubber over its step frames showing
// the canvas after step k (masks, drafts, committed tokens, block boundaries — the live canvas's
// own renderer, canvas.js), play / pause, a speed control, and a per-block timeline (steps and
// milliseconds per block, from the events' arrival times). Not here: the live view (runs.js).

import { GenCanvas } from './canvas.js';
import { el } from './dom.js';

// Compact trace, version 1:
//   {v:1, n:gen_length, B:block_length, np:prompt_tokens, layout, ids:showIds, nb:n_blocks,
//    ev:[ {k:'s', t, s:step, b:block, m?:merged, c:[[index,id,text,conf,special]], d?:[[...]]},
//         {k:'b', t, b:block, st:steps (cumulative), bs:block_steps (this block's)} ... ],
//    done:{t, reason}}
// t: milliseconds since `accepted` arrived. `d` is absent when the step carried no drafts
// (the canvas then keeps the previous drafts, as the live view does).
const round2 = (x) => Math.round((x ?? 0) * 100) / 100;
const packTok = (x) => [x.index, x.id, x.text, round2(x.confidence), x.special ? 1 : 0];
const unpackTok = (a) => ({ index: a[0], id: a[1], text: a[2], confidence: a[3], special: !!a[4] });

export class TraceRecorder {
  constructor() {
    this.trace = null;
    this.t0 = 0;
  }

  // m: a server event of this generation; now: performance.now() when it arrived.
  add(m, now = performance.now()) {
    if (m.type === 'accepted') {
      const p = m.params || {};
      this.t0 = now;
      this.trace = { v: 1, n: p.gen_length, B: p.block_length, np: m.prompt_tokens, layout: p.block_layout || 'llada', ids: false, nb: 0, ev: [], done: null };
      return;
    }
    const tr = this.trace;
    if (!tr) return;
    const t = Math.round((now - this.t0) * 10) / 10;
    if (m.type === 'step') {
      const e = { k: 's', t, s: m.step, b: m.block, c: (m.commits || []).map(packTok) };
      if (Array.isArray(m.drafts)) e.d = m.drafts.map(packTok);
      if (m.merged > 1) e.m = m.merged;
      if (m.n_blocks) tr.nb = m.n_blocks;
      tr.ev.push(e);
    } else if (m.type === 'block') {
      tr.ev.push({ k: 'b', t, b: m.block, st: m.steps, bs: m.block_steps });
      if (m.n_blocks) tr.nb = m.n_blocks;
    } else if (m.type === 'done') {
      tr.done = { t, reason: m.finish_reason };
    }
  }
}

export function traceSteps(trace) {
  return trace ? trace.ev.filter((e) => e.k === 's').length : 0;
}

// Render the trace after its first k step frames (and the block events that came before the next
// step frame) into root, with the live canvas's renderer. Returns the GenCanvas.
export function renderTraceAt(root, trace, k) {
  const c = new GenCanvas(root, { genLength: trace.n, blockLength: trace.B, nPrompt: trace.np, layout: trace.layout, showIds: trace.ids });
  let steps = 0;
  for (const e of trace.ev) {
    if (e.k === 's') {
      if (steps === k) break;
      c.applyStep({ step: e.s, block: e.b, commits: e.c.map(unpackTok), drafts: e.d ? e.d.map(unpackTok) : undefined });
      steps++;
    } else if (e.k === 'b') {
      c.applyBlock({ block: e.b, steps: e.st, block_steps: e.bs });
    }
  }
  for (const s of root.querySelectorAll('.fresh')) s.classList.remove('fresh');
  return c;
}

// Per block: step frames received, denoising steps (the block events count steps cumulatively:
// the difference to the previous block) and milliseconds (from the previous block's end, or from
// `accepted` for the first one).
export function blockTimeline(trace) {
  const rows = [];
  let start = 0;
  let prevSteps = 0;
  let frames = 0;
  let firstFrame = null;
  let stepIndex = 0;
  for (const e of trace.ev) {
    if (e.k === 's') {
      frames++;
      if (firstFrame === null) firstFrame = stepIndex;
      stepIndex++;
    } else if (e.k === 'b') {
      rows.push({ block: e.b, steps: e.bs ?? Math.max(0, e.st - prevSteps), frames, ms: Math.max(0, e.t - start), firstFrame: firstFrame ?? stepIndex });
      prevSteps = e.st;
      start = e.t;
      frames = 0;
      firstFrame = null;
    }
  }
  return rows;
}

export class Replay {
  constructor(container, trace) {
    this.trace = trace;
    this.total = traceSteps(trace);
    this.timer = null;
    this.root = el('div', 'replay');
    const bar = el('div', 'rp-bar');
    this.playBtn = el('button', 'rp-play', '▶');
    this.playBtn.type = 'button';
    this.playBtn.title = 'Play / pause';
    this.playBtn.setAttribute('aria-label', 'Play');
    this.scrub = el('input', 'rp-scrub');
    this.scrub.type = 'range';
    this.scrub.min = '0';
    this.scrub.max = String(this.total);
    this.scrub.step = '1';
    this.scrub.value = String(this.total);
    this.scrub.setAttribute('aria-label', 'Denoising step');
    this.label = el('span', 'rp-label');
    this.speed = el('select', 'rp-speed');
    this.speed.setAttribute('aria-label', 'Replay speed');
    for (const s of [0.25, 0.5, 1, 2, 4, 8]) {
      const o = el('option', '', `${s}×`);
      o.value = String(s);
      if (s === 1) o.selected = true;
      this.speed.appendChild(o);
    }
    bar.append(this.playBtn, this.scrub, this.label, this.speed);
    this.canvasEl = el('div', 'rp-canvas');
    this.timeline = el('div', 'rp-timeline');
    this.root.append(bar, this.canvasEl, this.timeline);
    container.appendChild(this.root);
    this.#buildTimeline();
    this.scrub.addEventListener('input', () => {
      this.pause();
      this.show(Number(this.scrub.value));
    });
    this.playBtn.addEventListener('click', () => (this.timer ? this.pause() : this.play()));
    this.show(this.total);
  }

  #buildTimeline() {
    const rows = blockTimeline(this.trace);
    const maxMs = Math.max(1, ...rows.map((r) => r.ms));
    for (const r of rows) {
      const row = el('button', 'rp-blk');
      row.type = 'button';
      row.dataset.block = String(r.block);
      row.dataset.steps = String(r.steps);
      row.dataset.ms = String(r.ms);
      row.title = `jump to block ${r.block}`;
      const track = el('span', 'rp-blk-track');
      const fill = el('span', 'rp-blk-fill');
      fill.style.width = `${Math.max(2, (r.ms / maxMs) * 100).toFixed(1)}%`;
      track.appendChild(fill);
      row.append(el('span', 'rp-blk-name', `block ${r.block}`), track,
        el('span', 'rp-blk-stat', `${r.steps} step${r.steps === 1 ? '' : 's'} · ${r.ms.toFixed(0)} ms`));
      row.addEventListener('click', () => {
        this.pause();
        this.show(Math.min(this.total, r.firstFrame + 1));
      });
      this.timeline.appendChild(row);
    }
  }

  show(k) {
    this.k = Math.max(0, Math.min(this.total, k));
    this.scrub.value = String(this.k);
    this.root.dataset.step = String(this.k);
    this.canvas = renderTraceAt(this.canvasEl, this.trace, this.k);
    const steps = this.trace.ev.filter((e) => e.k === 's');
    const cur = this.k ? steps[this.k - 1] : null;
    this.label.textContent = cur ? `frame ${this.k}/${this.total} · step ${cur.s + 1} · block ${cur.b + 1}` : `start · ${this.total} frames`;
    for (const row of this.timeline.children) row.classList.toggle('current', cur !== null && Number(row.dataset.block) === cur.b);
  }

  play() {
    if (this.k >= this.total) this.show(0);
    this.playBtn.textContent = '❚❚';
    this.playBtn.setAttribute('aria-label', 'Pause');
    this.root.dataset.playing = 'true';
    const steps = this.trace.ev.filter((e) => e.k === 's');
    const tick = () => {
      if (this.k >= this.total) return this.pause();
      const prev = this.k ? steps[this.k - 1].t : 0;
      const dt = (steps[this.k].t - prev) / Number(this.speed.value || 1);
      this.timer = setTimeout(() => {
        this.show(this.k + 1);
        tick();
      }, Math.max(25, Math.min(800, dt)));
    };
    tick();
  }

  pause() {
    clearTimeout(this.timer);
    this.timer = null;
    this.playBtn.textContent = '▶';
    this.playBtn.setAttribute('aria-label', 'Play');
    delete this.root.dataset.playing;
  }

  destroy() {
    this.pause();
    this.root.remove();
  }
}
