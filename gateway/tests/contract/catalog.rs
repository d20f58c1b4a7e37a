//! The catalog contract: definition and topology changes that would hide
//! cells are refused, index changes are built online, and no read or write
//! ever creates a table.

use std::sync::Arc;

use cellgate::cells::{Location, NewCell};
use cellgate::config::{ClusterConfig, ShardRange, StorageConfig};
use cellgate::indexes::IndexQuery;
use cellgate::storage::{connect, ColType, ConnectOptions, Sql};
use index_dsl::Literal;
use serde_json::json;
use uuid::Uuid;

use crate::harness::{Env, Kind};

const TRIPS: &str = "name: trips\ncolumns:\n  - name: BASE\n  - name: STATUS\n";
const TRIPS_2048: &str = "name: trips\nshards: 2048\ncolumns:\n  - name: BASE\n  - name: STATUS\n";
const BY_DRIVER: &str = "table: by_driver\ndatastore: trips\ncolumn_defs:\n  - column_key: BASE\n    fields:\n      - { field: driver, type: UUID }\n      - { field: at, type: datetime }\n";
const BY_DRIVER_WITH_CITY: &str = "table: by_driver\ndatastore: trips\ncolumn_defs:\n  - column_key: BASE\n    fields:\n      - { field: driver, type: UUID }\n      - { field: at, type: datetime }\n      - { field: city, type: string }\n";
const BY_CITY: &str = "table: by_city\ndatastore: trips\ncolumn_defs:\n  - column_key: BASE\n    fields:\n      - { field: city, type: string }\n  - column_key: STATUS\n    fields:\n      - { field: status, type: string }\n";

fn files<'a>(index_files: &[(&'a str, &'a str)], datastore: &'a str) -> Vec<(&'a str, &'a str)> {
    let mut files = vec![("trips/datastore.yaml", datastore)];
    files.extend_from_slice(index_files);
    files
}

/// Writes `n` trips of one driver in one city; returns the driver.
async fn write_trips(store: &cellgate::Store, n: usize, city: &str) -> Uuid {
    let driver = Uuid::new_v4();
    let cells: Vec<NewCell> = (0..n)
        .map(|i| NewCell {
            row_key: Uuid::new_v4(),
            column: "BASE".into(),
            ref_key: 1,
            body: json!({
                "driver": driver.to_string(),
                "at": format!("2024-02-01T00:{:02}:{:02}Z", i / 60 % 60, i % 60),
                "city": city,
            }),
        })
        .collect();
    for chunk in cells.chunks(500) {
        for result in store.put_cells("trips", chunk.to_vec()).await.unwrap() {
            result.unwrap();
        }
    }
    driver
}

fn by(index: &str, value: String) -> IndexQuery {
    IndexQuery {
        index: index.into(),
        shard_values: vec![Literal::String(value)],
        first: Some(1000),
        ..Default::default()
    }
}

pub async fn a_new_shard_count_is_refused(env: Arc<Env>) {
    let store = env
        .open_custom(&files(&[], TRIPS), env.storage(), true)
        .await
        .unwrap();
    let row = Uuid::new_v4();
    store
        .put_cell(
            "trips",
            NewCell {
                row_key: row,
                column: "BASE".into(),
                ref_key: 1,
                body: json!({"a": 1}),
            },
        )
        .await
        .unwrap();
    drop(store);
    let err = env
        .open_custom(&files(&[], TRIPS_2048), env.storage(), true)
        .await
        .err()
        .expect("a new shard count is refused");
    assert_eq!(err.code(), "CATALOG_MISMATCH");
    let message = err.to_string();
    assert!(
        message.contains("`trips` was created with 4096 shards")
            && message.contains("now says 2048"),
        "{message}"
    );
    // The original definitions still open, and the cell is there.
    let store = env
        .open_custom(&files(&[], TRIPS), env.storage(), true)
        .await
        .unwrap();
    assert!(store
        .get_cell_latest("trips", row, "BASE")
        .await
        .unwrap()
        .is_some());
}

fn two_clusters(a: &str, b: &str, split: Option<u32>) -> StorageConfig {
    let mut shards = std::collections::BTreeMap::new();
    if let Some(split) = split {
        shards.insert(
            "trips".to_string(),
            vec![
                ShardRange {
                    first: 0,
                    last: split - 1,
                    cluster: "a".into(),
                },
                ShardRange {
                    first: split,
                    last: 4095,
                    cluster: "b".into(),
                },
            ],
        );
    }
    StorageConfig {
        clusters: vec![
            ClusterConfig {
                name: "a".into(),
                master: a.to_string(),
                replicas: vec![],
            },
            ClusterConfig {
                name: "b".into(),
                master: b.to_string(),
                replicas: vec![],
            },
        ],
        shards,
        ..StorageConfig::default()
    }
}

pub async fn shards_moved_between_clusters_are_refused(env: Arc<Env>) {
    let other = env.extra_url().await;
    let defs = files(&[("trips/indexes/by_driver.yaml", BY_DRIVER)], TRIPS);
    let store = env
        .open_custom(&defs, two_clusters(&env.url, &other, None), true)
        .await
        .unwrap();
    assert_eq!(
        store.topology("trips"),
        vec![(0, 2047, "a".to_string()), (2048, 4095, "b".to_string())]
    );
    let driver = write_trips(&store, 50, "Lyon").await;
    store.sync_indexes().await.unwrap();
    let page = store
        .query_index("trips", &by("by_driver", driver.to_string()))
        .await
        .unwrap();
    assert_eq!(page.entries.len(), 50, "entries from both clusters");
    drop(store);
    let err = env
        .open_custom(&defs, two_clusters(&env.url, &other, Some(1024)), true)
        .await
        .err()
        .expect("moved shard ranges are refused");
    assert_eq!(err.code(), "CATALOG_MISMATCH");
    assert!(
        err.to_string()
            .contains("cluster `a` holds shards 0-2047 of `trips` but the topology now routes shards 0-1023 to it"),
        "{err}"
    );
}

pub async fn a_new_index_is_built_from_the_log(env: Arc<Env>) {
    let store = env
        .open_custom(
            &files(&[("trips/indexes/by_driver.yaml", BY_DRIVER)], TRIPS),
            env.storage(),
            true,
        )
        .await
        .unwrap();
    write_trips(&store, 300, "Lyon").await;
    drop(store);
    let with_city = files(
        &[
            ("trips/indexes/by_driver.yaml", BY_DRIVER),
            ("trips/indexes/by_city.yaml", BY_CITY),
        ],
        TRIPS,
    );
    // Maintenance off: the new index stays unbuilt, and says so.
    let store = env
        .open_custom(&with_city, env.storage(), false)
        .await
        .unwrap();
    let status = store.indexes("trips").unwrap();
    assert!(
        status.iter().any(|i| i.name == "by_city" && !i.ready),
        "{status:?}"
    );
    let err = store
        .query_index("trips", &by("by_city", "Lyon".into()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "INDEX_BUILDING");
    store.sync_indexes().await.unwrap();
    let page = store
        .query_index("trips", &by("by_city", "Lyon".into()))
        .await
        .unwrap();
    assert_eq!(page.entries.len(), 300, "backfilled from the cell log");
    drop(store);
    // Built once, ready for every later gateway.
    let store = env
        .open_custom(&with_city, env.storage(), false)
        .await
        .unwrap();
    assert!(store.indexes("trips").unwrap().iter().all(|i| i.ready));
}

pub async fn a_changed_index_gets_a_new_version(env: Arc<Env>) {
    let v1 = files(&[("trips/indexes/by_driver.yaml", BY_DRIVER)], TRIPS);
    let store = env.open_custom(&v1, env.storage(), true).await.unwrap();
    let driver = write_trips(&store, 120, "Oslo").await;
    store.sync_indexes().await.unwrap();
    drop(store);
    let v2 = files(
        &[("trips/indexes/by_driver.yaml", BY_DRIVER_WITH_CITY)],
        TRIPS,
    );
    let store = env.open_custom(&v2, env.storage(), false).await.unwrap();
    let status = &store.indexes("trips").unwrap()[0];
    assert_eq!(
        (status.version, status.table.as_str(), status.ready),
        (2, "trips_ix_by_driver_v2", false)
    );
    assert!(
        store
            .warnings()
            .iter()
            .any(|w| w.contains("building version 2") && w.contains("--index-version 1")),
        "{:?}",
        store.warnings()
    );
    assert_eq!(
        store
            .query_index("trips", &by("by_driver", driver.to_string()))
            .await
            .unwrap_err()
            .code(),
        "INDEX_BUILDING"
    );
    store.sync_indexes().await.unwrap();
    let page = store
        .query_index("trips", &by("by_driver", driver.to_string()))
        .await
        .unwrap();
    assert_eq!(page.entries.len(), 120);
    assert!(page.entries[0]
        .fields
        .iter()
        .any(|(name, value)| name == "city" && value.as_text() == Some("Oslo")));
    // The current version cannot be dropped; the old one can.
    assert_eq!(
        store
            .drop_index("trips", "by_driver", None)
            .await
            .unwrap_err()
            .code(),
        "BAD_USER_INPUT"
    );
    let dropped = store
        .drop_index("trips", "by_driver", Some(1))
        .await
        .unwrap();
    assert_eq!(dropped, vec!["main: trips_ix_by_driver".to_string()]);
    assert!(!table_names(&env)
        .await
        .contains(&"trips_ix_by_driver".to_string()));
}

pub async fn a_removed_index_keeps_its_table_until_dropped(env: Arc<Env>) {
    let both = files(
        &[
            ("trips/indexes/by_driver.yaml", BY_DRIVER),
            ("trips/indexes/by_city.yaml", BY_CITY),
        ],
        TRIPS,
    );
    let store = env.open_custom(&both, env.storage(), true).await.unwrap();
    write_trips(&store, 10, "Rome").await;
    drop(store);
    let one = files(&[("trips/indexes/by_driver.yaml", BY_DRIVER)], TRIPS);
    let store = env.open_custom(&one, env.storage(), true).await.unwrap();
    assert!(
        store
            .warnings()
            .iter()
            .any(|w| w.contains("index `by_city` (version 1) of `trips` is no longer defined")),
        "{:?}",
        store.warnings()
    );
    assert!(table_names(&env)
        .await
        .contains(&"trips_ix_by_city".to_string()));
    let dropped = store.drop_index("trips", "by_city", None).await.unwrap();
    assert_eq!(dropped, vec!["main: trips_ix_by_city".to_string()]);
    assert!(!table_names(&env)
        .await
        .contains(&"trips_ix_by_city".to_string()));
    drop(store);
    let store = env.open_custom(&one, env.storage(), true).await.unwrap();
    assert!(store.warnings().is_empty(), "{:?}", store.warnings());
}

async fn table_names(env: &Env) -> Vec<String> {
    let backend = connect(&env.url, &ConnectOptions::default()).await.unwrap();
    let rows = backend
        .fetch(
            &backend.dialect().tables_with_prefix("trips_"),
            &[ColType::Text],
        )
        .await
        .unwrap();
    rows.into_iter()
        .map(|r| r[0].as_text().unwrap().to_string())
        .collect()
}

/// Tables and indexes in the test database.
async fn schema_objects(env: &Env) -> i64 {
    let backend = connect(&env.url, &ConnectOptions::default()).await.unwrap();
    let mut sql = Sql::new(backend.dialect());
    sql.push(match env.kind {
        Kind::Sqlite => "SELECT COUNT(*) FROM sqlite_master",
        Kind::MySql => {
            "SELECT (SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE()) \
             + (SELECT COUNT(DISTINCT table_name, index_name) FROM information_schema.statistics \
             WHERE table_schema = DATABASE())"
        }
        Kind::Postgres => {
            "SELECT COUNT(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = current_schema()"
        }
    });
    backend.fetch(&sql, &[ColType::Int]).await.unwrap()[0][0]
        .as_int()
        .unwrap()
}

// Regression: reading the log of every shard created tables (minutes of
// DDL and a growing file on SQLite); reads and writes must never run DDL.
pub async fn reads_and_writes_create_no_tables(env: Arc<Env>) {
    let store = env.open().await;
    let before = schema_objects(&env).await;
    assert!(
        before < 120,
        "a few dozen schema objects, not per shard: {before}"
    );
    for shard in 0..crate::harness::TRIP_SHARDS {
        store
            .cells_for_shard("trips", shard, Location::AddedId(0), 1)
            .await
            .unwrap();
    }
    let rows: Vec<Uuid> = (0..500).map(|_| Uuid::new_v4()).collect();
    let cells: Vec<NewCell> = rows
        .iter()
        .map(|r| NewCell {
            row_key: *r,
            column: "BASE".into(),
            ref_key: 1,
            body: json!({"driver_partner_uuid": Uuid::new_v4().to_string()}),
        })
        .collect();
    for result in store.put_cells("trips", cells).await.unwrap() {
        result.unwrap();
    }
    let wanted: Vec<(Uuid, String)> = rows.iter().map(|r| (*r, "BASE".to_string())).collect();
    assert!(store
        .get_cells_latest("trips", &wanted)
        .await
        .unwrap()
        .iter()
        .all(Option::is_some));
    store.sync_indexes().await.unwrap();
    store
        .query_index(
            "trips",
            &by("driver_partner_index", Uuid::new_v4().to_string()),
        )
        .await
        .unwrap();
    assert_eq!(
        schema_objects(&env).await,
        before,
        "no DDL on the request path"
    );
}
