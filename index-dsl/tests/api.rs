//! The accessors the gateway codes against, on the repository's own definitions.

use std::path::Path;

use index_dsl::{load_dir, load_files, FieldType, DEFAULT_SHARDS};

#[test]
fn lookups_on_repository_definitions() {
    let defs = load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../datastores")).unwrap();
    let trips = defs.datastore("trips").unwrap();
    assert_eq!(trips.shards, DEFAULT_SHARDS);
    assert!(trips.column("BASE").is_some());
    assert!(trips.column("base").is_none());
    assert!(defs.datastore("nope").is_none());

    let index = trips.index("city_trips_index").unwrap();
    assert_eq!(index.datastore, "trips");
    assert_eq!(index.columns, ["BASE", "STATUS"]);
    assert_eq!(index.shard_field().name, "city_uuid");
    assert_eq!(index.shard_field().ty, FieldType::Uuid);
    // By name, then by path as written.
    assert_eq!(
        index.field("fare_total").unwrap().path.to_string(),
        "fare.total"
    );
    assert_eq!(index.field("fare.total").unwrap().name, "fare_total");
    assert_eq!(index.field("is_completed").unwrap().column, "STATUS");
    assert!(index.field("fare").is_none());

    let payments = defs.datastore("payments").unwrap();
    assert_eq!(payments.shards, 256);
    let refunds = payments.index("refunds_by_reason_index").unwrap();
    assert_eq!(refunds.shard_field, 3);
    assert_eq!(refunds.shard_field().name, "merchant_uuid");
}

#[test]
fn load_files_works_in_memory() {
    let defs = load_files(
        Path::new("mem"),
        [
            ("t/datastore.yaml", "name: t\ncolumns: [{ name: A }]\n"),
            (
                "t/indexes/i.yaml",
                "table: i\ndatastore: t\ncolumn_defs:\n  - column_key: A\n    fields: [{ field: x, type: int }]\n",
            ),
            ("t/README.md", "ignored"),
        ],
    )
    .unwrap();
    assert_eq!(defs.datastores[0].indexes[0].fields[0].ty, FieldType::Int);

    let err = load_files(Path::new("mem"), [("u/indexes/i.yaml", "table: i\n")]).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("mem/u/indexes/i.yaml:"), "{text}");
    assert!(text.contains("has no datastore.yaml"), "{text}");
    assert!(text.ends_with("2 errors in 2 files"), "{text}");
    let any: index_dsl::Error = err.into();
    assert!(matches!(any, index_dsl::Error::Definitions(_)));
}
