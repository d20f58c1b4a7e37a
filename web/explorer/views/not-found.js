import { h, replace } from '../dom.js';

export function notFound(main, ctx, message) {
  ctx.setTitle('Not found');
  replace(main, h('h1', {}, 'Not found'), h('p', {}, message), h('p', {}, h('a', { href: '#/' }, 'Back to the datastores')));
}
