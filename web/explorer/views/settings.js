// `#/settings`: extra request headers (an Authorization token, say) sent
// with every request of this browser tab.

import { h, replace, uid } from '../dom.js';
import { requestHeaders, saveRequestHeaders, parseHeaderLines, formatHeaderLines } from '../settings.js';

export async function settingsPage(main, _match, ctx) {
  ctx.setTitle('Settings');
  const id = uid('headers');
  const hint = uid('headers-hint');
  const status = h('p', { role: 'status', class: 'form-status' });
  const textarea = h('textarea', {
    id,
    name: 'headers',
    rows: 5,
    spellcheck: 'false',
    autocomplete: 'off',
    'aria-describedby': hint,
    placeholder: 'Authorization: Bearer …',
  });
  textarea.value = formatHeaderLines(requestHeaders());
  replace(
    main,
    h('h1', {}, 'Settings'),
    h(
      'form',
      {
        class: 'panel',
        novalidate: true,
        'aria-label': 'Request headers',
        onsubmit: (event) => {
          event.preventDefault();
          const parsed = parseHeaderLines(textarea.value);
          if (parsed.error) {
            status.textContent = `Not saved: ${parsed.error}.`;
            textarea.focus();
            return;
          }
          saveRequestHeaders(parsed.headers);
          const count = Object.keys(parsed.headers).length;
          status.textContent =
            count === 0 ? 'Saved: no extra headers.' : `Saved: ${count} header${count === 1 ? '' : 's'} sent with every request from this tab.`;
        },
      },
      h('label', { for: id }, 'Request headers'),
      textarea,
      h(
        'p',
        { id: hint, class: 'hint' },
        'One "Name: value" per line, sent with every request the explorer makes. They are kept for this browser tab only (session storage).',
      ),
      h('button', { type: 'submit' }, 'Save headers'),
      status,
    ),
  );
}
