// `#/ds/<name>/log/<shard>?since=…`: a shard's cell log in insertion order
// (`cellsForShard`), read page by page and, while "Follow new cells" is on,
// polled for cells written since.

import { h, replace, tableWrap, uid, errorBox } from '../dom.js';
import { findDatastore } from '../catalog.js';
import { loadCatalog, graphql } from '../api.js';
import { cellLogQuery } from '../queries.js';
import { compactJson, prettyJson, timestamp, plural, clock } from '../format.js';
import { breadcrumbs, dsHref } from './breadcrumbs.js';
import { notFound } from './not-found.js';

const PAGE = 100;
const POLL_MS = 2000;
/** Rows kept on the page; older ones are dropped while following. */
const KEEP = 2000;

export async function logPage(main, [dsName, shardText], ctx) {
  const catalog = await loadCatalog();
  const ds = findDatastore(catalog, dsName);
  if (!ds) return notFound(main, ctx, `No datastore is named “${dsName}”.`);
  const shard = Number(shardText);
  if (!Number.isInteger(shard) || shard < 0 || shard >= ds.shards) {
    return notFound(main, ctx, `${ds.name} has shards 0 to ${ds.shards - 1}; “${shardText}” is not one of them.`);
  }
  ctx.setTitle(`Cell log of shard ${shard} · ${ds.name}`);

  const since = ctx.params.get('since') || '';
  const query = cellLogQuery(ds);
  const tbody = h('tbody');
  const state = h('p', { class: 'log-state' });
  const problem = h('div');
  const dropped = h('p', { class: 'hint', hidden: true });
  const followId = uid('follow');
  const sinceId = uid('since');
  const follow = h('input', { id: followId, type: 'checkbox', checked: true });
  let after = null;
  let total = 0;
  let timer = null;
  let stopped = false;
  let busy = false;

  const controls = h(
    'form',
    {
      class: 'log-controls',
      novalidate: true,
      'aria-label': 'Cell log settings',
      onsubmit: (event) => {
        event.preventDefault();
        const value = event.target.elements.since.value.trim();
        const params = new URLSearchParams();
        if (value) params.set('since', value);
        const target = `${dsHref(ds, 'log', String(shard))}${value ? `?${params}` : ''}`;
        if (window.location.hash === target) return;
        window.location.hash = target;
      },
    },
    h(
      'div',
      {},
      h('label', { for: sinceId }, 'Start at cells created at or after'),
      h('input', {
        id: sinceId,
        name: 'since',
        value: since,
        autocomplete: 'off',
        placeholder: 'e.g. 2024-03-05T00:00:00Z (empty: from the first cell)',
      }),
    ),
    h('button', { type: 'submit', class: 'secondary' }, 'Read from there'),
    h('div', { class: 'check' }, follow, h('label', { for: followId }, 'Follow new cells')),
  );

  async function read() {
    if (busy || stopped) return;
    busy = true;
    try {
      let fresh = 0;
      // Cells found by the first read were there when the page opened;
      // later reads find new ones.
      const opening = after === null;
      // Read until a page comes back short: then the log is caught up.
      for (;;) {
        const variables = { shard, limit: PAGE };
        if (after !== null) variables.after = after;
        else if (since) variables.since = since;
        const data = await graphql(query, variables, { signal: ctx.signal });
        const page = data[ds.graphqlField].cellsForShard;
        for (const cell of page.cells) tbody.appendChild(cellRow(ds, cell, !opening));
        fresh += opening ? 0 : page.cells.length;
        total += page.cells.length;
        if (page.cells.length > 0 || after === null) after = page.next;
        while (tbody.children.length > KEEP) {
          tbody.firstChild.remove();
          dropped.hidden = false;
          dropped.textContent = `Only the latest ${KEEP} cells stay on the page.`;
        }
        if (page.cells.length < PAGE || stopped) break;
      }
      replace(problem);
      state.textContent = `${plural(total, 'cell', 'cells')} read${follow.checked ? `, following (checked at ${clock()})` : ''}.`;
      if (fresh > 0) ctx.announce(`${plural(fresh, 'new cell', 'new cells')} in shard ${shard}.`);
    } catch (error) {
      if (error.name !== 'AbortError') replace(problem, errorBox(error));
    } finally {
      busy = false;
    }
  }

  const schedule = () => {
    window.clearTimeout(timer);
    if (stopped || !follow.checked) return;
    timer = window.setTimeout(async () => {
      if (!document.hidden) await read();
      schedule();
    }, POLL_MS);
  };
  follow.addEventListener('change', () => {
    state.textContent = `${plural(total, 'cell', 'cells')} read${follow.checked ? ', following' : ', not following'}.`;
    schedule();
  });

  replace(
    main,
    breadcrumbs([ds.name, dsHref(ds)], [`cell log of shard ${shard}`]),
    h('h1', {}, `Cell log of shard ${shard}`),
    h(
      'p',
      { class: 'lead' },
      `Every cell written to shard ${shard} of `,
      h('a', { href: dsHref(ds) }, ds.name),
      ', in the order it was added (its added id).',
    ),
    controls,
    state,
    problem,
    dropped,
    tableWrap(
      `Cells of shard ${shard}`,
      h(
        'table',
        { class: 'log-table' },
        h(
          'thead',
          {},
          h('tr', {}, ['Added id', 'Created', 'Row key', 'Column', 'Ref key', 'Body'].map((t) => h('th', { scope: 'col' }, t))),
        ),
        tbody,
      ),
    ),
  );

  await read();
  schedule();
  return () => {
    stopped = true;
    window.clearTimeout(timer);
  };
}

function cellRow(ds, cell, fresh) {
  return h(
    'tr',
    { class: fresh ? 'fresh' : null },
    h('td', {}, String(cell.addedId), fresh ? h('span', { class: 'badge' }, 'new') : null),
    h('td', {}, timestamp(cell.createdAt)),
    h('td', {}, h('a', { class: 'mono', href: dsHref(ds, 'row', cell.rowKey) }, cell.rowKey)),
    h('td', {}, cell.column),
    h('td', {}, String(cell.refKey)),
    h('td', { class: 'body-cell' }, h('details', {}, h('summary', {}, h('code', {}, compactJson(cell.body, 80))), prettyJson(cell.body))),
  );
}
