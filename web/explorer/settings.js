// Extra request headers (e.g. an Authorization token) sent with every
// request of this browser tab. Kept in sessionStorage, so a token ends with
// the tab instead of lingering in localStorage.

const KEY = 'cellgate.explorer.headers';

/** The headers as an object; an unreadable value counts as none. */
export function requestHeaders() {
  try {
    const value = JSON.parse(window.sessionStorage.getItem(KEY) || '{}');
    return value && typeof value === 'object' && !Array.isArray(value) ? value : {};
  } catch {
    return {};
  }
}

export function saveRequestHeaders(headers) {
  if (Object.keys(headers).length === 0) window.sessionStorage.removeItem(KEY);
  else window.sessionStorage.setItem(KEY, JSON.stringify(headers));
}

/**
 * Parses `Name: value` lines. Returns { headers } or { error } naming the
 * first bad line.
 */
export function parseHeaderLines(text) {
  const headers = {};
  const lines = text.split('\n');
  for (let i = 0; i < lines.length; i += 1) {
    const line = lines[i].trim();
    if (line === '') continue;
    const colon = line.indexOf(':');
    const name = colon > 0 ? line.slice(0, colon).trim() : '';
    if (!/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(name)) {
      return { error: `line ${i + 1}: expected "Name: value"` };
    }
    headers[name] = line.slice(colon + 1).trim();
  }
  return { headers };
}

export function formatHeaderLines(headers) {
  return Object.entries(headers)
    .map(([name, value]) => `${name}: ${value}`)
    .join('\n');
}
