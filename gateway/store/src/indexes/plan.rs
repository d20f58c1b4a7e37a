//! Query planning: a typed query and a filter string become one plan.
//!
//! The GraphQL `where` input arrives as a list of [`Condition`]s; the filter
//! string is parsed by the `index-dsl` grammar into the same conditions.
//! Both are checked against the index's fields and types and normalized, so
//! the two forms of one question produce equal plans. The shard field
//! (equality or a short `in` list) selects the index shards to read; every
//! other condition becomes a predicate of the per-shard SQL.

use std::collections::BTreeMap;
use std::sync::Arc;

use index_dsl::{CompareOp, Condition, Datastore, Index, Literal};

use super::cursor::{self, Position};
use super::entry::{col_type, literal_value};
use crate::error::{Error, Result};
use crate::shards::value_shard;
use crate::storage::Value;

/// Entries per page unless `first` says otherwise.
pub const DEFAULT_PAGE: u32 = 50;
/// Hard maximum of `first`.
pub const MAX_PAGE: u32 = 1000;
/// Most shard-field values one query may fan out to.
pub const MAX_SHARD_VALUES: usize = 64;

/// An index query in its typed form.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IndexQuery {
    /// The index (its `table` name).
    pub index: String,
    /// Values of the shard field: one for equality, several for a fan-out.
    /// When empty, an `=` or `in` condition on the shard field is used.
    pub shard_values: Vec<Literal>,
    /// Conditions on index fields, combined with AND.
    pub conditions: Vec<Condition>,
    /// Further conditions in the filter language, combined with AND.
    pub filter: Option<String>,
    /// Order of the results; ties (and an empty order) go by row key.
    pub order_by: Vec<OrderBy>,
    /// Index fields to return; empty returns all.
    pub fields: Vec<String>,
    /// Page size (default 50, at most 1000).
    pub first: Option<u32>,
    /// Cursor of the last entry of the previous page.
    pub after: Option<String>,
}

/// One order key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderBy {
    pub field: String,
    pub descending: bool,
}

/// One condition, typed and bound to a field position.
#[derive(Debug, Clone, PartialEq)]
pub struct Predicate {
    pub field: usize,
    pub op: CompareOp,
    pub values: Vec<Value>,
}

/// What a query will do, independent of the form it was asked in.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryPlan {
    pub datastore: String,
    pub index: Arc<Index>,
    /// Index shard → the shard-field values that hash to it.
    pub shards: BTreeMap<u32, Vec<Value>>,
    pub predicates: Vec<Predicate>,
    /// Field positions and whether descending.
    pub order: Vec<(usize, bool)>,
    /// Field positions read from SQL (requested fields plus order fields).
    pub projection: Vec<usize>,
    pub limit: u32,
    pub after: Option<Position>,
}

impl QueryPlan {
    /// Checks a query against the datastore's definitions and plans it.
    pub fn build(datastore: &Datastore, query: &IndexQuery) -> Result<QueryPlan> {
        let index = datastore
            .index(&query.index)
            .ok_or_else(|| Error::UnknownIndex {
                datastore: datastore.name.clone(),
                index: query.index.clone(),
            })?;
        Self::build_on(datastore, index, query)
    }

    /// [`build`](Self::build) on the definition `index` of the queried
    /// index: a previous version's, which serves while a new one is built.
    pub(crate) fn build_on(
        datastore: &Datastore,
        index: &Arc<Index>,
        query: &IndexQuery,
    ) -> Result<QueryPlan> {
        let mut conditions = query.conditions.clone();
        if let Some(filter) = query.filter.as_deref().filter(|f| !f.trim().is_empty()) {
            let parsed = super::filters::parse_filter(filter)
                .map_err(|e| Error::BadInput(format!("invalid filter: {e}")))?;
            conditions.extend(parsed.conditions.iter().cloned());
        }
        let shard_field = index.shard_field();
        let mut shard_literals = query.shard_values.clone();
        let mut predicates = Vec::new();
        for condition in conditions {
            let (position, field) = find_field(index, &condition.field)?;
            let on_shard_field = position == index.shard_field;
            if on_shard_field
                && shard_literals.is_empty()
                && matches!(condition.op, CompareOp::Eq | CompareOp::In)
            {
                shard_literals = condition.values;
                continue;
            }
            predicates.push(predicate(position, field, condition)?);
        }
        if shard_literals.is_empty() {
            return Err(Error::ShardFieldRequired {
                index: index.name.clone(),
                field: shard_field.name.clone(),
            });
        }
        if shard_literals.len() > MAX_SHARD_VALUES {
            return Err(Error::LimitExceeded {
                what: format!("{} shard field values", shard_literals.len()),
                limit: MAX_SHARD_VALUES,
            });
        }
        let mut shards: BTreeMap<u32, Vec<Value>> = BTreeMap::new();
        for literal in &shard_literals {
            let value = literal_value(literal, shard_field).map_err(Error::BadInput)?;
            let shard = value_shard(&value, datastore.shards).ok_or_else(|| {
                Error::BadInput(format!(
                    "the shard field `{}` cannot be null",
                    shard_field.name
                ))
            })?;
            let values = shards.entry(shard).or_default();
            if !values.contains(&value) {
                values.push(value);
            }
        }
        predicates.sort_by(|a, b| {
            (a.field, a.op as u8, format!("{:?}", a.values)).cmp(&(
                b.field,
                b.op as u8,
                format!("{:?}", b.values),
            ))
        });
        predicates.dedup();
        let mut order = Vec::new();
        for key in &query.order_by {
            let (position, field) = find_field(index, &key.field)?;
            if !field.sorted {
                let sorted: Vec<&str> = index
                    .fields
                    .iter()
                    .filter(|f| f.sorted)
                    .map(|f| f.name.as_str())
                    .collect();
                return Err(Error::BadInput(format!(
                    "index `{}` stores field `{}` without a b-tree (`sort: false`): conditions on it are checked on the entries read, but pages cannot be ordered by it (order by one of {})",
                    index.name,
                    field.name,
                    sorted.join(", ")
                )));
            }
            if order.iter().any(|(p, _)| *p == position) {
                return Err(Error::BadInput(format!(
                    "field `{}` appears twice in the order",
                    key.field
                )));
            }
            order.push((position, key.descending));
        }
        let mut projection: Vec<usize> = if query.fields.is_empty() {
            (0..index.fields.len()).collect()
        } else {
            query
                .fields
                .iter()
                .map(|name| find_field(index, name).map(|(p, _)| p))
                .collect::<Result<_>>()?
        };
        projection.extend(order.iter().map(|(p, _)| *p));
        projection.sort_unstable();
        projection.dedup();
        let limit = query.first.unwrap_or(DEFAULT_PAGE);
        if limit > MAX_PAGE {
            return Err(Error::LimitExceeded {
                what: format!("first: {limit}"),
                limit: MAX_PAGE as usize,
            });
        }
        let after = match &query.after {
            None => None,
            Some(text) => {
                let position = cursor::decode(text, cursor::signature(index, &order))?;
                let typed = position.keys.len() == order.len()
                    && position.keys.iter().zip(&order).all(|(value, (field, _))| {
                        value.col_type() == col_type(index.fields[*field].ty)
                    });
                if !typed {
                    return Err(Error::InvalidCursor(
                        "the cursor does not match this query".into(),
                    ));
                }
                Some(position)
            }
        };
        Ok(QueryPlan {
            datastore: datastore.name.clone(),
            index: index.clone(),
            shards,
            predicates,
            order,
            projection,
            limit,
            after,
        })
    }

    /// The cursor signature of this plan's index and order.
    pub fn signature(&self) -> u64 {
        cursor::signature(&self.index, &self.order)
    }

    /// Whether this plan reads `index` as it is: the same fields at the
    /// same positions, the same shard field. (A `where:` predicate only
    /// decides which rows a table has entries for.)
    pub(crate) fn reads(&self, index: &Index) -> bool {
        self.index.shard_field == index.shard_field && self.index.fields == index.fields
    }

    /// This plan on another version of its index, `index`: `None` unless
    /// that version has the plan's shard field and every field the plan
    /// filters on, orders by or returns, each with the same column, path
    /// and type (with or without a b-tree: ordering by a field without one
    /// costs that version a sort, not a wrong answer). Positions are mapped
    /// by field; the cursor and the shards stay (they depend on field names
    /// and values only).
    pub(crate) fn rebased(&self, index: &Arc<Index>) -> Option<QueryPlan> {
        if !self.index.shard_field().same_values(index.shard_field()) {
            return None;
        }
        let map = |p: usize| {
            let field = &self.index.fields[p];
            index.fields.iter().position(|f| f.same_values(field))
        };
        let mut predicates = Vec::with_capacity(self.predicates.len());
        for predicate in &self.predicates {
            predicates.push(Predicate {
                field: map(predicate.field)?,
                ..predicate.clone()
            });
        }
        let mut order = Vec::with_capacity(self.order.len());
        for &(p, descending) in &self.order {
            order.push((map(p)?, descending));
        }
        let mut projection = Vec::with_capacity(self.projection.len());
        for &p in &self.projection {
            projection.push(map(p)?);
        }
        projection.sort_unstable();
        Some(QueryPlan {
            index: index.clone(),
            predicates,
            order,
            projection,
            ..self.clone()
        })
    }
}

fn find_field<'i>(index: &'i Index, name: &str) -> Result<(usize, &'i index_dsl::IndexField)> {
    index
        .fields
        .iter()
        .enumerate()
        .find(|(_, f)| f.name == name)
        .or_else(|| {
            index
                .fields
                .iter()
                .enumerate()
                .find(|(_, f)| f.path.to_string() == name)
        })
        .ok_or_else(|| {
            Error::BadInput(format!(
                "unknown field `{name}` in index `{}` (expected one of {})",
                index.name,
                index
                    .fields
                    .iter()
                    .map(|f| f.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

fn predicate(
    position: usize,
    field: &index_dsl::IndexField,
    condition: Condition,
) -> Result<Predicate> {
    let ordered = matches!(
        condition.op,
        CompareOp::Lt | CompareOp::Le | CompareOp::Gt | CompareOp::Ge
    );
    if ordered && !field.ty.is_ordered() {
        return Err(Error::BadInput(format!(
            "field `{}` is {} and has no order; use eq, ne or in",
            field.name,
            field.ty.name()
        )));
    }
    if condition.values.is_empty() {
        return Err(Error::BadInput(format!(
            "condition on `{}` has no value",
            field.name
        )));
    }
    if condition.op != CompareOp::In && condition.values.len() != 1 {
        return Err(Error::BadInput(format!(
            "condition on `{}` takes exactly one value",
            field.name
        )));
    }
    let mut values = Vec::with_capacity(condition.values.len());
    for literal in &condition.values {
        let value = literal_value(literal, field).map_err(Error::BadInput)?;
        if value.is_null() && (ordered || condition.op == CompareOp::In) {
            return Err(Error::BadInput(format!(
                "null can only be compared with `=` and `!=` (field `{}`)",
                field.name
            )));
        }
        if !values.contains(&value) {
            values.push(value);
        }
    }
    Ok(Predicate {
        field: position,
        op: condition.op,
        values,
    })
}
