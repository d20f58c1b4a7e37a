//! The results of a run: one structure, printed as tables and written as
//! JSON (`--json`), so that the file and the screen never disagree.
//!
//! The header comes first and names everything needed to repeat the run:
//! the command line (and the `CELLGATE_*` variables that set flags), the
//! build profile, the target, the data set with its seed, and the
//! workload parameters. Passwords in URLs are shown as `***`.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;
use serde::Serialize;

use crate::load::LoadReport;
use crate::maintenance::{MaintenanceReport, Spread, SAMPLE_EVERY};
use crate::phase::Outcome;
use crate::probe::ProbeReport;
use crate::server::ColdStart;
use cellgate_store::storage::redact_url as redact;

/// What the run was asked to do.
#[derive(Debug, Clone, Serialize)]
pub struct Parameters {
    /// `sqlite`, `mysql`, `postgres`, or `external` for `--url`.
    pub backend: &'static str,
    /// Where the store or gateway is, for people.
    pub target: String,
    pub trips: u64,
    pub cells: u64,
    pub status_cells: bool,
    pub drivers: usize,
    pub seed: u64,
    pub load_via: &'static str,
    pub load_batch: u64,
    pub workloads: Vec<&'static str>,
    pub concurrency: u32,
    pub duration_seconds: u64,
    pub write_batch: u32,
    pub sample_every_ms: u64,
    pub request_timeout_seconds: u64,
    pub drain_timeout_seconds: u64,
    /// Connections of the raw SQL baseline's pool; `None` when it does
    /// not run (`--raw false`, `--url`, or no `query` or `rows`).
    pub raw_pool_connections: Option<u32>,
}

/// One workload on one path.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub workload: &'static str,
    pub path: &'static str,
    pub requests: u64,
    pub errors: u64,
    pub seconds: f64,
    pub requests_per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub cells_written: u64,
    /// Statements sent to the databases during the phase per request,
    /// background index maintenance and sweeps included.
    pub statements_per_request: Option<f64>,
    pub first_error: Option<String>,
}

impl RunReport {
    pub fn new(
        workload: &'static str,
        path: &'static str,
        outcome: &Outcome,
        statements: Option<u64>,
    ) -> RunReport {
        RunReport {
            workload,
            path,
            requests: outcome.requests,
            errors: outcome.errors,
            seconds: outcome.elapsed.as_secs_f64(),
            requests_per_second: outcome.per_second(),
            p50_ms: outcome.ms(0.5),
            p99_ms: outcome.ms(0.99),
            cells_written: outcome.cells,
            statements_per_request: statements
                .filter(|_| outcome.requests > 0)
                .map(|s| s as f64 / outcome.requests as f64),
            first_error: outcome.first_error.clone(),
        }
    }

    pub fn failed(&self) -> bool {
        self.errors > 0 || self.requests == 0
    }
}

/// Everything a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub version: &'static str,
    /// `release` or `debug`.
    pub build: &'static str,
    pub command: String,
    /// `CELLGATE_*` variables that set flags of this run.
    pub environment: Vec<String>,
    pub parameters: Parameters,
    pub load: Option<LoadReport>,
    pub cold_start: Option<ColdStart>,
    pub runs: Vec<RunReport>,
    /// The raw SQL baseline of the read workloads (`--raw`).
    pub raw: Vec<RawReport>,
    pub maintenance: Vec<MaintenanceReport>,
    pub probe: Option<ProbeReport>,
    /// What went wrong besides failed requests; any makes the exit code 1.
    pub problems: Vec<String>,
}

impl Report {
    pub fn new(parameters: Parameters) -> Report {
        Report {
            version: env!("CARGO_PKG_VERSION"),
            build: build_profile(),
            command: command_line(),
            environment: environment(),
            parameters,
            load: None,
            cold_start: None,
            runs: Vec::new(),
            raw: Vec::new(),
            maintenance: Vec::new(),
            probe: None,
            problems: Vec::new(),
        }
    }

    pub fn failed(&self) -> bool {
        !self.problems.is_empty()
            || self.runs.iter().any(RunReport::failed)
            || self.raw.iter().any(RawReport::failed)
    }

    /// The header: how to repeat this run.
    pub fn header(&self) -> String {
        let p = &self.parameters;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "cellgate-bench {} ({} build)",
            self.version, self.build
        );
        let _ = writeln!(out, "command:     {}", self.command);
        for variable in &self.environment {
            let _ = writeln!(out, "environment: {variable}");
        }
        let _ = writeln!(out, "target:      {}", p.target);
        let _ = writeln!(
            out,
            "data:        {} trips of {} drivers, {} cells ({}), seed {}",
            p.trips,
            p.drivers,
            p.cells,
            if p.status_cells {
                "BASE + STATUS"
            } else {
                "BASE"
            },
            p.seed
        );
        let _ = writeln!(
            out,
            "load:        via {}, {} cells per request, concurrency {}",
            p.load_via, p.load_batch, p.concurrency
        );
        let _ = writeln!(
            out,
            "workloads:   {}; {} s each per path, concurrency {}, {} cells per write",
            p.workloads.join(", "),
            p.duration_seconds,
            p.concurrency,
            p.write_batch
        );
        if let Some(connections) = p.raw_pool_connections {
            let _ = writeln!(
                out,
                "raw SQL:     cellgate's statement per query/rows request on a pool of its own, \
                 {connections} pooled connections, after the HTTP reads"
            );
        }
        out
    }

    /// The tables and the summary.
    pub fn body(&self) -> String {
        let mut out = String::new();
        if let Some(load) = &self.load {
            let _ = writeln!(out, "\nload");
            let _ = writeln!(
                out,
                "  {:<8} {:>10} {:>9} {:>10} {:>14}",
                "via", "cells", "seconds", "cells/s", "catch-up s"
            );
            let _ = writeln!(
                out,
                "  {:<8} {:>10} {:>9.2} {:>10.0} {:>14}",
                load.via,
                load.cells,
                load.seconds,
                load.cells_per_second,
                opt(load.catch_up_seconds, 2)
            );
            if let Some(line) = load.backlog_line() {
                let _ = writeln!(out, "  {line}");
            }
            if let Some(storage) = &load.storage {
                let size = match (storage.sqlite_db_bytes, storage.sqlite_wal_bytes) {
                    (Some(db), Some(wal)) => format!(
                        "{} (database {} + WAL {})",
                        bytes(db + wal),
                        bytes(db),
                        bytes(wal)
                    ),
                    _ => match storage.bytes {
                        Some(n) if self.parameters.backend == "mysql" => {
                            format!("{} (InnoDB's estimate, updated lazily)", bytes(n))
                        }
                        Some(n) => bytes(n),
                        None => "unknown size".to_string(),
                    },
                };
                let _ = writeln!(
                    out,
                    "  storage: {size}; {} tables, {} schema objects",
                    storage.tables, storage.schema_objects
                );
            }
        }
        if let Some(cold) = &self.cold_start {
            let _ = writeln!(
                out,
                "\ncold start (spawn of `cellgate serve` on the loaded store)"
            );
            let _ = writeln!(
                out,
                "  first 200 of /readyz after {:.0} ms{}",
                cold.ready_ms,
                cold.listening_ms
                    .map(|ms| format!(" (listening line after {ms:.0} ms)"))
                    .unwrap_or_default()
            );
        }
        if !self.runs.is_empty() {
            let _ = writeln!(out, "\nworkloads");
            let _ = writeln!(
                out,
                "  {:<7} {:<9} {:>9} {:>10} {:>9} {:>9} {:>7} {:>10}",
                "", "path", "requests", "req/s", "p50 ms", "p99 ms", "errors", "stmts/req"
            );
            for r in &self.runs {
                let _ = writeln!(
                    out,
                    "  {:<7} {:<9} {:>9} {:>10.1} {:>9.2} {:>9.2} {:>7} {:>10}",
                    r.workload,
                    r.path,
                    r.requests,
                    r.requests_per_second,
                    r.p50_ms,
                    r.p99_ms,
                    r.errors,
                    opt(r.statements_per_request, 2)
                );
            }
            let _ = writeln!(
                out,
                "  stmts/req: statements sent to the databases during the phase per request, \
                 background index maintenance and sweeps included{}",
                if self.probe.is_some() {
                    " (exact figures below)"
                } else {
                    ""
                }
            );
        }
        if !self.raw.is_empty() {
            self.raw_table(&mut out);
        }
        if !self.maintenance.is_empty() {
            let _ = writeln!(
                out,
                "\nindex maintenance under sustained writes (sampled every {} ms)",
                SAMPLE_EVERY.as_millis()
            );
            let _ = writeln!(
                out,
                "  {:<9} {:>9} {:>9} {:>20} {:>20} {:>8}",
                "path",
                "write c/s",
                "apply c/s",
                "pending p50/p99/max",
                "lag ms p50/p99/max",
                "drain s"
            );
            for m in &self.maintenance {
                let _ = writeln!(
                    out,
                    "  {:<9} {:>9.0} {:>9} {:>20} {:>20} {:>8}",
                    m.path,
                    m.write_cells_per_second,
                    opt(m.apply_cells_per_second, 0),
                    spread(&m.pending_cells, m.samples),
                    spread(&m.lag_ms, m.samples),
                    match (m.drained, m.drain_seconds) {
                        (true, Some(s)) => format!("{s:.2}"),
                        _ => "—".to_string(),
                    }
                );
            }
            let _ = writeln!(
                out,
                "  apply c/s: cells applied to the indexes from the phase's start until caught \
                 up, per second of that time; pending and lag are those of the latest sweep"
            );
        }
        if let Some(probe) = &self.probe {
            let _ = writeln!(
                out,
                "\nstatements, exact (in-process, no index maintenance, no sweep)"
            );
            let _ = writeln!(
                out,
                "  write of {} cells:              {:.1} (min {}, max {}, {} batches)",
                probe.batch_cells,
                probe.per_batch.mean,
                probe.per_batch.min,
                probe.per_batch.max,
                probe.per_batch.calls
            );
            let _ = writeln!(
                out,
                "  page of 20 rows with BASE bodies: {:.1} (min {}, max {}, {} pages)",
                probe.per_page.mean, probe.per_page.min, probe.per_page.max, probe.per_page.calls
            );
        }
        let summary = self.summary();
        if !summary.is_empty() {
            let _ = writeln!(out, "\nsummary");
            out.push_str(&summary);
        }
        for r in self.raw.iter().filter(|r| r.first_error.is_some()) {
            let _ = writeln!(
                out,
                "\n{} (raw SQL): {} errors, the first: {}",
                r.workload,
                r.errors,
                r.first_error.as_deref().unwrap_or_default()
            );
        }
        for r in self.runs.iter().filter(|r| r.first_error.is_some()) {
            let _ = writeln!(
                out,
                "\n{} ({}): {} errors, the first: {}",
                r.workload,
                r.path,
                r.errors,
                r.first_error.as_deref().unwrap_or_default()
            );
        }
        for problem in &self.problems {
            let _ = writeln!(out, "\nproblem: {problem}");
        }
        out
    }

    fn summary(&self) -> String {
        let mut out = String::new();
        if let Some(load) = &self.load {
            let _ = writeln!(
                out,
                "  load: {:.0} cells/s via {}, {}",
                load.cells_per_second,
                load.via,
                match (load.catch_up_seconds, load.backlog_seconds) {
                    (Some(s), _) => format!("indexes caught up {s:.2} s later"),
                    (None, Some(_)) => "index maintenance off".to_string(),
                    (None, None) => "index catch-up not measured".to_string(),
                }
            );
            if let Some(line) = load.backlog_line() {
                let _ = writeln!(out, "  {line}");
            }
        }
        if let Some(cold) = &self.cold_start {
            let _ = writeln!(out, "  cold start: {:.0} ms", cold.ready_ms);
        }
        let mut workloads: Vec<&str> = Vec::new();
        for run in &self.runs {
            if !workloads.contains(&run.workload) {
                workloads.push(run.workload);
            }
        }
        for workload in workloads {
            let find = |path| {
                self.runs
                    .iter()
                    .find(|r| r.workload == workload && r.path == path)
            };
            if let (Some(http), Some(rust)) = (find("HTTP"), find("Rust API")) {
                let _ = writeln!(
                    out,
                    "  {workload}: HTTP/Rust throughput {:.2}x, p50 {:.2}x, p99 {:.2}x",
                    http.requests_per_second / rust.requests_per_second.max(1e-9),
                    http.p50_ms / rust.p50_ms.max(1e-9),
                    http.p99_ms / rust.p99_ms.max(1e-9),
                );
            }
        }
        for r in &self.raw {
            let _ = writeln!(
                out,
                "  {}: HTTP/raw SQL throughput {}x ({} req/s over HTTP, {:.0} tx/s of raw SQL), \
                 p50 {}x, p99 {}x",
                r.workload,
                opt(r.http_over_raw, 2),
                opt(r.http_requests_per_second, 0),
                r.transactions_per_second,
                opt(r.http_p50_over_raw, 2),
                opt(r.http_p99_over_raw, 2),
            );
        }
        for m in &self.maintenance {
            let _ = writeln!(
                out,
                "  index maintenance ({}): applied {} cells/s while {:.0} were written, lag p99 {} ms, drained {}",
                m.path,
                opt(m.apply_cells_per_second, 0),
                m.write_cells_per_second,
                opt((m.samples > 0).then_some(m.lag_ms.p99), 0),
                match m.drain_seconds {
                    Some(s) => format!("{s:.2} s after the writes"),
                    None => "—".to_string(),
                }
            );
        }
        if let Some(probe) = &self.probe {
            let _ = writeln!(
                out,
                "  statements: {:.1} per {}-cell write, {:.1} per 20-row page",
                probe.per_batch.mean, probe.batch_cells, probe.per_page.mean
            );
        }
        out
    }

    /// The raw SQL baseline: each workload's transactions beside its HTTP
    /// requests, and the statements.
    fn raw_table(&self, out: &mut String) {
        let connections = self.raw[0].pool_connections;
        let _ = writeln!(
            out,
            "\nraw SQL baseline (cellgate's own statement per request on a pool of its own, {connections} \
             pooled connections, concurrency {})",
            self.parameters.concurrency
        );
        let _ = writeln!(
            out,
            "  {:<7} {:>9} {:>10} {:>9} {:>9} {:>7} {:>10} {:>9}",
            "", "tx", "tx/s", "p50 ms", "p99 ms", "errors", "HTTP req/s", "HTTP/raw"
        );
        for r in &self.raw {
            let _ = writeln!(
                out,
                "  {:<7} {:>9} {:>10.1} {:>9.2} {:>9.2} {:>7} {:>10} {:>9}",
                r.workload,
                r.transactions,
                r.transactions_per_second,
                r.p50_ms,
                r.p99_ms,
                r.errors,
                opt(r.http_requests_per_second, 1),
                opt(r.http_over_raw, 2),
            );
        }
        let _ = writeln!(
            out,
            "  tx: one statement, sent and every column of every row decoded; each checked \
             first against the rows of {} HTTP pages",
            self.raw[0].checked_pages
        );
        for r in &self.raw {
            let _ = writeln!(out, "  {}: {}", r.workload, r.statement);
        }
    }

    /// Writes the report as JSON to `path`.
    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        let text = serde_json::to_string_pretty(self).context("cannot encode the results")?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write `{}`", path.display()))
    }
}

/// `release` or `debug`.
pub fn build_profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// `value` with `decimals`, or `—` when not measured.
pub fn opt(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "—".to_string(), |v| format!("{v:.decimals$}"))
}

fn spread(spread: &Spread, samples: usize) -> String {
    if samples == 0 {
        return "—".to_string();
    }
    format!("{:.0}/{:.0}/{:.0}", spread.p50, spread.p99, spread.max)
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// The command line as typed, with URL passwords hidden and arguments
/// quoted where a shell would need it.
pub fn command_line() -> String {
    std::env::args()
        .enumerate()
        .map(|(i, arg)| {
            let arg = if i == 0 {
                "cellgate-bench".to_string()
            } else if arg.contains("://") {
                redact(&arg)
            } else {
                arg
            };
            quote(&arg)
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The `CELLGATE_*` variables the bench command reads, as `NAME=value`.
pub fn environment() -> Vec<String> {
    let mut variables: Vec<String> = std::env::vars()
        .filter(|(name, _)| {
            name.starts_with("CELLGATE_BENCH_")
                || name == "CELLGATE_DATASTORES"
                || name == "CELLGATE_LOG"
        })
        .map(|(name, value)| format!("{name}={}", quote(&redact(&value))))
        .collect();
    variables.sort();
    variables
}

fn quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@+%".contains(c));
    if plain {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

/// The raw SQL baseline of one workload.
#[derive(Debug, Clone, Serialize)]
pub struct RawReport {
    pub workload: &'static str,
    /// The statement of the first queried driver, placeholders in the
    /// backend's syntax; every request sends one like it.
    pub statement: String,
    /// Connections of the benchmark's pool.
    pub pool_connections: u32,
    /// HTTP pages the statement's rows were checked against.
    pub checked_pages: usize,
    /// One transaction is one request's statement, sent and decoded.
    pub transactions: u64,
    pub errors: u64,
    pub seconds: f64,
    pub transactions_per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// The same workload over HTTP, for the ratios.
    pub http_requests_per_second: Option<f64>,
    /// HTTP requests/s ÷ raw transactions/s.
    pub http_over_raw: Option<f64>,
    /// HTTP p50 ÷ raw p50 and p99 ÷ p99.
    pub http_p50_over_raw: Option<f64>,
    pub http_p99_over_raw: Option<f64>,
    pub first_error: Option<String>,
}

impl RawReport {
    pub fn failed(&self) -> bool {
        self.errors > 0 || self.transactions == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_quoting() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 * 1024 * 1024), "3.0 MiB");
        assert_eq!(quote("--trips"), "--trips");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
    }
}
