// Copy buttons: the Clipboard API where the page may use it, otherwise the
// text is selected so the person can copy it with the keyboard.

import { h } from './dom.js';

export function copyButton(label, getText, status) {
  return h(
    'button',
    {
      type: 'button',
      class: 'secondary',
      onclick: async () => {
        const text = getText();
        try {
          await navigator.clipboard.writeText(text);
          const what = label.replace(/^Copy /, '');
          status.textContent = `${what[0].toUpperCase()}${what.slice(1)} copied to the clipboard.`;
        } catch {
          status.textContent = 'Copying is not allowed here: select the text and copy it yourself.';
        }
      },
    },
    label,
  );
}
