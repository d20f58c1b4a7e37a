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

  fetch('playground/examples.json')
    .then(function (response) {
      if (!response.ok) throw new Error('examples.json: HTTP ' + response.status);
      return response.json();
    })
    .then(function (examples) {
      var params = new URLSearchParams(window.location.search);
      var props = {
        fetcher: GraphiQL.createFetcher({ url: new URL('graphql', window.location.href).href }),
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
