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
                    "    {}: {} <- {}.{}",
                    f.name,
                    f.ty.name(),
                    f.column,
                    f.path
                )
                .unwrap();
            }
        }
    }
    out
}
