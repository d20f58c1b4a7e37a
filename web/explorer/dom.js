// A small element builder. Text always goes in as text nodes, never as
// HTML: the explorer shows cell bodies written by anyone.

/**
 * h('a', { href: '#/', class: 'brand', onclick: fn }, 'text', child, [more])
 * Attributes set to `false`, `null` or `undefined` are left out; `true`
 * sets a boolean attribute. Children may be strings, numbers, nodes,
 * arrays of them, or null (skipped).
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === false || value === null || value === undefined) continue;
    if (name.startsWith('on') && typeof value === 'function') {
      el.addEventListener(name.slice(2), value);
    } else if (name === 'class') {
      el.className = value;
    } else if (name === 'value' && 'value' in el) {
      el.value = value;
    } else if (name === 'checked' || name === 'selected') {
      el[name] = Boolean(value);
    } else {
      el.setAttribute(name, value === true ? '' : String(value));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false || child === '') continue;
    if (Array.isArray(child)) append(el, child);
    else if (child instanceof Node) el.appendChild(child);
    else el.appendChild(document.createTextNode(String(child)));
  }
}

/** Replaces every child of `el`. */
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

let ids = 0;
/** A document-unique id with a readable prefix. */
export function uid(prefix) {
  ids += 1;
  return `${prefix}-${ids}`;
}

/**
 * A table named `label` (a caption for screen readers; the page shows a
 * heading). In a narrow window its rows stack into blocks, each cell
 * prefixed with its column's header; explicit ARIA roles keep the table's
 * semantics when CSS changes its display. Should a table still be wider than
 * its box, the box scrolls sideways and then becomes a named, focusable
 * region, so keyboard users can scroll it without every table costing them
 * a Tab stop.
 */
export function tableWrap(label, table) {
  table.prepend(h('caption', { class: 'vh' }, label));
  table.classList.add('stack');
  table.setAttribute('role', 'table');
  const headers = [...table.querySelectorAll('thead th')].map((th) => th.textContent.trim());
  for (const group of table.querySelectorAll('thead, tbody')) group.setAttribute('role', 'rowgroup');
  for (const th of table.querySelectorAll('thead th')) th.setAttribute('role', 'columnheader');
  labelCells(table, headers);
  // Rows added later (the cell log) get their labels and roles too.
  new MutationObserver(() => labelCells(table, headers)).observe(table, { childList: true, subtree: true });
  const wrap = h('div', { class: 'table-wrap' }, table);
  const update = () => {
    if (wrap.scrollWidth > wrap.clientWidth) {
      wrap.setAttribute('role', 'region');
      wrap.setAttribute('aria-label', `${label}, scrollable`);
      wrap.setAttribute('tabindex', '0');
    } else {
      wrap.removeAttribute('role');
      wrap.removeAttribute('aria-label');
      wrap.removeAttribute('tabindex');
    }
  };
  new ResizeObserver(update).observe(wrap);
  return wrap;
}

function labelCells(table, headers) {
  for (const row of table.querySelectorAll('tr:not([role])')) {
    row.setAttribute('role', 'row');
    if (row.parentElement.tagName !== 'TBODY') continue;
    [...row.children].forEach((cell, i) => {
      cell.setAttribute('role', cell.tagName === 'TH' ? 'rowheader' : 'cell');
      if (headers[i]) cell.dataset.label = headers[i];
    });
  }
}

/** An error box that screen readers announce. */
export function errorBox(error) {
  const code = error && error.codes && error.codes.length ? error.codes.join(', ') : null;
  return h(
    'div',
    { class: 'error', role: 'alert' },
    h('strong', {}, 'Error: '),
    error && error.message ? error.message : String(error),
    code ? [' ', h('code', {}, code)] : null,
  );
}

/** Text for screen readers only. */
export function vh(text) {
  return h('span', { class: 'vh' }, text);
}
