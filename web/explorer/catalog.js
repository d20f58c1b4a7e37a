// What the gateway offers, read once per page load: every datastore's
// definition and topology from `Query.datastores`, and the GraphQL names
// and types the explorer needs to write its queries (argument types, filter
// operators, order enums) from introspection. Nothing is guessed from
// naming conventions. Pure (no fetch, no DOM), so it is tested in Node
// against a running gateway; `api.js` loads it.

const TYPE_REF = 'kind name ofType { kind name ofType { kind name ofType { kind name } } }';

export const CATALOG_QUERY = `query ExplorerCatalog {
  datastores {
    name
    description
    graphqlField
    shards
    columns { name description graphqlName }
    indexes {
      name
      description
      graphqlField
      shardField
      columns
      fields { name graphqlName path type column }
    }
    topology { first last cluster }
  }
  __schema {
    queryType {
      fields { name type { ${TYPE_REF} } }
    }
    types {
      kind
      name
      fields { name args { name type { ${TYPE_REF} } } type { ${TYPE_REF} } }
      inputFields { name type { ${TYPE_REF} } }
      enumValues { name }
    }
  }
}`;

/** `[UUID!]` style text of an introspected type reference. */
export function typeText(ref) {
  if (ref.kind === 'NON_NULL') return `${typeText(ref.ofType)}!`;
  if (ref.kind === 'LIST') return `[${typeText(ref.ofType)}]`;
  return ref.name;
}

/** The named type under any list and non-null wrappers. */
export function namedType(ref) {
  let t = ref;
  while (t.ofType) t = t.ofType;
  return t.name;
}

/**
 * Joins `Query.datastores` with the introspected schema. Throws when the
 * schema lacks something the explorer relies on, naming it.
 */
export function buildCatalog(data) {
  const types = new Map(data.__schema.types.map((t) => [t.name, t]));
  const rootFields = new Map(data.__schema.queryType.fields.map((f) => [f.name, f]));
  const need = (value, what) => {
    if (value === undefined || value === null) throw new Error(`the schema has no ${what}`);
    return value;
  };

  const datastores = data.datastores.map((ds) => {
    const root = need(rootFields.get(ds.graphqlField), `Query.${ds.graphqlField}`);
    const queryType = need(types.get(namedType(root.type)), `type of Query.${ds.graphqlField}`);
    const fields = new Map(queryType.fields.map((f) => [f.name, f]));
    const history = need(fields.get('history'), `${queryType.name}.history`);
    const columnArg = need(history.args.find((a) => a.name === 'column'), `${queryType.name}.history(column)`);
    const columnEnum = namedType(columnArg.type);

    const indexes = ds.indexes.map((index) => {
      const field = need(fields.get(index.graphqlField), `${queryType.name}.${index.graphqlField}`);
      const args = new Map(field.args.map((a) => [a.name, a]));
      const shard = need(
        index.fields.find((f) => f.name === index.shardField),
        `shard field ${index.shardField} of ${index.name}`,
      );
      const shardArg = need(args.get(shard.graphqlName), `argument ${shard.graphqlName} of ${index.graphqlField}`);
      const shardInArg = args.get(`${shard.graphqlName}In`) || null;

      const whereArg = args.get('where');
      const whereType = whereArg ? types.get(namedType(whereArg.type)) : null;
      const operators = new Map();
      for (const input of (whereType && whereType.inputFields) || []) {
        const filter = types.get(namedType(input.type));
        operators.set(input.name, (filter.inputFields || []).map((f) => f.name));
      }

      const orderArg = args.get('orderBy') || null;
      const orderValues = new Map();
      if (orderArg) {
        const orderInput = types.get(namedType(orderArg.type));
        const fieldInput = orderInput.inputFields.find((f) => f.name === 'field');
        const fieldEnum = types.get(namedType(fieldInput.type));
        for (const value of fieldEnum.enumValues) {
          const match = index.fields.find((f) => f.name.toUpperCase() === value.name);
          if (match) orderValues.set(match.graphqlName, value.name);
        }
      }

      const connection = types.get(namedType(field.type));
      const edge = types.get(namedType(need(connection.fields.find((f) => f.name === 'edges'), 'edges').type));
      const node = types.get(namedType(need(edge.fields.find((f) => f.name === 'node'), 'node').type));
      const nodeFields = new Set(node.fields.map((f) => f.name));

      return {
        ...index,
        shard,
        api: {
          field: index.graphqlField,
          shardArg: { name: shardArg.name, type: typeText(shardArg.type) },
          shardInArg: shardInArg && { name: shardInArg.name, type: typeText(shardInArg.type) },
          where: whereArg && { name: 'where', type: typeText(whereArg.type) },
          orderBy: orderArg && { name: 'orderBy', type: typeText(orderArg.type) },
          first: args.get('first') ? typeText(args.get('first').type) : null,
          after: args.get('after') ? typeText(args.get('after').type) : null,
          operators,
          orderValues,
          nodeFields,
        },
      };
    });

    return { ...ds, queryType: queryType.name, columnEnum, indexes };
  });
  return { datastores };
}

export function findDatastore(catalog, name) {
  return catalog.datastores.find((d) => d.name === name) || null;
}

export function findIndex(datastore, name) {
  return datastore.indexes.find((i) => i.name === name) || null;
}
