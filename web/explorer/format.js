// How values look on the page.

import { h } from './dom.js';

/** An index field value in a table cell; a missing value reads "null". */
export function fieldValue(value) {
  if (value === null || value === undefined) return h('span', { class: 'null' }, 'null');
  if (typeof value === 'boolean') return value ? 'true' : 'false';
  return String(value);
}

/** A cell body, pretty-printed. */
export function prettyJson(value) {
  return h('pre', { class: 'json' }, JSON.stringify(value, null, 2));
}

/** A cell body on one line, cut at `max` characters. */
export function compactJson(value, max = 120) {
  const text = JSON.stringify(value);
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

/** `2024-03-05T07:40:00Z` as given (UTC), in a <time> element. */
export function timestamp(iso) {
  return h('time', { datetime: iso }, iso);
}

/** 1 cell, 2 cells */
export function plural(count, one, many) {
  return `${count} ${count === 1 ? one : many}`;
}

/** A clock time for "updated at" notes. */
export function clock(date = new Date()) {
  return date.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });
}
