//! ID allocation: Leaf segments per biz tag (`segment.rs`), snowflake IDs
//! with leased worker ids (`snowflake.rs`) and shard-tagged IDs that name
//! the logical shard of the key they belong to (`tagged.rs`).
//!
//! [`Ids`] is the one entry point; the store opens it on the cluster that
//! `ids.cluster` names, and the GraphQL, HTTP and CLI surfaces call it. It
//! talks to the database only through [`Backend`], so tests can put a slow
//! or failing backend underneath, and reads time only through [`Clock`],
//! so tests can move the clock backwards.
//!
//! The shape follows Meituan's Leaf: a segment is taken in one
//! transaction and handed out from memory, with the next one loaded in the
//! background once 10% of the current one is used (the *double buffer*);
//! snowflake IDs need the database only to lease a worker id, which is
//! cached on disk so a restart works while the database is down. Unlike
//! Leaf, worker ids are leases and are recycled when one expires.

mod clock;
mod segment;
mod snowflake;
mod tagged;

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use clock::{Clock, ManualClock, SystemClock};
pub use segment::{SegmentState, TagRow};
pub use snowflake::{LeaseState, SnowflakeMetrics};
pub use tagged::{decode, DecodedId, IdKind, TAGGED_SHARD_BITS, TAGGED_VERSION};

use crate::error::{Error, Result};
use crate::storage::Backend;

/// 2024-01-01T00:00:00Z in Unix milliseconds: the default snowflake epoch.
pub const DEFAULT_EPOCH_MS: i64 = 1_704_067_200_000;

/// Worker ids a snowflake layout holds (10 bits).
pub const MAX_WORKERS: u16 = 1024;

/// Most tagged IDs of one shard a call hands out: what one worker issues
/// per shard in a second.
pub const MAX_TAGGED_PER_CALL: usize = tagged::TAGGED_MAX_SEQUENCE as usize + 1;

/// Longest biz tag name.
pub const MAX_TAG_LEN: usize = 128;

/// A biz tag to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTag {
    pub name: String,
    /// First ID handed out.
    pub start: i64,
    /// First segment length.
    pub step: i64,
    pub description: String,
}

/// How IDs are allocated (from `ids:` in `cellgate.yaml`).
#[derive(Clone)]
pub struct IdsOptions {
    /// Cluster of the segment table and worker leases; `None`: the first.
    pub cluster: Option<String>,
    /// Load the next segment in the background at 10% use.
    pub prefetch: bool,
    pub min_step: i64,
    pub max_step: i64,
    /// How long a segment should last (the adaptive step aims at it).
    pub segment_duration: Duration,
    /// Most IDs one call hands out.
    pub max_count: usize,
    /// Tags created when the allocator opens, if missing.
    pub tags: Vec<NewTag>,
    /// Take a worker id and serve snowflake IDs.
    pub snowflake: bool,
    pub epoch_ms: i64,
    pub worker_lease: Duration,
    /// Where the leased worker id and last issued time are cached.
    pub worker_cache: Option<PathBuf>,
    /// The clock of snowflake IDs; `None`: the system clock.
    pub clock: Option<Arc<dyn Clock>>,
    /// Worker ids to lease from (at most [`MAX_WORKERS`]); tests shrink it.
    pub max_workers: u16,
}

impl std::fmt::Debug for IdsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdsOptions")
            .field("cluster", &self.cluster)
            .field("prefetch", &self.prefetch)
            .field("min_step", &self.min_step)
            .field("max_step", &self.max_step)
            .field("snowflake", &self.snowflake)
            .field("worker_cache", &self.worker_cache)
            .finish_non_exhaustive()
    }
}

impl Default for IdsOptions {
    /// The defaults of `ids:` in `cellgate.yaml`, without a worker cache.
    fn default() -> Self {
        IdsOptions {
            cluster: None,
            prefetch: true,
            min_step: 1000,
            max_step: 1_000_000,
            segment_duration: Duration::from_secs(15 * 60),
            max_count: 10_000,
            tags: Vec::new(),
            snowflake: true,
            epoch_ms: DEFAULT_EPOCH_MS,
            worker_lease: Duration::from_secs(10 * 60),
            worker_cache: None,
            clock: None,
            max_workers: MAX_WORKERS,
        }
    }
}

/// Counters of one biz tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagMetrics {
    pub tag: String,
    /// IDs handed out by this process.
    pub issued: u64,
    /// Segments taken from the database.
    pub segment_loads: u64,
    /// Requests that found both buffers empty after the first segment and
    /// waited for the database (0 while prefetch keeps up).
    pub boundary_waits: u64,
    /// Length of the latest segment (the adaptive step).
    pub step: i64,
}

/// A snapshot for `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdsMetrics {
    pub tags: Vec<TagMetrics>,
    pub snowflake: Option<SnowflakeMetrics>,
}

/// The ID allocator; cheap to clone.
#[derive(Clone)]
pub struct Ids {
    inner: Arc<Inner>,
}

struct Inner {
    segments: Arc<segment::Segments>,
    snowflake: Option<Arc<snowflake::Snowflake>>,
    epoch_ms: i64,
    max_count: usize,
}

impl Ids {
    /// Opens the allocator on `backend` (whose cluster already has the ID
    /// tables): creates the configured tags that are missing and, with
    /// snowflake mode on, starts leasing a worker id in the background
    /// (at once from the disk cache when it holds a live lease). Never
    /// fails because the database is down: requests report it.
    pub async fn open(backend: Arc<dyn Backend>, options: IdsOptions) -> Result<Ids> {
        for tag in &options.tags {
            validate_new_tag(tag).map_err(|e| {
                Error::Config(format!(
                    "ids.tags: tag `{}`: {}",
                    tag.name,
                    e.client_message()
                ))
            })?;
        }
        for tag in &options.tags {
            if let Err(err) = segment::create_tag(backend.as_ref(), tag).await {
                if err.is_transient() {
                    tracing::warn!(tag = %tag.name, error = %err, "cannot create the configured biz tag now");
                } else {
                    return Err(err);
                }
            }
        }
        let segments = Arc::new(segment::Segments::new(backend.clone(), &options));
        let snowflake = if options.snowflake {
            Some(snowflake::Snowflake::start(backend, &options)?)
        } else {
            None
        };
        Ok(Ids {
            inner: Arc::new(Inner {
                segments,
                snowflake,
                epoch_ms: options.epoch_ms,
                max_count: options.max_count,
            }),
        })
    }

    fn check_count(&self, count: usize) -> Result<()> {
        if count == 0 {
            return Err(Error::BadInput("count must be at least 1".into()));
        }
        if count > self.inner.max_count {
            return Err(Error::LimitExceeded {
                what: "count".into(),
                limit: self.inner.max_count,
            });
        }
        Ok(())
    }

    /// `count` IDs of `tag`, increasing.
    pub async fn next_ids(&self, tag: &str, count: usize) -> Result<Vec<i64>> {
        let ranges = self.next_id_ranges(tag, count).await?;
        Ok(ranges.into_iter().flatten().collect())
    }

    /// `count` IDs of `tag` as increasing ranges (one unless the call
    /// crossed a segment boundary).
    pub async fn next_id_ranges(&self, tag: &str, count: usize) -> Result<Vec<Range<i64>>> {
        self.check_count(count)?;
        validate_tag(tag)?;
        self.inner.segments.take(tag, count as i64).await
    }

    /// Creates a biz tag whose first ID is `start`; `false` when it exists.
    pub async fn create_tag(&self, tag: &NewTag) -> Result<bool> {
        validate_new_tag(tag)?;
        segment::create_tag(self.inner.segments.backend(), tag).await
    }

    /// Every biz tag as stored.
    pub async fn tags(&self) -> Result<Vec<TagRow>> {
        segment::list_tags(self.inner.segments.backend()).await
    }

    /// The in-memory segments of the tags this process served.
    pub fn segment_state(&self) -> Vec<SegmentState> {
        self.inner.segments.state()
    }

    /// `count` snowflake IDs, increasing.
    pub async fn snowflake_ids(&self, count: usize) -> Result<Vec<i64>> {
        self.check_count(count)?;
        self.snowflake()?.next(count).await
    }

    /// `count` shard-tagged IDs naming logical shard `shard` (< 4096), at
    /// most [`MAX_TAGGED_PER_CALL`]: a worker issues that many per shard
    /// and second, so a larger count would wait seconds while other
    /// callers for the shard wait behind it.
    pub async fn tagged_ids(&self, shard: u32, count: usize) -> Result<Vec<i64>> {
        self.check_count(count)?;
        if count > MAX_TAGGED_PER_CALL {
            return Err(Error::LimitExceeded {
                what: "count of tagged IDs of one shard (a worker issues 512 per shard and second)"
                    .into(),
                limit: MAX_TAGGED_PER_CALL,
            });
        }
        if shard >= 1 << TAGGED_SHARD_BITS {
            return Err(Error::BadInput(format!(
                "a tagged ID holds shards below {}",
                1 << TAGGED_SHARD_BITS
            )));
        }
        self.snowflake()?.next_tagged(shard as u16, count).await
    }

    fn snowflake(&self) -> Result<&snowflake::Snowflake> {
        self.inner
            .snowflake
            .as_deref()
            .ok_or_else(|| Error::IdSourceUnavailable("snowflake ids are not enabled".into()))
    }

    /// Splits an ID into its parts (see [`decode`]).
    pub fn decode(&self, id: i64) -> Result<DecodedId> {
        decode(id, self.inner.epoch_ms)
    }

    /// The worker id held now, if any.
    pub fn worker_id(&self) -> Option<u16> {
        self.inner.snowflake.as_ref().and_then(|s| s.worker_id())
    }

    /// Waits (at most `timeout`) until a snowflake worker id is held.
    pub async fn wait_for_worker(&self, timeout: Duration) -> Result<u16> {
        self.snowflake()?.wait_for_worker(timeout).await
    }

    /// Counters for `/metrics`.
    pub fn metrics(&self) -> IdsMetrics {
        IdsMetrics {
            tags: self.inner.segments.metrics(),
            snowflake: self.inner.snowflake.as_ref().map(|s| s.metrics()),
        }
    }

    /// Stops lease renewal and writes the exact last issued time to the
    /// worker cache. The lease is kept (not released) so a restart takes
    /// the same worker id, from the cache if the database is down.
    pub async fn shutdown(&self) {
        if let Some(snowflake) = &self.inner.snowflake {
            snowflake.shutdown();
        }
    }
}

/// A tag to create has a valid name, a step of at least 1 (a step below
/// would lower `max_id` and hand out IDs again) and a start of at least 0.
fn validate_new_tag(tag: &NewTag) -> Result<()> {
    validate_tag(&tag.name)?;
    if tag.step < 1 {
        return Err(Error::BadInput("step must be at least 1".into()));
    }
    if tag.start < 0 {
        return Err(Error::BadInput("start must not be negative".into()));
    }
    Ok(())
}

/// A biz tag is 1 to 128 letters, digits, `_`, `-`, `.` or `:`.
pub fn validate_tag(tag: &str) -> Result<()> {
    let ok = !tag.is_empty()
        && tag.len() <= MAX_TAG_LEN
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'));
    if ok {
        Ok(())
    } else {
        Err(Error::BadInput(format!(
            "biz tag must be 1 to {MAX_TAG_LEN} letters, digits, `_`, `-`, `.` or `:`"
        )))
    }
}
