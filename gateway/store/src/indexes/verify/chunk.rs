//! One chunk of a verify run: the rows of a range of shards on one
//! cluster, their expected entries computed from their latest cells and
//! compared with the stored ones, entries without cells looked for, and
//! what differs reported (and repaired).

use super::*;

pub(super) struct Chunk<'a> {
    pub(super) topology: &'a Topology,
    pub(super) ds: &'a DatastoreRuntime,
    pub(super) consumers: &'a [Consumer],
    pub(super) indexes: &'a [usize],
    /// The cell cluster of the rows.
    pub(super) cluster: usize,
}

impl Chunk<'_> {
    fn cell_backend(&self, cluster: usize) -> Result<&std::sync::Arc<dyn Backend>> {
        self.topology.clusters[cluster].maintenance()
    }

    fn columns(&self) -> Vec<String> {
        self.indexes
            .iter()
            .flat_map(|&i| self.ds.indexes[i].def.columns.iter().cloned())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    /// Compares the entries of every row of `shards`; returns the
    /// mismatches (not yet confirmed).
    pub(super) async fn shards(
        &mut self,
        shards: &[u32],
        progress: &mut VerifyProgress,
    ) -> Result<Vec<Found>> {
        let backend = self.cell_backend(self.cluster)?.clone();
        let offsets = read_offsets(backend.as_ref(), self.ds, self.consumers, shards).await?;
        let source = self
            .read_source(backend.as_ref(), Selection::Shards(shards))
            .await?;
        progress.cells += source.cells;
        self.compare_bulk(&offsets, &source, progress).await
    }

    /// Reads the cells of the index columns of the selected rows: only the
    /// columns a verify needs, every version (for the pending check), the
    /// body of the latest version of each column decoded.
    async fn read_source(&self, backend: &dyn Backend, selection: Selection<'_>) -> Result<Source> {
        let columns = self.columns();
        let table = ddl::cells_table(self.ds.name());
        let keys: Vec<Value> = match selection {
            Selection::Shards(shards) => shards.iter().map(|s| Value::Int(i64::from(*s))).collect(),
            Selection::Rows(rows) => rows.iter().map(|r| Value::Uuid(*r)).collect(),
        };
        let by = match selection {
            Selection::Shards(_) => "shard",
            Selection::Rows(_) => "row_key",
        };
        let mut at: HashMap<Uuid, usize> = HashMap::new();
        let mut raw: Vec<SourceRow<Vec<u8>>> = Vec::new();
        let shards = self.ds.def.shards;
        let mut cells = 0u64;
        for part in keys.chunks(MAX_PARAMS / 2) {
            let mut sql = Sql::new(backend.dialect());
            sql.push("SELECT ")
                .idents(["row_key", "column_name", "ref_key", "added_id", "body"])
                .push(" FROM ")
                .ident(&table)
                .push(" WHERE ")
                .ident(by)
                .in_list(part.iter().cloned())
                .push(" AND ")
                .ident("column_name")
                .in_list(columns.iter().map(|c| Value::Text(c.clone())));
            type Row = (Uuid, String, i64, i64, Vec<u8>);
            for (row_key, column, ref_key, added_id, body) in backend.rows::<Row>(&sql).await? {
                let Some(c) = columns.iter().position(|name| *name == column) else {
                    continue;
                };
                cells += 1;
                let i = *at.entry(row_key).or_insert_with(|| {
                    raw.push(SourceRow {
                        row_key,
                        shard: row_shard(&row_key, shards),
                        latest: vec![None; columns.len()],
                        newest_added: vec![0; columns.len()],
                        unreadable: vec![false; columns.len()],
                    });
                    raw.len() - 1
                });
                let SourceRow {
                    latest,
                    newest_added: newest,
                    ..
                } = &mut raw[i];
                newest[c] = newest[c].max(added_id);
                if latest[c].as_ref().is_none_or(|(kept, _)| *kept < ref_key) {
                    latest[c] = Some((ref_key, body));
                }
            }
        }
        // Only the members the indexes read (fields and predicates) are decoded.
        let members: BTreeSet<String> = self
            .indexes
            .iter()
            .flat_map(|&i| self.ds.indexes[i].def.members())
            .map(str::to_string)
            .collect();
        let mut rows: Vec<SourceRow> = raw
            .into_iter()
            .map(|row| {
                let mut unreadable = row.unreadable;
                let latest = row
                    .latest
                    .into_iter()
                    .enumerate()
                    .map(|(c, cell)| {
                        let (ref_key, body) = cell?;
                        match codec::decode_members(&body, &members) {
                            Ok(body) => Some((ref_key, body)),
                            Err(_) => {
                                unreadable[c] = true;
                                None
                            }
                        }
                    })
                    .collect();
                SourceRow {
                    row_key: row.row_key,
                    shard: row.shard,
                    latest,
                    newest_added: row.newest_added,
                    unreadable,
                }
            })
            .collect();
        // In row-key order: reports come out sorted, and the databases
        // look the stored rows up in key order.
        rows.sort_unstable_by_key(|r| r.row_key);
        let at = rows
            .iter()
            .enumerate()
            .map(|(i, r)| (r.row_key, i))
            .collect();
        Ok(Source {
            columns,
            rows,
            at,
            cells,
        })
    }

    /// The entries of `index` that the source's rows (or only those of
    /// `only`) give; rows the maintainer has not caught up with are counted
    /// as pending, rows with an undecodable latest cell as unreadable.
    fn expected(
        &self,
        index: usize,
        offsets: &BTreeMap<u32, Vec<i64>>,
        source: &Source,
        only: Option<&BTreeSet<(usize, Uuid)>>,
        progress: &mut VerifyProgress,
    ) -> Vec<Expected> {
        let runtime = &self.ds.indexes[index];
        let columns: Vec<usize> = runtime
            .def
            .columns
            .iter()
            .filter_map(|c| source.column(c))
            .collect();
        // The lowest offset among the index's consumers, per shard.
        let applied = |shard: u32| -> i64 {
            offsets.get(&shard).map_or(0, |per| {
                self.consumers
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.index == index)
                    .map(|(i, _)| per[i])
                    .min()
                    .unwrap_or(0)
            })
        };
        let mut out = Vec::new();
        for row in &source.rows {
            if only.is_some_and(|o| !o.contains(&(index, row.row_key))) {
                continue;
            }
            let newest = columns
                .iter()
                .map(|&c| row.newest_added[c])
                .max()
                .unwrap_or(0);
            if newest > applied(row.shard) {
                progress.pending += 1;
                continue;
            }
            if columns.iter().any(|&c| row.unreadable[c]) {
                progress.unreadable += 1;
                continue;
            }
            progress.rows += 1;
            let mut scratch = PassResult::default();
            let entry = entry_from(
                runtime,
                self.ds.def.shards,
                |column| {
                    let c = source.column(column)?;
                    row.latest[c].as_ref().map(|(r, body)| (*r, body))
                },
                &mut scratch,
            );
            out.push(Expected {
                row_key: row.row_key,
                shard: row.shard,
                entry,
            });
        }
        out
    }

    /// The first look at a chunk: each index's expected entries are
    /// compared by the databases (`bulk`), which return only the rows that
    /// differ. The mismatches are candidates for [`Chunk::settle`].
    async fn compare_bulk(
        &self,
        offsets: &BTreeMap<u32, Vec<i64>>,
        source: &Source,
        progress: &mut VerifyProgress,
    ) -> Result<Vec<Found>> {
        let targets = self.ds.map().clusters();
        let expected: Vec<(usize, Vec<Expected>)> = self
            .indexes
            .iter()
            .map(|&index| (index, self.expected(index, offsets, source, None, progress)))
            .collect();
        // Per index and target cluster: the rows whose entry belongs there
        // (compared), and the others (any live row there is extra).
        let mut lists: Vec<(usize, usize, Vec<&Expected>, Vec<&Expected>)> = Vec::new();
        for (index, rows) in &expected {
            for &target in &targets {
                let (here, elsewhere) = rows.iter().partition(|e| {
                    e.entry.shard.map(|s| self.ds.map().cluster_of(s)) == Some(target)
                });
                lists.push((*index, target, here, elsewhere));
            }
        }
        let mut reads: Vec<futures::future::BoxFuture<'_, Result<Vec<Found>>>> = Vec::new();
        for (index, target, here, elsewhere) in &lists {
            let runtime = &self.ds.indexes[*index];
            for part in bulk::batches(here.len(), bulk::rows_per_statement(runtime)) {
                reads.push(Box::pin(self.bulk_mismatches(*index, *target, &here[part])));
            }
            for part in elsewhere.chunks(KEYS_PER_STATEMENT) {
                reads.push(Box::pin(self.bulk_extra(*index, *target, part)));
            }
        }
        // One statement at a time: a run keeps at most two in flight (two
        // chunks at once when it runs flat out), so most of the
        // maintenance pool stays free for the maintainer's passes and
        // leases.
        let mut found = Vec::new();
        for read in reads {
            found.extend(read.await?);
        }
        found.sort_by_key(|f| (f.index, f.row_key, f.target));
        Ok(found)
    }

    /// The rows of `rows` (whose entries belong on `target`) whose stored
    /// row on `target` is missing or stale.
    async fn bulk_mismatches(
        &self,
        index: usize,
        target: usize,
        rows: &[&Expected],
    ) -> Result<Vec<Found>> {
        let runtime = &self.ds.indexes[index];
        let backend = self.topology.clusters[target].maintenance()?;
        let pairs: Vec<(Uuid, &Entry)> = rows.iter().map(|e| (e.row_key, &e.entry)).collect();
        let sql = bulk::mismatches(backend.dialect(), runtime, &pairs);
        let by_key: HashMap<Uuid, &Expected> = rows.iter().map(|e| (e.row_key, *e)).collect();
        let mut found = Vec::new();
        for (row_key, live) in backend.rows::<(Uuid, Option<i64>)>(&sql).await? {
            let Some(e) = by_key.get(&row_key) else {
                continue;
            };
            found.push(Found {
                index,
                row_key,
                shard: e.shard,
                kind: if live.is_some() {
                    DriftKind::Stale
                } else {
                    DriftKind::Missing
                },
                target,
                expected: Some(e.entry.clone()),
                stored: None,
            });
        }
        Ok(found)
    }

    /// The rows of `rows` (whose entries belong elsewhere, or nowhere) that
    /// have a live stored row on `target`.
    async fn bulk_extra(
        &self,
        index: usize,
        target: usize,
        rows: &[&Expected],
    ) -> Result<Vec<Found>> {
        let runtime = &self.ds.indexes[index];
        let backend = self.topology.clusters[target].maintenance()?;
        let keys: Vec<Uuid> = rows.iter().map(|e| e.row_key).collect();
        let sql = bulk::live(backend.dialect(), runtime, &keys);
        let by_key: HashMap<Uuid, &Expected> = rows.iter().map(|e| (e.row_key, *e)).collect();
        Ok(backend
            .rows::<(Uuid,)>(&sql)
            .await?
            .into_iter()
            .filter_map(|(row_key,)| {
                by_key.get(&row_key).map(|e| Found {
                    index,
                    row_key,
                    shard: e.shard,
                    kind: DriftKind::Extra,
                    target,
                    expected: None,
                    stored: None,
                })
            })
            .collect())
    }

    /// The second look at candidate mismatches (the rows of `only`): the
    /// stored rows are read and compared with the expected entries in Rust
    /// ([`same`]).
    async fn compare_exact(
        &self,
        offsets: &BTreeMap<u32, Vec<i64>>,
        source: &Source,
        only: &BTreeSet<(usize, Uuid)>,
        progress: &mut VerifyProgress,
    ) -> Result<Vec<Found>> {
        let mut found = Vec::new();
        let targets = self.ds.map().clusters();
        for &index in self.indexes {
            let expected = self.expected(index, offsets, source, Some(only), progress);
            if expected.is_empty() {
                continue;
            }
            let runtime = &self.ds.indexes[index];
            let rows: Vec<Uuid> = expected.iter().map(|e| e.row_key).collect();
            let stored = read_stored(self.topology, runtime, &targets, &rows).await?;
            for e in expected {
                let home = e.entry.shard.map(|s| self.ds.map().cluster_of(s));
                for &target in &targets {
                    let live = stored
                        .get(&(target, e.row_key))
                        .filter(|s| s.shard.is_some());
                    let kind = match (home == Some(target), live) {
                        (true, None) => Some(DriftKind::Missing),
                        (true, Some(s)) if !same(&e.entry, s) => Some(DriftKind::Stale),
                        (false, Some(_)) => Some(DriftKind::Extra),
                        _ => None,
                    };
                    if let Some(kind) = kind {
                        found.push(Found {
                            index,
                            row_key: e.row_key,
                            shard: e.shard,
                            kind,
                            target,
                            expected: (home == Some(target)).then(|| e.entry.clone()),
                            stored: live.cloned(),
                        });
                    }
                }
            }
        }
        Ok(found)
    }

    /// Reads the mismatches again and reports (and repairs) those that
    /// remain.
    pub(super) async fn settle(
        &mut self,
        found: Vec<Found>,
        repair: bool,
        progress: &mut VerifyProgress,
        out: &mut Vec<Drift>,
    ) -> Result<()> {
        if found.is_empty() {
            return Ok(());
        }
        let only: BTreeSet<(usize, Uuid)> = found.iter().map(|f| (f.index, f.row_key)).collect();
        let rows: Vec<Uuid> = only
            .iter()
            .map(|(_, r)| *r)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let backend = self.cell_backend(self.cluster)?.clone();
        let shards: Vec<u32> = found
            .iter()
            .map(|f| f.shard)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let offsets = read_offsets(backend.as_ref(), self.ds, self.consumers, &shards).await?;
        let source = self
            .read_source(backend.as_ref(), Selection::Rows(&rows))
            .await?;
        // The second look counts nothing but the drift it confirms.
        let mut again = VerifyProgress::default();
        let mut confirmed = self
            .compare_exact(&offsets, &source, &only, &mut again)
            .await?;
        progress.pending += again.pending;
        // Rows with no cells left in the index columns: whatever is live is extra.
        let first: HashMap<(usize, Uuid, usize), &Found> = found
            .iter()
            .map(|f| ((f.index, f.row_key, f.target), f))
            .collect();
        confirmed.retain(|f| first.contains_key(&(f.index, f.row_key, f.target)));
        let missing_rows: Vec<&Found> = found
            .iter()
            .filter(|f| source.row(&f.row_key).is_none() && f.kind == DriftKind::Extra)
            .collect();
        for f in missing_rows {
            let runtime = &self.ds.indexes[f.index];
            let stored = read_stored(self.topology, runtime, &[f.target], &[f.row_key]).await?;
            if let Some(live) = stored
                .get(&(f.target, f.row_key))
                .filter(|s| s.shard.is_some())
            {
                confirmed.push(Found {
                    stored: Some(live.clone()),
                    expected: None,
                    ..*f
                });
            }
        }
        self.report(confirmed, repair, progress, out).await
    }

    async fn report(
        &mut self,
        confirmed: Vec<Found>,
        repair: bool,
        progress: &mut VerifyProgress,
        out: &mut Vec<Drift>,
    ) -> Result<()> {
        if confirmed.is_empty() {
            return Ok(());
        }
        let repaired = if repair {
            self.repair(&confirmed).await?
        } else {
            HashSet::new()
        };
        for f in &confirmed {
            progress.count(f.kind);
            let runtime = &self.ds.indexes[f.index];
            let fixed = repaired.contains(&(f.index, f.row_key));
            if fixed {
                progress.repaired += 1;
            }
            out.push(Drift {
                index: runtime.def.name.clone(),
                row_key: f.row_key,
                shard: f.shard,
                kind: f.kind,
                cluster: self.topology.clusters[f.target].name.clone(),
                expected: f
                    .expected
                    .as_ref()
                    .map(|e| entry_json(runtime, e.shard, &e.fields, &e.refs)),
                stored: f
                    .stored
                    .as_ref()
                    .map(|s| entry_json(runtime, s.shard, &s.fields, &s.refs)),
                repaired: fixed,
            });
        }
        Ok(())
    }

    /// Deletes the wrong live entries that are still as read, then writes
    /// every drifting row's entry with the maintainer's guarded upsert.
    /// Returns the (index, row) pairs written.
    async fn repair(&mut self, confirmed: &[Found]) -> Result<HashSet<(usize, Uuid)>> {
        for f in confirmed {
            if let Some(stored) = &f.stored {
                let runtime = &self.ds.indexes[f.index];
                let backend = self.topology.clusters[f.target].maintenance()?;
                let mut sql = Sql::new(backend.dialect());
                sql.push("DELETE FROM ")
                    .ident(&runtime.table)
                    .push(" WHERE ")
                    .ident("row_key")
                    .push(" = ")
                    .bind(Value::Uuid(f.row_key))
                    .push(" AND ")
                    .ident(ddl::INDEX_SHARD_COLUMN)
                    .push(" = ")
                    .bind(Value::Int(i64::from(stored.shard.unwrap_or(0))))
                    .push(" AND ")
                    .ident("_updated_at")
                    .push(" = ")
                    .bind(stored.updated_at.clone());
                backend.execute(&sql).await?;
            }
        }
        let mut by_cluster: BTreeMap<usize, Touched> = BTreeMap::new();
        for f in confirmed {
            by_cluster
                .entry(self.ds.map().cluster_of(f.shard))
                .or_default()
                .insert((f.index, f.row_key), (f.shard, 0));
        }
        let mut written = HashSet::new();
        let mut attempts = HashMap::new();
        for (cluster, touched) in by_cluster {
            let mut pass = Pass {
                topology: self.topology,
                ds: self.ds,
                cluster,
                consumers: self.consumers,
                fence: None,
                attempts: &mut attempts,
                quarantine_after: 1,
                hook: None,
                recent: None,
            };
            pass.reapply(&touched, &[]).await?;
            written.extend(touched.keys().copied());
        }
        Ok(written)
    }

    /// Finds live entries of `index` whose rows have no cells in the
    /// index's columns (so the shard scan never met them).
    pub(super) async fn orphans(
        &mut self,
        index: usize,
        shards: &[u32],
        options: &VerifyOptions,
        progress: &mut VerifyProgress,
        out: &mut Vec<Drift>,
    ) -> Result<()> {
        let runtime = &self.ds.indexes[index];
        let selected: HashSet<u32> = shards.iter().copied().collect();
        for target in self.ds.map().clusters() {
            let backend = self.topology.clusters[target].maintenance()?.clone();
            let mut after: Option<Uuid> = None;
            loop {
                // A page of up to ORPHAN_PAGE keys of the index table, ending
                // at `upper` (the last page has none), whose live entries
                // the database checks against its own cells: only those
                // without a cell here come back, to be looked for on the
                // row's cell cluster (another one in a multi-cluster
                // datastore).
                let upper = page_end(backend.as_ref(), &runtime.table, after).await?;
                let page = live_without_local_cells(
                    backend.as_ref(),
                    runtime,
                    &ddl::cells_table(self.ds.name()),
                    after,
                    upper,
                )
                .await?;
                let mut by_cluster: BTreeMap<usize, Vec<Uuid>> = BTreeMap::new();
                for row_key in &page {
                    let shard = row_shard(row_key, self.ds.def.shards);
                    if selected.contains(&shard) {
                        by_cluster
                            .entry(self.ds.map().cluster_of(shard))
                            .or_default()
                            .push(*row_key);
                    }
                }
                for (cell_cluster, rows) in by_cluster {
                    let mut have = HashSet::new();
                    if cell_cluster != target {
                        for part in rows.chunks(KEYS_PER_STATEMENT) {
                            have.extend(self.rows_with_cells(cell_cluster, runtime, part).await?);
                        }
                    }
                    let lonely: Vec<Found> = rows
                        .iter()
                        .filter(|r| !have.contains(r))
                        .map(|r| Found {
                            index,
                            row_key: *r,
                            shard: row_shard(r, self.ds.def.shards),
                            kind: DriftKind::Extra,
                            target,
                            expected: None,
                            stored: None,
                        })
                        .collect();
                    if !lonely.is_empty() {
                        self.cluster = cell_cluster;
                        self.settle(lonely, options.repair, progress, out).await?;
                    }
                }
                match upper {
                    Some(upper) => after = Some(upper),
                    None => break,
                }
            }
        }
        Ok(())
    }

    /// Which of `rows` have a cell in one of the index's columns.
    async fn rows_with_cells(
        &self,
        cluster: usize,
        runtime: &IndexRuntime,
        rows: &[Uuid],
    ) -> Result<HashSet<Uuid>> {
        let backend = self.cell_backend(cluster)?;
        let mut sql = Sql::new(backend.dialect());
        sql.push("SELECT DISTINCT ")
            .ident("row_key")
            .push(" FROM ")
            .ident(&ddl::cells_table(self.ds.name()))
            .push(" WHERE ")
            .ident("row_key")
            .in_list(rows.iter().map(|r| Value::Uuid(*r)))
            .push(" AND ")
            .ident("column_name")
            .in_list(runtime.def.columns.iter().map(|c| Value::Text(c.clone())));
        Ok(backend
            .rows::<(Uuid,)>(&sql)
            .await?
            .into_iter()
            .map(|(row_key,)| row_key)
            .collect())
    }
}

#[derive(Clone, Copy)]
enum Selection<'a> {
    Shards(&'a [u32]),
    Rows(&'a [Uuid]),
}

/// Index rows a page of the orphan phase covers: sized so that a page
/// is one short statement even on a server's statement timeout.
const ORPHAN_PAGE: usize = 10_000;

/// The key that ends the page of `table` after `after`: the
/// [`ORPHAN_PAGE`]th key, or `None` when fewer keys are left.
async fn page_end(backend: &dyn Backend, table: &str, after: Option<Uuid>) -> Result<Option<Uuid>> {
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT ")
        .ident("row_key")
        .push(" FROM ")
        .ident(table);
    if let Some(after) = after {
        sql.push(" WHERE ")
            .ident("row_key")
            .push(" > ")
            .bind(Value::Uuid(after));
    }
    sql.push(" ORDER BY ")
        .ident("row_key")
        .push(&format!(" LIMIT 1 OFFSET {}", ORPHAN_PAGE - 1));
    Ok(backend
        .first_row::<(Uuid,)>(&sql)
        .await?
        .map(|(row_key,)| row_key))
}

/// The live entries of `runtime` with keys in (`after`, `upper`] whose row
/// has no cell in the index's columns in this database.
async fn live_without_local_cells(
    backend: &dyn Backend,
    runtime: &IndexRuntime,
    cells_table: &str,
    after: Option<Uuid>,
    upper: Option<Uuid>,
) -> Result<Vec<Uuid>> {
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT t.")
        .ident("row_key")
        .push(" FROM ")
        .ident(&runtime.table)
        .push(" t WHERE t.")
        .ident(ddl::INDEX_SHARD_COLUMN)
        .push(" IS NOT NULL");
    if let Some(after) = after {
        sql.push(" AND t.")
            .ident("row_key")
            .push(" > ")
            .bind(Value::Uuid(after));
    }
    if let Some(upper) = upper {
        sql.push(" AND t.")
            .ident("row_key")
            .push(" <= ")
            .bind(Value::Uuid(upper));
    }
    sql.push(" AND NOT EXISTS (SELECT 1 FROM ")
        .ident(cells_table)
        .push(" c WHERE c.")
        .ident("row_key")
        .push(" = t.")
        .ident("row_key")
        .push(" AND c.")
        .ident("column_name")
        .in_list(runtime.def.columns.iter().map(|c| Value::Text(c.clone())))
        .push(")");
    Ok(backend
        .rows::<(Uuid,)>(&sql)
        .await?
        .into_iter()
        .map(|(row_key,)| row_key)
        .collect())
}

/// The stored rows of `rows` in `runtime`'s table on each of `targets`.
async fn read_stored(
    topology: &Topology,
    runtime: &IndexRuntime,
    targets: &[usize],
    rows: &[Uuid],
) -> Result<HashMap<(usize, Uuid), Stored>> {
    let index = &runtime.def;
    let mut names: Vec<String> = vec!["row_key".into(), ddl::INDEX_SHARD_COLUMN.into()];
    names.extend(index.fields.iter().map(|f| f.name.clone()));
    names.extend(index.columns.iter().map(|c| ddl::ref_column(c)));
    names.push("_updated_at".into());
    let mut types = vec![ColType::Uuid, ColType::Int];
    types.extend(index.fields.iter().map(|f| col_type(f.ty)));
    types.extend(index.columns.iter().map(|_| ColType::Int));
    types.push(ColType::DateTime);
    let mut pages = Vec::new();
    for &target in targets {
        for part in rows.chunks(KEYS_PER_STATEMENT) {
            pages.push(read_page(topology, &runtime.table, &names, &types, target, part).await?);
        }
    }
    let mut stored = HashMap::new();
    for (target, page) in pages {
        for row in page {
            let mut row = row.into_iter();
            let Some(Value::Uuid(row_key)) = row.next() else {
                continue;
            };
            let shard = row.next().and_then(|v| v.as_int()).map(|s| s as u32);
            let fields: Vec<Value> = row.by_ref().take(index.fields.len()).collect();
            let refs: Vec<Option<i64>> = row
                .by_ref()
                .take(index.columns.len())
                .map(|v| v.as_int())
                .collect();
            let updated_at = row.next().unwrap_or(Value::Null(ColType::DateTime));
            stored.insert(
                (target, row_key),
                Stored {
                    shard,
                    fields,
                    refs,
                    updated_at,
                },
            );
        }
    }
    Ok(stored)
}

/// The rows of `part` in `table` on cluster `target`.
async fn read_page(
    topology: &Topology,
    table: &str,
    names: &[String],
    types: &[ColType],
    target: usize,
    part: &[Uuid],
) -> Result<(usize, Vec<crate::storage::Row>)> {
    let backend = topology.clusters[target].maintenance()?;
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT ")
        .idents(names.iter().map(String::as_str))
        .push(" FROM ")
        .ident(table)
        .push(" WHERE ")
        .ident("row_key")
        .in_list(part.iter().map(|r| Value::Uuid(*r)));
    Ok((target, backend.fetch(&sql, types).await?))
}

/// Whether a live stored row is the expected entry.
fn same(expected: &Entry, stored: &Stored) -> bool {
    expected.shard == stored.shard
        && expected.refs == stored.refs
        && expected.fields.len() == stored.fields.len()
        && expected
            .fields
            .iter()
            .zip(&stored.fields)
            .all(|(a, b)| same_value(a, b))
}

fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Null(_), Value::Null(_)) => true,
        _ => a == b,
    }
}

/// An entry as JSON for the report: its fields by name, `_shard` and the
/// source ref keys as `_ref_<column>`.
fn entry_json(
    runtime: &IndexRuntime,
    shard: Option<u32>,
    fields: &[Value],
    refs: &[Option<i64>],
) -> serde_json::Value {
    let mut object = serde_json::Map::new();
    object.insert("_shard".into(), shard.into());
    for (field, value) in runtime.def.fields.iter().zip(fields) {
        object.insert(field.name.clone(), value_json(value));
    }
    for (column, r) in runtime.def.columns.iter().zip(refs) {
        object.insert(ddl::ref_column(column), r.map(|r| r.to_string()).into());
    }
    serde_json::Value::Object(object)
}

fn value_json(value: &Value) -> serde_json::Value {
    use serde_json::Value as J;
    match value {
        Value::Null(_) => J::Null,
        Value::Bool(b) => J::Bool(*b),
        Value::Int(i) => J::String(i.to_string()),
        Value::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
        Value::Text(s) => J::String(s.clone()),
        Value::Bytes(b) => J::String(hex_text(b)),
        Value::Uuid(u) => J::String(u.to_string()),
        Value::DateTime(t) => J::String(t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)),
        Value::Array(_, values) => J::Array(values.iter().map(value_json).collect()),
    }
}

fn hex_text(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
