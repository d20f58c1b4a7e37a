//! Arguments decoded into store requests: page sizes, filter strings
//! within their limits, and the index query of an index field, shared
//! with the compiled reads of `direct.rs`.

use async_graphql::dynamic::ResolverContext;
use async_graphql::Value;
use index_dsl::{CompareOp, Condition, Index, Literal};

use crate::errors::{bad_input, coded};
use cellgate_store::indexes::{IndexQuery, OrderBy};

use super::*;

/// The limits the schema was built with.
pub(super) fn limits(ctx: &ResolverContext<'_>) -> GraphqlLimits {
    ctx.data::<GraphqlLimits>().copied().unwrap_or_default()
}

/// Refuses a filter string longer than the limits allow before it is
/// planned (a 10,000-term filter took seconds to plan). A filter that
/// does not parse is left to the planner, whose error says where.
pub(super) fn check_filter(filter: &str, limits: GraphqlLimits) -> async_graphql::Result<()> {
    if filter.len() > limits.filter_bytes {
        return Err(coded(
            "LIMIT_EXCEEDED",
            format!("`filter` is at most {} bytes", limits.filter_bytes),
        ));
    }
    if let Ok(parsed) = cellgate_store::indexes::filters::parse_filter(filter) {
        if parsed.conditions.len() > limits.filter_terms {
            return Err(coded(
                "LIMIT_EXCEEDED",
                format!("`filter` has at most {} conditions", limits.filter_terms),
            ));
        }
        if parsed
            .conditions
            .iter()
            .any(|c| c.values.len() > limits.in_values)
        {
            return Err(coded(
                "LIMIT_EXCEEDED",
                format!(
                    "an `in` list of `filter` has at most {} values",
                    limits.in_values
                ),
            ));
        }
    }
    Ok(())
}

/// Reads a page-size argument, with its default and maximum.
pub(super) fn page_size(
    ctx: &ResolverContext<'_>,
    name: &str,
    default: u32,
    max: u32,
) -> async_graphql::Result<u32> {
    page_size_of(argument(ctx.args.as_index_map(), name), name, default, max)
}

/// A page-size argument's value, with its default and maximum.
pub(super) fn page_size_of(
    value: Option<&Value>,
    name: &str,
    default: u32,
    max: u32,
) -> async_graphql::Result<u32> {
    let value = match value {
        Some(Value::Number(n)) => n
            .as_i64()
            .ok_or_else(|| bad_input(format!("`{name}` must be an integer")))?,
        Some(_) => return Err(bad_input(format!("`{name}` must be an integer"))),
        None => i64::from(default),
    };
    if value < 0 {
        return Err(bad_input(format!("`{name}` must not be negative")));
    }
    if value > i64::from(max) {
        return Err(coded(
            "LIMIT_EXCEEDED",
            format!("`{name}` is at most {max}"),
        ));
    }
    Ok(value as u32)
}
pub(crate) use crate::args::Arguments;

/// The non-null argument `name`.
pub(super) fn argument<'a>(args: &'a Arguments, name: &str) -> Option<&'a Value> {
    args.get(name).filter(|v| !matches!(v, Value::Null))
}

pub(super) fn list_of<'a>(value: &'a Value, what: &str) -> async_graphql::Result<&'a [Value]> {
    match value {
        Value::List(items) => Ok(items),
        _ => Err(bad_input(format!("`{what}` must be a list"))),
    }
}

pub(super) fn object_of<'a>(value: &'a Value, what: &str) -> async_graphql::Result<&'a Arguments> {
    match value {
        Value::Object(map) => Ok(map),
        _ => Err(bad_input(format!("`{what}` must be an object"))),
    }
}

/// Turns the arguments of an index field into an [`IndexQuery`] reading
/// the index fields for which `selects` is true.
pub(crate) fn index_query(
    args: &Arguments,
    limits: GraphqlLimits,
    selects: &dyn Fn(&str) -> bool,
    index: &Index,
    shard_arg: &str,
    shard_list_arg: &str,
) -> async_graphql::Result<IndexQuery> {
    let shard_field = index.shard_field();
    let mut query = IndexQuery {
        index: index.name.clone(),
        ..IndexQuery::default()
    };
    if let Some(value) = argument(args, shard_arg) {
        query
            .shard_values
            .push(literal(value, shard_field.ty, shard_arg)?);
    }
    if let Some(list) = argument(args, shard_list_arg) {
        for value in list_of(list, shard_list_arg)? {
            query
                .shard_values
                .push(literal(value, shard_field.ty, shard_list_arg)?);
        }
    }
    if let Some(conditions) = argument(args, "where") {
        let conditions = object_of(conditions, "where")?;
        for field in &index.fields {
            let Some(filter) = argument(conditions, &camel(&field.name)) else {
                continue;
            };
            for (op, value) in object_of(filter, "where")? {
                let what = format!("where.{}.{}", camel(&field.name), op.as_str());
                if matches!(value, Value::Null) {
                    continue;
                }
                let condition = |op, values| Condition {
                    field: field.name.clone(),
                    op,
                    values,
                    column: 1,
                };
                let op = match op.as_str() {
                    "eq" => CompareOp::Eq,
                    "ne" => CompareOp::Ne,
                    "gt" => CompareOp::Gt,
                    "gte" => CompareOp::Ge,
                    "lt" => CompareOp::Lt,
                    "lte" => CompareOp::Le,
                    "in" => {
                        let list = list_of(value, &what)?;
                        let max = limits.in_values;
                        if list.len() > max {
                            return Err(coded(
                                "LIMIT_EXCEEDED",
                                format!("{what}: at most {max} values"),
                            ));
                        }
                        let values = list
                            .iter()
                            .map(|v| literal(v, field.ty, &what))
                            .collect::<async_graphql::Result<Vec<_>>>()?;
                        if values.is_empty() {
                            return Err(bad_input(format!("{what}: the list is empty")));
                        }
                        query.conditions.push(condition(CompareOp::In, values));
                        continue;
                    }
                    "isNull" => {
                        let Value::Boolean(is_null) = value else {
                            return Err(bad_input(format!("{what} must be a boolean")));
                        };
                        let op = if *is_null {
                            CompareOp::Eq
                        } else {
                            CompareOp::Ne
                        };
                        query.conditions.push(condition(op, vec![Literal::Null]));
                        continue;
                    }
                    other => return Err(bad_input(format!("unknown condition `{other}`"))),
                };
                let literal = literal(value, field.ty, &what)?;
                query.conditions.push(condition(op, vec![literal]));
            }
        }
    }
    if let Some(filter) = argument(args, "filter") {
        let Value::String(filter) = filter else {
            return Err(bad_input("`filter` must be a string"));
        };
        check_filter(filter, limits)?;
        query.filter = Some(filter.to_string());
    }
    if let Some(order) = argument(args, "orderBy") {
        for key in list_of(order, "orderBy")? {
            let key = object_of(key, "orderBy")?;
            let item = match key.get("field") {
                Some(Value::Enum(name)) => name.to_string(),
                Some(Value::String(name)) => name.clone(),
                _ => return Err(bad_input("`orderBy` needs a `field`")),
            };
            let field = index
                .fields
                .iter()
                .find(|f| screaming(&f.name) == item)
                .ok_or_else(|| bad_input(format!("unknown order field `{item}`")))?;
            let descending = match key.get("direction") {
                Some(Value::Enum(name)) => name.as_str() == "DESC",
                Some(Value::String(name)) => name == "DESC",
                _ => false,
            };
            query.order_by.push(OrderBy {
                field: field.name.clone(),
                descending,
            });
        }
    }
    let first = page_size_of(
        argument(args, "first"),
        "first",
        cellgate_store::indexes::plan::DEFAULT_PAGE,
        cellgate_store::indexes::plan::MAX_PAGE,
    )?;
    query.first = Some(first);
    if let Some(after) = argument(args, "after") {
        let Value::String(after) = after else {
            return Err(bad_input("`after` must be a string"));
        };
        query.after = Some(after.clone());
    }
    // Projection: read only the fields the query selects under edges.node.
    query.fields = index
        .fields
        .iter()
        .filter(|f| selects(&camel(&f.name)))
        .map(|f| f.name.clone())
        .collect();
    if query.fields.is_empty() {
        query.fields.push(shard_field.name.clone());
    }
    Ok(query)
}
