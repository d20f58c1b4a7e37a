// `#/`: every datastore with its columns and indexes.

import { loadCatalog } from '../api.js';
import { h, replace } from '../dom.js';
import { plural } from '../format.js';

export async function home(main, _match, ctx) {
  const catalog = await loadCatalog();
  ctx.setTitle('Datastores');
  replace(
    main,
    h('h1', {}, 'Datastores'),
    h(
      'p',
      { class: 'lead' },
      `${plural(catalog.datastores.length, 'datastore', 'datastores')} defined in this gateway. `,
      'Open one to see its columns, indexes and shards, to query an index, or to read a row or a shard’s cell log.',
    ),
    h(
      'ul',
      { class: 'cards', 'aria-label': 'Datastores' },
      catalog.datastores.map((ds) =>
        h(
          'li',
          { class: 'card' },
          h('h2', {}, h('a', { href: `#/ds/${encodeURIComponent(ds.name)}` }, ds.name)),
          ds.description ? h('p', {}, ds.description) : null,
          h(
            'dl',
            { class: 'facts' },
            h('dt', {}, 'Shards'),
            h('dd', {}, String(ds.shards)),
            h('dt', {}, 'Columns'),
            h('dd', {}, ds.columns.map((c) => c.name).join(', ')),
            h('dt', {}, 'Indexes'),
            h(
              'dd',
              {},
              ds.indexes.length === 0
                ? 'none'
                : h(
                    'ul',
                    { class: 'inline-list' },
                    ds.indexes.map((ix) =>
                      h(
                        'li',
                        {},
                        h(
                          'a',
                          {
                            href: `#/ds/${encodeURIComponent(ds.name)}/index/${encodeURIComponent(ix.name)}`,
                            'aria-label': `Query ${ix.name}`,
                          },
                          ix.name,
                        ),
                      ),
                    ),
                  ),
            ),
          ),
        ),
      ),
    ),
  );
}
