//! The catalog contract: definition and topology changes that would hide
//! cells are refused, index changes are built online, and no read or write
//! ever creates a table.

use std::sync::Arc;

use cellgate_store::cells::{Location, NewCell};
use cellgate_store::indexes::{IndexQuery, PassHook, PassPoint, PassStage};
use cellgate_store::storage::{connect, ColType, ConnectOptions, Sql};
use cellgate_store::{ClusterConfig, ShardRange, StorageConfig, Store, StoreOptions};
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
async fn write_trips(store: &cellgate_store::Store, n: usize, city: &str) -> Uuid {
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

pub async fn configured_ranges_only_seed_the_stored_topology(env: Arc<Env>) {
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
    // Cells spread over two clusters are not joined to the index page.
    let joined = store
        .query_index_with_cells_json(
            "trips",
            &by("by_driver", driver.to_string()),
            &["BASE"],
            &Default::default(),
        )
        .await
        .unwrap();
    assert!(joined.is_none(), "a page joined across clusters");
    drop(store);
    // Other ranges in the configuration move nothing: the stored topology
    // is served (only `cellgate shard move` changes it), with a warning.
    let store = env
        .open_custom(&defs, two_clusters(&env.url, &other, Some(1024)), true)
        .await
        .expect("the stored topology is served");
    assert_eq!(
        store.topology("trips"),
        vec![(0, 2047, "a".to_string()), (2048, 4095, "b".to_string())]
    );
    assert!(
        store.warnings().iter().any(|w| w.contains(
            "the configuration's shard ranges differ from the stored topology (version 1: 0-2047:a,2048-4095:b)"
        )),
        "{:?}",
        store.warnings()
    );
    let page = store
        .query_index("trips", &by("by_driver", driver.to_string()))
        .await
        .unwrap();
    assert_eq!(page.entries.len(), 50, "nothing hidden");
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
    // A query of every field (`city` too) waits for version 2.
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
        .any(|(name, value)| &**name == "city" && value.as_text() == Some("Oslo")));
    // The current version cannot be dropped; the old one can, once the
    // gateways had time to switch (or at once, when told so).
    assert_eq!(
        store
            .drop_index("trips", "by_driver", None)
            .await
            .unwrap_err()
            .code(),
        "BAD_USER_INPUT"
    );
    let err = store
        .drop_index("trips", "by_driver", Some(1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "BAD_USER_INPUT", "{err}");
    let dropped = store
        .drop_index_with("trips", "by_driver", Some(1), false)
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

pub async fn a_removed_index_added_again_changed_has_no_previous_version(env: Arc<Env>) {
    let both = files(
        &[
            ("trips/indexes/by_driver.yaml", BY_DRIVER),
            ("trips/indexes/by_city.yaml", BY_CITY),
        ],
        TRIPS,
    );
    let store = env.open_custom(&both, env.storage(), false).await.unwrap();
    write_trips(&store, 10, "Rome").await;
    store.sync_indexes().await.unwrap();
    drop(store);
    // Removed: nothing maintains `by_city` from now on.
    let one = files(&[("trips/indexes/by_driver.yaml", BY_DRIVER)], TRIPS);
    let store = env.open_custom(&one, env.storage(), false).await.unwrap();
    write_trips(&store, 5, "Rome").await;
    drop(store);
    // Added again with another field: version 1 missed the writes since,
    // so it does not answer for version 2.
    let by_city_changed = BY_CITY.replace(
        "      - { field: city, type: string }\n",
        "      - { field: city, type: string }\n      - { field: at, type: datetime }\n",
    );
    assert_ne!(by_city_changed, BY_CITY);
    let again = files(
        &[
            ("trips/indexes/by_driver.yaml", BY_DRIVER),
            ("trips/indexes/by_city.yaml", &by_city_changed),
        ],
        TRIPS,
    );
    let store = env.open_custom(&again, env.storage(), false).await.unwrap();
    let status: Vec<_> = store
        .indexes("trips")
        .unwrap()
        .into_iter()
        .filter(|i| i.name == "by_city")
        .map(|i| (i.version, i.ready, i.serves_until))
        .collect();
    assert_eq!(status, [(2, false, None)]);
    let err = store
        .query_index(
            "trips",
            &IndexQuery {
                fields: vec!["city".into()],
                ..by("by_city", "Rome".into())
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), "INDEX_BUILDING", "{err}");
    store.sync_indexes().await.unwrap();
    let page = store
        .query_index("trips", &by("by_city", "Rome".into()))
        .await
        .unwrap();
    assert_eq!(page.entries.len(), 15);
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

/// How many indexes called `name` the cell table of `trips` has (its name
/// on MySQL, where index names are per table, or in the schema elsewhere).
async fn cell_table_indexes(env: &Env, name: &str) -> i64 {
    let sql = match env.kind {
        Kind::Sqlite => format!(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = 'trips_cells_{name}'"
        ),
        Kind::MySql => format!(
            "SELECT COUNT(DISTINCT index_name) FROM information_schema.statistics \
             WHERE table_schema = DATABASE() AND table_name = 'trips_cells' AND index_name = '{name}'"
        ),
        Kind::Postgres => format!(
            "SELECT COUNT(*) FROM pg_indexes WHERE schemaname = current_schema() \
             AND indexname = 'trips_cells_{name}'"
        ),
    };
    crate::harness::scalar(env.kind, &env.url, &sql)
        .await
        .unwrap_or(0)
}

// The cell table's `(shard, created_at)` b-tree, which earlier versions
// created and every write paid for, is dropped when a gateway starts on
// their tables; the cells and reads of the log by time are unchanged.
pub async fn the_cell_tables_time_index_of_earlier_versions_is_dropped(env: Arc<Env>) {
    let store = env.open().await;
    assert_eq!(cell_table_indexes(&env, "created").await, 0);
    assert_eq!(
        cell_table_indexes(&env, "key").await,
        1,
        "the query names the indexes the table has"
    );
    let row = Uuid::new_v4();
    let shard = cellgate_store::shards::row_shard(&row, crate::harness::TRIP_SHARDS);
    let before = chrono::Utc::now() - chrono::Duration::seconds(1);
    store
        .put_cell("trips", crate::cell(row, "BASE", 1, json!({"a": 1})))
        .await
        .unwrap();
    drop(store);
    let create = match env.kind {
        Kind::MySql => "ALTER TABLE trips_cells ADD KEY created (shard, created_at)",
        _ => "CREATE INDEX trips_cells_created ON trips_cells (shard, created_at)",
    };
    crate::harness::execute(env.kind, &env.url, create).await;
    assert_eq!(cell_table_indexes(&env, "created").await, 1);

    // A transaction reading the table holds the drop's lock: the start
    // does not wait for it (statements of other gateways would queue
    // behind the waiting drop), and leaves the index to the next start.
    if let Some(reader) =
        crate::harness::read_in_open_transaction(env.kind, &env.url, "trips_cells").await
    {
        let store = tokio::time::timeout(std::time::Duration::from_secs(60), env.open())
            .await
            .expect("the start waits for the reader's transaction to end");
        assert_eq!(cell_table_indexes(&env, "created").await, 1);
        assert!(store
            .get_cell_latest("trips", row, "BASE")
            .await
            .unwrap()
            .is_some());
        drop(store);
        drop(reader);
    }

    let store = env.open().await;
    assert_eq!(
        cell_table_indexes(&env, "created").await,
        0,
        "dropped at start-up"
    );
    let log = store
        .cells_for_shard("trips", shard, Location::Timestamp(before), 10)
        .await
        .unwrap();
    assert_eq!(
        log.cells.iter().map(|c| c.row_key).collect::<Vec<_>>(),
        vec![row]
    );
    drop(store);
    // A start without it has nothing to drop.
    let store = env.open().await;
    assert!(store
        .get_cell_latest("trips", row, "BASE")
        .await
        .unwrap()
        .is_some());
}

/// Creates a table of the per-shard layout of earlier versions.
async fn v1_table(
    backend: &dyn cellgate_store::storage::Backend,
    kind: Kind,
    name: &str,
    columns: &str,
) {
    let types = |sql: &str| -> String {
        let (uuid, time, blob, text, id) = match kind {
            Kind::Sqlite => (
                "BLOB",
                "INTEGER",
                "BLOB",
                "TEXT",
                "INTEGER PRIMARY KEY AUTOINCREMENT",
            ),
            Kind::MySql => (
                "BINARY(16)",
                "DATETIME(6)",
                "LONGBLOB",
                "VARCHAR(128) COLLATE utf8mb4_bin",
                "BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY",
            ),
            Kind::Postgres => (
                "UUID",
                "TIMESTAMPTZ",
                "BYTEA",
                "TEXT COLLATE \"C\"",
                "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
            ),
        };
        sql.replace("$UUID", uuid)
            .replace("$TIME", time)
            .replace("$BLOB", blob)
            .replace("$TEXT", text)
            .replace("$ID", id)
    };
    let mut sql = Sql::new(backend.dialect());
    sql.push(&format!("CREATE TABLE {name} ({})", types(columns)));
    backend.execute(&sql).await.unwrap();
}

// Stores of the per-shard layout are refused with the command that
// converts them, and the conversion keeps every cell with its shard and
// added id.
pub async fn a_v1_store_is_refused_then_converted(env: Arc<Env>) {
    use cellgate_store::cells::{codec, CellKey};
    use cellgate_store::shards::row_shard;
    use cellgate_store::storage::Value;
    let backend = connect(&env.url, &ConnectOptions::default()).await.unwrap();
    let dialect = backend.dialect();
    v1_table(
        backend.as_ref(),
        env.kind,
        "cellgate_shards",
        "datastore $TEXT NOT NULL, shard BIGINT NOT NULL, created_at $TIME NOT NULL, schema_hash $TEXT, PRIMARY KEY (datastore, shard)",
    )
    .await;
    let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
    let driver = Uuid::new_v4();
    let now =
        chrono::DateTime::from_timestamp_micros(chrono::Utc::now().timestamp_micros()).unwrap();
    let mut cells = vec![
        (
            a,
            "BASE",
            1,
            json!({"driver": driver.to_string(), "at": "2024-01-01T00:00:00Z"}),
        ),
        (a, "STATUS", 1, json!({"status": "requested"})),
        (
            a,
            "BASE",
            2,
            json!({"driver": driver.to_string(), "at": "2024-01-02T00:00:00Z"}),
        ),
        (
            b,
            "BASE",
            1,
            json!({"driver": driver.to_string(), "at": "2024-01-03T00:00:00Z"}),
        ),
    ];
    for row in [a, b] {
        let shard = row_shard(&row, crate::harness::TRIP_SHARDS);
        let prefix = format!("trips_s{shard}_");
        v1_table(
            backend.as_ref(),
            env.kind,
            &format!("{prefix}cells"),
            "added_id $ID, row_key $UUID NOT NULL, column_name $TEXT NOT NULL, ref_key BIGINT NOT NULL, body $BLOB NOT NULL, created_at $TIME NOT NULL",
        )
        .await;
        v1_table(
            backend.as_ref(),
            env.kind,
            &format!("{prefix}meta"),
            "id INTEGER NOT NULL, writes BIGINT NOT NULL",
        )
        .await;
        v1_table(
            backend.as_ref(),
            env.kind,
            &format!("{prefix}ix_by_driver"),
            "row_key $UUID NOT NULL",
        )
        .await;
        let mut register = Sql::new(dialect);
        register
            .push("INSERT INTO cellgate_shards (datastore, shard, created_at) VALUES (")
            .bind(Value::Text("trips".into()))
            .push(", ")
            .bind(Value::Int(i64::from(shard)))
            .push(", ")
            .bind(Value::DateTime(now))
            .push(")");
        backend.execute(&register).await.unwrap();
        for (row_key, column, ref_key, body) in cells.iter().filter(|c| c.0 == row) {
            let mut insert = Sql::new(dialect);
            insert
                .push(&format!(
                    "INSERT INTO {prefix}cells (row_key, column_name, ref_key, body, created_at) VALUES ("
                ))
                .bind(Value::Uuid(*row_key))
                .push(", ")
                .bind(Value::Text(column.to_string()))
                .push(", ")
                .bind(Value::Int(*ref_key))
                .push(", ")
                .bind(Value::Bytes(codec::encode(body).unwrap()))
                .push(", ")
                .bind(Value::DateTime(now))
                .push(")");
            backend.execute(&insert).await.unwrap();
        }
    }
    // A buffered cell kept on this cluster for a shard it does not hold.
    let buffered_row = Uuid::new_v4();
    let buffer = format!(
        "trips_s{}_buffer",
        row_shard(&buffered_row, crate::harness::TRIP_SHARDS)
    );
    v1_table(
        backend.as_ref(),
        env.kind,
        &buffer,
        "buffer_id $ID, row_key $UUID NOT NULL, column_name $TEXT NOT NULL, ref_key BIGINT NOT NULL, body $BLOB NOT NULL, created_at $TIME NOT NULL",
    )
    .await;
    let mut insert = Sql::new(dialect);
    insert
        .push(&format!(
            "INSERT INTO {buffer} (row_key, column_name, ref_key, body, created_at) VALUES ("
        ))
        .bind(Value::Uuid(buffered_row))
        .push(", ")
        .bind(Value::Text("STATUS".into()))
        .push(", ")
        .bind(Value::Int(1))
        .push(", ")
        .bind(Value::Bytes(
            codec::encode(&json!({"status": "buffered"})).unwrap(),
        ))
        .push(", ")
        .bind(Value::DateTime(now))
        .push(")");
    backend.execute(&insert).await.unwrap();

    let defs = files(&[("trips/indexes/by_driver.yaml", BY_DRIVER)], TRIPS);
    let err = env
        .open_custom(&defs, env.storage(), false)
        .await
        .err()
        .expect("the old layout is refused");
    assert_eq!(err.code(), "LAYOUT_UPGRADE_REQUIRED");
    assert!(
        err.to_string().contains("cellgate migrate --from-v1"),
        "{err}"
    );

    let parsed = index_dsl::load_files(std::path::Path::new("defs"), defs.iter().copied()).unwrap();
    let summary = cellgate_store::upgrade::convert_v1(parsed, env.storage(), |_, _| {})
        .await
        .unwrap();
    assert_eq!((summary.shards, summary.cells, summary.buffered), (2, 4, 1));
    let left: Vec<String> = table_names(&env)
        .await
        .into_iter()
        .filter(|t| t.starts_with("trips_s") && t != "trips_shards")
        .collect();
    assert!(left.is_empty(), "old tables left: {left:?}");

    let store = env.open_custom(&defs, env.storage(), false).await.unwrap();
    assert_eq!(
        store
            .query_index("trips", &by("by_driver", driver.to_string()))
            .await
            .unwrap_err()
            .code(),
        "INDEX_BUILDING",
        "indexes are rebuilt from the log"
    );
    let keys: Vec<CellKey> = cells
        .iter()
        .map(|(row_key, column, ref_key, _)| CellKey {
            row_key: *row_key,
            column: column.to_string(),
            ref_key: *ref_key,
        })
        .collect();
    let read = store.get_cells("trips", &keys).await.unwrap();
    let a_ids: Vec<i64> = read[..3]
        .iter()
        .map(|c| c.as_ref().unwrap().added_id)
        .collect();
    assert_eq!(a_ids, vec![1, 2, 3], "added ids kept");
    for ((row_key, _, _, body), got) in cells.iter().zip(&read) {
        let got = got.as_ref().unwrap();
        assert_eq!(&got.body, body);
        assert_eq!(got.shard, row_shard(row_key, crate::harness::TRIP_SHARDS));
    }
    store.sync_indexes().await.unwrap();
    let page = store
        .query_index("trips", &by("by_driver", driver.to_string()))
        .await
        .unwrap();
    assert_eq!(page.entries.len(), 2);
    // The next write to the shard continues its added ids.
    cells.push((a, "BASE", 3, json!({"driver": driver.to_string()})));
    let (row_key, column, ref_key, body) = cells.last().unwrap().clone();
    store
        .put_cell(
            "trips",
            NewCell {
                row_key,
                column: column.into(),
                ref_key,
                body,
            },
        )
        .await
        .unwrap();
    let latest = store
        .get_cell_latest("trips", a, "BASE")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(latest.added_id, 4);
}

/// Definitions from `files`, as `Store::reload` takes them.
fn definitions(files: &[(&str, &str)]) -> index_dsl::Definitions {
    index_dsl::load_files(std::path::Path::new("defs"), files.iter().copied())
        .unwrap_or_else(|e| panic!("test definitions are invalid:\n{e}"))
}

/// Queries `index` for `value` until it answers `count` entries; only
/// `INDEX_BUILDING` may come before.
async fn until_built(
    store: &cellgate_store::Store,
    index: &str,
    value: &str,
    count: usize,
) -> cellgate_store::indexes::IndexPage {
    for _ in 0..3000 {
        store.sync_indexes().await.unwrap();
        match store
            .query_index("trips", &by(index, value.to_string()))
            .await
        {
            Ok(page) if page.entries.len() == count => return page,
            Ok(page) => assert!(page.entries.len() < count, "{}", page.entries.len()),
            Err(err) => assert_eq!(err.code(), "INDEX_BUILDING", "{err}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("index `{index}` was not built");
}

pub async fn a_reload_builds_new_indexes_and_keeps_removed_tables(env: Arc<Env>) {
    let one = files(&[("trips/indexes/by_driver.yaml", BY_DRIVER)], TRIPS);
    let store = env.open_custom(&one, env.storage(), true).await.unwrap();
    let driver = write_trips(&store, 40, "Lyon").await.to_string();
    until_built(&store, "by_driver", &driver, 40).await;

    // What a running store cannot change is refused, and nothing changes.
    let err = store
        .reload(definitions(&files(
            &[
                ("trips/indexes/by_driver.yaml", BY_DRIVER),
                ("trips/indexes/by_city.yaml", BY_CITY),
            ],
            TRIPS_2048,
        )))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "RELOAD_REFUSED", "{err}");
    assert!(err.to_string().contains("shard count is fixed"), "{err}");
    assert_eq!(store.indexes("trips").unwrap().len(), 1);
    assert!(!table_names(&env)
        .await
        .contains(&"trips_ix_by_city".to_string()));

    // Added: its table is created and filled from the log.
    let two = files(
        &[
            ("trips/indexes/by_driver.yaml", BY_DRIVER),
            ("trips/indexes/by_city.yaml", BY_CITY),
        ],
        TRIPS,
    );
    let report = store.reload(definitions(&two)).await.unwrap();
    assert_eq!(
        report.changes,
        ["index `by_city` of `trips` added (version 1, filled from the cell log; INDEX_BUILDING until it has caught up)"]
    );
    until_built(&store, "by_city", "Lyon", 40).await;
    // The index that stayed kept serving, and keeps being maintained.
    let more = write_trips(&store, 5, "Lyon").await.to_string();
    until_built(&store, "by_driver", &more, 5).await;
    until_built(&store, "by_city", "Lyon", 45).await;
    assert!(store.reload(definitions(&two)).await.unwrap().unchanged());

    // Changed: a new table version, built the same way.
    let changed = files(
        &[
            ("trips/indexes/by_driver.yaml", BY_DRIVER_WITH_CITY),
            ("trips/indexes/by_city.yaml", BY_CITY),
        ],
        TRIPS,
    );
    let report = store.reload(definitions(&changed)).await.unwrap();
    assert_eq!(
        report.changes,
        ["index `by_driver` of `trips` changed: version 2 replaces version 1 (filled from the cell log; version 1 answers the queries it can answer until then)"]
    );
    let page = until_built(&store, "by_driver", &driver, 40).await;
    assert!(page.entries[0]
        .fields
        .iter()
        .any(|(name, value)| &**name == "city" && value.as_text() == Some("Lyon")));

    // Removed: no longer served; its table stays until dropped.
    let without_city = files(
        &[("trips/indexes/by_driver.yaml", BY_DRIVER_WITH_CITY)],
        TRIPS,
    );
    let before = store.snapshot();
    let report = store.reload(definitions(&without_city)).await.unwrap();
    assert_eq!(report.changes.len(), 1, "{:?}", report.changes);
    // A request pinned to the snapshot it started on still reads it.
    let page = cellgate_store::Store::pinned(
        before,
        store.query_index("trips", &by("by_city", "Lyon".into())),
    )
    .await
    .unwrap();
    assert_eq!(page.entries.len(), 45);
    assert!(report.changes[0].starts_with("index `by_city` of `trips` removed"));
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    assert_eq!(
        store
            .query_index("trips", &by("by_city", "Lyon".into()))
            .await
            .unwrap_err()
            .code(),
        "UNKNOWN_INDEX"
    );
    assert!(table_names(&env)
        .await
        .contains(&"trips_ix_by_city".to_string()));
    until_built(&store, "by_driver", &more, 5).await;

    // A new datastore: its tables and shard rows, then writes and its index.
    let mut with_payments = without_city.clone();
    with_payments.push((
        "payments/datastore.yaml",
        "name: payments\nshards: 16\ncolumns:\n  - name: BASE\n",
    ));
    with_payments.push((
        "payments/indexes/by_merchant.yaml",
        "table: by_merchant\ndatastore: payments\ncolumn_defs:\n  - column_key: BASE\n    fields:\n      - { field: merchant, type: string }\n",
    ));
    let report = store.reload(definitions(&with_payments)).await.unwrap();
    assert_eq!(
        report.changes[0], "datastore `payments` added (16 shards)",
        "{:?}",
        report.changes
    );
    let cells: Vec<NewCell> = (0..20)
        .map(|_| NewCell {
            row_key: Uuid::new_v4(),
            column: "BASE".into(),
            ref_key: 1,
            body: json!({"merchant": "m-1"}),
        })
        .collect();
    for result in store.put_cells("payments", cells).await.unwrap() {
        result.unwrap();
    }
    for _ in 0..3000 {
        store.sync_indexes().await.unwrap();
        match store
            .query_index("payments", &by("by_merchant", "m-1".into()))
            .await
        {
            Ok(page) if page.entries.len() == 20 => return,
            Ok(_) => {}
            Err(err) => assert_eq!(err.code(), "INDEX_BUILDING", "{err}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the index of the new datastore was not built");
}

/// `by_driver` queries returning and ordering by the fields of its first
/// version only.
fn by_driver_v1_fields(driver: &str, after: Option<String>) -> IndexQuery {
    IndexQuery {
        fields: vec!["driver".into(), "at".into()],
        order_by: vec![cellgate_store::indexes::OrderBy {
            field: "at".into(),
            descending: true,
        }],
        first: Some(7),
        after,
        ..by("by_driver", driver.to_string())
    }
}

pub async fn a_changed_index_answers_from_its_previous_version_until_built(env: Arc<Env>) {
    let one = files(&[("trips/indexes/by_driver.yaml", BY_DRIVER)], TRIPS);
    // Maintenance off: nothing applies the log until `sync_indexes`.
    let store = env.open_custom(&one, env.storage(), false).await.unwrap();
    let driver = write_trips(&store, 30, "Kyiv").await.to_string();
    store.sync_indexes().await.unwrap();
    let first = store
        .query_index("trips", &by_driver_v1_fields(&driver, None))
        .await
        .unwrap();
    let cursor = first.end_cursor.clone();
    let second = store
        .query_index("trips", &by_driver_v1_fields(&driver, cursor.clone()))
        .await
        .unwrap();

    // A field added: version 2 is built from the log, version 1 answers
    // every query that reads only what it has.
    let two = files(
        &[("trips/indexes/by_driver.yaml", BY_DRIVER_WITH_CITY)],
        TRIPS,
    );
    let report = store.reload(definitions(&two)).await.unwrap();
    assert_eq!(
        report.changes,
        ["index `by_driver` of `trips` changed: version 2 replaces version 1 (filled from the cell log; version 1 answers the queries it can answer until then)"]
    );
    let check_v1_answers = |store: cellgate_store::Store| {
        let (driver, first, second, cursor) = (
            driver.clone(),
            first.clone(),
            second.clone(),
            cursor.clone(),
        );
        async move {
            let again = store
                .query_index("trips", &by_driver_v1_fields(&driver, None))
                .await
                .unwrap();
            assert_eq!(again, first);
            // A cursor of the first version's pages keeps paging.
            let next = store
                .query_index("trips", &by_driver_v1_fields(&driver, cursor))
                .await
                .unwrap();
            assert_eq!(next, second);
            // Those that need `city` wait for version 2.
            let needs_city = [
                by("by_driver", driver.clone()),
                IndexQuery {
                    fields: vec!["city".into()],
                    ..by("by_driver", driver.clone())
                },
                IndexQuery {
                    fields: vec!["driver".into()],
                    filter: Some("city = \"Kyiv\"".into()),
                    ..by("by_driver", driver.clone())
                },
                IndexQuery {
                    fields: vec!["driver".into()],
                    order_by: vec![cellgate_store::indexes::OrderBy {
                        field: "city".into(),
                        descending: false,
                    }],
                    ..by("by_driver", driver.clone())
                },
            ];
            for query in needs_city {
                let err = store.query_index("trips", &query).await.unwrap_err();
                assert_eq!(err.code(), "INDEX_BUILDING", "{query:?}: {err}");
            }
        }
    };
    check_v1_answers(store.clone()).await;
    let status: Vec<_> = store
        .indexes("trips")
        .unwrap()
        .into_iter()
        .map(|i| (i.version, i.ready, i.serves_until))
        .collect();
    assert_eq!(status, [(2, false, None), (1, true, Some(2))]);
    let err = store
        .drop_index_with("trips", "by_driver", Some(1), false)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("answers queries until version 2"),
        "{err}"
    );
    drop(store);

    // Started with the new definitions, a store serves version 1 as well:
    // the catalog records the definition it was built from.
    let store = env.open_custom(&two, env.storage(), false).await.unwrap();
    assert!(
        store
            .warnings()
            .iter()
            .any(|w| w.contains("version 1 answers the queries it can answer")),
        "{:?}",
        store.warnings()
    );
    check_v1_answers(store.clone()).await;

    // Once built, version 2 answers everything, `city` included.
    store.sync_indexes().await.unwrap();
    let page = store
        .query_index("trips", &by("by_driver", driver.clone()))
        .await
        .unwrap();
    assert_eq!(page.entries.len(), 30);
    assert!(page.entries.iter().all(|e| e
        .fields
        .iter()
        .any(|(name, value)| &**name == "city" && value.as_text() == Some("Kyiv"))));
    let on_v2 = store
        .query_index("trips", &by_driver_v1_fields(&driver, None))
        .await
        .unwrap();
    assert_eq!(on_v2, first, "the same answer and cursors from version 2");
    drop(store);
    // Superseded: a store started now serves version 2 alone.
    let store = env.open_custom(&two, env.storage(), false).await.unwrap();
    let status: Vec<_> = store
        .indexes("trips")
        .unwrap()
        .into_iter()
        .map(|i| (i.version, i.ready, i.serves_until))
        .collect();
    assert_eq!(status, [(2, true, None)]);
}

pub async fn a_reloaded_index_answers_index_building_until_it_is_built(env: Arc<Env>) {
    let one = files(&[("trips/indexes/by_driver.yaml", BY_DRIVER)], TRIPS);
    // Maintenance off: nothing applies the log until `sync_indexes`.
    let store = env.open_custom(&one, env.storage(), false).await.unwrap();
    write_trips(&store, 30, "Kyiv").await;
    store.sync_indexes().await.unwrap();
    let two = files(
        &[
            ("trips/indexes/by_driver.yaml", BY_DRIVER),
            ("trips/indexes/by_city.yaml", BY_CITY),
        ],
        TRIPS,
    );
    store.reload(definitions(&two)).await.unwrap();
    let err = store
        .query_index("trips", &by("by_city", "Kyiv".into()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "INDEX_BUILDING", "{err}");
    let status = store.indexes("trips").unwrap();
    assert!(
        status.iter().any(|i| i.name == "by_city" && !i.ready),
        "{status:?}"
    );
    store.sync_indexes().await.unwrap();
    let page = store
        .query_index("trips", &by("by_city", "Kyiv".into()))
        .await
        .unwrap();
    assert_eq!(page.entries.len(), 30);
    assert!(store.indexes("trips").unwrap().iter().all(|i| i.ready));
}

/// The `by_city` entry of `Store::measure_indexes`.
async fn by_city_measured(store: &cellgate_store::Store) -> cellgate_store::IndexStatus {
    store
        .measure_indexes("trips")
        .await
        .unwrap()
        .into_iter()
        .find(|i| i.name == "by_city")
        .expect("by_city is served")
}

pub async fn an_index_build_reports_its_progress(env: Arc<Env>) {
    use futures::FutureExt as _;
    let one = files(&[("trips/indexes/by_driver.yaml", BY_DRIVER)], TRIPS);
    let store = env.open_custom(&one, env.storage(), false).await.unwrap();
    write_trips(&store, 5000, "Kyiv").await;
    store.sync_indexes().await.unwrap();
    store.shutdown(std::time::Duration::from_secs(5)).await;
    // With `by_city` added, each pass of its build waits for a permit.
    let two = files(
        &[
            ("trips/indexes/by_driver.yaml", BY_DRIVER),
            ("trips/indexes/by_city.yaml", BY_CITY),
        ],
        TRIPS,
    );
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let hook = {
        let gate = gate.clone();
        PassHook(Arc::new(move |point: PassPoint| {
            let gate = gate.clone();
            let building = point.stage == PassStage::Start
                && point.consumers.iter().any(|c| c.starts_with("ix:by_city:"));
            async move {
                if building {
                    gate.acquire().await.expect("open gate").forget();
                }
            }
            .boxed()
        }))
    };
    let mut options = StoreOptions::new(env.storage());
    options.maintenance.pass_hook = Some(hook);
    options.maintenance.sweep_every = std::time::Duration::from_millis(50);
    let store = Store::open(definitions(&two), options).await.unwrap();
    // The 5000 cells of the log, read once per cluster the index is
    // written to.
    let total = 5000 * env.storage().clusters.len() as i64;
    let first = by_city_measured(&store).await;
    assert!(!first.ready, "{first:?}");
    assert_eq!(
        (first.build_total_cells, first.build_done_cells()),
        (Some(total), Some(0)),
        "{first:?}"
    );
    assert_eq!(first.pending_cells, total);
    // One pass at a time: the cells done grow, the total stays.
    let mut done = 0;
    let mut steps = 0;
    loop {
        gate.add_permits(1);
        let mut next = None;
        for _ in 0..3000 {
            let status = by_city_measured(&store).await;
            if status.ready || status.build_done_cells() > Some(done) {
                next = Some(status);
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let next = next.expect("a released pass applied nothing");
        if next.ready {
            break;
        }
        assert_eq!(next.build_total_cells, Some(total), "{next:?}");
        assert_eq!(
            next.build_done_cells(),
            Some(total - next.pending_cells),
            "{next:?}"
        );
        assert!(next.build_rate.is_some_and(|r| r > 0.0), "{next:?}");
        assert!(next.build_eta_seconds.is_some(), "{next:?}");
        done = next.build_done_cells().unwrap();
        steps += 1;
    }
    assert!(
        steps > 0,
        "the build finished in one pass: no progress seen"
    );
    let status = by_city_measured(&store).await;
    assert_eq!(
        (
            status.pending_cells,
            status.build_total_cells,
            status.build_rate
        ),
        (0, None, None)
    );
    store.shutdown(std::time::Duration::from_secs(5)).await;
}
