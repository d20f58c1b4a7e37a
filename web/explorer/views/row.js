// `#/ds/<name>/row/<rowKey>`: every column of a row with its versions,
// newest first: ref key, created time, shard, added id and the body,
// pretty-printed. Also where the row's index entries are, from its latest
// cells, as links to those index queries.

import { h, replace, uid, errorBox } from '../dom.js';
import { findDatastore } from '../catalog.js';
import { loadCatalog, graphql } from '../api.js';
import { rowQuery, olderVersionsQuery, isUuid, valueAtPath } from '../queries.js';
import { prettyJson, timestamp, plural } from '../format.js';
import { breadcrumbs, dsHref } from './breadcrumbs.js';
import { notFound } from './not-found.js';

const VERSIONS = 20;

export async function rowPage(main, [dsName, rowKey], ctx) {
  const catalog = await loadCatalog();
  const ds = findDatastore(catalog, dsName);
  if (!ds) return notFound(main, ctx, `No datastore is named “${dsName}”.`);
  ctx.setTitle(`Row ${rowKey} · ${ds.name}`);
  const heading = [breadcrumbs([ds.name, dsHref(ds)], [`row ${rowKey.slice(0, 8)}…`]), h('h1', {}, 'Row ', h('span', { class: 'mono break' }, rowKey))];
  if (!isUuid(rowKey)) {
    replace(main, ...heading, errorBox(new Error('a row key is a UUID')));
    return undefined;
  }

  const { query, first } = rowQuery(ds, VERSIONS);
  const data = await graphql(query, { rowKey, first }, { signal: ctx.signal });
  const byColumn = data[ds.graphqlField];
  const cells = ds.columns.flatMap((c) => byColumn[c.graphqlName]);
  const shard = cells.length > 0 ? cells[0].shard : null;
  const created = cells.map((c) => c.createdAt).sort()[0];

  replace(
    main,
    ...heading,
    h(
      'dl',
      { class: 'facts wide' },
      h('dt', {}, 'Datastore'),
      h('dd', {}, h('a', { href: dsHref(ds) }, ds.name)),
      h('dt', {}, 'Shard'),
      h(
        'dd',
        {},
        shard === null
          ? 'none (the row has no cells)'
          : [String(shard), ' · ', h('a', { href: dsHref(ds, 'log', String(shard)) }, `Cell log of shard ${shard}`)],
      ),
      h('dt', {}, 'Columns with cells'),
      h('dd', {}, `${ds.columns.filter((c) => byColumn[c.graphqlName].length > 0).length} of ${ds.columns.length}`),
      created ? [h('dt', {}, 'First cell written'), h('dd', {}, timestamp(created))] : null,
    ),
    cells.length === 0 ? h('p', { class: 'empty' }, 'This row has no cells.') : null,
    indexLinks(ds, byColumn),
    ds.columns.map((column) => columnSection(ds, rowKey, column, byColumn[column.graphqlName], ctx)),
  );
  return undefined;
}

/** For each index the row's latest cells feed: its shard field value, linked to a query. */
function indexLinks(ds, byColumn) {
  const items = ds.indexes
    .map((ix) => {
      const column = ds.columns.find((c) => c.name === ix.shard.column);
      const latest = column && byColumn[column.graphqlName][0];
      const value = latest ? valueAtPath(latest.body, ix.shard.path) : undefined;
      if (value === undefined || value === null) return null;
      const params = new URLSearchParams({ shard: String(value), run: '1' });
      return h(
        'li',
        {},
        h('a', { href: `${dsHref(ds, 'index', ix.name)}?${params}` }, ix.name),
        ` with ${ix.shardField} = `,
        h('span', { class: 'mono' }, String(value)),
      );
    })
    .filter(Boolean);
  if (items.length === 0) return null;
  const id = uid('related');
  return h('section', { 'aria-labelledby': id }, h('h2', { id }, 'Related index queries'), h('ul', {}, items));
}

function columnSection(ds, rowKey, column, versions, ctx) {
  const id = uid('column');
  const list = h('ol', { class: 'versions', 'aria-label': `Versions of ${column.name}` });
  const more = h('div', { class: 'more' });
  const count = h('span', { class: 'count' });

  const addVersions = (cells, latestRefKey) => {
    for (const cell of cells) list.appendChild(versionItem(cell, cell.refKey === latestRefKey));
    const shown = list.children.length;
    count.textContent = shown === 0 ? 'no cells' : plural(shown, 'version', 'versions') + (shown >= VERSIONS ? ' shown' : '');
  };
  const latestRefKey = versions.length > 0 ? versions[0].refKey : null;
  addVersions(versions, latestRefKey);

  const loadOlder = (before) => {
    const button = h(
      'button',
      {
        type: 'button',
        class: 'secondary',
        onclick: async () => {
          button.disabled = true;
          try {
            const data = await graphql(
              olderVersionsQuery(ds),
              { rowKey, column: column.name, first: VERSIONS, before },
              { signal: ctx.signal },
            );
            const older = data[ds.graphqlField].history;
            addVersions(older, latestRefKey);
            ctx.announce(`${plural(older.length, 'older version', 'older versions')} of ${column.name} loaded.`);
            replace(more, older.length === VERSIONS ? loadOlder(older[older.length - 1].refKey) : null);
          } catch (error) {
            if (error.name !== 'AbortError') replace(more, errorBox(error));
          }
        },
      },
      `Load older versions of ${column.name}`,
    );
    return button;
  };
  if (versions.length === VERSIONS) more.appendChild(loadOlder(versions[versions.length - 1].refKey));

  return h(
    'section',
    { class: 'column', 'aria-labelledby': id },
    h('h2', { id }, column.name, ' ', count),
    column.description ? h('p', { class: 'hint' }, column.description) : null,
    versions.length === 0 ? h('p', { class: 'empty' }, 'No cells in this column.') : list,
    more,
  );
}

function versionItem(cell, latest) {
  return h(
    'li',
    { class: 'version' },
    h('h3', {}, `ref key ${cell.refKey}`, latest ? h('span', { class: 'badge' }, 'latest') : null),
    h(
      'dl',
      { class: 'facts' },
      h('dt', {}, 'Created'),
      h('dd', {}, timestamp(cell.createdAt)),
      h('dt', {}, 'Shard'),
      h('dd', {}, String(cell.shard)),
      h('dt', {}, 'Added id'),
      h('dd', {}, String(cell.addedId)),
    ),
    prettyJson(cell.body),
  );
}
