// The explorer's shell: a hash router (`#/ds/trips/row/…`), so the gateway
// serves one page and every view has a link that can be shared or
// bookmarked. Each view renders into <main>, may return a cleanup function
// (timers, pending requests), and names its page for the title and the
// heading that receives focus after navigation.

import { replace, errorBox, h } from './dom.js';
import { home } from './views/home.js';
import { datastorePage } from './views/datastore.js';
import { indexPage } from './views/index-query.js';
import { rowPage } from './views/row.js';
import { logPage } from './views/log.js';
import { healthPage } from './views/health.js';
import { triggersPage } from './views/triggers.js';
import { tailPage } from './views/tail.js';
import { settingsPage } from './views/settings.js';

const routes = [
  { pattern: /^\/$/, view: home, section: 'datastores' },
  { pattern: /^\/ds\/([^/]+)$/, view: datastorePage, section: 'datastores' },
  { pattern: /^\/ds\/([^/]+)\/index\/([^/]+)$/, view: indexPage, section: 'datastores' },
  { pattern: /^\/ds\/([^/]+)\/row\/([^/]+)$/, view: rowPage, section: 'datastores' },
  { pattern: /^\/ds\/([^/]+)\/log\/([^/]+)$/, view: logPage, section: 'datastores' },
  { pattern: /^\/ds\/([^/]+)\/tail$/, view: tailPage, section: 'datastores' },
  { pattern: /^\/health$/, view: healthPage, section: 'health' },
  { pattern: /^\/triggers$/, view: triggersPage, section: 'triggers' },
  { pattern: /^\/settings$/, view: settingsPage, section: 'settings' },
];

const main = document.getElementById('main');
const announcer = document.getElementById('announcer');
let cleanup = null;
let rendered = null;
let firstRender = true;

/** Tells screen reader users about something that happened off-focus. */
export function announce(text) {
  announcer.textContent = '';
  // A fresh text node after a tick is announced even when the text repeats.
  window.setTimeout(() => {
    announcer.textContent = text;
  }, 50);
}

function parseHash() {
  const hash = window.location.hash.replace(/^#/, '') || '/';
  const [path, query = ''] = hash.split('?');
  return { path, params: new URLSearchParams(query) };
}

async function route() {
  const hash = window.location.hash || '#/';
  // In-page anchors such as the skip link are not routes.
  if (!hash.startsWith('#/')) return;
  if (hash === rendered) return;
  rendered = hash;
  if (cleanup) {
    cleanup();
    cleanup = null;
  }
  const { path, params } = parseHash();
  const match = routes.map((r) => ({ r, m: r.pattern.exec(path) })).find((x) => x.m);
  for (const link of document.querySelectorAll('.site-header nav a[data-section]')) {
    if (match && link.dataset.section === match.r.section) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  const controller = new AbortController();
  const ctx = {
    params,
    signal: controller.signal,
    announce,
    setTitle(title) {
      document.title = `${title} · cellgate explorer`;
    },
    /** Updates the address for the current view without rendering it again. */
    replaceParams(next, { push = true } = {}) {
      const query = next.toString();
      const url = `#${path}${query ? `?${query}` : ''}`;
      rendered = url;
      if (push) window.history.pushState(null, '', url);
      else window.history.replaceState(null, '', url);
    },
  };
  replace(main, h('p', { role: 'status' }, 'Loading…'));
  let viewCleanup = null;
  try {
    if (!match) {
      ctx.setTitle('Not found');
      replace(main, h('h1', { tabindex: -1 }, 'Page not found'), h('p', {}, h('a', { href: '#/' }, 'Back to the datastores')));
    } else {
      viewCleanup = await match.r.view(main, match.m.slice(1).map(decodeURIComponent), ctx);
    }
  } catch (error) {
    if (error.name !== 'AbortError') {
      ctx.setTitle('Error');
      replace(main, h('h1', { tabindex: -1 }, 'Something went wrong'), errorBox(error));
    }
  }
  cleanup = () => {
    controller.abort();
    if (typeof viewCleanup === 'function') viewCleanup();
  };
  if (!firstRender) {
    const heading = main.querySelector('h1');
    if (heading) {
      heading.setAttribute('tabindex', '-1');
      heading.focus();
    }
  }
  firstRender = false;
}

document.querySelector('.skip-link').addEventListener('click', (event) => {
  event.preventDefault();
  main.focus();
});
window.addEventListener('hashchange', route);
window.addEventListener('popstate', route);
route();
