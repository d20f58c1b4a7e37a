//! Helpers shared by the integration tests.

use std::fmt::Write;

use index_dsl::Definitions;

/// A compact, stable rendering of loaded definitions for snapshots.
pub fn summary(defs: &Definitions) -> String {
    let mut out = String::new();
    for ds in &defs.datastores {
        let columns: Vec<&str> = ds.columns.iter().map(|c| c.name.as_str()).collect();
        writeln!(
            out,
            "datastore {} shards={} columns=[{}]",
            ds.name,
            ds.shards,
            columns.join(", ")
        )
        .unwrap();
        for index in &ds.indexes {
            writeln!(
                out,
                "  index {} columns=[{}] shard_field={}",
                index.name,
                index.columns.join(", "),
                index.shard_field().name
            )
            .unwrap();
            for f in &index.fields {
                writeln!(
                    out,
                    "    {}: {} <- {}.{}{}",
                    f.name,
                    f.ty.name(),
                    f.column,
                    f.path,
                    if f.sorted { "" } else { " (sort: false)" }
                )
                .unwrap();
            }
            if let Some(predicate) = &index.predicate {
                writeln!(out, "    where {predicate}").unwrap();
            }
        }
        for t in &ds.triggers {
            let headers: Vec<String> = t
                .webhook
                .headers
                .iter()
                .map(|(name, value)| format!("{name}: {value}"))
                .collect();
            writeln!(
                out,
                "  trigger {} columns=[{}] batch_size={} max_attempts={} filter={:?}",
                t.name,
                t.columns.join(", "),
                t.batch_size,
                t.max_attempts,
                t.filter_text
            )
            .unwrap();
            writeln!(
                out,
                "    POST {} timeout_ms={} secret_env={:?} headers=[{}]",
                t.webhook.url,
                t.webhook.timeout_ms,
                t.webhook.secret_env,
                headers.join(", ")
            )
            .unwrap();
        }
    }
    out
}
