//! `cellgate index explain`: how an index query is answered now — the
//! version and shards it reads, the b-tree whose range it reads, the
//! conditions that bound that range and those checked on each entry read
//! (on fields stored without a b-tree, `sort: false`, among others), how
//! its order comes about, and each cluster's statement with the database's
//! own plan of it.

use std::process::ExitCode;

use cellgate_store::indexes::{IndexExplain, IndexQuery, OrderBy};
use clap::Args;
use serde_json::json;

use super::store_args::StoreArgs;

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The datastore.
    pub datastore: String,
    /// The index (its `table` name).
    pub index: String,
    /// The query's conditions in the filter language, the shard field's
    /// value among them: `city_uuid = "…" and fare_total > 10`.
    #[arg(long, value_name = "FILTER", env = "CELLGATE_EXPLAIN_FILTER")]
    pub filter: String,
    /// An order key, `FIELD` or `FIELD:desc`; repeatable, first key first.
    #[arg(
        long,
        value_name = "FIELD[:desc]",
        env = "CELLGATE_EXPLAIN_ORDER_BY",
        value_delimiter = ','
    )]
    pub order_by: Vec<String>,
    /// Page size.
    #[arg(long, value_name = "N", env = "CELLGATE_EXPLAIN_FIRST")]
    pub first: Option<u32>,
    /// Print JSON instead of text.
    #[arg(long, env = "CELLGATE_EXPLAIN_JSON")]
    pub json: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

pub async fn explain(args: ExplainArgs) -> anyhow::Result<ExitCode> {
    let mut order_by = Vec::new();
    for key in &args.order_by {
        let (field, descending) = match key.rsplit_once(':') {
            Some((field, "desc")) => (field, true),
            Some((field, "asc")) => (field, false),
            Some((_, other)) => {
                anyhow::bail!("--order-by `{key}`: the direction is `asc` or `desc`, not `{other}`")
            }
            None => (key.as_str(), false),
        };
        order_by.push(OrderBy {
            field: field.to_string(),
            descending,
        });
    }
    let Some(store) = args.store.open().await? else {
        return Ok(ExitCode::FAILURE);
    };
    let query = IndexQuery {
        index: args.index.clone(),
        filter: Some(args.filter.clone()),
        order_by,
        first: args.first,
        ..IndexQuery::default()
    };
    let explained = store
        .explain_index_query(&args.datastore, &query)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&as_json(&explained))?);
    } else {
        print!("{}", text(&explained));
    }
    Ok(ExitCode::SUCCESS)
}

fn as_json(e: &IndexExplain) -> serde_json::Value {
    json!({
        "datastore": e.datastore,
        "index": e.index,
        "version": e.version,
        "table": e.table,
        "previous_version": e.previous,
        "shards": e.shards.iter().map(|(shard, values)| json!({"shard": shard, "values": values})).collect::<Vec<_>>(),
        "btree": e.btree,
        "bounds": e.bounds,
        "residual": e.residual,
        "order": e.order,
        "limit": e.limit,
        "statements": e.statements.iter().map(|s| json!({
            "cluster": s.cluster,
            "sql": s.sql,
            "params": s.params,
            "database_plan": s.database_plan,
        })).collect::<Vec<_>>(),
    })
}

fn text(e: &IndexExplain) -> String {
    let mut out = format!(
        "index `{}` of `{}`: version {} (table {}){}\n",
        e.index,
        e.datastore,
        e.version,
        e.table,
        if e.previous {
            ", the previous version, which answers while the new one is built"
        } else {
            ""
        }
    );
    let shards: Vec<String> = e
        .shards
        .iter()
        .map(|(shard, values)| format!("{shard} ({})", values.join(", ")))
        .collect();
    out.push_str(&format!("  shards:   {}\n", shards.join(", ")));
    out.push_str(&format!("  b-tree:   ({})\n", e.btree.join(", ")));
    out.push_str(&format!("  range:    {}\n", e.bounds.join(" and ")));
    if e.residual.is_empty() {
        out.push_str("  residual: none\n");
    } else {
        out.push_str(&format!(
            "  residual: {} (checked on each entry of the range)\n",
            e.residual.join(" and ")
        ));
    }
    out.push_str(&format!("  order:    {}\n", e.order));
    out.push_str(&format!(
        "  page:     {} entries (one more is read to tell whether another page follows)\n",
        e.limit
    ));
    for statement in &e.statements {
        out.push_str(&format!(
            "\ncluster {}:\n  {}\n",
            statement.cluster, statement.sql
        ));
        if !statement.params.is_empty() {
            out.push_str(&format!("  parameters: {}\n", statement.params.join(", ")));
        }
        out.push_str("  the database's plan:\n");
        for line in &statement.database_plan {
            out.push_str(&format!("    {line}\n"));
        }
    }
    out
}
