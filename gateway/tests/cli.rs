//! The `cellgate` binary end to end: each test runs the real executable
//! with a clean `CELLGATE_*` environment and checks its exit code and output.
//! Snapshots are `expect![[…]]` blocks; `UPDATE_EXPECT=1` rewrites them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use expect_test::expect;

/// The workspace root, where `datastores/` and `schema/sql/` live.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// Runs `cellgate args…` in `dir` with no `CELLGATE_*` or `RUST_LOG`
/// variables inherited from the test's environment.
fn cellgate(dir: &Path, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cellgate"));
    command.current_dir(dir).args(args);
    for (name, _) in std::env::vars_os() {
        let name_str = name.to_string_lossy();
        if name_str.starts_with("CELLGATE_") || name_str == "RUST_LOG" {
            command.env_remove(&name);
        }
    }
    command.output().expect("run cellgate")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts a failure that was reported, not a crash.
fn assert_clean_failure(output: &Output) {
    assert_eq!(output.status.code(), Some(1), "stderr:\n{}", stderr(output));
    assert!(
        !stderr(output).contains("panicked"),
        "cellgate panicked:\n{}",
        stderr(output)
    );
}

#[test]
fn check_summarizes_the_repository_datastores() {
    let output = cellgate(&root(), &["check"]);
    assert!(output.status.success(), "stderr:\n{}", stderr(&output));
    expect![[r#"
        datastores in ./datastores: 2 datastores, 7 columns, 4 indexes

        payments: 256 shards, columns ORDER, CHARGE, REFUND
          index merchant_payments_index: shard field merchant_uuid, from ORDER, CHARGE
            merchant_uuid        UUID      ORDER.merchant_uuid
            amount_cents         int       ORDER.amount_cents
            currency             string    ORDER.currency
            created_at           datetime  ORDER.created_at
            fee_rate             float     CHARGE.fee.rate
            captured             bool      CHARGE.captured
            processor_reference  string    CHARGE.processor.reference
          index refunds_by_reason_index: shard field merchant_uuid, from REFUND, ORDER
            refunded_at     datetime  REFUND.refunded_at
            reason          string    REFUND.reason
            refunded_cents  int       REFUND.amount_cents
            merchant_uuid   UUID      ORDER.merchant_uuid

        trips: 4096 shards, columns BASE, STATUS, NOTES, FARE_ADJUSTMENT
          index city_trips_index: shard field city_uuid, from BASE, STATUS
            city_uuid        UUID      BASE.city_uuid
            trip_created_at  datetime  BASE.trip_created_at
            fare_total       float     BASE.fare.total
            status           string    STATUS.status
            is_completed     bool      STATUS.is_completed
          index driver_partner_index: shard field driver_partner_uuid, from BASE
            driver_partner_uuid  UUID      BASE.driver_partner_uuid
            city_uuid            UUID      BASE.city_uuid
            trip_created_at      datetime  BASE.trip_created_at
    "#]]
    .assert_eq(&stdout(&output));
}

#[test]
fn check_reports_every_error_with_its_position() {
    let dsl = root().join("index-dsl");
    let output = cellgate(&dsl, &["check", "tests/fixtures/bad/multiple_errors"]);
    assert_clean_failure(&output);
    assert!(stdout(&output).is_empty(), "stdout:\n{}", stdout(&output));
    let err = stderr(&output);
    assert!(err.matches("error: ").count() > 2, "{err}");
    assert!(err.contains(" --> tests/fixtures/bad/multiple_errors/trips/datastore.yaml:2:9"));
    expect![[r#"
        error: datastore name `paymnts` does not match its directory `payments` (expected `payments`)
         --> tests/fixtures/bad/multiple_errors/payments/datastore.yaml:1:7
          |
        1 | name: paymnts
          |       ^^^^^^^

        error: datastore `paymnts` declares no columns (expected at least one `- name: ...`)
         --> tests/fixtures/bad/multiple_errors/payments/datastore.yaml:2:10
          |
        2 | columns: []
          |          ^

        error: index `merchant_idx` is defined in file `merchant_index` (expected the file to be named `merchant_idx.yaml`)
         --> tests/fixtures/bad/multiple_errors/payments/indexes/merchant_index.yaml:1:8
          |
        1 | table: merchant_idx
          |        ^^^^^^^^^^^^

        error: bool field `captured` cannot be the shard field: its two values would put every entry in one of two shards (pick a UUID, string or int field, or name one with `shard_field:`; the default is the first field)
         --> tests/fixtures/bad/multiple_errors/payments/indexes/merchant_index.yaml:6:34
          |
        6 |       - { field: captured, type: bool }
          |                                  ^^^^

        error: shard count 0 is out of range (expected 1 to 65536)
         --> tests/fixtures/bad/multiple_errors/trips/datastore.yaml:2:9
          |
        2 | shards: 0
          |         ^

        error: duplicate column `base` (already declared on line 4; column names are case-insensitive)
         --> tests/fixtures/bad/multiple_errors/trips/datastore.yaml:5:11
          |
        5 |   - name: base
          |           ^^^^

        error: unknown column `BASEE` in datastore `trips` (expected one of BASE, base)
         --> tests/fixtures/bad/multiple_errors/trips/indexes/driver_partner_index.yaml:4:17
          |
        4 |   - column_key: BASEE
          |                 ^^^^^

        error: malformed field path `city..uuid`: expected field name
         --> tests/fixtures/bad/multiple_errors/trips/indexes/driver_partner_index.yaml:7:23
          |
        7 |       - { field: city..uuid, type: UUID}
          |                       ^

        error: unknown type `datetme` (expected one of UUID, string, int, float, bool, datetime)
         --> tests/fixtures/bad/multiple_errors/trips/indexes/driver_partner_index.yaml:8:41
          |
        8 |       - { field: trip_created_at, type: datetme}
          |                                         ^^^^^^^

        error: unknown key `unexpected` (expected one of table, datastore, description, shard_field, column_defs, where)
         --> tests/fixtures/bad/multiple_errors/trips/indexes/status_index.yaml:8:1
          |
        8 | unexpected: true
          | ^^^^^^^^^^

        error: could not load definitions: 10 errors in 5 files
    "#]].assert_eq(&err);
}

#[test]
fn check_of_a_missing_directory_fails_cleanly() {
    let output = cellgate(&root(), &["check", "no/such/datastores"]);
    assert_clean_failure(&output);
    expect![[r#"
        error: datastores directory `no/such/datastores` does not exist (give it with the DIR argument or CELLGATE_DATASTORES)
    "#]].assert_eq(&stderr(&output));
}

#[test]
fn schema_sql_is_up_to_date() {
    let output = cellgate(&root(), &["ddl", "--check"]);
    assert!(
        output.status.success(),
        "schema/sql/ does not match the definitions in datastores/: \
         run `cargo run -p cellgate -- ddl` and commit the result\n{}",
        stderr(&output)
    );
}

#[test]
fn ddl_check_names_stale_and_missing_files() {
    let out = tempfile::tempdir().unwrap();
    let out_arg = out.path().to_str().unwrap();
    let written = cellgate(&root(), &["ddl", "--out", out_arg]);
    assert!(written.status.success(), "{}", stderr(&written));
    for dialect in ["sqlite", "mysql", "postgres"] {
        assert!(out.path().join(format!("{dialect}.sql")).is_file());
    }
    let fresh = cellgate(&root(), &["ddl", "--check", "--out", out_arg]);
    assert!(fresh.status.success(), "{}", stderr(&fresh));

    let mysql = out.path().join("mysql.sql");
    let mut text = std::fs::read_to_string(&mysql).unwrap();
    text.push_str("-- edited by hand\n");
    std::fs::write(&mysql, text).unwrap();
    std::fs::remove_file(out.path().join("postgres.sql")).unwrap();

    let output = cellgate(&root(), &["ddl", "--check", "--out", out_arg]);
    assert_clean_failure(&output);
    let err = stderr(&output).replace(out_arg, "<out>");
    expect![[r#"
        error: <out>/mysql.sql is stale: run `cellgate ddl --out <out>`
        error: <out>/postgres.sql is missing: run `cellgate ddl --out <out>`
    "#]]
    .assert_eq(&err);
    // `--check` writes nothing.
    assert!(!out.path().join("postgres.sql").exists());
}

/// A definitions directory with one datastore `t` of 4 shards and one index.
fn tiny_datastores() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t");
    std::fs::create_dir_all(t.join("indexes")).unwrap();
    std::fs::write(
        t.join("datastore.yaml"),
        "name: t\nshards: 4\ncolumns:\n  - name: BASE\n",
    )
    .unwrap();
    std::fs::write(
        t.join("indexes/by_owner.yaml"),
        "table: by_owner\ndatastore: t\ncolumn_defs:\n  - column_key: BASE\n    fields:\n      - { field: owner_uuid, type: UUID }\n",
    )
    .unwrap();
    dir
}

#[tokio::test]
async fn migrate_creates_one_table_set_whatever_the_shard_count() {
    let datastores = tiny_datastores();
    let data = tempfile::tempdir().unwrap();
    let args = [
        "migrate",
        "--datastores",
        datastores.path().to_str().unwrap(),
        "--data",
        data.path().to_str().unwrap(),
    ];
    let output = cellgate(&root(), &args);
    assert!(output.status.success(), "stderr:\n{}", stderr(&output));
    expect![[r#"
        cluster main: tables ready
        t: 4 shards (0-3 on main)
          index by_owner (table t_ix_by_owner, version 1): ready
    "#]]
    .assert_eq(&stdout(&output));

    // Running it again finds everything in place.
    let again = cellgate(&root(), &args);
    assert!(again.status.success(), "stderr:\n{}", stderr(&again));
    assert_eq!(stdout(&again), stdout(&output));

    let url = format!("sqlite://{}", data.path().join("cellgate.db").display());
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .fetch_all(&pool)
            .await
            .unwrap();
    expect![[r#"
        [
            "cellgate_catalog",
            "cellgate_id_segments",
            "cellgate_leases",
            "cellgate_tokens",
            "cellgate_topology",
            "sqlite_sequence",
            "t_buffer",
            "t_cells",
            "t_conflicts",
            "t_ix_by_owner",
            "t_offsets",
            "t_quarantine",
            "t_shards",
            "t_trigger_quarantine",
        ]
    "#]]
    .assert_debug_eq(&tables);
    let shards: Vec<i64> = sqlx::query_scalar("SELECT shard FROM t_shards ORDER BY shard")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(shards, vec![0, 1, 2, 3], "one counter row per shard");
}

#[test]
fn buffer_conflicts_lists_none_on_a_fresh_store_and_refuses_an_unknown_datastore() {
    let datastores = tiny_datastores();
    let data = tempfile::tempdir().unwrap();
    let args = |datastore: &'static str| {
        vec![
            "buffer".to_string(),
            "conflicts".into(),
            "--datastore".into(),
            datastore.into(),
            "--datastores".into(),
            datastores.path().to_str().unwrap().into(),
            "--data".into(),
            data.path().to_str().unwrap().into(),
        ]
    };
    let none = args("t");
    let output = cellgate(
        &root(),
        &none.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert!(output.status.success(), "stderr:\n{}", stderr(&output));
    assert_eq!(stdout(&output), "0 conflicts\n");
    let unknown = args("nope");
    let output = cellgate(
        &root(),
        &unknown.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert_clean_failure(&output);
    assert!(stderr(&output).contains("nope"), "{}", stderr(&output));
}

#[test]
fn migrate_reports_an_unreachable_database_on_one_line() {
    let output = cellgate(
        &root(),
        &["migrate", "--database", "mysql://nobody@127.0.0.1:1/x"],
    );
    assert_clean_failure(&output);
    let err = stderr(&output);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: cannot open storage main (mysql://nobody@127.0.0.1:1/x)"),
        "{err}"
    );
}

#[test]
fn shard_move_refuses_a_duty_outside_zero_to_one() {
    for duty in ["0", "1.5", "half"] {
        let output = cellgate(
            &root(),
            &[
                "shard",
                "move",
                "--datastore",
                "trips",
                "--shards",
                "0-1023",
                "--to",
                "c",
                "--duty",
                duty,
            ],
        );
        // A usage error from the argument parser, before any store opens.
        assert_eq!(
            output.status.code(),
            Some(2),
            "stderr:\n{}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains("within (0, 1]"),
            "{}",
            stderr(&output)
        );
    }
}
