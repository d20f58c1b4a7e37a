//! The bit layouts of snowflake and shard-tagged IDs, and decoding.
//!
//! Snowflake (Twitter/Leaf): 41 bits of milliseconds, of which the top
//! two are the layout version bits 62–61 and so must stay 0:
//!
//! ```text
//!  63 | 62 61 | 60 ...... 22 | 21 ..... 12 | 11 ...... 0
//!   0 |  00   | ms since epoch |  worker id  |  sequence
//!     |version|    39 bits     |   10 bits   |   12 bits
//! ```
//!
//! The two kinds of ID are disjoint because a snowflake ID's version bits
//! are always 0: the generator refuses to issue once 2^39 ms (17.4 years,
//! until 2041-06-02 for the default epoch) have passed since the epoch,
//! and refuses to start with an epoch that far back. Letting the time run
//! into bit 61 would make later snowflake IDs read as tagged ones and
//! collide with them.
//!
//! Shard-tagged, version 1: the logical shard of the key the ID belongs to
//! (the stable hash of `shards.rs` of a row key or shard field value) sits
//! in fixed bits, so an ID alone routes a lookup:
//!
//! ```text
//!  63 | 62 61 | 60 ..... 49 | 48 ......... 19 | 18 ..... 9 | 8 ..... 0
//!   0 |  01   | logical     | seconds since   | worker id  | sequence
//!     |version| shard (12)  | epoch (30 bits) | (10 bits)  | (9 bits)
//! ```
//!
//! 30 bits of seconds last 34 years from the epoch; a worker hands out 512
//! IDs per second per shard (it waits for the next second beyond that).

use chrono::{DateTime, Utc};

use crate::error::{Error, Result};

pub(crate) const WORKER_BITS: u32 = 10;
pub(crate) const SEQUENCE_BITS: u32 = 12;
pub(crate) const MAX_SEQUENCE: i64 = (1 << SEQUENCE_BITS) - 1;
/// Bits of time a snowflake ID may use: the 41 of the classic layout
/// less the two version bits that must stay 0.
pub(crate) const SNOWFLAKE_TIME_BITS: u32 = 39;
/// The last millisecond after the epoch a snowflake ID can carry.
pub(crate) const SNOWFLAKE_MAX_TIME: i64 = (1 << SNOWFLAKE_TIME_BITS) - 1;
/// Whole years of snowflake IDs from the epoch (2^39 ms is 17.4 years).
pub(crate) const SNOWFLAKE_YEARS: u32 = 17;

/// Version of the tagged layout this code writes.
pub const TAGGED_VERSION: u8 = 1;
/// Bits of the logical shard in a tagged ID.
pub const TAGGED_SHARD_BITS: u32 = 12;
pub(crate) const TAGGED_SEQUENCE_BITS: u32 = 9;
pub(crate) const TAGGED_MAX_SEQUENCE: i64 = (1 << TAGGED_SEQUENCE_BITS) - 1;
pub(crate) const TAGGED_TIME_BITS: u32 = 30;
pub(crate) const TAGGED_MAX_TIME: i64 = (1 << TAGGED_TIME_BITS) - 1;
const TAGGED_WORKER_SHIFT: u32 = TAGGED_SEQUENCE_BITS;
const TAGGED_TIME_SHIFT: u32 = TAGGED_WORKER_SHIFT + WORKER_BITS;
const TAGGED_SHARD_SHIFT: u32 = TAGGED_TIME_SHIFT + TAGGED_TIME_BITS;
const VERSION_SHIFT: u32 = TAGGED_SHARD_SHIFT + TAGGED_SHARD_BITS;

/// A snowflake ID from its parts.
pub(crate) fn snowflake(ms_since_epoch: i64, worker: u16, sequence: i64) -> i64 {
    (ms_since_epoch << (WORKER_BITS + SEQUENCE_BITS))
        | (i64::from(worker) << SEQUENCE_BITS)
        | sequence
}

/// A tagged ID (current version) from its parts.
pub(crate) fn tagged(shard: u16, secs_since_epoch: i64, worker: u16, sequence: i64) -> i64 {
    (i64::from(TAGGED_VERSION) << VERSION_SHIFT)
        | (i64::from(shard) << TAGGED_SHARD_SHIFT)
        | (secs_since_epoch << TAGGED_TIME_SHIFT)
        | (i64::from(worker) << TAGGED_WORKER_SHIFT)
        | sequence
}

/// Which layout an ID was read with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    Snowflake,
    Tagged,
}

/// The parts of an ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedId {
    pub id: i64,
    pub kind: IdKind,
    /// 0 for snowflake IDs, the layout version of tagged ones.
    pub version: u8,
    /// The logical shard of a tagged ID.
    pub shard: Option<u16>,
    /// When it was issued (millisecond precision for snowflake IDs, second
    /// precision for tagged ones).
    pub time: DateTime<Utc>,
    pub worker: u16,
    pub sequence: u32,
}

/// Splits `id` by its version bits (62–61): 0 reads as a snowflake ID,
/// 1 as a tagged ID; `epoch_ms` is the configured epoch.
pub fn decode(id: i64, epoch_ms: i64) -> Result<DecodedId> {
    if id < 0 {
        return Err(Error::BadInput("an ID is never negative".into()));
    }
    let version = (id >> VERSION_SHIFT) as u8;
    let time = |ms: i64| {
        DateTime::from_timestamp_millis(epoch_ms + ms)
            .ok_or_else(|| Error::BadInput("the ID's time is out of range".into()))
    };
    match version {
        0 => Ok(DecodedId {
            id,
            kind: IdKind::Snowflake,
            version: 0,
            shard: None,
            time: time(id >> (WORKER_BITS + SEQUENCE_BITS))?,
            worker: ((id >> SEQUENCE_BITS) & ((1 << WORKER_BITS) - 1)) as u16,
            sequence: (id & MAX_SEQUENCE) as u32,
        }),
        TAGGED_VERSION => Ok(DecodedId {
            id,
            kind: IdKind::Tagged,
            version,
            shard: Some(((id >> TAGGED_SHARD_SHIFT) & ((1 << TAGGED_SHARD_BITS) - 1)) as u16),
            time: time(((id >> TAGGED_TIME_SHIFT) & TAGGED_MAX_TIME) * 1000)?,
            worker: ((id >> TAGGED_WORKER_SHIFT) & ((1 << WORKER_BITS) - 1)) as u16,
            sequence: (id & TAGGED_MAX_SEQUENCE) as u32,
        }),
        other => Err(Error::BadInput(format!(
            "unknown ID layout version {other}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EPOCH: i64 = crate::ids::DEFAULT_EPOCH_MS;

    #[test]
    fn snowflake_round_trips() {
        let id = snowflake(123_456_789, 1023, 4095);
        let d = decode(id, EPOCH).unwrap();
        assert_eq!(d.kind, IdKind::Snowflake);
        assert_eq!(d.time.timestamp_millis(), EPOCH + 123_456_789);
        assert_eq!((d.worker, d.sequence), (1023, 4095));
    }

    #[test]
    fn the_last_snowflake_millisecond_still_reads_as_snowflake() {
        let last = snowflake(SNOWFLAKE_MAX_TIME, 1023, MAX_SEQUENCE);
        let d = decode(last, EPOCH).unwrap();
        assert_eq!(d.kind, IdKind::Snowflake);
        assert_eq!(d.time.timestamp_millis(), EPOCH + SNOWFLAKE_MAX_TIME);
        // One millisecond later the version bits would read as tagged:
        // the reason the generator stops at SNOWFLAKE_MAX_TIME.
        let over = snowflake(SNOWFLAKE_MAX_TIME + 1, 0, 0);
        assert_eq!(decode(over, EPOCH).unwrap().kind, IdKind::Tagged);
        assert!(
            last < tagged(0, 0, 0, 0),
            "every snowflake ID sorts below every tagged one"
        );
    }

    #[test]
    fn tagged_round_trips_and_pins_the_layout() {
        let id = tagged(4095, 1_000_000, 7, 511);
        assert_eq!(
            id,
            (1 << 61) | (4095 << 49) | (1_000_000 << 19) | (7 << 9) | 511
        );
        let d = decode(id, EPOCH).unwrap();
        assert_eq!(d.kind, IdKind::Tagged);
        assert_eq!((d.version, d.shard), (1, Some(4095)));
        assert_eq!(d.time.timestamp_millis(), EPOCH + 1_000_000_000);
        assert_eq!((d.worker, d.sequence), (7, 511));
        assert!(decode(-1, EPOCH).is_err());
        assert!(decode(3 << 61, EPOCH).is_err());
    }
}
