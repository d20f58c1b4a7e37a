//! What each index built from the cell log will read, from a store's log
//! heads, and about how long: at the rate of the largest build the store's
//! catalogs recorded (every cluster's share of the build runs at once, and
//! each index version is written to every cluster of its datastore, so the
//! build reads the datastore's log once per cluster, as its progress
//! counts it). Without a recorded build of at least 10,000 cells there is
//! no rate, and the plan says so rather than guess.

use std::collections::BTreeMap;

use cellgate_store::Inspection;

use super::changes::{Change, Estimate};

/// The changes that build an index from the cell log.
const BUILDS: [&str; 2] = ["INDEX_ADDED", "INDEX_REBUILT"];

/// The fewest cells a build must have read for its rate to count: a
/// smaller one is over within a few sweeps of the maintainer, so its rate
/// is that of the sweeps, not of the work.
const MEASURED_BUILD: i64 = 10_000;

/// Attaches an estimate to each index build among `changes`.
pub fn attach(changes: &mut [Change], inspection: &Inspection) {
    let rate = inspection
        .clusters
        .iter()
        .filter_map(|c| c.largest_build)
        .max_by_key(|b| b.cells)
        .filter(|b| b.cells >= MEASURED_BUILD && b.seconds > 0.0)
        .map(|b| b.cells as f64 / b.seconds);
    for change in changes.iter_mut().filter(|c| BUILDS.contains(&c.kind)) {
        let datastore = change.path.split('/').next().unwrap_or_default();
        let clusters: BTreeMap<String, i64> = inspection
            .clusters
            .iter()
            .filter_map(|c| Some((c.name.clone(), *c.log_cells.get(datastore)?)))
            .collect();
        let cells = clusters.values().sum();
        let reads = cells * clusters.len().max(1) as i64;
        change.estimate = Some(Estimate {
            cells,
            clusters,
            rate,
            seconds: rate.map(|rate| reads as f64 / rate),
        });
    }
}

/// One line for the text format.
pub fn describe(estimate: &Estimate) -> String {
    let per_cluster = if estimate.clusters.len() > 1 {
        let each: Vec<String> = estimate
            .clusters
            .iter()
            .map(|(name, n)| format!("{name} {}", thousands(*n)))
            .collect();
        format!(" ({})", each.join(", "))
    } else {
        String::new()
    };
    let time = match (estimate.seconds, estimate.rate) {
        (Some(seconds), Some(rate)) => format!(
            "; about {} at {} cells/s, the rate of the largest build this store recorded",
            duration(seconds),
            thousands(rate.round() as i64)
        ),
        _ => "; no build recorded on this store yet, so no time estimate".to_string(),
    };
    format!(
        "reads {} log cells{per_cluster}{time}",
        thousands(estimate.cells)
    )
}

/// `12,345`.
fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        out.insert(0, '-');
    }
    out
}

/// `under 1 s`, `42 s`, `3 min 20 s`, `2 h 5 min`.
fn duration(seconds: f64) -> String {
    let s = seconds.round() as u64;
    match s {
        0 => "under 1 s".to_string(),
        1..=59 => format!("{s} s"),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, s % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::{duration, thousands};

    #[test]
    fn figures_read_well() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(100_000), "100,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(duration(0.2), "under 1 s");
        assert_eq!(duration(42.4), "42 s");
        assert_eq!(duration(200.0), "3 min 20 s");
        assert_eq!(duration(7500.0), "2 h 5 min");
    }
}
