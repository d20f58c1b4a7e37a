//! Logical shards: the stable hash that places row keys and index shard
//! values, and the routing of shards to storage clusters.
//!
//! **The hash** (identical on every backend and version; changing it would
//! strand every stored cell): `shard = xxh3_64(bytes, seed = 0) mod shards`,
//! where `bytes` is
//!
//! | value | bytes hashed |
//! |---|---|
//! | row key, UUID | its 16 bytes in RFC 4122 (big-endian) order |
//! | string | its UTF-8 bytes |
//! | int | the 8 bytes of the i64, big-endian |
//! | float | the 8 bytes of the f64 bit pattern, big-endian, with -0.0 read as 0.0 |
//! | datetime | the 8 bytes of the i64 microseconds since the Unix epoch (UTC), big-endian |
//!
//! Bool values are never shard values (definitions reject bool shard fields).
//! `tests` below pins known values so an accidental change fails.

use uuid::Uuid;

use crate::storage::Value;

/// Hashes `bytes` to one of `shards` logical shards.
pub fn shard_of_bytes(bytes: &[u8], shards: u32) -> u32 {
    (xxhash_rust::xxh3::xxh3_64(bytes) % u64::from(shards.max(1))) as u32
}

/// The shard that stores every cell of `row_key`.
pub fn row_shard(row_key: &Uuid, shards: u32) -> u32 {
    shard_of_bytes(row_key.as_bytes(), shards)
}

/// The shard that stores an index entry whose shard field is `value`;
/// `None` for NULL (such a row has no entry), for bools and for arrays
/// (never a field's value).
pub fn value_shard(value: &Value, shards: u32) -> Option<u32> {
    let shard = match value {
        Value::Uuid(v) => shard_of_bytes(v.as_bytes(), shards),
        Value::Text(v) => shard_of_bytes(v.as_bytes(), shards),
        Value::Int(v) => shard_of_bytes(&v.to_be_bytes(), shards),
        Value::Float(v) => {
            let v = if *v == 0.0 { 0.0f64 } else { *v };
            shard_of_bytes(&v.to_bits().to_be_bytes(), shards)
        }
        Value::DateTime(v) => shard_of_bytes(&v.timestamp_micros().to_be_bytes(), shards),
        Value::Bytes(v) => shard_of_bytes(v, shards),
        Value::Null(_) | Value::Bool(_) | Value::Array(..) => return None,
    };
    Some(shard)
}

/// Which cluster holds each shard of one datastore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardMap {
    /// `cluster_of[shard]` is an index into the store's cluster list.
    cluster_of: Vec<u16>,
    /// The cluster holding every shard, when there is only one.
    sole: Option<usize>,
}

impl ShardMap {
    /// Builds a map from `(first, last, cluster)` ranges that must cover
    /// `0..shards` exactly once.
    pub fn from_ranges(shards: u32, ranges: &[(u32, u32, usize)]) -> Result<ShardMap, String> {
        let mut cluster_of = vec![u16::MAX; shards as usize];
        for &(first, last, cluster) in ranges {
            if first > last || last >= shards {
                return Err(format!(
                    "shard range {first}-{last} is outside 0-{}",
                    shards - 1
                ));
            }
            for shard in first..=last {
                let slot = &mut cluster_of[shard as usize];
                if *slot != u16::MAX {
                    return Err(format!("shard {shard} is assigned to two clusters"));
                }
                *slot = cluster as u16;
            }
        }
        if let Some(missing) = cluster_of.iter().position(|c| *c == u16::MAX) {
            return Err(format!("shard {missing} is assigned to no cluster"));
        }
        Ok(ShardMap::new(cluster_of))
    }

    /// Splits `shards` into contiguous, equal ranges over `clusters`
    /// clusters, in order (the layout that doubling keeps contiguous).
    pub fn even(shards: u32, clusters: usize) -> ShardMap {
        let clusters = clusters.max(1) as u64;
        let cluster_of = (0..u64::from(shards))
            .map(|s| (s * clusters / u64::from(shards)) as u16)
            .collect();
        ShardMap::new(cluster_of)
    }

    fn new(cluster_of: Vec<u16>) -> ShardMap {
        let first = cluster_of.first().copied();
        let sole = first
            .filter(|first| cluster_of.iter().all(|c| c == first))
            .map(usize::from);
        ShardMap { cluster_of, sole }
    }

    /// The cluster holding every shard, when one holds them all.
    pub fn sole_cluster(&self) -> Option<usize> {
        self.sole
    }

    pub fn cluster_of(&self, shard: u32) -> usize {
        self.cluster_of[shard as usize] as usize
    }

    pub fn shards(&self) -> u32 {
        self.cluster_of.len() as u32
    }

    /// The contiguous `(first, last)` shard ranges held by `cluster`.
    pub fn ranges_of(&self, cluster: usize) -> Vec<(u32, u32)> {
        let mut ranges: Vec<(u32, u32)> = Vec::new();
        for (shard, owner) in self.cluster_of.iter().enumerate() {
            if *owner as usize != cluster {
                continue;
            }
            let shard = shard as u32;
            match ranges.last_mut() {
                Some(last) if last.1 + 1 == shard => last.1 = shard,
                _ => ranges.push((shard, shard)),
            }
        }
        ranges
    }

    /// The clusters holding at least one shard, in increasing order.
    pub fn clusters(&self) -> Vec<usize> {
        let mut clusters: Vec<usize> = self.cluster_of.iter().map(|c| *c as usize).collect();
        clusters.sort_unstable();
        clusters.dedup();
        clusters
    }
}

/// `0-2047,3000-3100`: shard ranges as text (the catalog's form).
pub fn format_ranges(ranges: &[(u32, u32)]) -> String {
    ranges
        .iter()
        .map(|(first, last)| format!("{first}-{last}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    // The hash is a storage format: these values must never change.
    #[test]
    fn hash_is_pinned() {
        let uuid = Uuid::parse_str("7d0b2b1e-4c3a-4a8e-9b59-1a2b3c4d5e6f").unwrap();
        let pinned = [
            row_shard(&uuid, 4096),
            value_shard(&Value::Text("driver-1".into()), 4096).unwrap(),
            value_shard(&Value::Int(42), 4096).unwrap(),
            value_shard(&Value::Float(-0.0), 4096).unwrap(),
        ];
        expect_test::expect![[r#"
            [
                1402,
                4017,
                172,
                3289,
            ]
        "#]]
        .assert_debug_eq(&pinned);
        assert_eq!(
            value_shard(&Value::Float(0.0), 4096),
            value_shard(&Value::Float(-0.0), 4096)
        );
        assert_eq!(value_shard(&Value::Uuid(uuid), 4096), Some(pinned[0]));
    }

    #[test]
    fn even_split_is_contiguous_and_complete() {
        let map = ShardMap::even(10, 3);
        let owners: Vec<_> = (0..10).map(|s| map.cluster_of(s)).collect();
        assert_eq!(owners, vec![0, 0, 0, 0, 1, 1, 1, 2, 2, 2]);
    }

    #[test]
    fn ranges_of_a_cluster_are_contiguous_runs() {
        let map = ShardMap::from_ranges(8, &[(0, 1, 0), (2, 4, 1), (5, 7, 0)]).unwrap();
        assert_eq!(map.ranges_of(0), vec![(0, 1), (5, 7)]);
        assert_eq!(map.ranges_of(1), vec![(2, 4)]);
        assert_eq!(map.clusters(), vec![0, 1]);
        assert_eq!(format_ranges(&map.ranges_of(0)), "0-1,5-7");
    }

    #[test]
    fn ranges_must_cover_every_shard_once() {
        assert!(ShardMap::from_ranges(4, &[(0, 1, 0), (2, 3, 1)]).is_ok());
        assert!(ShardMap::from_ranges(4, &[(0, 1, 0)])
            .unwrap_err()
            .contains("shard 2 is assigned to no cluster"));
        assert!(ShardMap::from_ranges(4, &[(0, 2, 0), (2, 3, 1)])
            .unwrap_err()
            .contains("two clusters"));
        assert!(ShardMap::from_ranges(4, &[(0, 4, 0)]).is_err());
    }
}
