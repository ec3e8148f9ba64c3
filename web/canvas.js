// canvas.js — renders one generation's denoising canvas: every generated position is a span that
// is a mask placeholder, a draft (faint, opacity from confidence) or a committed token; positions
// are grouped into blocks, and a finalized block is marked. Applies the protocol's step / block /
// done events (docs/protocol.md). Not here: the protocol (client.js), the page (runs.js and
// replay.js draw with it).

export class GenCanvas {
  // opts: { genLength, blockLength, nPrompt, layout: 'llada' | 'aligned', showIds }
  constructor(root, opts) {
    this.root = root;
    this.n = opts.genLength;
    this.B = Math.max(1, opts.blockLength);
    this.showIds = !!opts.showIds;
    this.offset = opts.layout === 'aligned' ? opts.nPrompt % this.B : 0;
    this.state = new Array(this.n).fill(0);   // 0 mask, 1 draft, 2 committed
    this.committed = 0;
    this.textTokens = 0;                      // committed, non-special
    this.drafted = new Set();
    this.spans = [];
    this.blocks = [];
    this.activeBlock = -1;
    root.replaceChildren();
    root.classList.add('canvas');
    let blk = null, blkIndex = -1;
    for (let i = 0; i < this.n; i++) {
      const b = this.blockOf(i);
      if (b !== blkIndex) {
        blk = document.createElement('span');
        blk.className = 'blk';
        blk.dataset.block = String(b);
        root.appendChild(blk);
        this.blocks[b] = blk;
        blkIndex = b;
      }
      const s = document.createElement('span');
      s.className = 'tok mask';
      blk.appendChild(s);
      this.spans.push(s);
    }
  }

  blockOf(index) {
    return Math.floor((index + this.offset) / this.B);
  }

  #label(t) {
    if (t.special) return '';
    if (t.text === '' && this.showIds) return `⟨${t.id}⟩`;
    return t.text;
  }

  #setActive(b) {
    if (b === this.activeBlock) return;
    if (this.blocks[this.activeBlock]) this.blocks[this.activeBlock].classList.remove('active');
    this.activeBlock = b;
    if (this.blocks[b] && !this.blocks[b].classList.contains('final')) this.blocks[b].classList.add('active');
  }

  applyStep(ev) {
    for (const c of ev.commits || []) {
      const i = c.index;
      if (i < 0 || i >= this.n) continue;
      const s = this.spans[i];
      if (this.state[i] !== 2) {
        this.committed++;
        if (!c.special && c.text !== '') this.textTokens++;
      }
      this.state[i] = 2;
      this.drafted.delete(i);
      // a revised commit (token-editing decoders) rewrites a token written earlier in the block
      s.className = (c.special ? 'tok done special fresh' : 'tok done fresh') + (c.revised ? ' revised' : '');
      s.textContent = this.#label(c);
      s.style.opacity = '';
      s.title = `#${c.id} · confidence ${(c.confidence ?? 0).toFixed(2)} · step ${ev.step}` +
        (c.revised ? ` · revised (was #${c.previous})` : '');
    }
    if (Array.isArray(ev.drafts)) {
      const now = new Set();
      for (const d of ev.drafts) {
        const i = d.index;
        if (i < 0 || i >= this.n || this.state[i] === 2) continue;
        now.add(i);
        const s = this.spans[i];
        const conf = Math.max(0, Math.min(1, d.confidence ?? 0));
        this.state[i] = 1;
        const lv = conf >= 0.75 ? 3 : conf >= 0.4 ? 2 : 1;
        s.className = d.special ? `tok draft special lv${lv}` : `tok draft lv${lv}`;
        s.textContent = d.special ? '' : this.#label(d);
        s.style.opacity = String(0.28 + 0.62 * conf);
        s.title = `draft #${d.id} · confidence ${conf.toFixed(2)}`;
      }
      for (const i of this.drafted) {
        if (!now.has(i) && this.state[i] === 1) this.#mask(i);
      }
      this.drafted = now;
    }
    if (typeof ev.block === 'number') this.#setActive(ev.block);
  }

  #mask(i) {
    const s = this.spans[i];
    this.state[i] = 0;
    s.className = 'tok mask';
    s.textContent = '';
    s.style.opacity = '';
    s.title = '';
  }

  applyBlock(ev) {
    const blk = this.blocks[ev.block];
    if (blk) {
      blk.classList.remove('active');
      blk.classList.add('final');
      blk.title = ev.block_steps != null ? `block ${ev.block} final: ${ev.block_steps} steps (${ev.steps} in all)` : `block ${ev.block} final after step ${ev.steps}`;
    }
  }

  // Remaining drafts/masks (cancelled, errors) fade out; positions that never committed vanish.
  finish(ev) {
    if (this.blocks[this.activeBlock]) this.blocks[this.activeBlock].classList.remove('active');
    for (let i = 0; i < this.n; i++) {
      if (this.state[i] !== 2) {
        const s = this.spans[i];
        s.className = ev.finish_reason === 'stop' || ev.finish_reason === 'length' ? 'tok gone' : 'tok abandoned';
        s.textContent = '';
        s.style.opacity = '';
      }
    }
    this.root.classList.add('finished');
  }

  get progress() {
    return this.n ? this.committed / this.n : 1;
  }
}

// A small decorative canvas for the empty state: a row of masks that keeps resolving.
export function heroAnimation(root) {
  const words = 'every answer begins as masks and resolves in parallel'.split(' ');
  root.replaceChildren();
  const spans = words.map(() => {
    const s = document.createElement('span');
    s.className = 'tok mask';
    root.appendChild(s);
    return s;
  });
  let order = [];
  let k = 0;
  const reset = () => {
    order = words.map((_, i) => i).sort(() => Math.random() - 0.5);
    k = 0;
    spans.forEach((s) => {
      s.className = 'tok mask';
      s.textContent = '';
    });
  };
  reset();
  return setInterval(() => {
    if (k >= order.length + 6) return reset();
    if (k < order.length) {
      const i = order[k];
      spans[i].className = 'tok done fresh';
      spans[i].textContent = (i ? ' ' : '') + words[i];
    }
    k++;
  }, 420);
}
