// theme.js — the light/dark theme shared by the pages (index.html, ide.html): the saved choice, else
// the system preference; the #theme-toggle button switches and remembers it (localStorage).

export function initTheme() {
  const saved = localStorage.getItem('unmask.theme');
  const prefersLight = window.matchMedia && window.matchMedia('(prefers-color-scheme: light)').matches;
  document.documentElement.dataset.theme = saved || (prefersLight ? 'light' : 'dark');
  document.getElementById('theme-toggle').addEventListener('click', () => {
    const next = document.documentElement.dataset.theme === 'dark' ? 'light' : 'dark';
    document.documentElement.dataset.theme = next;
    localStorage.setItem('unmask.theme', next);
  });
}
