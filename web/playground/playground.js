// Starts GraphiQL on the gateway's own endpoint, every asset served by the
// gateway itself. The README's example operations open as tabs the first
// time (GraphiQL keeps the tabs a person edits in localStorage after that).
// `?query=…&variables=…` opens that operation in a tab: the explorer's
// "Open in playground" links use it.
(function () {
  'use strict';

  var root = document.getElementById('graphiql');

  function showError(message) {
    root.textContent = '';
    var p = document.createElement('p');
    p.className = 'playground-status';
    p.setAttribute('role', 'alert');
    p.textContent = message;
    root.appendChild(p);
  }

  if (!window.GraphiQL || !window.React || !window.ReactDOM) {
    showError('The playground could not start: its scripts did not load.');
    return;
  }

  // Subscriptions go over `/graphql/ws` (graphql-transport-ws), spoken here
  // with the browser's WebSocket: GraphiQL shows each event of the async
  // iterable it is given. The Authorization header from the headers editor
  // goes in the connection_init payload.
  function isSubscription(params) {
    var text = (params.query || '').replace(/#[^\n]*/g, '');
    if (params.operationName) {
      var named = new RegExp('subscription\\s+' + params.operationName + '\\b');
      return named.test(text);
    }
    return /^\s*subscription\b/.test(text);
  }

  function subscribe(params, headers) {
    var url = new URL('graphql/ws', window.location.href);
    url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
    var queue = [];
    var waiting = null;
    var done = false;
    var socket = new WebSocket(url.href, 'graphql-transport-ws');
    function push(item) {
      if (waiting) { var w = waiting; waiting = null; w(item); } else queue.push(item);
    }
    function finish(value) { done = true; push({ done: true, value: value }); }
    socket.onopen = function () {
      var auth = headers && (headers.Authorization || headers.authorization);
      socket.send(JSON.stringify({ type: 'connection_init', payload: auth ? { Authorization: auth } : {} }));
    };
    socket.onmessage = function (event) {
      var message = JSON.parse(event.data);
      if (message.type === 'connection_ack') {
        socket.send(JSON.stringify({ id: '1', type: 'subscribe', payload: params }));
      } else if (message.type === 'ping') {
        socket.send(JSON.stringify({ type: 'pong' }));
      } else if (message.type === 'next') {
        push({ done: false, value: message.payload });
      } else if (message.type === 'error') {
        push({ done: false, value: { errors: message.payload } });
        finish();
      } else if (message.type === 'complete') {
        finish();
      }
    };
    socket.onclose = function (event) {
      if (!done) {
        push({ done: false, value: { errors: [{ message: 'connection closed: ' + event.code + ' ' + event.reason }] } });
        finish();
      }
    };
    var iterator = {
      next: function () {
        if (queue.length) return Promise.resolve(queue.shift());
        if (done) return Promise.resolve({ done: true, value: undefined });
        return new Promise(function (resolve) { waiting = resolve; });
      },
      return: function () {
        done = true;
        socket.close(1000);
        return Promise.resolve({ done: true, value: undefined });
      },
    };
    iterator[Symbol.asyncIterator] = function () { return iterator; };
    return iterator;
  }

  fetch('playground/examples.json')
    .then(function (response) {
      if (!response.ok) throw new Error('examples.json: HTTP ' + response.status);
      return response.json();
    })
    .then(function (examples) {
      var params = new URLSearchParams(window.location.search);
      var http = GraphiQL.createFetcher({ url: new URL('graphql', window.location.href).href });
      var props = {
        fetcher: function (params, options) {
          var headers = (options && options.headers) || {};
          return isSubscription(params) ? subscribe(params, headers) : http(params, options);
        },
        defaultTabs: examples.map(function (example) {
          return { query: example.query, variables: example.variables };
        }),
        // Request headers (e.g. an Authorization token) are editable but not
        // persisted: a token must not outlive the browser tab in localStorage.
        isHeadersEditorEnabled: true,
        shouldPersistHeaders: false,
        defaultEditorToolsVisibility: true,
      };
      if (params.has('query')) {
        props.query = params.get('query');
        props.variables = params.get('variables') || undefined;
      }
      // The top-right corner links to the web explorer instead of GraphiQL's name.
      var logo = React.createElement(
        GraphiQL.Logo,
        null,
        React.createElement('a', { href: 'ui/', className: 'playground-explorer-link' }, 'cellgate explorer')
      );
      ReactDOM.createRoot(root).render(React.createElement(GraphiQL, props, logo));
    })
    .catch(function (error) {
      showError('The playground could not start: ' + error.message);
    });
})();
