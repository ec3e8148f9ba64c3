// store.js — the UI's conversations in localStorage: an ordered list of conversations, each an
// ordered list of turns ({id, role: 'user' | 'assistant', mode, content, ...}), the current one,
// and each finished answer's denoising trace in a compact form (see replay.js). Saving is
// debounced, and flushed when an answer finishes and when the page goes away; when the browser's
// quota is hit, the traces shrink (first without drafts, then without traces at all) so the text
// history survives. Not here: rendering (transcript.js).

export const CONVS_KEY = 'unmask.conversations.v1';
export const CURRENT_KEY = 'unmask.currentConversation';

const uid = (p) => `${p}${Date.now().toString(36)}${Math.random().toString(36).slice(2, 8)}`;

export class ConversationStore {
  constructor(storage = localStorage) {
    this.storage = storage;
    this.convs = [];
    this.currentId = null;
    this.saveTimer = null;
    this.load();
  }

  load() {
    let list = [];
    try {
      list = JSON.parse(this.storage.getItem(CONVS_KEY)) || [];
    } catch {
      list = [];
    }
    this.convs = Array.isArray(list) ? list.filter((c) => c && typeof c.id === 'string' && Array.isArray(c.turns)) : [];
    for (const c of this.convs) {
      c.turns = c.turns.filter((t) => t && (t.role === 'user' || t.role === 'assistant') && typeof t.content === 'string');
      // a turn that was running or queued when the page went away did not finish
      for (const t of c.turns) {
        if (t.role === 'assistant' && (t.status === 'running' || t.status === 'queued' || t.status === 'regen')) t.status = 'interrupted';
        if (t.queued) delete t.queued;
      }
    }
    const cur = this.storage.getItem(CURRENT_KEY);
    this.currentId = this.convs.some((c) => c.id === cur) ? cur : (this.convs[0] ? this.convs[0].id : null);
  }

  get current() {
    return this.convs.find((c) => c.id === this.currentId) || null;
  }

  // The current conversation, created when there is none.
  ensureCurrent() {
    return this.current || this.create();
  }

  create() {
    const c = { id: uid('c'), title: '', created: Date.now(), updated: Date.now(), turns: [] };
    this.convs.unshift(c);
    this.select(c.id);
    this.save();
    return c;
  }

  select(id) {
    this.currentId = id;
    if (id) this.storage.setItem(CURRENT_KEY, id);
    else this.storage.removeItem(CURRENT_KEY);
  }

  remove(id) {
    this.convs = this.convs.filter((c) => c.id !== id);
    if (this.currentId === id) this.select(this.convs[0] ? this.convs[0].id : null);
    this.saveNow();
  }

  clear() {
    this.convs = [];
    this.select(null);
    this.saveNow();
  }

  get(id) {
    return this.convs.find((c) => c.id === id) || null;
  }

  // The conversation that holds turn (null: none, e.g. it was deleted).
  convOf(turn) {
    return this.convs.find((c) => c.turns.includes(turn)) || null;
  }

  // The user turn an assistant turn answers (null: none).
  userTurnOf(answer) {
    const conv = this.convOf(answer);
    return (conv && conv.turns.find((x) => x.id === answer.replyTo)) || null;
  }

  newTurn(conv, turn, afterId) {
    const t = { id: uid('t'), time: Date.now(), ...turn };
    const at = afterId ? conv.turns.findIndex((x) => x.id === afterId) : -1;
    if (at >= 0) conv.turns.splice(at + 1, 0, t);
    else conv.turns.push(t);
    if (!conv.title && t.role === 'user') conv.title = t.content.replace(/\s+/g, ' ').trim().slice(0, 60);
    this.touch(conv);
    return t;
  }

  touch(conv) {
    conv.updated = Date.now();
    // the conversation used last comes first
    const i = this.convs.indexOf(conv);
    if (i > 0) {
      this.convs.splice(i, 1);
      this.convs.unshift(conv);
    }
    this.save();
  }

  save() {
    if (this.saveTimer) return;
    this.saveTimer = setTimeout(() => this.saveNow(), 150);
  }

  // Write a pending debounced save now (nothing when none is pending).
  flush() {
    if (this.saveTimer) this.saveNow();
  }

  saveNow() {
    clearTimeout(this.saveTimer);
    this.saveTimer = null;
    const strip = (level) => this.convs.map((c) => ({
      ...c,
      turns: c.turns.map((t) => {
        if (!t.trace || level === 0) return t;
        if (level === 1) return { ...t, trace: { ...t.trace, ev: t.trace.ev.map((e) => (e.d ? { ...e, d: undefined } : e)) } };
        const { trace: _t, ...rest } = t;
        return rest;
      }),
    }));
    // full; then without drafts; then without traces (text history only)
    for (const level of [0, 1, 2]) {
      try {
        this.storage.setItem(CONVS_KEY, JSON.stringify(level ? strip(level) : this.convs));
        return true;
      } catch {
        // quota: try a smaller form
      }
    }
    return false;
  }
}
