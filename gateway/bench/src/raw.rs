//! The raw SQL baseline of the `query` and `rows` workloads: for each
//! request, the one statement cellgate sends for it, run on a pool of the
//! benchmark's own (opened by the store's `storage::connect`), so that a run can state what the gateway
//! costs over the database alone (HTTP requests/s ÷ raw transactions/s).
//!
//! The statements are not written here but built with the store's public
//! API, as the store builds them: `QueryPlan::build` of the workload's
//! index query, then `QueryPlan::sql` on the index table; for `rows`,
//! `cells::with_latest_ref_keys` around that page, which is the one
//! statement a gateway with its cell cache warm (the default) sends for a
//! page with `row { base { body } }` (the bodies come from the cache). One
//! statement per driver is built before the phase, so the measured time is
//! the database's and the client's: a round trip, binding, and decoding
//! every column of every row into typed values, as a client would.
//!
//! The pool is the size of the gateway's read pool for the same storage
//! configuration (`storage.max_connections`, 16 by default; on SQLite the
//! gateway's readers are at most 8). On SQLite it opens the gateway's
//! own file beside it; WAL lets the reads run while the server is up.
//!
//! Before a workload is measured, its statement is run for a few drivers
//! and checked against the pages the gateway answered over HTTP for the
//! same drivers: the same row keys, and one more row (the lookahead) when
//! the page is full. A statement that does not find cellgate's rows (a UUID
//! bound in the wrong representation, say) would measure nothing.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use index_dsl::Definitions;
use serde_json::Value as Json;
use uuid::Uuid;

use crate::database::Database;
use crate::dataset::{Dataset, Workload, BASE, DATASTORE, INDEX, PAGE, QUERY};
use crate::http::Gateway;
use crate::phase::{Op, Outcome};
use crate::report::RawReport;
use cellgate_store::cells::with_latest_ref_keys;
use cellgate_store::indexes::entry::col_type;
use cellgate_store::indexes::QueryPlan;
use cellgate_store::storage::redact_url as redact;
use cellgate_store::storage::{self, ddl, Backend, ColType, ConnectOptions, Dialect, Sql, Value};
use cellgate_store::{Store, StoreOptions};

/// Drivers whose HTTP page each statement is checked against.
pub const CHECKED_PAGES: usize = 5;

/// Most reader connections of the gateway's SQLite store (`sqlite.rs` of
/// the store clamps `storage.max_connections` to it).
const SQLITE_READERS: u32 = 8;

/// Longest wait for a store opened to read the index table's name to stop.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The name of the index table the workloads read, as the store reports
/// it (`Store::indexes`). The store is opened without index maintenance,
/// so it takes no lease, and stopped again.
pub async fn index_table(defs: &Definitions, database: &Database) -> anyhow::Result<String> {
    let mut options = StoreOptions::new(database.storage());
    options.maintain_indexes = false;
    let store = Store::open(defs.clone(), options)
        .await
        .map_err(|e| anyhow::anyhow!("cannot open the store ({}): {e}", redact(&database.url)))?;
    let status = store.indexes(DATASTORE);
    store.shutdown(SHUTDOWN_GRACE).await;
    let status = status.map_err(|e| anyhow::anyhow!("cannot read the indexes: {e}"))?;
    status
        .into_iter()
        .find(|index| index.name == INDEX)
        .map(|index| index.table)
        .ok_or_else(|| anyhow::anyhow!("the store has no `{INDEX}` index"))
}

/// The connections the baseline uses: as many as the gateway reads
/// through on the same storage configuration.
pub fn pool_size(database: &Database) -> u32 {
    let size = database.storage().max_connections.max(1);
    if database.dialect == Dialect::Sqlite {
        size.min(SQLITE_READERS)
    } else {
        size
    }
}

/// The row keys of the HTTP pages of the first [`CHECKED_PAGES`] queried
/// drivers, in the order the gateway answered them.
pub async fn http_pages(
    gateway: &Gateway,
    data: &Dataset,
) -> anyhow::Result<Vec<(Uuid, Vec<Uuid>)>> {
    let mut pages = Vec::new();
    for &driver in data.queried_drivers().iter().take(CHECKED_PAGES) {
        let answer = gateway
            .graphql(QUERY, data.query_variables(driver))
            .await
            .map_err(|e| anyhow::anyhow!("cannot read the page of driver {driver}: {e}"))?;
        let edges = answer
            .pointer("/trips/driverPartnerIndex/edges")
            .and_then(Json::as_array)
            .ok_or_else(|| anyhow::anyhow!("no page for driver {driver} over HTTP"))?;
        let keys = edges
            .iter()
            .map(|edge| {
                edge.pointer("/node/rowKey")
                    .and_then(Json::as_str)
                    .and_then(|key| Uuid::parse_str(key).ok())
                    .ok_or_else(|| anyhow::anyhow!("an entry without a row key over HTTP"))
            })
            .collect::<anyhow::Result<Vec<Uuid>>>()?;
        pages.push((driver, keys));
    }
    Ok(pages)
}

/// A pool of the benchmark's own on the database of the run, opened by the
/// store's own connection code (`storage::connect`): the same driver
/// settings, binding and decoding as the gateway's reads, without the
/// gateway.
pub struct Pool(Arc<dyn Backend>);

impl Pool {
    /// Opens `size` connections at most to `database`.
    pub async fn connect(
        database: &Database,
        size: u32,
        timeout: Duration,
    ) -> anyhow::Result<Pool> {
        let options = ConnectOptions {
            cluster: "raw".to_string(),
            max_connections: size,
            acquire_timeout: timeout,
            statement_timeout: timeout,
            // Reads only: on SQLite the WAL checkpoints stay the gateway's.
            background: true,
        };
        storage::connect(&database.url, &options)
            .await
            .map(Pool)
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot open the raw SQL pool on {}: {e}",
                    redact(&database.url)
                )
            })
    }

    /// Runs `sql` and decodes every column of every row as `types`.
    pub async fn fetch(
        &self,
        sql: &Sql,
        types: &[ColType],
    ) -> cellgate_store::Result<Vec<Vec<Value>>> {
        self.0.fetch(sql, types).await
    }
}

/// The statements of one workload, one per queried driver.
pub struct Statements {
    workload: Workload,
    by_driver: HashMap<Uuid, Sql>,
    /// The columns of a row: the row key, the projected index fields and,
    /// for `rows`, the BASE ref key.
    types: Vec<ColType>,
    /// The statement of the first queried driver, for the report.
    example: String,
}

impl Statements {
    /// Builds the statement of every queried driver, as cellgate builds
    /// it for the request of `workload` on the index table `table`.
    pub fn build(
        defs: &Definitions,
        dialect: Dialect,
        table: &str,
        data: &Dataset,
        workload: Workload,
    ) -> anyhow::Result<Statements> {
        let datastore = defs
            .datastore(DATASTORE)
            .ok_or_else(|| anyhow::anyhow!("no `{DATASTORE}` datastore"))?;
        let cells_table = ddl::cells_table(DATASTORE);
        let mut by_driver = HashMap::new();
        let mut types = Vec::new();
        let mut example = String::new();
        for &driver in data.queried_drivers() {
            let plan = QueryPlan::build(datastore, &data.index_query(driver))
                .map_err(|e| anyhow::anyhow!("cannot plan the index query: {e}"))?;
            // Every shard-field value, as the store's single-cluster reads
            // pass them.
            let values: Vec<Value> = plan.shards.values().flatten().cloned().collect();
            let page = plan.sql(dialect, table, &values);
            let sql = match workload {
                Workload::Rows => with_latest_ref_keys(&page, &cells_table, &[BASE]),
                Workload::Query | Workload::Write => page,
            };
            if by_driver.is_empty() {
                types.push(ColType::Uuid);
                types.extend(
                    plan.projection
                        .iter()
                        .map(|&p| col_type(plan.index.fields[p].ty)),
                );
                if workload == Workload::Rows {
                    types.push(ColType::Int);
                }
                example = sql.text().to_string();
            }
            by_driver.insert(driver, sql);
        }
        anyhow::ensure!(!by_driver.is_empty(), "no queried driver");
        Ok(Statements {
            workload,
            by_driver,
            types,
            example,
        })
    }

    /// Runs the statement of `driver` and checks its rows as a page of
    /// the workload: at least one entry, at most the page and its
    /// lookahead, and with `rows` a BASE ref key on every row.
    async fn run(&self, pool: &Pool, driver: Uuid) -> Result<Vec<Vec<Value>>, String> {
        let sql = self
            .by_driver
            .get(&driver)
            .ok_or_else(|| format!("no statement for driver {driver}"))?;
        let rows = pool
            .fetch(sql, &self.types)
            .await
            .map_err(|e| e.to_string())?;
        if rows.is_empty() {
            return Err(format!("no index entries for driver {driver}"));
        }
        if rows.len() > PAGE as usize + 1 {
            return Err(format!(
                "{} rows for driver {driver}, more than a page and its lookahead",
                rows.len()
            ));
        }
        if self.workload == Workload::Rows
            && !rows
                .iter()
                .all(|row| row.last().is_some_and(|v| v.as_int().is_some()))
        {
            return Err(format!("a row of driver {driver} has no BASE cell"));
        }
        Ok(rows)
    }

    /// Checks the statement's rows against the pages the gateway answered
    /// over HTTP: the same row keys (in the same order for `query`; the
    /// `rows` statement does not keep the order), plus the lookahead row
    /// when the page is full.
    async fn check(&self, pool: &Pool, pages: &[(Uuid, Vec<Uuid>)]) -> anyhow::Result<()> {
        for (driver, http) in pages {
            let rows = self
                .run(pool, *driver)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let raw: Vec<Uuid> = rows.iter().filter_map(|row| row[0].as_uuid()).collect();
            let (same, counted) = same_page(self.workload, &raw, http);
            anyhow::ensure!(
                same && counted,
                "the raw SQL of `{}` returned {} rows for driver {driver} where the gateway's page \
                 has {} entries{}; the statement does not find cellgate's rows",
                self.workload.name(),
                raw.len(),
                http.len(),
                if same { "" } else { " with other row keys" }
            );
        }
        Ok(())
    }

    fn op(self: &Arc<Self>, pool: &Arc<Pool>, data: &Arc<Dataset>) -> Op {
        let (statements, pool, data) = (self.clone(), pool.clone(), data.clone());
        Arc::new(move || {
            let (statements, pool, data) = (statements.clone(), pool.clone(), data.clone());
            Box::pin(async move {
                let driver = data.random_driver();
                statements.run(&pool, driver).await.map(|_| 0)
            })
        })
    }
}

/// Whether the row keys `raw` of a statement are those of the gateway's
/// page `http` (in its order for `query`; the `rows` statement does not
/// keep the order), and whether there are as many, one more (the
/// lookahead) when the page is full.
fn same_page(workload: Workload, raw: &[Uuid], http: &[Uuid]) -> (bool, bool) {
    let counted =
        raw.len() == http.len() || (http.len() == PAGE as usize && raw.len() == http.len() + 1);
    let same = match workload {
        Workload::Rows => {
            let found: HashSet<&Uuid> = raw.iter().collect();
            http.iter().all(|key| found.contains(key))
        }
        Workload::Query | Workload::Write => raw.iter().take(http.len()).eq(http.iter()),
    };
    (same, counted)
}

/// What the baseline needs of the run.
pub struct Baseline<'a> {
    pub defs: &'a Definitions,
    pub database: &'a Database,
    pub table: &'a str,
    pub data: &'a Arc<Dataset>,
    pub concurrency: u32,
    pub duration: Duration,
    pub request_timeout: Duration,
}

/// Runs the baseline of each of `workloads` (`query`, `rows`) after
/// checking its statement against `pages`; a workload whose statement
/// does not match is reported as a problem and not measured. `http` is
/// the HTTP run of each workload, for the ratios.
pub async fn run(
    baseline: &Baseline<'_>,
    workloads: &[Workload],
    pages: &[(Uuid, Vec<Uuid>)],
    http: &[crate::report::RunReport],
    problems: &mut Vec<String>,
) -> anyhow::Result<Vec<RawReport>> {
    let workloads: Vec<Workload> = workloads
        .iter()
        .copied()
        .filter(|w| matches!(w, Workload::Query | Workload::Rows))
        .collect();
    if workloads.is_empty() {
        return Ok(Vec::new());
    }
    let size = pool_size(baseline.database);
    let pool = Arc::new(Pool::connect(baseline.database, size, baseline.request_timeout).await?);
    let mut reports = Vec::new();
    for workload in workloads {
        let statements = Arc::new(Statements::build(
            baseline.defs,
            baseline.database.dialect,
            baseline.table,
            baseline.data,
            workload,
        )?);
        if let Err(e) = statements.check(&pool, pages).await {
            problems.push(format!("raw SQL: {e:#}"));
            continue;
        }
        let label = format!("{} (raw SQL)", workload.name());
        let outcome = crate::phase::run(
            &label,
            baseline.concurrency,
            baseline.duration,
            baseline.request_timeout,
            statements.op(&pool, baseline.data),
        )
        .await?;
        let http = http
            .iter()
            .find(|r| r.workload == workload.name() && r.path == "HTTP");
        reports.push(report(
            workload,
            &statements,
            size,
            pages.len(),
            &outcome,
            http,
        ));
    }
    Ok(reports)
}

fn report(
    workload: Workload,
    statements: &Statements,
    pool_connections: u32,
    checked_pages: usize,
    outcome: &Outcome,
    http: Option<&crate::report::RunReport>,
) -> RawReport {
    let (p50, p99) = (outcome.ms(0.5), outcome.ms(0.99));
    let ratio = |http: f64, raw: f64| (raw > 0.0).then_some(http / raw);
    RawReport {
        workload: workload.name(),
        statement: statements.example.clone(),
        pool_connections,
        checked_pages,
        transactions: outcome.requests,
        errors: outcome.errors,
        seconds: outcome.elapsed.as_secs_f64(),
        transactions_per_second: outcome.per_second(),
        p50_ms: p50,
        p99_ms: p99,
        http_requests_per_second: http.map(|h| h.requests_per_second),
        http_over_raw: http.and_then(|h| ratio(h.requests_per_second, outcome.per_second())),
        http_p50_over_raw: http.and_then(|h| ratio(h.p50_ms, p50)),
        http_p99_over_raw: http.and_then(|h| ratio(h.p99_ms, p99)),
        first_error: outcome.first_error.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn definitions() -> Definitions {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../datastores");
        index_dsl::load_dir(&dir).expect("the example definitions load")
    }

    #[test]
    fn statements_are_the_page_and_for_rows_its_latest_ref_keys() {
        let defs = definitions();
        let data = Dataset::new(100, 3, false, 7, 50);
        let table = ddl::index_table(DATASTORE, INDEX, 1);
        let query = Statements::build(&defs, Dialect::Postgres, &table, &data, Workload::Query)
            .expect("query statements");
        let rows = Statements::build(&defs, Dialect::Postgres, &table, &data, Workload::Rows)
            .expect("rows statements");
        assert_eq!(query.by_driver.len(), data.queried_drivers().len());
        assert_eq!(query.types, [ColType::Uuid, ColType::DateTime]);
        assert_eq!(rows.types, [ColType::Uuid, ColType::DateTime, ColType::Int]);
        let driver = data.queried_drivers()[0];
        let (page, joined) = (&query.by_driver[&driver], &rows.by_driver[&driver]);
        assert!(page.text().ends_with(" LIMIT 21"), "{}", page.text());
        assert_eq!(page.params()[0], Value::Uuid(driver));
        // The page is the inner statement, its placeholders after the
        // column name's.
        assert!(joined
            .text()
            .starts_with("SELECT i.*, (SELECT m.\"ref_key\" FROM"));
        assert_eq!(joined.params()[0], Value::Text(BASE.to_string()));
        assert_eq!(&joined.params()[1..], page.params());
    }

    #[test]
    fn a_page_matches_with_its_lookahead_and_rows_in_any_order() {
        let keys: Vec<Uuid> = (0..=PAGE as u128).map(Uuid::from_u128).collect();
        let full = &keys[..PAGE as usize];
        assert_eq!(same_page(Workload::Query, &keys, full), (true, true));
        assert_eq!(same_page(Workload::Query, full, full), (true, true));
        assert_eq!(
            same_page(Workload::Query, &keys[..3], &keys[..3]),
            (true, true)
        );
        // A short page has no lookahead row.
        assert_eq!(
            same_page(Workload::Query, &keys[..4], &keys[..3]),
            (true, false)
        );
        let mut shuffled = keys.clone();
        shuffled.reverse();
        assert_eq!(same_page(Workload::Query, &shuffled, full), (false, true));
        assert_eq!(same_page(Workload::Rows, &shuffled, full), (true, true));
        assert!(!same_page(Workload::Rows, &keys[1..], full).0);
        assert_eq!(same_page(Workload::Query, &[], full), (false, false));
    }
}
