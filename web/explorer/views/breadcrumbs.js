// The trail above a page's heading: Datastores › trips › …

import { h } from '../dom.js';

export function breadcrumbs(...items) {
  const trail = [['Datastores', '#/'], ...items];
  return h(
    'nav',
    { class: 'breadcrumbs', 'aria-label': 'Breadcrumb' },
    h(
      'ol',
      {},
      trail.map(([label, href], i) =>
        h(
          'li',
          {},
          i === trail.length - 1 || !href ? h('span', { 'aria-current': 'page' }, label) : h('a', { href }, label),
        ),
      ),
    ),
  );
}

export function dsHref(ds, ...rest) {
  return ['#/ds', encodeURIComponent(ds.name), ...rest.map((p) => encodeURIComponent(p))].join('/');
}
