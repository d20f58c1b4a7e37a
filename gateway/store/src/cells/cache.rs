//! Cells kept in memory by their full key.
//!
//! A cell never changes once written, so a cell read by its full key
//! `(row_key, column, ref_key)` can be kept and served again without ever
//! being invalidated. The cache holds bodies as their JSON text, the form
//! responses carry, so a hit also saves inflating and transcoding the
//! stored body. Its size is bounded by `storage.cell_cache_bytes` (the
//! bodies' bytes plus a fixed cost per cell); cells read once are evicted
//! before cells read again (quick_cache's S3-FIFO). A lookup borrows its
//! key and takes one shard's read lock: it allocates nothing.
//!
//! Two reads use it: reads by full key, and the latest cells of an index
//! page's rows, whose statement (or, when the rows are spread over
//! several clusters, the read on each cluster) then only looks up each
//! row's latest ref key in the unique key (an index-only lookup) and reads
//! the bodies of cells it has not kept in a second statement. Pruning removes old
//! versions from the database but not from the cache: a kept cell read by
//! its full key may outlive its pruning until it is evicted.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use quick_cache::sync::Cache;
use quick_cache::{Equivalent, Weighter};
use uuid::Uuid;

use super::{Cell, CellKey};

/// Bytes counted per kept cell besides its body and names.
const OVERHEAD: usize = 96;

/// A kept cell's key. It hashes as [`Lookup`] does (the same fields, in
/// the same order, `Box<str>` hashing as `str`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    row_key: Uuid,
    ref_key: i64,
    column: Box<str>,
    datastore: Box<str>,
}

/// A key to look up, borrowed.
#[derive(Hash)]
struct Lookup<'a> {
    row_key: Uuid,
    ref_key: i64,
    column: &'a str,
    datastore: &'a str,
}

impl Equivalent<Key> for Lookup<'_> {
    fn equivalent(&self, key: &Key) -> bool {
        self.row_key == key.row_key
            && self.ref_key == key.ref_key
            && *self.column == *key.column
            && *self.datastore == *key.datastore
    }
}

/// A kept cell's weight: its bytes.
#[derive(Clone)]
struct Bytes;

impl Weighter<Key, Arc<Kept>> for Bytes {
    fn weight(&self, key: &Key, kept: &Arc<Kept>) -> u64 {
        (kept.body.len() + key.column.len() + key.datastore.len() + OVERHEAD) as u64
    }
}

struct Kept {
    /// The body's JSON text.
    body: Box<[u8]>,
    created_at: DateTime<Utc>,
    shard: u32,
    added_id: i64,
}

/// The cache of one store; cheap to clone (clones share it).
#[derive(Clone)]
pub(crate) struct CellCache {
    cells: Option<Arc<Cache<Key, Arc<Kept>, Bytes>>>,
    budget: u64,
    counts: Arc<Counts>,
}

#[derive(Default)]
struct Counts {
    hits: AtomicU64,
    misses: AtomicU64,
}

/// The cache's state, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CellCacheMetrics {
    /// `storage.cell_cache_bytes`; 0 when the cache is off.
    pub budget_bytes: u64,
    /// Bytes held now (bodies plus a fixed cost per cell).
    pub bytes: u64,
    pub cells: u64,
    /// Cells served from the cache, and cells looked up but read from the
    /// database, since start.
    pub hits: u64,
    pub misses: u64,
}

impl CellCache {
    /// A cache holding at most `budget` bytes; 0 keeps nothing.
    pub(crate) fn new(budget: u64) -> CellCache {
        let cells = (budget > 0).then(|| {
            // Sized for cells of about a kilobyte.
            let estimated = usize::try_from(budget / 1024).unwrap_or(usize::MAX).max(64);
            Arc::new(Cache::with_weighter(estimated, budget, Bytes))
        });
        CellCache {
            cells,
            budget,
            counts: Arc::default(),
        }
    }

    /// Whether cells are kept at all.
    pub(crate) fn enabled(&self) -> bool {
        self.cells.is_some()
    }

    /// The kept cell at the key, its body as JSON text.
    pub(crate) fn get(
        &self,
        datastore: &str,
        row_key: Uuid,
        column: &str,
        ref_key: i64,
    ) -> Option<Cell<Vec<u8>>> {
        let cells = self.cells.as_ref()?;
        let key = Lookup {
            row_key,
            ref_key,
            column,
            datastore,
        };
        let Some(kept) = cells.get(&key) else {
            self.counts.misses.fetch_add(1, Relaxed);
            return None;
        };
        self.counts.hits.fetch_add(1, Relaxed);
        Some(Cell {
            row_key,
            column: column.to_string(),
            ref_key,
            body: kept.body.to_vec(),
            created_at: kept.created_at,
            shard: kept.shard,
            added_id: kept.added_id,
        })
    }

    /// [`CellCache::get`] by a [`CellKey`].
    pub(crate) fn get_key(&self, datastore: &str, key: &CellKey) -> Option<Cell<Vec<u8>>> {
        self.get(datastore, key.row_key, &key.column, key.ref_key)
    }

    /// Keeps `cell`, read from the database, its body as JSON text.
    pub(crate) fn insert(&self, datastore: &str, cell: &Cell<Vec<u8>>) {
        let Some(cells) = &self.cells else { return };
        let key = Key {
            row_key: cell.row_key,
            ref_key: cell.ref_key,
            column: cell.column.as_str().into(),
            datastore: datastore.into(),
        };
        cells.insert(
            key,
            Arc::new(Kept {
                body: cell.body.as_slice().into(),
                created_at: cell.created_at,
                shard: cell.shard,
                added_id: cell.added_id,
            }),
        );
    }

    pub(crate) fn metrics(&self) -> CellCacheMetrics {
        let (bytes, cells) = self
            .cells
            .as_ref()
            .map_or((0, 0), |cells| (cells.weight(), cells.len() as u64));
        CellCacheMetrics {
            budget_bytes: self.budget,
            bytes,
            cells,
            hits: self.counts.hits.load(Relaxed),
            misses: self.counts.misses.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(row: u128, ref_key: i64, body: &str) -> Cell<Vec<u8>> {
        Cell {
            row_key: Uuid::from_u128(row),
            column: "BASE".into(),
            ref_key,
            body: body.as_bytes().to_vec(),
            created_at: DateTime::<Utc>::from_timestamp(1_700_000_000, 0).unwrap(),
            shard: 7,
            added_id: 42,
        }
    }

    #[test]
    fn a_kept_cell_is_found_by_its_full_key_only() {
        let cache = CellCache::new(1 << 20);
        let kept = cell(1, 5, r#"{"a":1}"#);
        cache.insert("trips", &kept);
        assert_eq!(
            cache.get("trips", kept.row_key, "BASE", 5),
            Some(kept.clone())
        );
        assert_eq!(cache.get("trips", kept.row_key, "BASE", 6), None);
        assert_eq!(cache.get("trips", kept.row_key, "STATUS", 5), None);
        assert_eq!(cache.get("payments", kept.row_key, "BASE", 5), None);
        let metrics = cache.metrics();
        assert_eq!((metrics.hits, metrics.misses, metrics.cells), (1, 3, 1));
        assert_eq!(metrics.budget_bytes, 1 << 20);
        assert!(metrics.bytes >= 7 + OVERHEAD as u64, "{metrics:?}");
    }

    #[test]
    fn the_cache_stays_within_its_budget() {
        let budget = 64 * 1024;
        let cache = CellCache::new(budget);
        let body = "x".repeat(1000);
        for row in 0..1000 {
            cache.insert("trips", &cell(row, 1, &body));
        }
        let metrics = cache.metrics();
        assert!(metrics.bytes <= budget, "{metrics:?}");
        assert!(metrics.cells < 100, "{metrics:?}");
    }

    #[test]
    fn a_zero_budget_keeps_nothing() {
        let cache = CellCache::new(0);
        let kept = cell(1, 5, "{}");
        cache.insert("trips", &kept);
        assert!(!cache.enabled());
        assert_eq!(cache.get("trips", kept.row_key, "BASE", 5), None);
        assert_eq!(cache.metrics(), CellCacheMetrics::default());
    }
}
