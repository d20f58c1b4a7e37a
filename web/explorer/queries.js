// The GraphQL documents the explorer sends, built from the catalog and the
// form state. Pure functions (no DOM, no fetch), so they are unit-tested in
// Node. Every value goes into `variables`; documents only name fields.

/** Operators a condition row can use, with their labels. */
export const OPERATORS = [
  { op: 'eq', label: '= equals', needs: 'value' },
  { op: 'ne', label: '≠ not equal (or missing)', needs: 'value' },
  { op: 'gt', label: '> greater than', needs: 'value' },
  { op: 'gte', label: '≥ at least', needs: 'value' },
  { op: 'lt', label: '< less than', needs: 'value' },
  { op: 'lte', label: '≤ at most', needs: 'value' },
  { op: 'in', label: 'in list (comma-separated)', needs: 'list' },
  { op: 'isNull', label: 'is missing', needs: 'none', via: 'isNull' },
  { op: 'notNull', label: 'has a value', needs: 'none', via: 'isNull' },
];

/** Operators offered for a field: those its GraphQL filter input has. */
export function operatorsFor(index, field) {
  const available = index.api.operators.get(field.graphqlName) || [];
  return OPERATORS.filter((o) => available.includes(o.via || o.op));
}

/** Placeholder text for a value of an index field type. */
export function placeholderFor(type) {
  switch (type) {
    case 'UUID':
      return 'e.g. 5f0c8a4e-6d1b-4c2e-9a57-3b8e1d2c4f60';
    case 'datetime':
      return 'e.g. 2024-03-05T00:00:00Z';
    case 'int':
      return 'e.g. 1200';
    case 'float':
      return 'e.g. 30.5';
    case 'bool':
      return 'true or false';
    default:
      return 'text';
  }
}

/** Splits a list typed into a text box: commas, newlines or spaces. */
export function splitList(text) {
  return text
    .split(/[\s,]+/)
    .map((s) => s.trim())
    .filter((s) => s !== '');
}

const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const DATETIME_RE = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:\d{2})$/;

export function isUuid(text) {
  return UUID_RE.test(text);
}

/**
 * One typed value for a GraphQL variable, or throws a message for the form.
 * `Int64` travels as a decimal string so JavaScript keeps it exact.
 */
export function typedValue(type, text, label) {
  const value = text.trim();
  if (value === '') throw new Error(`${label}: enter a value`);
  switch (type) {
    case 'UUID':
      if (!isUuid(value)) throw new Error(`${label}: "${value}" is not a UUID`);
      return value.toLowerCase();
    case 'int':
      if (!/^-?\d+$/.test(value)) throw new Error(`${label}: "${value}" is not a whole number`);
      return value;
    case 'float': {
      const number = Number(value);
      if (!Number.isFinite(number)) throw new Error(`${label}: "${value}" is not a number`);
      return number;
    }
    case 'bool':
      if (value !== 'true' && value !== 'false') throw new Error(`${label}: choose true or false`);
      return value === 'true';
    case 'datetime':
      if (!DATETIME_RE.test(value)) {
        throw new Error(`${label}: "${value}" is not an RFC 3339 time such as 2024-03-05T00:00:00Z`);
      }
      return value;
    default:
      return text;
  }
}

/**
 * The index query for one page.
 *
 * state: {
 *   shard: string (one value or a list),
 *   conditions: { [graphqlName]: { op, value } },
 *   order: graphqlName | '', direction: 'ASC' | 'DESC',
 *   first: number, show: [graphqlName],
 * }
 * Returns { query, variables, operationName }; throws Error with a message
 * for the person filling the form when the state is not a valid query.
 */
export function indexPageQuery(datastore, index, state, after = null) {
  const api = index.api;
  const variables = {};
  const declared = [];
  const passed = [];
  const problems = [];
  const attempt = (fn) => {
    try {
      return fn();
    } catch (error) {
      problems.push(error.message);
      return undefined;
    }
  };

  const shardValues = splitList(state.shard || '');
  if (shardValues.length === 0) {
    problems.push(`${index.shard.name}: the shard field needs a value`);
  } else if (shardValues.length === 1) {
    variables[api.shardArg.name] = attempt(() => typedValue(index.shard.type, shardValues[0], index.shard.name));
    declared.push(`$${api.shardArg.name}: ${api.shardArg.type}`);
    passed.push(`${api.shardArg.name}: $${api.shardArg.name}`);
  } else if (!api.shardInArg) {
    problems.push(`${index.shard.name}: this index takes one shard field value`);
  } else {
    variables[api.shardInArg.name] = shardValues.map((v) => attempt(() => typedValue(index.shard.type, v, index.shard.name)));
    declared.push(`$${api.shardInArg.name}: ${api.shardInArg.type}`);
    passed.push(`${api.shardInArg.name}: $${api.shardInArg.name}`);
  }

  const where = {};
  for (const field of index.fields) {
    const condition = state.conditions && state.conditions[field.graphqlName];
    if (!condition || !condition.op) continue;
    const operator = OPERATORS.find((o) => o.op === condition.op);
    if (!operator || !operatorsFor(index, field).includes(operator)) {
      problems.push(`${field.name}: no operator "${condition.op}" for a ${field.type} field`);
      continue;
    }
    let value;
    if (operator.needs === 'none') {
      value = operator.op === 'isNull';
    } else if (operator.needs === 'list') {
      const items = splitList(condition.value || '');
      if (items.length === 0) problems.push(`${field.name}: enter at least one value`);
      value = items.map((item) => attempt(() => typedValue(field.type, item, field.name)));
    } else {
      value = attempt(() => typedValue(field.type, condition.value || '', field.name));
    }
    where[field.graphqlName] = { ...(where[field.graphqlName] || {}), [operator.via || operator.op]: value };
  }
  if (Object.keys(where).length > 0) {
    if (!api.where) problems.push('this index takes no conditions');
    else {
      variables.where = where;
      declared.push(`$where: ${api.where.type}`);
      passed.push('where: $where');
    }
  }

  if (state.order) {
    const value = api.orderValues.get(state.order);
    if (!value || !api.orderBy) problems.push(`cannot order by ${state.order}`);
    else {
      variables.orderBy = [{ field: value, direction: state.direction === 'DESC' ? 'DESC' : 'ASC' }];
      declared.push(`$orderBy: ${api.orderBy.type}`);
      passed.push('orderBy: $orderBy');
    }
  }

  const first = Number(state.first);
  if (!Number.isInteger(first) || first < 1 || first > 1000) {
    problems.push('page size: a whole number from 1 to 1000');
  }
  variables.first = first;
  declared.push(`$first: ${api.first || 'Int'}`);
  passed.push('first: $first');
  declared.push(`$after: ${api.after || 'String'}`);
  passed.push('after: $after');
  if (after) variables.after = after;

  if (problems.length > 0) throw new Error(problems.join('; '));

  const shown = index.fields
    .filter((f) => !state.show || state.show.includes(f.graphqlName))
    .map((f) => f.graphqlName)
    .filter((name) => api.nodeFields.has(name));
  const operationName = `${pascal(index.name)}Page`;
  const query = [
    `query ${operationName}(${declared.join(', ')}) {`,
    `  ${datastore.graphqlField} {`,
    `    ${api.field}(`,
    ...passed.map((p) => `      ${p}`),
    '    ) {',
    '      edges {',
    '        node {',
    '          rowKey',
    ...shown.map((name) => `          ${name}`),
    '        }',
    '      }',
    '      pageInfo {',
    '        hasNextPage',
    '        endCursor',
    '      }',
    '    }',
    '  }',
    '}',
  ].join('\n');
  return { query, variables, operationName, shown };
}

const CELL_FIELDS = 'rowKey column refKey createdAt shard addedId body';

/** Every column's versions of one row, newest first: one aliased `history` per column. */
export function rowQuery(datastore, versions = 20) {
  const lines = datastore.columns.map(
    (c) => `    ${c.graphqlName}: history(rowKey: $rowKey, column: ${c.name}, first: $first) { ${CELL_FIELDS} }`,
  );
  return {
    query: [`query Row($rowKey: UUID!, $first: Int) {`, `  ${datastore.graphqlField} {`, ...lines, '  }', '}'].join(
      '\n',
    ),
    first: versions,
  };
}

/** Older versions of one column: those with a ref key below `before`. */
export function olderVersionsQuery(datastore) {
  return [
    `query OlderVersions($rowKey: UUID!, $column: ${datastore.columnEnum}!, $first: Int, $before: Int64) {`,
    `  ${datastore.graphqlField} {`,
    `    history(rowKey: $rowKey, column: $column, first: $first, before: $before) { ${CELL_FIELDS} }`,
    '  }',
    '}',
  ].join('\n');
}

/** A page of a shard's cell log. */
export function cellLogQuery(datastore) {
  return [
    'query CellLog($shard: Int!, $after: Int64, $since: DateTime, $limit: Int) {',
    `  ${datastore.graphqlField} {`,
    `    cellsForShard(shard: $shard, after: $after, since: $since, limit: $limit) {`,
    `      next`,
    `      cells { ${CELL_FIELDS} }`,
    '    }',
    '  }',
    '}',
  ].join('\n');
}

/** `driver_partner_index` → `DriverPartnerIndex` */
export function pascal(name) {
  return name
    .split(/[^A-Za-z0-9]+/)
    .filter(Boolean)
    .map((part) => part[0].toUpperCase() + part.slice(1).toLowerCase())
    .join('');
}

/** Reads the value at a dotted path (`fare.total`) of a cell body. */
export function valueAtPath(body, path) {
  let value = body;
  for (const key of path.split('.')) {
    if (value === null || typeof value !== 'object' || !(key in value)) return undefined;
    value = value[key];
  }
  return value;
}
