// `#/ds/<name>/index/<index>?…`: a query form generated from the index's
// fields, results in a table, paging with the connection's cursors and the
// GraphQL of the page on show, ready to copy.
//
// The form state lives in the address (`shard`, `op.<field>`, `v.<field>`,
// `order`, `dir`, `first`, `show`, `run`), so a query can be bookmarked or
// shared and the browser's back button returns to the previous query.
// Paging is forward-only in the API (`first`/`after`); "Previous page"
// re-reads the page from the cursor it started at, kept in a stack.

import { h, replace, tableWrap, uid, errorBox, vh } from '../dom.js';
import { findDatastore, findIndex } from '../catalog.js';
import { loadCatalog, graphql, playgroundLink } from '../api.js';
import { indexPageQuery, operatorsFor, placeholderFor } from '../queries.js';
import { fieldValue, plural } from '../format.js';
import { copyButton } from '../copy.js';
import { breadcrumbs, dsHref } from './breadcrumbs.js';
import { notFound } from './not-found.js';

const DEFAULT_PAGE_SIZE = 20;

export async function indexPage(main, [dsName, indexName], ctx) {
  const catalog = await loadCatalog();
  const ds = findDatastore(catalog, dsName);
  if (!ds) return notFound(main, ctx, `No datastore is named “${dsName}”.`);
  const index = findIndex(ds, indexName);
  if (!index) return notFound(main, ctx, `The datastore ${ds.name} has no index “${indexName}”.`);
  ctx.setTitle(`${index.name} · ${ds.name}`);

  const state = stateFromParams(index, ctx.params);
  const results = h('section', { class: 'results', 'aria-labelledby': 'results-title', hidden: true });
  const problem = h('div', { class: 'form-problem' });
  const form = queryForm(ds, index, state);

  // Cursors each shown page started after; the last is the current page's.
  let pages = [null];
  let pending = null;

  async function run(after) {
    let built;
    try {
      built = indexPageQuery(ds, index, readForm(form, index), after);
    } catch (error) {
      replace(problem, errorBox(error));
      return;
    }
    replace(problem);
    if (pending) pending.abort();
    pending = new AbortController();
    const signal = pending.signal;
    results.hidden = false;
    const busy = h('p', { role: 'status' }, 'Running the query…');
    results.setAttribute('aria-busy', 'true');
    replace(results, h('h2', { id: 'results-title' }, 'Results'), busy);
    try {
      const data = await graphql(built.query, built.variables, { signal });
      const connection = data[ds.graphqlField][index.api.field];
      renderResults(built, connection);
    } catch (error) {
      if (error.name === 'AbortError') return;
      replace(results, h('h2', { id: 'results-title' }, 'Results'), errorBox(error));
      ctx.announce(`The query failed: ${error.message}`);
    } finally {
      results.removeAttribute('aria-busy');
    }
  }

  function renderResults(built, connection) {
    const page = pages.length;
    const rows = connection.edges.map((e) => e.node);
    const status = h('p', { class: 'copy-status', role: 'status' });
    const shownFields = index.fields.filter((f) => built.shown.includes(f.graphqlName));
    const summary = `Page ${page}: ${plural(rows.length, 'entry', 'entries')}${
      connection.pageInfo.hasNextPage ? ', more on the next page' : ', last page'
    }.`;
    const previous = h(
      'button',
      {
        type: 'button',
        class: 'secondary',
        disabled: page === 1,
        onclick: () => {
          pages.pop();
          run(pages[pages.length - 1]);
        },
      },
      '← Previous page',
    );
    const next = h(
      'button',
      {
        type: 'button',
        class: 'secondary',
        disabled: !connection.pageInfo.hasNextPage,
        onclick: () => {
          pages.push(connection.pageInfo.endCursor);
          run(connection.pageInfo.endCursor);
        },
      },
      'Next page →',
    );
    const variablesText = JSON.stringify(built.variables, null, 2);
    replace(
      results,
      h('h2', { id: 'results-title' }, 'Results'),
      h('p', { class: 'summary' }, summary),
      rows.length === 0
        ? h('p', { class: 'empty' }, 'No entries match.')
        : tableWrap(
            `Entries of ${index.name}, page ${page}`,
            h(
              'table',
              { class: 'results-table' },
              h(
                'thead',
                {},
                h(
                  'tr',
                  {},
                  h('th', { scope: 'col' }, 'Row key'),
                  shownFields.map((f) => h('th', { scope: 'col' }, f.name)),
                ),
              ),
              h(
                'tbody',
                {},
                rows.map((row) =>
                  h(
                    'tr',
                    {},
                    h(
                      'th',
                      { scope: 'row' },
                      h('a', { href: dsHref(ds, 'row', row.rowKey), class: 'mono' }, row.rowKey),
                    ),
                    shownFields.map((f) => h('td', {}, fieldValue(row[f.graphqlName]))),
                  ),
                ),
              ),
            ),
          ),
      h('nav', { class: 'pager', 'aria-label': 'Pages' }, previous, h('span', { class: 'page-number' }, `Page ${page}`), next),
      h(
        'details',
        { class: 'generated', open: true },
        h('summary', {}, 'GraphQL of this page'),
        h('h3', {}, 'Query'),
        h('pre', { class: 'code', 'data-testid': 'generated-query' }, built.query),
        h('h3', {}, 'Variables'),
        h('pre', { class: 'code', 'data-testid': 'generated-variables' }, variablesText),
        h(
          'div',
          { class: 'actions' },
          copyButton('Copy query', () => built.query, status),
          copyButton('Copy variables', () => variablesText, status),
          h('a', { class: 'button secondary', href: playgroundLink(built.query, built.variables) }, 'Open in playground'),
        ),
        status,
      ),
    );
    ctx.announce(summary);
  }

  form.addEventListener('submit', (event) => {
    event.preventDefault();
    const params = paramsFromForm(form, index);
    params.set('run', '1');
    ctx.replaceParams(params);
    pages = [null];
    run(null);
  });

  replace(
    main,
    breadcrumbs([ds.name, dsHref(ds)], [index.name]),
    h('h1', {}, index.name),
    h(
      'p',
      { class: 'lead' },
      index.description ? `${index.description}. ` : '',
      'Index of ',
      h('a', { href: dsHref(ds) }, ds.name),
      ' over the columns ',
      index.columns.join(', '),
      '; every query names the shard field ',
      h('code', {}, index.shardField),
      '.',
    ),
    form,
    problem,
    results,
  );

  if (ctx.params.get('run') === '1') run(null);
  return () => pending && pending.abort();
}

function stateFromParams(index, params) {
  const conditions = {};
  for (const f of index.fields) {
    const op = params.get(`op.${f.graphqlName}`);
    if (op) conditions[f.graphqlName] = { op, value: params.get(`v.${f.graphqlName}`) || '' };
  }
  const show = params.get('show');
  return {
    shard: params.get('shard') || '',
    conditions,
    order: params.get('order') || '',
    direction: params.get('dir') === 'DESC' ? 'DESC' : 'ASC',
    first: params.get('first') || String(DEFAULT_PAGE_SIZE),
    show: show === null ? null : show.split(',').filter(Boolean),
  };
}

/** The form's state, as `indexPageQuery` takes it. */
function readForm(form, index) {
  const el = form.elements;
  const conditions = {};
  for (const f of index.fields) {
    if (f.name === index.shardField) continue;
    const op = el[`op.${f.graphqlName}`].value;
    if (op) conditions[f.graphqlName] = { op, value: el[`v.${f.graphqlName}`].value };
  }
  return {
    shard: el.shard.value,
    conditions,
    order: el.order.value,
    direction: el.dir.value,
    first: el.first.value,
    show: index.fields.filter((f) => el[`show.${f.graphqlName}`].checked).map((f) => f.graphqlName),
  };
}

function paramsFromForm(form, index) {
  const state = readForm(form, index);
  const params = new URLSearchParams();
  if (state.shard) params.set('shard', state.shard.trim());
  for (const [name, c] of Object.entries(state.conditions)) {
    params.set(`op.${name}`, c.op);
    if (c.value) params.set(`v.${name}`, c.value);
  }
  if (state.order) params.set('order', state.order);
  if (state.direction === 'DESC') params.set('dir', 'DESC');
  if (state.first !== String(DEFAULT_PAGE_SIZE)) params.set('first', state.first);
  const defaultShow = index.fields.filter((f) => f.name !== index.shardField).map((f) => f.graphqlName);
  if (state.show.join(',') !== defaultShow.join(',')) params.set('show', state.show.join(','));
  return params;
}

function queryForm(ds, index, state) {
  const shardId = uid('shard');
  const shardHint = uid('shard-hint');
  const conditionFields = index.fields.filter((f) => f.name !== index.shardField);

  const form = h(
    'form',
    { class: 'query-form', novalidate: true, 'aria-label': `Query ${index.name}` },
    h(
      'fieldset',
      {},
      h('legend', {}, 'Shard field'),
      h('label', { for: shardId }, index.shard.name, ' ', h('span', { class: 'type' }, `(${index.shard.type}, required)`)),
      h('input', {
        id: shardId,
        name: 'shard',
        value: state.shard,
        autocomplete: 'off',
        spellcheck: 'false',
        'aria-describedby': shardHint,
        placeholder: placeholderFor(index.shard.type),
      }),
      h(
        'p',
        { id: shardHint, class: 'hint' },
        index.api.shardInArg
          ? 'One value, or several separated by commas (each is read from its own index shard, at most 64).'
          : 'One value.',
      ),
    ),
    conditionFields.length === 0
      ? null
      : h(
          'fieldset',
          { class: 'conditions' },
          h('legend', {}, 'Conditions (all must hold)'),
          h('div', { class: 'condition-grid' }, conditionFields.map((f) => conditionRow(index, f, state.conditions[f.graphqlName]))),
        ),
    h(
      'fieldset',
      { class: 'order' },
      h('legend', {}, 'Order and page size'),
      orderControls(index, state),
    ),
    h(
      'fieldset',
      { class: 'show' },
      h('legend', {}, 'Fields to show'),
      h(
        'div',
        { class: 'checks' },
        index.fields.map((f) => {
          const id = uid('show');
          return h(
            'div',
            { class: 'check' },
            h('input', {
              id,
              type: 'checkbox',
              name: `show.${f.graphqlName}`,
              // The shard field repeats the value asked for, so it is off by default.
              checked: state.show ? state.show.includes(f.graphqlName) : f.name !== index.shardField,
            }),
            h('label', { for: id }, f.name),
          );
        }),
      ),
    ),
    h('div', { class: 'actions' }, h('button', { type: 'submit' }, 'Run query')),
  );
  return form;
}

function conditionRow(index, field, condition) {
  const opId = uid('op');
  const valueId = uid('value');
  const nameId = uid('field');
  const operators = operatorsFor(index, field);
  const current = condition || { op: '', value: '' };
  const valueInput =
    field.type === 'bool'
      ? h(
          'select',
          { id: valueId, name: `v.${field.graphqlName}` },
          h('option', { value: 'true', selected: current.value !== 'false' }, 'true'),
          h('option', { value: 'false', selected: current.value === 'false' }, 'false'),
        )
      : h('input', {
          id: valueId,
          name: `v.${field.graphqlName}`,
          value: current.value,
          autocomplete: 'off',
          spellcheck: 'false',
          inputmode: field.type === 'int' || field.type === 'float' ? 'decimal' : null,
          placeholder: placeholderFor(field.type),
        });
  const operatorSelect = h(
    'select',
    { id: opId, name: `op.${field.graphqlName}` },
    h('option', { value: '' }, 'any value'),
    operators.map((o) => h('option', { value: o.op, selected: o.op === current.op }, o.label)),
  );
  const sync = () => {
    const operator = operators.find((o) => o.op === operatorSelect.value);
    valueInput.disabled = !operator || operator.needs === 'none';
  };
  operatorSelect.addEventListener('change', sync);
  sync();
  return h(
    'div',
    { class: 'condition', role: 'group', 'aria-labelledby': nameId },
    h('p', { id: nameId, class: 'condition-name' }, field.name, ' ', h('span', { class: 'type' }, field.type)),
    h('label', { for: opId }, vh(`${field.name} `), 'operator'),
    operatorSelect,
    h('label', { for: valueId }, vh(`${field.name} `), 'value'),
    valueInput,
  );
}

function orderControls(index, state) {
  const orderId = uid('order');
  const dirId = uid('dir');
  const firstId = uid('first');
  const orderable = index.fields.filter((f) => index.api.orderValues.has(f.graphqlName));
  return h(
    'div',
    { class: 'order-grid' },
    h(
      'div',
      {},
      h('label', { for: orderId }, 'Order by'),
      h(
        'select',
        { id: orderId, name: 'order' },
        h('option', { value: '' }, 'row key (default)'),
        orderable.map((f) => h('option', { value: f.graphqlName, selected: state.order === f.graphqlName }, f.name)),
      ),
    ),
    h(
      'div',
      {},
      h('label', { for: dirId }, 'Direction'),
      h(
        'select',
        { id: dirId, name: 'dir' },
        h('option', { value: 'ASC', selected: state.direction !== 'DESC' }, 'ascending'),
        h('option', { value: 'DESC', selected: state.direction === 'DESC' }, 'descending'),
      ),
    ),
    h(
      'div',
      {},
      h('label', { for: firstId }, 'Page size'),
      h('input', { id: firstId, name: 'first', type: 'number', min: 1, max: 1000, step: 1, value: state.first }),
    ),
  );
}
