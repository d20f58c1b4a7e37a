//! Running a plan: one SQL statement per cluster, in parallel, merged.
//!
//! Each statement selects only the projected fields, filters on the shard
//! field first (so the `(shard_field, field, row_key)` SQL indexes apply),
//! continues after the cursor with a keyset condition (never `OFFSET`) and
//! reads one row more than the page to know whether another page exists.
//! An `in` list on the shard field becomes one statement per cluster
//! holding any of the values' shards, a `UNION ALL` of one page-long
//! index range scan per value; their rows are merged in the same order in
//! Rust.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use index_dsl::{CompareOp, Index};
use uuid::Uuid;

use super::cursor::{self, Position};
use super::entry::col_type;
use super::plan::{IndexQuery, QueryPlan};
use crate::cells::Cell;
use crate::cells::{
    codec, decoded_cell, get_named_cells_json, with_latest_cells, with_latest_ref_keys, CellCache,
    CellKey, CELL_TYPES,
};
use crate::error::{Error, Result};
use crate::replicas::{read_on, ReadOptions};
use crate::storage::{ddl, ColType, Dialect, Sql, Value};
use crate::topology::{DatastoreRuntime, IndexRuntime, Topology};

/// One index entry of a result.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexEntry {
    pub row_key: Uuid,
    /// The projected fields, by name, in index order. A page's entries
    /// share their names.
    pub fields: Vec<(Arc<str>, Value)>,
    /// Position of this entry in the query's order; encoded into a cursor
    /// only when asked for, since most entries' cursors are never read.
    position: Position,
    signature: u64,
}

impl IndexEntry {
    /// The value of the projected field `name` (as in the definitions).
    pub fn field(&self, name: &str) -> Option<&Value> {
        self.fields
            .iter()
            .find(|(n, _)| &**n == name)
            .map(|(_, v)| v)
    }

    /// The opaque cursor of this entry, for `after`.
    pub fn cursor(&self) -> String {
        cursor::encode(self.signature, &self.position)
    }
}

/// One page of an index query.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexPage {
    pub entries: Vec<IndexEntry>,
    pub has_next_page: bool,
    pub end_cursor: Option<String>,
}

/// Most shard-field values read as branches of one `UNION ALL`; a longer
/// `in` list is one `IN`.
const MAX_BRANCHES: usize = 64;

impl QueryPlan {
    /// The SQL this plan runs on the index table `table` of one cluster,
    /// for the shard-field `values` whose shards that cluster holds.
    ///
    /// Several values (an `in` list) are a `UNION ALL` of one branch per
    /// value, each an index range scan in the plan's order that stops
    /// after a page: with one `IN` the database reads every entry of every
    /// value in the range and sorts them (5 drivers' pages cost PostgreSQL
    /// 0.8 ms against 0.2 ms). The branches' rows come unordered, at most
    /// a page per value; the caller sorts them.
    pub fn sql(&self, dialect: Dialect, table: &str, values: &[Value]) -> Sql {
        if values.len() < 2 || values.len() > MAX_BRANCHES {
            return self.branch_sql(dialect, table, values);
        }
        let mut sql = Sql::new(dialect);
        for (i, value) in values.iter().enumerate() {
            if i > 0 {
                sql.push(" UNION ALL ");
            }
            let branch = self.branch_sql(dialect, table, std::slice::from_ref(value));
            sql.push("SELECT * FROM (")
                .append(&branch)
                .push(&format!(") b{i}"));
        }
        sql
    }

    /// One statement over `values`, in the plan's order.
    fn branch_sql(&self, dialect: Dialect, table: &str, values: &[Value]) -> Sql {
        let index = &self.index;
        let mut sql = Sql::new(dialect);
        sql.push("SELECT ").ident("row_key");
        for &p in &self.projection {
            sql.push(", ").ident(&index.fields[p].name);
        }
        sql.push(" FROM ").ident(table).push(" WHERE ");
        let shard_field = &index.shard_field().name;
        let values = values.to_vec();
        if values.len() == 1 {
            sql.ident(shard_field).push(" = ").bind(values[0].clone());
        } else {
            sql.ident(shard_field).in_list(values);
        }
        for predicate in &self.predicates {
            sql.push(" AND ");
            let name = &index.fields[predicate.field].name;
            let value = predicate.values[0].clone();
            match (predicate.op, value.is_null()) {
                (CompareOp::Eq, true) => {
                    sql.ident(name).push(" IS NULL");
                }
                (CompareOp::Ne, true) => {
                    sql.ident(name).push(" IS NOT NULL");
                }
                (CompareOp::Ne, false) => {
                    // A missing value is "not equal" too: the body has no schema.
                    sql.push("(")
                        .ident(name)
                        .push(" <> ")
                        .bind(value)
                        .push(" OR ")
                        .ident(name)
                        .push(" IS NULL)");
                }
                (CompareOp::In, _) => {
                    sql.ident(name).in_list(predicate.values.iter().cloned());
                }
                (op, _) => {
                    let symbol = match op {
                        CompareOp::Eq => " = ",
                        CompareOp::Lt => " < ",
                        CompareOp::Le => " <= ",
                        CompareOp::Gt => " > ",
                        CompareOp::Ge => " >= ",
                        CompareOp::Ne | CompareOp::In => unreachable!("handled above"),
                    };
                    sql.ident(name).push(symbol).bind(value);
                }
            }
        }
        if let Some(after) = &self.after {
            sql.push(" AND ");
            self.keyset(&mut sql, after);
        }
        sql.push(" ORDER BY ");
        for &(p, descending) in &self.order {
            sql.ident(&index.fields[p].name)
                .push(if descending { " DESC" } else { " ASC" })
                .push(dialect.nulls(descending))
                .push(", ");
        }
        sql.ident("row_key")
            .push(if self.row_key_descending() {
                " DESC"
            } else {
                " ASC"
            })
            .push(&format!(" LIMIT {}", self.limit + 1));
        sql
    }

    /// Row keys follow the direction of the last order key, so one SQL
    /// index serves the whole order in either direction.
    fn row_key_descending(&self) -> bool {
        self.order.last().is_some_and(|(_, d)| *d)
    }

    /// `(k1, …, kn, row_key) > (cursor)` in the plan's order, expanded into
    /// ORs of ANDs because directions and NULLs differ per key. Ascending
    /// order puts NULL first, descending last, on every backend.
    fn keyset(&self, sql: &mut Sql, after: &Position) {
        let index = &self.index;
        let mut terms: Vec<Sql> = Vec::new();
        for i in 0..=self.order.len() {
            let mut term = Sql::new(sql.dialect());
            let mut possible = true;
            for (j, &(p, _)) in self.order.iter().take(i).enumerate() {
                let name = &index.fields[p].name;
                match &after.keys[j] {
                    v if v.is_null() => term.ident(name).push(" IS NULL AND "),
                    v => term.ident(name).push(" = ").bind(v.clone()).push(" AND "),
                };
            }
            if i < self.order.len() {
                let (p, descending) = self.order[i];
                let name = &index.fields[p].name;
                match (&after.keys[i], descending) {
                    (v, false) if v.is_null() => {
                        term.ident(name).push(" IS NOT NULL");
                    }
                    (v, false) => {
                        term.ident(name).push(" > ").bind(v.clone());
                    }
                    (v, true) if v.is_null() => possible = false,
                    (v, true) => {
                        term.push("(")
                            .ident(name)
                            .push(" < ")
                            .bind(v.clone())
                            .push(" OR ")
                            .ident(name)
                            .push(" IS NULL)");
                    }
                }
            } else {
                let op = if self.row_key_descending() {
                    " < "
                } else {
                    " > "
                };
                term.ident("row_key")
                    .push(op)
                    .bind(Value::Uuid(after.row_key));
            }
            if possible {
                terms.push(term);
            }
        }
        sql.push("(");
        for (i, term) in terms.into_iter().enumerate() {
            if i > 0 {
                sql.push(" OR ");
            }
            // Re-bind the term's values so placeholders number correctly.
            sql.push("(").append(&term).push(")");
        }
        sql.push(")");
    }

    /// Compares two result rows (row key first, then the projection) in the
    /// plan's order.
    fn compare(&self, a: &[Value], b: &[Value]) -> Ordering {
        for &(p, descending) in &self.order {
            let at = 1 + self
                .projection
                .iter()
                .position(|x| *x == p)
                .expect("order field projected");
            let ord = a[at].sort_cmp(&b[at]);
            let ord = if descending { ord.reverse() } else { ord };
            if ord != Ordering::Equal {
                return ord;
            }
        }
        let ord = a[0].sort_cmp(&b[0]);
        if self.row_key_descending() {
            ord.reverse()
        } else {
            ord
        }
    }

    fn position_of(&self, row: &[Value]) -> Position {
        Position {
            keys: self
                .order
                .iter()
                .map(|(p, _)| {
                    let at = 1 + self
                        .projection
                        .iter()
                        .position(|x| x == p)
                        .expect("projected");
                    row[at].clone()
                })
                .collect(),
            row_key: row[0].as_uuid().unwrap_or_default(),
        }
    }
}

/// Answers an index query.
pub(crate) async fn query_index(
    topology: &Topology,
    datastore: &str,
    query: &IndexQuery,
    read: &ReadOptions,
) -> Result<IndexPage> {
    let ds = topology.datastore(datastore)?;
    let plan = plan(&ds, query)?;
    run_plan(topology, &plan, read).await
}

/// Plans `query` on the index as defined now; while a new version of an
/// index whose shard field changed is built, a query by the previous
/// version's shard field is planned on that version, which answers it.
pub(crate) fn plan(ds: &DatastoreRuntime, query: &IndexQuery) -> Result<QueryPlan> {
    match QueryPlan::build(&ds.def, query) {
        // A field the current definition no longer has may be the previous
        // version's shard field.
        Err(err @ (Error::ShardFieldRequired { .. } | Error::BadInput(_))) => {
            let building = ds.index(&query.index).is_ok_and(|c| !c.is_ready());
            // Only then: a query the current definition refuses for
            // another reason (an order by a field without a b-tree) is
            // refused while the previous version serves too.
            let shard_field = |index: &Arc<Index>| index.shard_field().name.clone();
            let sharded_anew = |previous: &Arc<IndexRuntime>| {
                ds.def.index(&query.index).map(shard_field) != Some(shard_field(&previous.def))
            };
            match ds
                .serving_previous(&query.index)
                .filter(|previous| building && sharded_anew(previous))
            {
                Some(previous) => QueryPlan::build_on(&ds.def, &previous.def, query).or(Err(err)),
                None => Err(err),
            }
        }
        planned => planned,
    }
}

/// The index version that answers `plan`, with the plan for that version:
/// the current version once it is ready; while it is being built, the
/// previous version that serves meanwhile, when the plan reads only what
/// that version has as the current one has it ([`QueryPlan::rebased`]);
/// else `INDEX_BUILDING`. A version is chosen per query, so a query is
/// answered from one version; the switch to a new version is its
/// readiness flag.
pub(crate) fn serving<'p>(
    ds: &DatastoreRuntime,
    plan: &'p QueryPlan,
) -> Result<(Arc<IndexRuntime>, Cow<'p, QueryPlan>)> {
    let current = ds.index(&plan.index.name)?;
    let candidates = std::iter::once(current).chain(ds.serving_previous(&plan.index.name));
    for runtime in candidates.filter(|r| r.is_ready()) {
        if plan.reads(&runtime.def) {
            return Ok((runtime.clone(), Cow::Borrowed(plan)));
        }
        if let Some(rebased) = plan.rebased(&runtime.def) {
            return Ok((runtime.clone(), Cow::Owned(rebased)));
        }
    }
    current.check_ready()?;
    // Planned on a previous version that has just been replaced, by a
    // field the current one does not shard by.
    Err(Error::ShardFieldRequired {
        index: current.def.name.clone(),
        field: current.def.shard_field().name.clone(),
    })
}

/// Runs a plan built by [`QueryPlan::build`], on the nodes `read` allows
/// ([`ReadOptions::for_index`]).
pub(crate) async fn run_plan(
    topology: &Topology,
    plan: &QueryPlan,
    read: &ReadOptions,
) -> Result<IndexPage> {
    let ds = topology.datastore(&plan.datastore)?;
    let (runtime, plan) = serving(&ds, plan)?;
    let plan = plan.as_ref();
    if plan.limit == 0 {
        return Ok(empty_page());
    }
    let types = plan.types();
    let groups = topology.by_cluster(
        &ds,
        plan.shards
            .iter()
            .flat_map(|(shard, values)| values.iter().map(move |v| (*shard, v.clone()))),
    );
    let read = read.for_index();
    let no_shards = BTreeSet::new();
    let reads = groups.into_iter().map(|(cluster, values)| {
        let types = &types;
        let table = &runtime.table;
        let (ds, read, no_shards) = (&ds, &read, &no_shards);
        async move {
            read_on(topology, ds, cluster, no_shards, read, |node| {
                let sql = plan.sql(node.dialect(), table, &values);
                async move { node.fetch(&sql, types).await }
            })
            .await
        }
    });
    let mut rows: Vec<Vec<Value>> = futures::future::try_join_all(reads)
        .await?
        .into_iter()
        .flatten()
        .collect();
    // Several clusters' pages, or an `in` list's branches.
    rows.sort_by(|a, b| plan.compare(a, b));
    Ok(plan.page(rows))
}

/// Runs a plan and reads the latest cells of `columns` for the rows of
/// its page, bodies as JSON text, when one cluster holds every shard of
/// the datastore, so that the rows' cells are where the index entries are.
/// `None` when the cells are spread over clusters: the caller then reads
/// them on their own clusters.
///
/// With the cell cache on, the page's statement looks up only each row's
/// latest ref keys ([`with_latest_ref_keys`]) and the bodies come from the
/// cache, or from one more statement for the cells it does not hold. With
/// it off, one statement reads the bodies too ([`with_latest_cells`]).
pub(crate) async fn run_plan_with_cells(
    topology: &Topology,
    cache: &CellCache,
    plan: &QueryPlan,
    columns: &[&str],
    read: &ReadOptions,
) -> Result<Option<(IndexPage, Vec<Cell<Vec<u8>>>)>> {
    let ds = topology.datastore(&plan.datastore)?;
    let (Some(cluster), false) = (ds.map().sole_cluster(), columns.is_empty()) else {
        return Ok(None);
    };
    let (runtime, plan) = serving(&ds, plan)?;
    let plan = plan.as_ref();
    if plan.limit == 0 {
        return Ok(Some((empty_page(), Vec::new())));
    }
    let values: Vec<Value> = plan
        .shards
        .values()
        .flat_map(|values| values.iter().cloned())
        .collect();
    let mut types = plan.types();
    let width = types.len();
    if cache.enabled() {
        types.extend(columns.iter().map(|_| ColType::Int));
    } else {
        types.extend(CELL_TYPES);
    }
    let cells_table = ddl::cells_table(ds.name());
    // The statement reads the rows' cells with the entries, so it goes
    // where a read of those cells would: with a token, to a node that has
    // applied all of it (the rows found may be on any of its shards).
    let token_shards = read.token_shards(ds.name());
    let found = read_on(topology, &ds, cluster, &token_shards, read, |node| {
        let rows = plan.sql(node.dialect(), &runtime.table, &values);
        let sql = if cache.enabled() {
            with_latest_ref_keys(&rows, &cells_table, columns)
        } else {
            with_latest_cells(&rows, &cells_table, columns)
        };
        let types = &types;
        async move { node.fetch(&sql, types).await }
    })
    .await?;
    if !cache.enabled() {
        let mut entries: Vec<Vec<Value>> = Vec::new();
        let mut seen = HashSet::new();
        let mut cells = Vec::new();
        for mut row in found {
            let cell = row.split_off(width);
            if !cell[0].is_null() {
                cells.push(decoded_cell(cell, &codec::decode_json)?);
            }
            if seen.insert(row[0].as_uuid()) {
                entries.push(row);
            }
        }
        entries.sort_by(|a, b| plan.compare(a, b));
        return Ok(Some((plan.page(entries), cells)));
    }
    let mut rows: Vec<(Vec<Value>, Vec<Value>)> = found
        .into_iter()
        .map(|mut row| {
            let refs = row.split_off(width);
            (row, refs)
        })
        .collect();
    rows.sort_by(|a, b| plan.compare(&a.0, &b.0));
    // The row past the page only tells that another page exists.
    let mut cells = Vec::new();
    let mut missing = Vec::new();
    for (row, refs) in rows.iter().take(plan.limit as usize) {
        let Some(row_key) = row[0].as_uuid() else {
            continue;
        };
        for (column, ref_key) in columns.iter().zip(refs) {
            let Value::Int(ref_key) = *ref_key else {
                continue;
            };
            match cache.get(ds.name(), row_key, column, ref_key) {
                Some(cell) => cells.push(cell),
                None => missing.push(CellKey {
                    row_key,
                    column: (*column).to_string(),
                    ref_key,
                }),
            }
        }
    }
    crate::cells::cache_span(ds.name(), cells.len(), cells.len() + missing.len());
    if !missing.is_empty() {
        let read_now = get_named_cells_json(topology, cache, ds.name(), &missing, read).await?;
        cells.extend(read_now.into_iter().flatten());
    }
    let entries = rows.into_iter().map(|(row, _)| row).collect();
    Ok(Some((plan.page(entries), cells)))
}

fn empty_page() -> IndexPage {
    IndexPage {
        entries: Vec::new(),
        has_next_page: false,
        end_cursor: None,
    }
}

impl QueryPlan {
    /// The column types of [`QueryPlan::sql`]'s rows.
    fn types(&self) -> Vec<ColType> {
        let mut types = vec![ColType::Uuid];
        types.extend(
            self.projection
                .iter()
                .map(|&p| col_type(self.index.fields[p].ty)),
        );
        types
    }

    /// The page of `rows`, in the plan's order, one more than the limit
    /// when another page exists.
    fn page(&self, mut rows: Vec<Vec<Value>>) -> IndexPage {
        let has_next_page = rows.len() > self.limit as usize;
        rows.truncate(self.limit as usize);
        let signature = self.signature();
        let names: Vec<Arc<str>> = self
            .projection
            .iter()
            .map(|&p| Arc::from(self.index.fields[p].name.as_str()))
            .collect();
        let entries: Vec<IndexEntry> = rows
            .into_iter()
            .map(|row| {
                let position = self.position_of(&row);
                let row_key = row[0].as_uuid().unwrap_or_default();
                let fields = names.iter().cloned().zip(row.into_iter().skip(1)).collect();
                IndexEntry {
                    row_key,
                    fields,
                    position,
                    signature,
                }
            })
            .collect();
        let end_cursor = entries.last().map(IndexEntry::cursor);
        IndexPage {
            entries,
            has_next_page,
            end_cursor,
        }
    }
}
