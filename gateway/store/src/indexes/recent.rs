//! The bodies this process just wrote, kept for its index maintenance.
//!
//! A pass computes each touched row's entry from the row's latest cells,
//! which it reads in one statement. Most of those cells were written by
//! this very process a moment before, which had their bodies as JSON
//! values: a write event carries them (`WrittenCell`), the worker of the
//! cells' datastore and cluster keeps them here, and a pass takes the body
//! of each latest cell it reads from here instead of inflating and decoding
//! the stored one. A cell never changes once written, so a body kept under
//! its full key `(row_key, column, ref_key)` is the stored body.
//!
//! Only which cell is a row's latest still comes from the database (other
//! gateways write too, and ref keys need not arrive in order), so entries
//! are computed exactly as without the bodies kept; a body not kept is
//! decoded as before. A pass takes the bodies it uses; at most [`KEEP`]
//! are kept, the oldest dropped first (a backlog is read back as before).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use uuid::Uuid;

use crate::topology::WrittenCell;

/// Bodies kept per worker: two passes' worth (a pass reads at most 2,000
/// log cells).
pub(crate) const KEEP: usize = 4000;

type Key = (Uuid, Box<str>, i64);

/// The bodies kept for one worker (a datastore on a cell cluster).
#[derive(Default)]
pub(crate) struct Recent {
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    bodies: HashMap<Key, Arc<serde_json::Value>>,
    /// The keys in the order they came, some perhaps taken already.
    order: VecDeque<Key>,
}

impl Recent {
    /// Keeps the bodies of `cells` that `wanted` (the shards this worker
    /// maintains), dropping the oldest beyond [`KEEP`].
    pub(crate) fn keep(&self, cells: &[WrittenCell], wanted: impl Fn(u32) -> bool) {
        if cells.is_empty() {
            return;
        }
        let mut kept = self.kept.lock().expect("recent bodies");
        for cell in cells.iter().filter(|cell| wanted(cell.shard)) {
            let key: Key = (cell.row_key, cell.column.as_str().into(), cell.ref_key);
            kept.order.push_back(key.clone());
            kept.bodies.insert(key, cell.body.clone());
        }
        while kept.order.len() > KEEP {
            if let Some(oldest) = kept.order.pop_front() {
                kept.bodies.remove(&oldest);
            }
        }
    }

    /// The body of the cell `(row_key, column, ref_key)` if it is kept,
    /// which it no longer is afterwards.
    pub(crate) fn take(
        &self,
        row_key: Uuid,
        column: &str,
        ref_key: i64,
    ) -> Option<Arc<serde_json::Value>> {
        let mut kept = self.kept.lock().expect("recent bodies");
        if kept.bodies.is_empty() {
            return None;
        }
        let body = kept.bodies.remove(&(row_key, column.into(), ref_key))?;
        if kept.bodies.is_empty() {
            kept.order.clear();
        }
        Some(body)
    }

    /// How many bodies are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.kept.lock().expect("recent bodies").bodies.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(n: i64) -> WrittenCell {
        WrittenCell {
            shard: 0,
            row_key: Uuid::from_u128(n as u128),
            column: "BASE".into(),
            ref_key: n,
            body: Arc::new(serde_json::json!({ "n": n })),
        }
    }

    #[test]
    fn a_kept_body_is_taken_once_by_its_full_key() {
        let recent = Recent::default();
        recent.keep(&[cell(1), cell(2)], |_| true);
        let row = Uuid::from_u128(1);
        assert_eq!(recent.take(row, "STATUS", 1), None, "another column");
        assert_eq!(recent.take(row, "BASE", 2), None, "another ref key");
        let body = recent.take(row, "BASE", 1).expect("kept");
        assert_eq!(*body, serde_json::json!({ "n": 1 }));
        assert_eq!(recent.take(row, "BASE", 1), None, "taken already");
        assert_eq!(recent.len(), 1);
    }

    #[test]
    fn the_oldest_bodies_go_beyond_the_bound() {
        let recent = Recent::default();
        let cells: Vec<WrittenCell> = (0..KEEP as i64 + 10).map(cell).collect();
        for chunk in cells.chunks(50) {
            recent.keep(chunk, |_| true);
        }
        assert_eq!(recent.len(), KEEP);
        assert_eq!(recent.take(Uuid::from_u128(9), "BASE", 9), None);
        assert!(recent.take(Uuid::from_u128(10), "BASE", 10).is_some());
        let last = KEEP as i64 + 9;
        assert!(recent
            .take(Uuid::from_u128(last as u128), "BASE", last)
            .is_some());
    }
}
