//! Applying new definitions to a running store (`Store::reload`).
//!
//! What a reload may change, and how each change is applied:
//!
//! | change | applied as |
//! |---|---|
//! | an index added | its table is created on every ready cluster of the datastore, its version recorded as building; it is filled from the cell log while queries on it answer `INDEX_BUILDING` (as at start-up) |
//! | an index changed (fields, types, paths, shard field, `where:`) | a new table version, built like an added index; the previous version stays maintained and answers the queries it can answer until the new one is ready, then is retired ([`retire`]); its table stays until `cellgate index drop` |
//! | an index removed | no longer served nor maintained; its table and progress stay until `cellgate index drop` |
//! | a column added, descriptions | served at once |
//! | a datastore added | its tables and shard rows are created, as at start-up |
//!
//! Refused, with nothing changed (they need a restart, or are refused at
//! start-up too): a datastore removed, a column removed, a new shard count,
//! anything a cluster's catalog refuses (`catalog::validate`). Triggers are
//! the gateway's business; the store ignores them.
//!
//! **Order.** The new definitions are checked against every ready
//! cluster's catalog and their new tables are created before anything is
//! served from them; only then is the topology's snapshot replaced
//! (`Topology::replace`). Requests that loaded the previous snapshot finish
//! with it. The maintenance workers of each changed datastore are stopped
//! before the replacement (so no pass applies the log for the previous
//! consumers under the new definitions) and started again after it, with
//! the consumers of the new one; an index version they find caught up is
//! ready at once. Clusters that are not prepared yet (unreachable since
//! start-up) are prepared with the new definitions when they answer.

use std::collections::HashMap;
use std::sync::Arc;

use index_dsl::{Datastore, Definitions};

use crate::catalog;
use crate::error::{Error, Result};
use crate::indexes::maintainer::{self, Maintainer};
use crate::topology::{ClusterState, DatastoreRuntime, Defined, IndexRuntime, Topology};

/// What a reload changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// One line per change, e.g. ``index `by_city` of `trips` added
    /// (version 1, filled from the cell log; …)``; empty when the definitions
    /// were those served already.
    pub changes: Vec<String>,
    /// Notes worth a warning: tables that stay, superseded versions.
    pub warnings: Vec<String>,
}

impl ReloadReport {
    /// Whether the reload changed nothing.
    pub fn unchanged(&self) -> bool {
        self.changes.is_empty()
    }
}

/// Checks and applies `defs` (see the module doc).
pub(crate) async fn reload(
    topology: &Arc<Topology>,
    maintainer: &Arc<Maintainer>,
    config: &crate::StorageConfig,
    defs: Definitions,
) -> Result<ReloadReport> {
    let old = topology.defined();
    refuse_runtime_changes(&old.defs, &defs)?;
    let maps = crate::options::shard_maps(&defs, config)?;
    // The catalogs of the prepared clusters; a pending one is prepared
    // with the new definitions when it answers.
    let mut catalogs = Vec::new();
    for cluster in &topology.clusters {
        if cluster.state() != ClusterState::Ready {
            continue;
        }
        let found = catalog::read(cluster.master()?.as_ref()).await?;
        catalogs.push((cluster, found));
    }
    let mut warnings = Vec::new();
    let reachable: Vec<&catalog::Catalog> = catalogs.iter().map(|(_, c)| c).collect();
    let plans = catalog::plan_indexes(&defs, &reachable, &mut warnings);
    // Indexes removed now are reported as changes below; those removed
    // before were warned about at start-up or by their own reload.
    warnings.retain(|w| !w.contains("is no longer defined"));

    let mut changes = Vec::new();
    let mut datastores = HashMap::new();
    let mut changed: Vec<Arc<DatastoreRuntime>> = Vec::new();
    for def in &defs.datastores {
        let previous = old.datastores.get(&def.name);
        if let Some(previous) = previous.filter(|p| same_store_part(&p.def, def)) {
            // Triggers are the gateway's; the store's part is unchanged.
            let runtime = if previous.def == *def {
                previous.clone()
            } else {
                Arc::new(previous.redefined(def.clone(), previous.indexes.clone()))
            };
            datastores.insert(def.name.clone(), runtime);
            continue;
        }
        let first_change = changes.len();
        let mut indexes = Vec::new();
        let mut serving = Vec::new();
        for index in &def.indexes {
            let plan = &plans[&(def.name.clone(), index.name.clone())];
            // The versions of this index served until now: the current one
            // and a previous one serving while it is built.
            let served: Vec<&Arc<IndexRuntime>> = previous
                .map(|p| {
                    p.indexes
                        .iter()
                        .filter(|i| i.def.name == index.name)
                        .collect()
                })
                .unwrap_or_default();
            let before = previous.and_then(|p| p.index(&index.name).ok());
            let kept = before.filter(|i| i.version == plan.version && i.def == *index);
            let current = match kept {
                Some(kept) => kept.clone(),
                None => {
                    let serves = (!served
                        .iter()
                        .any(|i| i.version == plan.version && i.is_ready()))
                    .then(|| previous_version(&served, plan))
                    .flatten();
                    changes.push(match before {
                        Some(before) if before.version != plan.version => format!(
                            "index `{}` of `{}` changed: version {} replaces version {} \
                             (filled from the cell log; {})",
                            index.name,
                            def.name,
                            plan.version,
                            before.version,
                            match &serves {
                                Some((v, _)) => format!(
                                    "version {v} answers the queries it can answer until then"
                                ),
                                None => "INDEX_BUILDING until it has caught up".to_string(),
                            }
                        ),
                        Some(_) => format!(
                            "index `{}` of `{}`: description updated",
                            index.name, def.name
                        ),
                        None => format!(
                            "index `{}` of `{}` added (version {}, filled from the cell log; \
                             INDEX_BUILDING until it has caught up)",
                            index.name, def.name, plan.version
                        ),
                    });
                    // Served again from now on: whatever the catalog says,
                    // it is ready only once it is caught up with the log
                    // (a removed index was not maintained meanwhile); a
                    // version served until now, also as the previous one,
                    // was.
                    let ready = served
                        .iter()
                        .any(|b| b.version == plan.version && b.is_ready());
                    if let Some((version, def)) = serves {
                        let runtime = IndexRuntime::new(def, version, true);
                        runtime.set_serves_until(plan.version);
                        serving.push(Arc::new(runtime));
                    }
                    Arc::new(IndexRuntime::new(index.clone(), plan.version, ready))
                }
            };
            if kept.is_some() {
                // Still building, or switched within the grace: the
                // previous version goes on until `retire` takes it out.
                serving.extend(
                    served
                        .iter()
                        .filter(|i| i.serves_until() == Some(current.version))
                        .map(|i| (*i).clone()),
                );
            }
            indexes.push(current);
        }
        indexes.extend(serving);
        let runtime = match previous {
            Some(previous) => {
                for index in &previous.def.indexes {
                    if def.index(&index.name).is_none() {
                        let version = previous.index(&index.name).map(|i| i.version)?;
                        changes.push(format!(
                            "index `{}` of `{}` removed: no longer served; its table `{}` \
                             stays until `cellgate index drop {} {}`",
                            index.name,
                            def.name,
                            crate::storage::ddl::index_table(&def.name, &index.name, version),
                            def.name,
                            index.name
                        ));
                    }
                }
                for column in &def.columns {
                    if previous.def.column(&column.name).is_none() {
                        changes.push(format!("column `{}` of `{}` added", column.name, def.name));
                    }
                }
                if previous.def.description != def.description
                    || columns_described(&previous.def) != columns_described(def)
                {
                    changes.push(format!("descriptions of `{}` updated", def.name));
                }
                previous.redefined(def.clone(), indexes)
            }
            None => {
                changes.insert(
                    first_change,
                    format!("datastore `{}` added ({} shards)", def.name, def.shards),
                );
                DatastoreRuntime::new(def.clone(), maps[&def.name].clone(), indexes)
            }
        };
        let runtime = Arc::new(runtime);
        changed.push(runtime.clone());
        datastores.insert(def.name.clone(), runtime);
    }
    let defined = Defined {
        defs: Arc::new(defs),
        datastores,
    };
    for (cluster, found) in &catalogs {
        catalog::validate_defined(&defined, cluster, found, &mut warnings)?;
    }
    if changed.is_empty() {
        topology.replace(defined);
        return Ok(ReloadReport { changes, warnings });
    }
    for (cluster, found) in &catalogs {
        catalog::prepare_reloaded(&changed, cluster, found).await?;
    }
    for ds in &changed {
        maintainer::pause(maintainer, ds.name()).await;
    }
    topology.replace(defined);
    for ds in &changed {
        maintainer::resume(topology, maintainer, ds).await;
    }
    for change in &changes {
        tracing::debug!("definitions reloaded: {change}");
    }
    Ok(ReloadReport { changes, warnings })
}

/// Retires the previous index versions whose new version has been ready
/// for `grace`: each datastore that has one is served by a runtime
/// without it, its workers stopped and started again as for a reload, so
/// the previous version's consumers stop. `ready_since` remembers when
/// each new version was first seen ready. Called by one task of the store
/// under its reload lock.
///
/// The switch itself is the new version's readiness: from then on queries
/// are answered from it (`indexes/query.rs`). The grace keeps the previous
/// version maintained while other gateways, which notice the new version
/// ready at their own next sweep, may still answer from it.
pub(crate) async fn retire(
    topology: &Arc<Topology>,
    maintainer: &Arc<Maintainer>,
    grace: std::time::Duration,
    ready_since: &mut HashMap<(String, String, u32), std::time::Instant>,
) {
    let defined = topology.defined();
    let mut datastores = defined.datastores.clone();
    let mut changed = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (name, ds) in &defined.datastores {
        let mut retired = Vec::new();
        for (position, runtime) in ds.indexes.iter().enumerate() {
            let Some(building) = runtime.serves_until() else {
                continue;
            };
            let current = ds.index(&runtime.def.name).ok();
            if current.is_some_and(|c| c.version == building && !c.is_ready()) {
                continue;
            }
            let key = (name.clone(), runtime.def.name.clone(), building);
            let since = *ready_since
                .entry(key.clone())
                .or_insert_with(std::time::Instant::now);
            seen.insert(key);
            if since.elapsed() >= grace {
                retired.push(position);
            }
        }
        if retired.is_empty() {
            continue;
        }
        for &position in &retired {
            let runtime = &ds.indexes[position];
            tracing::info!(
                datastore = %name,
                index = %runtime.def.name,
                version = runtime.version,
                "previous index version retired: no longer maintained (its table stays until `cellgate index drop`)"
            );
        }
        let indexes = ds
            .indexes
            .iter()
            .enumerate()
            .filter(|(position, _)| !retired.contains(position))
            .map(|(_, i)| i.clone())
            .collect();
        let runtime = Arc::new(ds.redefined(ds.def.clone(), indexes));
        changed.push(runtime.clone());
        datastores.insert(name.clone(), runtime);
    }
    ready_since.retain(|key, _| seen.contains(key));
    if changed.is_empty() {
        return;
    }
    for ds in &changed {
        maintainer::pause(maintainer, ds.name()).await;
    }
    topology.replace(Defined {
        defs: defined.defs.clone(),
        datastores,
    });
    for ds in &changed {
        maintainer::resume(topology, maintainer, ds).await;
    }
}

/// The version that serves while `plan`'s is built: the ready version
/// served (and so maintained) until now, the current one or the previous
/// one it served for. Not one the catalog alone records: a removed
/// index's table was not maintained since.
fn previous_version(
    served: &[&Arc<IndexRuntime>],
    plan: &catalog::IndexPlan,
) -> Option<(u32, Arc<index_dsl::Index>)> {
    served
        .iter()
        .filter(|i| i.version != plan.version && i.is_ready())
        .max_by_key(|i| (i.serves_until().is_none(), i.version))
        .map(|i| (i.version, i.def.clone()))
}

/// Whether two definitions of a datastore agree on all but triggers.
fn same_store_part(a: &Datastore, b: &Datastore) -> bool {
    a.name == b.name
        && a.shards == b.shards
        && a.description == b.description
        && a.columns == b.columns
        && a.indexes == b.indexes
}

fn columns_described(ds: &Datastore) -> Vec<(&str, Option<&str>)> {
    ds.columns
        .iter()
        .map(|c| (c.name.as_str(), c.description.as_deref()))
        .collect()
}

/// Refuses what a running store cannot change, naming every such change.
fn refuse_runtime_changes(old: &Definitions, new: &Definitions) -> Result<()> {
    let mut problems = Vec::new();
    for before in &old.datastores {
        let Some(after) = new.datastore(&before.name) else {
            problems.push(format!(
                "datastore `{}` was removed: a running gateway keeps serving it; restart to \
                 stop serving it (its tables stay)",
                before.name
            ));
            continue;
        };
        if after.shards != before.shards {
            problems.push(format!(
                "datastore `{}` has {} shards but its definition now says {}: the shard count \
                 is fixed at creation; restore `shards: {}`",
                before.name, before.shards, after.shards, before.shards
            ));
        }
        for column in &before.columns {
            if after.column(&column.name).is_none() {
                problems.push(format!(
                    "column `{}` of `{}` was removed: a running gateway keeps serving it; \
                     restart to remove it",
                    column.name, before.name
                ));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::ReloadRefused(problems.join("\n")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defs(files: &[(&str, &str)]) -> Definitions {
        index_dsl::load_files(std::path::Path::new("defs"), files.iter().copied())
            .expect("valid definitions")
    }

    const TRIPS: (&str, &str) = (
        "trips/datastore.yaml",
        "name: trips\nshards: 8\ncolumns:\n  - name: BASE\n  - name: STATUS\n",
    );
    const PAYMENTS: (&str, &str) = (
        "payments/datastore.yaml",
        "name: payments\nshards: 8\ncolumns:\n  - name: BASE\n",
    );

    #[test]
    fn removed_datastores_and_columns_and_new_shard_counts_are_refused_together() {
        let old = defs(&[TRIPS, PAYMENTS]);
        let new = defs(&[(
            "trips/datastore.yaml",
            "name: trips\nshards: 16\ncolumns:\n  - name: BASE\n",
        )]);
        let err = refuse_runtime_changes(&old, &new).unwrap_err();
        assert_eq!(err.code(), "RELOAD_REFUSED");
        let message = err.to_string();
        assert!(
            message.contains("datastore `payments` was removed"),
            "{message}"
        );
        assert!(
            message.contains("has 8 shards but its definition now says 16"),
            "{message}"
        );
        assert!(
            message.contains("column `STATUS` of `trips` was removed"),
            "{message}"
        );
    }

    #[test]
    fn added_datastores_columns_and_indexes_are_not_refused() {
        let old = defs(&[TRIPS]);
        let new = defs(&[
            (
                "trips/datastore.yaml",
                "name: trips\nshards: 8\ncolumns:\n  - name: BASE\n  - name: STATUS\n  - name: NOTES\n",
            ),
            (
                "trips/indexes/by_city.yaml",
                "table: by_city\ndatastore: trips\ncolumn_defs:\n  - column_key: BASE\n    fields:\n      - { field: city, type: string }\n",
            ),
            PAYMENTS,
        ]);
        refuse_runtime_changes(&old, &new).unwrap();
    }
}
