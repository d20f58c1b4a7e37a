//! The bodies this process just wrote, kept for its index maintenance.
//!
//! A pass computes each touched row's entry from the row's latest cells,
//! which it reads in one statement. Most of those cells were written by
//! this very process a moment before, which had their bodies as JSON
//! values: a write event carries them (`WrittenCell`), cut on the writer's
//! thread to the top-level members the datastore's indexes read, the
//! worker of the cells' datastore and cluster keeps them here, and a pass
//! takes the body of each latest cell it reads from here instead of
//! inflating and decoding the stored one. A cell never changes once
//! written, so a body kept under its full key `(row_key, column, ref_key)`
//! holds the stored body's members; a pass takes it only if it was cut to
//! every member the pass reads (the indexes may have changed since the
//! write), and decodes the stored body otherwise.
//!
//! Only which cell is a row's latest still comes from the database (other
//! gateways write too, and ref keys need not arrive in order), so entries
//! are computed exactly as without the bodies kept; a body not kept is
//! decoded as before. A pass takes the bodies it uses; at most [`KEEP`]
//! are kept, the oldest dropped first (a backlog is read back as before).

use std::collections::{BTreeSet, HashMap, VecDeque};
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
    /// Each body, and the members it was cut to.
    bodies: HashMap<Key, (Arc<serde_json::Value>, Arc<BTreeSet<String>>)>,
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
            kept.bodies
                .insert(key, (cell.body.clone(), cell.members.clone()));
        }
        while kept.order.len() > KEEP {
            if let Some(oldest) = kept.order.pop_front() {
                kept.bodies.remove(&oldest);
            }
        }
    }

    /// The body of the cell `(row_key, column, ref_key)` if it is kept
    /// with every member of `reads`; it is no longer kept afterwards.
    pub(crate) fn take(
        &self,
        row_key: Uuid,
        column: &str,
        ref_key: i64,
        reads: &BTreeSet<String>,
    ) -> Option<Arc<serde_json::Value>> {
        let mut kept = self.kept.lock().expect("recent bodies");
        if kept.bodies.is_empty() {
            return None;
        }
        let (body, members) = kept.bodies.remove(&(row_key, column.into(), ref_key))?;
        if kept.bodies.is_empty() {
            kept.order.clear();
        }
        drop(kept);
        reads.is_subset(&members).then_some(body)
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
            members: Arc::new(reads(&["n", "m"])),
        }
    }

    fn reads(members: &[&str]) -> BTreeSet<String> {
        members.iter().map(|m| m.to_string()).collect()
    }

    #[test]
    fn a_body_cut_to_fewer_members_than_a_pass_reads_is_not_taken() {
        let recent = Recent::default();
        recent.keep(&[cell(1), cell(2)], |_| true);
        assert!(recent
            .take(Uuid::from_u128(1), "BASE", 1, &reads(&["n", "city"]))
            .is_none());
        assert_eq!(recent.len(), 1, "taken all the same: it is of no use");
        assert!(recent
            .take(Uuid::from_u128(2), "BASE", 2, &reads(&["m"]))
            .is_some());
    }

    #[test]
    fn a_kept_body_is_taken_once_by_its_full_key() {
        let recent = Recent::default();
        recent.keep(&[cell(1), cell(2)], |_| true);
        let row = Uuid::from_u128(1);
        assert_eq!(
            recent.take(row, "STATUS", 1, &reads(&["n"])),
            None,
            "another column"
        );
        assert_eq!(
            recent.take(row, "BASE", 2, &reads(&["n"])),
            None,
            "another ref key"
        );
        let body = recent.take(row, "BASE", 1, &reads(&["n"])).expect("kept");
        assert_eq!(*body, serde_json::json!({ "n": 1 }));
        assert_eq!(
            recent.take(row, "BASE", 1, &reads(&["n"])),
            None,
            "taken already"
        );
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
        assert_eq!(
            recent.take(Uuid::from_u128(9), "BASE", 9, &reads(&["n"])),
            None
        );
        assert!(recent
            .take(Uuid::from_u128(10), "BASE", 10, &reads(&["n"]))
            .is_some());
        let last = KEEP as i64 + 9;
        assert!(recent
            .take(Uuid::from_u128(last as u128), "BASE", last, &reads(&["n"]))
            .is_some());
    }
}
