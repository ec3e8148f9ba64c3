// markdown.js — a small, safe Markdown renderer for committed answer text: fenced code blocks,
// headings, unordered / ordered lists, block quotes, paragraphs, and inline code, **strong** and
// *emphasis*. Safety by construction: it never parses HTML — every piece of text reaches the page
// through document.createTextNode, elements are created by name from a fixed list, and there are
// no links or attributes taken from the text (model output cannot inject markup or URLs).

const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([\w+#.-]*)\s*$/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const ULIST = /^\s{0,3}[-*+]\s+(.*)$/;
const OLIST = /^\s{0,3}(\d{1,9})[.)]\s+(.*)$/;
const QUOTE = /^\s{0,3}>\s?(.*)$/;
const HR = /^\s{0,3}([-*_])(\s*\1){2,}\s*$/;

function node(tag, cls) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  return e;
}

// Inline spans: `code` first (its content is literal), then **strong** / __strong__, then
// *em* / _em_. Unmatched markers stay as text.
export function renderInline(text, parent) {
  let i = 0;
  let plain = '';
  const flush = () => {
    if (plain) parent.appendChild(document.createTextNode(plain));
    plain = '';
  };
  while (i < text.length) {
    const ch = text[i];
    if (ch === '\\' && i + 1 < text.length && /[\\`*_#>[\]-]/.test(text[i + 1])) {
      plain += text[i + 1];
      i += 2;
      continue;
    }
    if (ch === '`') {
      let ticks = 1;
      while (text[i + ticks] === '`') ticks++;
      const marker = '`'.repeat(ticks);
      const end = text.indexOf(marker, i + ticks);
      if (end > i) {
        flush();
        const c = node('code');
        c.textContent = text.slice(i + ticks, end).replace(/^ (.*) $/s, '$1');
        parent.appendChild(c);
        i = end + ticks;
        continue;
      }
    }
    // `_` markers only at word boundaries: snake_case and __dunder__ names stay as they are
    const openOk = ch !== '_' || i === 0 || !/\w/.test(text[i - 1]);
    const closeOk = (end, len) => ch !== '_' || end + len >= text.length || !/\w/.test(text[end + len]);
    if ((ch === '*' || ch === '_') && text[i + 1] === ch && openOk) {
      const marker = ch + ch;
      const end = text.indexOf(marker, i + 2);
      if (end > i + 2 && text[i + 2] !== ' ' && closeOk(end, 2)) {
        flush();
        const s = node('strong');
        renderInline(text.slice(i + 2, end), s);
        parent.appendChild(s);
        i = end + 2;
        continue;
      }
    }
    if ((ch === '*' || ch === '_') && openOk && text[i + 1] !== ch) {
      const end = text.indexOf(ch, i + 1);
      if (end > i + 1 && text[i + 1] !== ' ' && text[end - 1] !== ' ' && closeOk(end, 1)) {
        flush();
        const em = node('em');
        renderInline(text.slice(i + 1, end), em);
        parent.appendChild(em);
        i = end + 1;
        continue;
      }
    }
    plain += ch;
    i++;
  }
  flush();
  return parent;
}

// Markdown text -> a DocumentFragment of block elements.
export function renderMarkdown(text) {
  const out = document.createDocumentFragment();
  const lines = String(text ?? '').replace(/\r\n?/g, '\n').split('\n');
  let para = [];
  let list = null;   // { el, ordered }
  let quote = [];
  const endPara = () => {
    if (!para.length) return;
    const p = node('p');
    para.forEach((l, k) => {
      if (k) p.appendChild(node('br'));
      renderInline(l, p);
    });
    out.appendChild(p);
    para = [];
  };
  const endList = () => { list = null; };
  const endQuote = () => {
    if (!quote.length) return;
    const q = node('blockquote');
    q.appendChild(renderMarkdown(quote.join('\n')));
    out.appendChild(q);
    quote = [];
  };
  const endAll = () => { endPara(); endList(); endQuote(); };

  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(FENCE);
    if (fence) {
      endAll();
      const close = new RegExp(`^\\s{0,3}${fence[1][0] === '`' ? '`' : '~'}{${fence[1].length},}\\s*$`);
      const body = [];
      i++;
      while (i < lines.length && !close.test(lines[i])) body.push(lines[i++]);
      const pre = node('pre');
      const code = node('code');
      if (fence[2]) code.dataset.lang = fence[2];
      code.textContent = body.join('\n');
      pre.appendChild(code);
      out.appendChild(pre);
      continue;
    }
    const q = line.match(QUOTE);
    if (q) {
      endPara();
      endList();
      quote.push(q[1]);
      continue;
    }
    endQuote();
    if (!line.trim()) {
      endPara();
      endList();
      continue;
    }
    const h = line.match(HEADING);
    if (h) {
      endAll();
      const e = node(`h${h[1].length}`);
      renderInline(h[2], e);
      out.appendChild(e);
      continue;
    }
    if (HR.test(line) && !para.length) {
      endAll();
      out.appendChild(node('hr'));
      continue;
    }
    const ul = line.match(ULIST);
    const ol = ul ? null : line.match(OLIST);
    if (ul || ol) {
      endPara();
      const ordered = !!ol;
      if (!list || list.ordered !== ordered) {
        list = { el: node(ordered ? 'ol' : 'ul'), ordered };
        if (ordered && ol[1] !== '1') list.el.start = Number(ol[1]);
        out.appendChild(list.el);
      }
      const li = node('li');
      renderInline(ordered ? ol[2] : ul[1], li);
      list.el.appendChild(li);
      continue;
    }
    if (list && /^\s{2,}\S/.test(line)) {   // a continuation line of the last item
      const li = list.el.lastChild;
      li.appendChild(document.createTextNode(' '));
      renderInline(line.trim(), li);
      continue;
    }
    endList();
    para.push(line);
  }
  endAll();
  return out;
}
