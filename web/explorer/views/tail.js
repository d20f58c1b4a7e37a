// `#/ds/<name>/tail`: a datastore's cells as they are committed, from the
// `<ds>Cells` subscription over `/graphql/ws`. Newest first. "Pause" ends
// the subscription and keeps the cursor of the last cell shown; "Resume"
// subscribes again after it, so the cells written meanwhile arrive too. A
// socket that drops is reconnected (after 1, 2, 4… up to 15 seconds) from
// the same cursor, so no cell falls between; before the first cell there is
// no cursor yet, and a reconnect then starts from that moment.

import { h, replace, tableWrap, uid, errorBox } from '../dom.js';
import { findDatastore } from '../catalog.js';
import { loadCatalog } from '../api.js';
import { subscribe } from '../live.js';
import { compactJson, prettyJson, timestamp, plural, clock } from '../format.js';
import { breadcrumbs, dsHref } from './breadcrumbs.js';
import { notFound } from './not-found.js';

/** Rows kept on the page; older ones are dropped. */
const KEEP = 500;
const MAX_RETRY_MS = 15_000;

/** The subscription of `ds`, with the cursor to resume after. */
export function tailQuery(ds) {
  return [
    'subscription Tail($after: String) {',
    `  ${ds.graphqlField}Cells(after: $after) {`,
    '    cursor',
    '    cell { rowKey column refKey shard addedId createdAt body }',
    '  }',
    '}',
  ].join('\n');
}

export async function tailPage(main, [dsName], ctx) {
  const catalog = await loadCatalog();
  const ds = findDatastore(catalog, dsName);
  if (!ds) return notFound(main, ctx, `No datastore is named “${dsName}”.`);
  ctx.setTitle(`Live tail · ${ds.name}`);

  const query = tailQuery(ds);
  const field = `${ds.graphqlField}Cells`;
  const tbody = h('tbody');
  const state = h('p', { class: 'log-state' });
  const problem = h('div');
  const dropped = h('p', { class: 'hint', hidden: true });
  const toggle = h('button', { type: 'button', class: 'secondary' }, 'Pause');
  let cursor = null;
  let received = 0;
  let live = null;
  let paused = false;
  let stopped = false;
  let retryTimer = null;
  let retries = 0;
  let refused = false;

  const show = (text) => {
    state.textContent = `${text} ${plural(received, 'cell', 'cells')} received.`;
  };

  function connect() {
    window.clearTimeout(retryTimer);
    if (stopped || paused || refused) return;
    show(retries > 0 ? 'Reconnecting…' : 'Connecting…');
    const variables = cursor ? { after: cursor } : {};
    live = subscribe(query, variables, {
      onOpen() {
        replace(problem);
        show(`Live since ${clock()}${cursor ? ', resumed after the last cell shown' : ''}.`);
        if (retries > 0) ctx.announce('The live tail is connected again.');
        retries = 0;
      },
      onNext(data) {
        const event = data[field];
        if (!event) return;
        cursor = event.cursor;
        received += 1;
        tbody.prepend(cellRow(ds, event.cell));
        while (tbody.children.length > KEEP) {
          tbody.lastChild.remove();
          dropped.hidden = false;
          dropped.textContent = `Only the latest ${KEEP} cells stay on the page.`;
        }
        show(`Live, last cell at ${clock()}.`);
      },
      onError(errors) {
        refused = true;
        const codes = [...new Set(errors.map((e) => e.extensions && e.extensions.code).filter(Boolean))];
        const error = new Error(errors.map((e) => e.message).join('; '));
        error.codes = codes;
        replace(problem, errorBox(error));
        show('Stopped.');
        toggle.disabled = true;
      },
      onClose({ code, reason, expected }) {
        live = null;
        if (expected || stopped || paused) return;
        if (code >= 4400 && code < 4500) {
          // The gateway refused the connection (e.g. 4403: the token).
          refused = true;
          replace(problem, errorBox(new Error(`the gateway closed the connection: ${code} ${reason}`)));
          show('Stopped.');
          toggle.disabled = true;
          return;
        }
        const wait = Math.min(1000 * 2 ** retries, MAX_RETRY_MS);
        retries += 1;
        show(`Connection lost; reconnecting in ${Math.round(wait / 1000)} s.`);
        if (retries === 1) ctx.announce('The live tail lost its connection; reconnecting.');
        retryTimer = window.setTimeout(connect, wait);
      },
    });
  }

  toggle.addEventListener('click', () => {
    paused = !paused;
    toggle.textContent = paused ? 'Resume' : 'Pause';
    toggle.setAttribute('aria-pressed', String(paused));
    if (paused) {
      window.clearTimeout(retryTimer);
      if (live) live.close();
      live = null;
      show('Paused; resuming continues after the last cell shown.');
    } else {
      retries = 0;
      connect();
    }
  });
  toggle.setAttribute('aria-pressed', 'false');

  replace(
    main,
    breadcrumbs([ds.name, dsHref(ds)], ['live tail']),
    h('h1', {}, `Live tail of ${ds.name}`),
    h(
      'p',
      { class: 'lead' },
      'Cells of every column of ',
      h('a', { href: dsHref(ds) }, ds.name),
      ' as they are committed, newest first (the ',
      h('code', {}, field),
      ' subscription).',
    ),
    h('div', { class: 'log-controls' }, toggle),
    state,
    problem,
    dropped,
    tableWrap(
      `New cells of ${ds.name}`,
      h(
        'table',
        { class: 'log-table tail-table' },
        h(
          'thead',
          {},
          h('tr', {}, ['Row key', 'Column', 'Shard', 'Added id', 'Ref key', 'Created', 'Body'].map((t) => h('th', { scope: 'col' }, t))),
        ),
        tbody,
      ),
    ),
  );
  connect();
  return () => {
    stopped = true;
    window.clearTimeout(retryTimer);
    if (live) live.close();
  };
}

function cellRow(ds, cell) {
  return h(
    'tr',
    {},
    h('td', {}, h('a', { class: 'mono', href: dsHref(ds, 'row', cell.rowKey) }, cell.rowKey)),
    h('td', {}, cell.column),
    h('td', {}, h('a', { href: dsHref(ds, 'log', String(cell.shard)) }, String(cell.shard))),
    h('td', {}, String(cell.addedId)),
    h('td', {}, String(cell.refKey)),
    h('td', {}, timestamp(cell.createdAt)),
    h('td', { class: 'body-cell' }, h('details', {}, h('summary', {}, h('code', {}, compactJson(cell.body, 80))), prettyJson(cell.body))),
  );
}
