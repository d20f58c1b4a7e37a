// `#/ds/<name>`: a datastore's columns, indexes (fields, types, shard
// field) and shard topology as served now (its version, and the shard move
// in progress), with forms to open a row or a shard's log, and a link to
// its live tail.

import { loadCatalog, loadTopology } from '../api.js';
import { h, replace, tableWrap, uid, errorBox } from '../dom.js';
import { findDatastore } from '../catalog.js';
import { moveText } from '../topology.js';
import { isUuid } from '../queries.js';
import { plural } from '../format.js';
import { breadcrumbs, dsHref } from './breadcrumbs.js';
import { notFound } from './not-found.js';

export async function datastorePage(main, [name], ctx) {
  const catalog = await loadCatalog();
  const ds = findDatastore(catalog, name);
  if (!ds) return notFound(main, ctx, `No datastore is named “${name}”.`);
  ctx.setTitle(ds.name);
  const live = (await loadTopology({ signal: ctx.signal })).get(ds.name);

  replace(
    main,
    breadcrumbs([ds.name]),
    h('h1', {}, ds.name),
    ds.description ? h('p', { class: 'lead' }, ds.description) : null,
    h(
      'div',
      { class: 'split' },
      openRowForm(ds),
      openLogForm(ds),
    ),
    columnsSection(ds),
    indexesSection(ds),
    topologySection(ds, live),
  );
}

function columnsSection(ds) {
  const id = uid('columns');
  return h(
    'section',
    { 'aria-labelledby': id },
    h('h2', { id }, 'Columns'),
    tableWrap(
      'Columns',
      h(
        'table',
        {},
        h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Column'), h('th', { scope: 'col' }, 'GraphQL field'), h('th', { scope: 'col' }, 'Description'))),
        h(
          'tbody',
          {},
          ds.columns.map((c) =>
            h('tr', {}, h('th', { scope: 'row' }, c.name), h('td', {}, h('code', {}, c.graphqlName)), h('td', {}, c.description || '')),
          ),
        ),
      ),
    ),
  );
}

function indexesSection(ds) {
  const id = uid('indexes');
  return h(
    'section',
    { 'aria-labelledby': id },
    h('h2', { id }, 'Indexes'),
    ds.indexes.length === 0 ? h('p', {}, 'This datastore has no indexes.') : null,
    ds.indexes.map((ix) => {
      const hid = uid('index');
      return h(
        'section',
        { class: 'index', 'aria-labelledby': hid },
        h(
          'div',
          { class: 'index-head' },
          h('h3', { id: hid }, ix.name),
          h('a', { class: 'button', href: dsHref(ds, 'index', ix.name) }, 'Query ', h('span', { class: 'vh' }, ix.name)),
        ),
        h(
          'p',
          {},
          ix.description ? `${ix.description}. ` : '',
          'Shard field ',
          h('code', {}, ix.shardField),
          '; GraphQL field ',
          h('code', {}, `${ds.graphqlField}.${ix.graphqlField}`),
          '.',
        ),
        tableWrap(
          `Fields of ${ix.name}`,
          h(
            'table',
            {},
            h(
              'thead',
              {},
              h(
                'tr',
                {},
                ['Field', 'Type', 'From column', 'Path in the cell', 'GraphQL', 'Role'].map((t) => h('th', { scope: 'col' }, t)),
              ),
            ),
            h(
              'tbody',
              {},
              ix.fields.map((f) =>
                h(
                  'tr',
                  {},
                  h('th', { scope: 'row' }, f.name),
                  h('td', {}, f.type),
                  h('td', {}, f.column),
                  h('td', {}, h('code', {}, f.path)),
                  h('td', {}, h('code', {}, f.graphqlName)),
                  h('td', {}, f.name === ix.shardField ? h('strong', {}, 'shard field') : ''),
                ),
              ),
            ),
          ),
        ),
      );
    }),
  );
}

function topologySection(ds, live) {
  const id = uid('topology');
  const move = live ? moveText(live.move) : null;
  return h(
    'section',
    { 'aria-labelledby': id },
    h('h2', { id }, 'Shards'),
    h(
      'p',
      {},
      `${plural(ds.shards, 'logical shard', 'logical shards')}, placed on storage clusters in ranges`,
      live ? ` (topology version ${live.version})` : '',
      ':',
    ),
    move ? h('p', { class: 'state' }, move) : null,
    tableWrap(
      'Shard ranges',
      h(
        'table',
        {},
        h(
          'thead',
          {},
          h('tr', {}, ['First shard', 'Last shard', 'Shards', 'Cluster'].map((t) => h('th', { scope: 'col' }, t))),
        ),
        h(
          'tbody',
          {},
          (live ? live.ranges : ds.topology).map((r) =>
            h('tr', {}, h('td', {}, String(r.first)), h('td', {}, String(r.last)), h('td', {}, String(r.last - r.first + 1)), h('td', {}, r.cluster)),
          ),
        ),
      ),
    ),
  );
}

function openRowForm(ds) {
  const input = uid('row-key');
  const hint = uid('row-key-hint');
  const problem = h('div', { class: 'form-problem' });
  return h(
    'form',
    {
      class: 'panel',
      'aria-labelledby': `${input}-title`,
      onsubmit: (event) => {
        event.preventDefault();
        const value = event.target.elements.rowKey.value.trim();
        if (!isUuid(value)) {
          replace(problem, errorBox(new Error(`“${value}” is not a UUID`)));
          event.target.elements.rowKey.focus();
          return;
        }
        window.location.hash = dsHref(ds, 'row', value.toLowerCase());
      },
    },
    h('h2', { id: `${input}-title` }, 'Open a row'),
    h('label', { for: input }, 'Row key'),
    h('input', {
      id: input,
      name: 'rowKey',
      required: true,
      autocomplete: 'off',
      spellcheck: 'false',
      'aria-describedby': hint,
      placeholder: 'e.g. 0b6f7c1e-2a4d-4c8e-9f10-1a2b3c4d5e6f',
    }),
    h('p', { id: hint, class: 'hint' }, 'A UUID. Shows every column with its versions.'),
    problem,
    h('button', { type: 'submit' }, 'Open row'),
  );
}

function openLogForm(ds) {
  const input = uid('shard');
  const hint = uid('shard-hint');
  return h(
    'form',
    {
      class: 'panel',
      'aria-labelledby': `${input}-title`,
      onsubmit: (event) => {
        event.preventDefault();
        window.location.hash = dsHref(ds, 'log', event.target.elements.shard.value);
      },
    },
    h('h2', { id: `${input}-title` }, 'Read a cell log'),
    h('label', { for: input }, 'Shard'),
    h('input', {
      id: input,
      name: 'shard',
      type: 'number',
      required: true,
      min: 0,
      max: ds.shards - 1,
      step: 1,
      value: '0',
      'aria-describedby': hint,
    }),
    h('p', { id: hint, class: 'hint' }, `From 0 to ${ds.shards - 1}. A row page links to its own shard.`),
    h('button', { type: 'submit' }, 'Open log'),
    h('p', { class: 'hint' }, 'Or follow every shard: ', h('a', { href: dsHref(ds, 'tail') }, `live tail of ${ds.name}`), ', the cells as they are committed.'),
  );
}
