//! What an index query reads (`cellgate index explain`): the version that
//! answers it, the index shards, the b-tree whose range it reads, the
//! conditions that bound that range and those checked on each entry read
//! (residual: on fields without a b-tree of their own, `sort: false`, or
//! beyond the one the range uses), how its order comes about, and for
//! each cluster the statement it sends with the database's own plan of it.
//!
//! Every index table has a b-tree on `(shard field, row_key)` and one on
//! `(shard field, field, row_key)` per other field with `sort:` left true
//! (`storage/ddl.rs`). A query names the shard field's values, so a page
//! reads at most one range per value: of the b-tree of its first order
//! field, else of a field it has a condition on, else of the row keys.

use index_dsl::CompareOp;

use super::plan::{IndexQuery, Predicate, QueryPlan};
use super::query::{plan as plan_query, serving};
use crate::error::Result;
use crate::replicas::{read_on, ReadOptions};
use crate::storage::Value;
use crate::topology::Topology;

/// How an index query is answered.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexExplain {
    pub datastore: String,
    pub index: String,
    /// The table version that answers it.
    pub version: u32,
    pub table: String,
    /// Whether the version is the current one or the previous one, which
    /// answers while the current one is built.
    pub previous: bool,
    /// The index shards read, each with the shard field's values it holds.
    pub shards: Vec<(u32, Vec<String>)>,
    /// The key of the b-tree whose range is read, e.g. `city_uuid,
    /// trip_created_at, row_key`.
    pub btree: Vec<String>,
    /// Conditions that bound that range.
    pub bounds: Vec<String>,
    /// Conditions checked on each entry of the range.
    pub residual: Vec<String>,
    /// How the page's order comes about.
    pub order: String,
    /// Entries on a page (one more is read to tell whether another page
    /// follows).
    pub limit: u32,
    /// The statement of each cluster, with the database's plan of it.
    pub statements: Vec<ExplainedStatement>,
}

/// One cluster's statement of an explained query.
#[derive(Debug, Clone, PartialEq)]
pub struct ExplainedStatement {
    pub cluster: String,
    /// The statement's text, with placeholders.
    pub sql: String,
    /// Its parameters, in order.
    pub params: Vec<String>,
    /// The database's plan of it (`EXPLAIN`), line by line.
    pub database_plan: Vec<String>,
}

/// Explains `query` on `datastore`'s index as [`super::query::query_index`]
/// would answer it now, asking each cluster's master for its plan of the
/// statement.
pub(crate) async fn explain(
    topology: &Topology,
    datastore: &str,
    query: &IndexQuery,
) -> Result<IndexExplain> {
    let ds = topology.datastore(datastore)?;
    let planned = plan_query(&ds, query)?;
    let (runtime, plan) = serving(&ds, &planned)?;
    let plan = plan.as_ref();
    let access = access(plan);
    let groups = topology.by_cluster(
        &ds,
        plan.shards
            .iter()
            .flat_map(|(shard, values)| values.iter().map(move |v| (*shard, v.clone()))),
    );
    let mut statements = Vec::new();
    let read = ReadOptions::default().for_index();
    let no_shards = Default::default();
    for (cluster, values) in groups {
        let explained = read_on(topology, &ds, cluster, &no_shards, &read, |node| {
            let sql = plan.sql(node.dialect(), &runtime.table, &values);
            async move {
                let (prefix, types, text_column) = node.dialect().explain();
                let mut explain = crate::storage::Sql::new(node.dialect());
                explain.push(prefix).append(&sql);
                let rows = node.fetch(&explain, &types).await?;
                let lines = rows
                    .iter()
                    .filter_map(|row| match row.get(text_column) {
                        Some(Value::Text(text)) => Some(text.clone()),
                        _ => None,
                    })
                    .flat_map(|text| text.lines().map(str::to_string).collect::<Vec<_>>())
                    .collect();
                Ok((sql, lines))
            }
        })
        .await?;
        let (sql, database_plan) = explained;
        statements.push(ExplainedStatement {
            cluster: topology.clusters[cluster].name.clone(),
            sql: sql.text().to_string(),
            params: sql.params().iter().map(value_text).collect(),
            database_plan,
        });
    }
    Ok(IndexExplain {
        datastore: ds.name().to_string(),
        index: plan.index.name.clone(),
        version: runtime.version,
        table: runtime.table.clone(),
        previous: runtime.serves_until().is_some(),
        shards: plan
            .shards
            .iter()
            .map(|(shard, values)| (*shard, values.iter().map(value_text).collect()))
            .collect(),
        btree: access.btree,
        bounds: access.bounds,
        residual: access.residual,
        order: access.order,
        limit: plan.limit,
        statements,
    })
}

/// The b-tree a plan reads and what its conditions do there.
#[derive(Debug, Clone, PartialEq)]
struct Access {
    btree: Vec<String>,
    bounds: Vec<String>,
    residual: Vec<String>,
    order: String,
}

fn access(plan: &QueryPlan) -> Access {
    let index = &plan.index;
    let shard = index.shard_field;
    let own_btree = |p: usize| p != shard && index.fields[p].sorted;
    let leading = plan.order.iter().map(|(p, _)| *p).find(|p| *p != shard);
    // The range: of the first order field's b-tree, else of a field with
    // an equality, else a range, condition.
    let key = leading.filter(|p| own_btree(*p)).or_else(|| {
        let conditioned = |ops: &[CompareOp]| {
            plan.predicates
                .iter()
                .find(|pr| own_btree(pr.field) && ops.contains(&pr.op))
                .map(|pr| pr.field)
        };
        conditioned(&[CompareOp::Eq, CompareOp::In])
            .or_else(|| conditioned(&[CompareOp::Lt, CompareOp::Le, CompareOp::Gt, CompareOp::Ge]))
    });
    let mut btree = vec![index.fields[shard].name.clone()];
    btree.extend(key.map(|p| index.fields[p].name.clone()));
    btree.push("row_key".to_string());

    let values = plan.shards.values().map(Vec::len).sum::<usize>();
    let mut bounds = vec![format!(
        "{} {}",
        index.fields[shard].name,
        if values == 1 {
            "= its value".to_string()
        } else {
            format!("= each of its {values} values (one range each)")
        }
    )];
    let mut residual = Vec::new();
    for predicate in &plan.predicates {
        let text = predicate_text(plan, predicate);
        let bounding = Some(predicate.field) == key && predicate.op != CompareOp::Ne;
        if bounding {
            bounds.push(text);
        } else if !index.fields[predicate.field].sorted {
            residual.push(format!("{text} (no b-tree: `sort: false`)"));
        } else {
            residual.push(text);
        }
    }
    if plan.after.is_some() {
        bounds.push("after the cursor's entry".to_string());
    }
    let order_names: Vec<String> = plan
        .order
        .iter()
        .map(|(p, descending)| {
            format!(
                "{}{}",
                index.fields[*p].name,
                if *descending { " desc" } else { "" }
            )
        })
        .chain(std::iter::once("row_key".to_string()))
        .collect();
    let equal_on_key = plan
        .predicates
        .iter()
        .any(|pr| Some(pr.field) == key && pr.op == CompareOp::Eq);
    let mut order = match (leading, key) {
        (None, None) => "row_key, as the b-tree holds the entries".to_string(),
        (None, Some(_)) if equal_on_key => {
            "row_key, as the b-tree holds the entries of one value".to_string()
        }
        (None, Some(_)) => "row_key, sorted on the entries of the range".to_string(),
        (Some(first), Some(key)) if first == key && plan.order.len() == 1 => {
            format!(
                "{}, as the b-tree holds the entries",
                order_names.join(", ")
            )
        }
        (Some(first), Some(key)) if first == key => format!(
            "{}: the first key as the b-tree holds the entries, the rest sorted on them",
            order_names.join(", ")
        ),
        _ => format!(
            "{}, sorted on the entries of the range",
            order_names.join(", ")
        ),
    };
    if values > 1 {
        order.push_str("; the ranges' pages merged");
    }
    Access {
        btree,
        bounds,
        residual,
        order,
    }
}

fn predicate_text(plan: &QueryPlan, predicate: &Predicate) -> String {
    let field = &plan.index.fields[predicate.field].name;
    let values: Vec<String> = predicate.values.iter().map(value_text).collect();
    match predicate.op {
        CompareOp::In => format!("{field} in ({})", values.join(", ")),
        op => format!("{field} {} {}", op.symbol(), values.join(", ")),
    }
}

fn value_text(value: &Value) -> String {
    match value {
        Value::Null(_) => "null".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Int(i) => i.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Text(t) => format!("{t:?}"),
        Value::Bytes(b) => format!("{} bytes", b.len()),
        Value::Uuid(u) => u.to_string(),
        Value::DateTime(at) => at.to_rfc3339(),
        Value::Array(_, items) => {
            let items: Vec<String> = items.iter().map(value_text).collect();
            format!("[{}]", items.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use index_dsl::Literal;

    use super::*;
    use crate::indexes::plan::OrderBy;

    const DATASTORE: &str = "name: trips\nshards: 64\ncolumns:\n  - name: BASE\n";
    const INDEX: &str = "table: by_city\ndatastore: trips\ncolumn_defs:\n  - column_key: BASE\n    fields:\n      - { field: city, type: string }\n      - { field: at, type: datetime }\n      - { field: fare, type: float, sort: false }\n";

    fn plan(filter: &str, order: &[(&str, bool)]) -> QueryPlan {
        let defs = index_dsl::load_files(
            std::path::Path::new("defs"),
            [
                ("trips/datastore.yaml", DATASTORE),
                ("trips/indexes/by_city.yaml", INDEX),
            ],
        )
        .expect("definitions");
        let query = IndexQuery {
            index: "by_city".into(),
            shard_values: vec![Literal::String("a".into())],
            filter: Some(filter.into()),
            order_by: order
                .iter()
                .map(|(field, descending)| OrderBy {
                    field: field.to_string(),
                    descending: *descending,
                })
                .collect(),
            ..IndexQuery::default()
        };
        QueryPlan::build(&defs.datastores[0], &query).expect("a plan")
    }

    #[test]
    fn a_field_without_a_b_tree_is_a_residual_condition() {
        let access = access(&plan(
            "at > \"2026-01-01T00:00:00Z\" and fare > 10",
            &[("at", true)],
        ));
        assert_eq!(access.btree, ["city", "at", "row_key"]);
        assert_eq!(access.bounds.len(), 2, "{access:?}");
        assert_eq!(access.residual, ["fare > 10 (no b-tree: `sort: false`)"]);
        assert_eq!(
            access.order,
            "at desc, row_key, as the b-tree holds the entries"
        );
    }

    #[test]
    fn without_an_order_a_condition_on_a_sorted_field_picks_its_b_tree() {
        let ranged = access(&plan("fare > 10 and at = \"2026-01-01T00:00:00Z\"", &[]));
        assert_eq!(ranged.btree, ["city", "at", "row_key"]);
        assert_eq!(ranged.residual.len(), 1);
        let stored_only = access(&plan("fare > 10", &[]));
        assert_eq!(stored_only.btree, ["city", "row_key"]);
        assert_eq!(
            stored_only.order,
            "row_key, as the b-tree holds the entries"
        );
    }
}
