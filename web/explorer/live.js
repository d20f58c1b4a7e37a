// One GraphQL subscription over `/graphql/ws` (the graphql-transport-ws
// protocol), spoken with the browser's WebSocket as the playground does:
// connection_init (with the Authorization header of the settings as its
// payload), subscribe, then `next` events until `complete`, `error` or the
// socket closes. Reconnecting is the caller's choice: it knows where to
// resume from.

import { requestHeaders } from './settings.js';

/** The WebSocket address of the gateway's `/graphql/ws`. */
export function socketUrl() {
  const url = new URL('../graphql/ws', window.location.href);
  url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
  return url.href;
}

/**
 * Subscribes to `query` with `variables`. Calls `onOpen()` once the server
 * acknowledged the connection and the subscription is sent, `onNext(data)`
 * per event, `onError(messages)` when the server refuses the operation (then
 * nothing more), and `onClose({ code, reason, expected })` when the socket
 * closed: `expected` is true after `close()`, `complete` or `error`.
 * Returns `{ close() }`.
 */
export function subscribe(query, variables, { onOpen, onNext, onError, onClose }) {
  const socket = new WebSocket(socketUrl(), 'graphql-transport-ws');
  let expected = false;
  socket.addEventListener('open', () => {
    const headers = requestHeaders();
    const auth = Object.entries(headers).find(([name]) => name.toLowerCase() === 'authorization');
    socket.send(JSON.stringify({ type: 'connection_init', payload: auth ? { Authorization: auth[1] } : {} }));
  });
  socket.addEventListener('message', (event) => {
    let message;
    try {
      message = JSON.parse(event.data);
    } catch {
      return;
    }
    if (message.type === 'connection_ack') {
      socket.send(JSON.stringify({ id: '1', type: 'subscribe', payload: { query, variables } }));
      if (onOpen) onOpen();
    } else if (message.type === 'ping') {
      socket.send(JSON.stringify({ type: 'pong' }));
    } else if (message.type === 'next') {
      const payload = message.payload || {};
      if (payload.errors && payload.errors.length > 0) {
        expected = true;
        onError(payload.errors);
        socket.close(1000);
      } else if (payload.data) {
        onNext(payload.data);
      }
    } else if (message.type === 'error') {
      expected = true;
      onError(Array.isArray(message.payload) ? message.payload : [{ message: 'the subscription was refused' }]);
      socket.close(1000);
    } else if (message.type === 'complete') {
      expected = true;
      socket.close(1000);
    }
  });
  socket.addEventListener('close', (event) => {
    if (onClose) onClose({ code: event.code, reason: event.reason, expected });
  });
  return {
    close() {
      expected = true;
      if (socket.readyState === WebSocket.CONNECTING || socket.readyState === WebSocket.OPEN) socket.close(1000);
    },
  };
}
