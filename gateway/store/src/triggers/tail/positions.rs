//! A follower's per-shard positions, sharing the tail's snapshot.

use std::collections::BTreeMap;
use std::sync::Arc;

/// A follower's positions: a snapshot shared with the tail and other
/// followers, and the shards moved since.
#[derive(Debug, Clone)]
pub(super) struct Positions {
    pub(super) base: Arc<BTreeMap<u32, i64>>,
    pub(super) moved: BTreeMap<u32, i64>,
    /// Whether `moved` was folded into `base` (which then holds moves).
    pub(super) folded: bool,
}

impl Positions {
    pub(super) fn get(&self, shard: u32) -> i64 {
        self.moved
            .get(&shard)
            .or_else(|| self.base.get(&shard))
            .copied()
            .unwrap_or(0)
    }

    pub(super) fn set(&mut self, shard: u32, at: i64) {
        self.moved.insert(shard, at);
        // A follower out of step would end up with a second copy of every
        // shard in `moved`: fold it into a base of its own now and then.
        if self.moved.len() > 64 && self.moved.len() * 4 > self.base.len() {
            let base = Arc::make_mut(&mut self.base);
            base.append(&mut self.moved);
            self.folded = true;
        }
    }

    /// Every position, `moved` over `base`, in shard order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u32, i64)> + '_ {
        let mut base = self.base.iter().peekable();
        let mut moved = self.moved.iter().peekable();
        std::iter::from_fn(move || match (base.peek(), moved.peek()) {
            (Some((b, _)), Some((m, _))) if b < m => base.next().map(|(s, p)| (*s, *p)),
            (Some((b, _)), Some((m, _))) if b == m => {
                base.next();
                moved.next().map(|(s, p)| (*s, *p))
            }
            (_, Some(_)) => moved.next().map(|(s, p)| (*s, *p)),
            (Some(_), None) => base.next().map(|(s, p)| (*s, *p)),
            (None, None) => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::cursor::{encode_cursor, encode_positions};
    use super::*;

    #[test]
    fn positions_over_a_shared_base_read_and_encode_like_one_map() {
        let base = Arc::new((0..4096u32).map(|s| (s, 100 + i64::from(s))).collect());
        let mut positions = Positions {
            base,
            moved: BTreeMap::new(),
            folded: false,
        };
        let mut plain: BTreeMap<u32, i64> = positions.base.as_ref().clone();
        for (shard, at) in [(7, 500), (4095, 9000), (5000, 3), (7, 501)] {
            positions.set(shard, at);
            plain.insert(shard, at);
        }
        assert!(!positions.folded, "a few moves stay beside the base");
        assert_eq!(positions.iter().collect::<BTreeMap<_, _>>(), plain);
        assert_eq!(encode_positions(positions.iter()), encode_cursor(&plain));
        assert_eq!(positions.get(7), 501);
        assert_eq!(positions.get(8), 108);
        assert_eq!(positions.get(6000), 0);
        // Many moves fold into a base of the follower's own.
        let shared = positions.base.clone();
        for shard in 0..2000u32 {
            positions.set(shard, 7000 + i64::from(shard));
            plain.insert(shard, 7000 + i64::from(shard));
        }
        assert!(positions.folded);
        assert!(
            !Arc::ptr_eq(&shared, &positions.base),
            "the shared base is not changed"
        );
        assert_eq!(shared.get(&0), Some(&100));
        assert_eq!(positions.iter().collect::<BTreeMap<_, _>>(), plain);
    }
}
