//! Data-driven tests over `tests/fixtures/{good,bad}/<case>/`.
//!
//! Each case is a small `datastores/`-shaped directory. Good cases must load, and a summary of
//! what loaded is compared with `<case>/expected.txt`; bad cases must fail, and the rendered
//! diagnostics are compared with `<case>/expected.txt`. `UPDATE_EXPECT=1 cargo test -p
//! index-dsl` rewrites the expectations. Cases are loaded through a relative path so that the
//! file names in the snapshots do not depend on where the repository is checked out.

mod support;

use std::fs;
use std::path::{Path, PathBuf};

use expect_test::expect_file;

fn cases(kind: &str) -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(kind);
    let mut names: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(!names.is_empty(), "no fixtures in {}", dir.display());
    names
}

fn relative(kind: &str, case: &str) -> PathBuf {
    // Cargo runs integration tests with the package root as working directory.
    assert_eq!(
        std::env::current_dir().unwrap(),
        Path::new(env!("CARGO_MANIFEST_DIR"))
    );
    Path::new("tests/fixtures").join(kind).join(case)
}

fn expected(kind: &str, case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(kind)
        .join(case)
        .join("expected.txt")
}

#[test]
fn good_fixtures_load() {
    for case in cases("good") {
        let dir = relative("good", &case);
        match index_dsl::load_dir(&dir) {
            Ok(defs) => expect_file![expected("good", &case)].assert_eq(&support::summary(&defs)),
            Err(diags) => panic!("good fixture {case} failed to load:\n{diags}"),
        }
    }
}

#[test]
fn bad_fixtures_report_every_problem() {
    for case in cases("bad") {
        let dir = relative("bad", &case);
        match index_dsl::load_dir(&dir) {
            Ok(defs) => panic!("bad fixture {case} loaded:\n{}", support::summary(&defs)),
            Err(diags) => expect_file![expected("bad", &case)].assert_eq(&format!("{diags}\n")),
        }
    }
}

#[test]
fn repository_datastores_load() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../datastores");
    let defs = index_dsl::load_dir(&dir).unwrap_or_else(|d| panic!("{d}"));
    expect_test::expect![[r#"
        datastore payments shards=256 columns=[ORDER, CHARGE, REFUND]
          index merchant_payments_index columns=[ORDER, CHARGE] shard_field=merchant_uuid
            merchant_uuid: UUID <- ORDER.merchant_uuid
            amount_cents: int <- ORDER.amount_cents
            currency: string <- ORDER.currency
            created_at: datetime <- ORDER.created_at
            fee_rate: float <- CHARGE.fee.rate
            captured: bool <- CHARGE.captured
            processor_reference: string <- CHARGE.processor.reference
          index refunds_by_reason_index columns=[REFUND, ORDER] shard_field=merchant_uuid
            refunded_at: datetime <- REFUND.refunded_at
            reason: string <- REFUND.reason
            refunded_cents: int <- REFUND.amount_cents
            merchant_uuid: UUID <- ORDER.merchant_uuid
        datastore trips shards=4096 columns=[BASE, STATUS, NOTES, FARE_ADJUSTMENT]
          index city_trips_index columns=[BASE, STATUS] shard_field=city_uuid
            city_uuid: UUID <- BASE.city_uuid
            trip_created_at: datetime <- BASE.trip_created_at
            fare_total: float <- BASE.fare.total (sort: false)
            status: string <- STATUS.status (sort: false)
            is_completed: bool <- STATUS.is_completed (sort: false)
          index driver_partner_index columns=[BASE] shard_field=driver_partner_uuid
            driver_partner_uuid: UUID <- BASE.driver_partner_uuid
            city_uuid: UUID <- BASE.city_uuid (sort: false)
            trip_created_at: datetime <- BASE.trip_created_at
    "#]]
    .assert_eq(&support::summary(&defs));
}

#[test]
fn missing_directory_is_a_diagnostic() {
    let err = index_dsl::load_dir(Path::new("tests/fixtures/does_not_exist")).unwrap_err();
    assert_eq!(err.0.len(), 1);
    assert_eq!(err.0[0].line, 0);
    assert!(
        err.0[0].message.starts_with("cannot read directory"),
        "{err}"
    );
}
