//! Leaf segment mode: IDs of a biz tag handed out from memory, from
//! segments taken from `cellgate_id_segments`.
//!
//! A segment is taken in one transaction: `UPDATE … SET max_id = max_id +
//! step WHERE biz_tag = ?`, then the row is read back; the segment is
//! `[max_id - step, max_id)`. Concurrent gateways serialize on the row, so
//! their segments never overlap. Each tag keeps two buffers: the current
//! segment and the next one, which is loaded in the background once 10% of
//! the current one is used, so a request reaches the database at a
//! boundary only when the next segment did not arrive in time (counted as
//! a *boundary wait*). While the database is down the buffers keep
//! serving; when both are used up requests fail with
//! `ID_SOURCE_UNAVAILABLE` and a load is retried at most every
//! [`RETRY_AFTER`].
//!
//! The step adapts as Leaf's does: it doubles (up to `max_step`) when the
//! previous segment lasted less than `segment_duration`, stays when it
//! lasted up to twice that, and halves (down to `min_step`) otherwise.
//!
//! The state of a tag sits behind one `std::sync::Mutex` held for a few
//! arithmetic steps and never across an `.await`.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::{IdsOptions, NewTag, TagMetrics};
use crate::error::{Error, Result};
use crate::storage::{ddl, Backend, Sql, Value};

/// How long after a failed load the next one is tried.
pub(crate) const RETRY_AFTER: Duration = Duration::from_millis(200);

/// One stored biz tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagRow {
    pub tag: String,
    /// Highest ID handed out in a segment so far (exclusive).
    pub max_id: i64,
    pub step: i64,
    pub description: String,
    pub update_time: DateTime<Utc>,
}

/// What this process holds of one tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentState {
    pub tag: String,
    /// The rest of the current segment.
    pub current: Range<i64>,
    /// The segment loaded in advance, if any.
    pub next: Option<Range<i64>>,
    /// A load is under way.
    pub loading: bool,
    pub step: i64,
}

fn now() -> DateTime<Utc> {
    crate::storage::value::truncate_to_micros(Utc::now())
}

/// Inserts `tag` unless it exists; `true` when it was created.
pub(crate) async fn create_tag(backend: &dyn Backend, tag: &NewTag) -> Result<bool> {
    let dialect = backend.dialect();
    let mut sql = Sql::new(dialect);
    sql.push(dialect.insert_ignore())
        .ident(ddl::ID_SEGMENTS_TABLE)
        .push(" (")
        .idents(["biz_tag", "max_id", "step", "description", "update_time"])
        .push(") ")
        .rows([vec![
            Value::Text(tag.name.clone()),
            Value::Int(tag.start),
            Value::Int(tag.step),
            Value::Text(tag.description.clone()),
            Value::DateTime(now()),
        ]])
        .push(dialect.on_conflict_do_nothing());
    Ok(backend.execute(&sql).await? == 1)
}

/// Every stored tag, by name.
pub(crate) async fn list_tags(backend: &dyn Backend) -> Result<Vec<TagRow>> {
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT ")
        .idents(["biz_tag", "max_id", "step", "description", "update_time"])
        .push(" FROM ")
        .ident(ddl::ID_SEGMENTS_TABLE)
        .push(" ORDER BY ")
        .ident("biz_tag");
    Ok(backend
        .rows::<(String, i64, i64, String, DateTime<Utc>)>(&sql)
        .await?
        .into_iter()
        .map(|(tag, max_id, step, description, update_time)| TagRow {
            tag,
            max_id,
            step,
            description,
            update_time,
        })
        .collect())
}

/// Takes the next segment of `tag` in one transaction: `step` IDs, or the
/// tag's stored step when `None`. Returns the segment.
pub(crate) async fn take_segment(
    backend: &dyn Backend,
    tag: &str,
    step: Option<i64>,
) -> Result<Range<i64>> {
    let dialect = backend.dialect();
    let mut update = Sql::new(dialect);
    update
        .push("UPDATE ")
        .ident(ddl::ID_SEGMENTS_TABLE)
        .push(" SET ")
        .ident("max_id")
        .push(" = ")
        .ident("max_id")
        .push(" + ");
    match step {
        Some(step) => update.bind(Value::Int(step)),
        None => update.ident("step"),
    };
    update
        .push(", ")
        .ident("update_time")
        .push(" = ")
        .bind(Value::DateTime(now()))
        .push(" WHERE ")
        .ident("biz_tag")
        .push(" = ")
        .bind(Value::Text(tag.to_string()));
    if step.is_none() {
        // A stored step below 1 would lower max_id and hand IDs out again.
        update.push(" AND ").ident("step").push(" >= 1");
    }
    let mut select = Sql::new(dialect);
    select
        .push("SELECT ")
        .idents(["max_id", "step"])
        .push(" FROM ")
        .ident(ddl::ID_SEGMENTS_TABLE)
        .push(" WHERE ")
        .ident("biz_tag")
        .push(" = ")
        .bind(Value::Text(tag.to_string()));
    let mut tx = backend.begin().await?;
    if tx.execute(&update).await? == 0 {
        let rows = tx.rows::<(i64, i64)>(&select).await?;
        return Err(match rows.first() {
            Some(_) => Error::BadInput(format!(
                "biz tag `{tag}` has a stored step below 1; set its step to 1 or more"
            )),
            None => Error::UnknownBizTag(tag.to_string()),
        });
    }
    let row = tx.first_row::<(i64, i64)>(&select).await?;
    tx.commit().await?;
    let Some((max_id, stored_step)) = row else {
        return Err(Error::UnknownBizTag(tag.to_string()));
    };
    let step = step.unwrap_or(stored_step);
    Ok(max_id - step..max_id)
}

/// All tags served by this process.
pub(crate) struct Segments {
    backend: Arc<dyn Backend>,
    prefetch: bool,
    min_step: i64,
    max_step: i64,
    segment_duration: Duration,
    tags: RwLock<HashMap<String, Arc<TagBuffer>>>,
}

/// The double buffer of one tag.
struct TagBuffer {
    tag: String,
    state: Mutex<State>,
    /// Woken when a load finishes, successfully or not.
    loaded: tokio::sync::Notify,
    issued: AtomicU64,
    loads: AtomicU64,
    boundary_waits: AtomicU64,
}

#[derive(Default)]
struct State {
    /// Unused IDs of the current segment.
    current: Range<i64>,
    /// Length of the current segment, for the 10% rule.
    current_len: i64,
    next: Option<Range<i64>>,
    loading: bool,
    /// A segment was ever loaded (the first load is not a boundary).
    started: bool,
    /// Step of the latest segment; 0 before the first.
    step: i64,
    loaded_at: Option<Instant>,
    /// When the latest load failed, and why (for the backoff).
    failed: Option<(Instant, String)>,
    /// The tag does not exist.
    unknown: bool,
}

impl State {
    fn used_a_tenth(&self) -> bool {
        let left = self.current.end - self.current.start;
        self.current_len - left >= (self.current_len + 9) / 10
    }

    fn backing_off(&self) -> bool {
        matches!(&self.failed, Some((at, _)) if at.elapsed() < RETRY_AFTER)
    }

    /// Whether the next segment should start loading now: the current one
    /// is a tenth used, no next one is held or loading, and the last load
    /// did not just fail.
    fn wants_next(&self) -> bool {
        self.started
            && self.next.is_none()
            && !self.loading
            && self.used_a_tenth()
            && !self.backing_off()
    }
}

impl Segments {
    pub(crate) fn new(backend: Arc<dyn Backend>, options: &IdsOptions) -> Segments {
        Segments {
            backend,
            prefetch: options.prefetch,
            min_step: options.min_step.max(1),
            max_step: options.max_step.max(options.min_step.max(1)),
            segment_duration: options.segment_duration,
            tags: RwLock::new(HashMap::new()),
        }
    }

    pub(crate) fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    fn buffer(&self, tag: &str) -> Arc<TagBuffer> {
        if let Some(buffer) = self.tags.read().expect("tags lock").get(tag) {
            return buffer.clone();
        }
        self.tags
            .write()
            .expect("tags lock")
            .entry(tag.to_string())
            .or_insert_with(|| {
                Arc::new(TagBuffer {
                    tag: tag.to_string(),
                    state: Mutex::new(State::default()),
                    loaded: tokio::sync::Notify::new(),
                    issued: AtomicU64::new(0),
                    loads: AtomicU64::new(0),
                    boundary_waits: AtomicU64::new(0),
                })
            })
            .clone()
    }

    /// Forgets a tag that turned out not to exist, so typos take no memory.
    fn forget(&self, tag: &str) {
        let mut tags = self.tags.write().expect("tags lock");
        if tags
            .get(tag)
            .is_some_and(|b| b.state.lock().expect("tag lock").unknown)
        {
            tags.remove(tag);
        }
    }

    /// `count` IDs of `tag` from the current segment when it holds them:
    /// the common case, without cloning the buffer's `Arc` or preparing a
    /// wait.
    fn take_current(self: &Arc<Self>, tag: &str, count: i64) -> Option<Vec<Range<i64>>> {
        let tags = self.tags.read().expect("tags lock");
        let buffer = tags.get(tag)?;
        let mut state = buffer.state.lock().expect("tag lock");
        let start = state.current.start;
        if state.current.end - start < count {
            return None;
        }
        state.current.start += count;
        if self.prefetch && state.wants_next() {
            state.loading = true;
            self.spawn_load(buffer);
        }
        buffer.issued.fetch_add(count as u64, Relaxed);
        Some(std::iter::once(start..start + count).collect())
    }

    /// `count` IDs of `tag` as ranges.
    pub(crate) async fn take(self: &Arc<Self>, tag: &str, count: i64) -> Result<Vec<Range<i64>>> {
        if let Some(out) = self.take_current(tag, count) {
            return Ok(out);
        }
        let buffer = self.buffer(tag);
        let mut out = Vec::with_capacity(1);
        let mut need = count;
        loop {
            let notified = buffer.loaded.notified();
            tokio::pin!(notified);
            {
                let mut state = buffer.state.lock().expect("tag lock");
                if state.unknown {
                    drop(state);
                    self.forget(tag);
                    return Err(Error::UnknownBizTag(tag.to_string()));
                }
                while need > 0 {
                    let left = state.current.end - state.current.start;
                    if left > 0 {
                        let k = left.min(need);
                        let start = state.current.start;
                        out.push(start..start + k);
                        state.current.start += k;
                        need -= k;
                    } else if let Some(next) = state.next.take() {
                        state.current_len = next.end - next.start;
                        state.current = next;
                    } else {
                        break;
                    }
                }
                if self.prefetch && state.wants_next() {
                    state.loading = true;
                    self.spawn_load(&buffer);
                }
                if need == 0 {
                    buffer.issued.fetch_add(count as u64, Relaxed);
                    return Ok(out);
                }
                if !state.loading {
                    if let Some((at, reason)) = &state.failed {
                        if at.elapsed() < RETRY_AFTER {
                            return Err(Error::IdSourceUnavailable(format!(
                                "biz tag `{tag}`: segments used up and {reason}"
                            )));
                        }
                    }
                    state.loading = true;
                    self.spawn_load(&buffer);
                }
                if state.started {
                    buffer.boundary_waits.fetch_add(1, Relaxed);
                }
                notified.as_mut().enable();
            }
            notified.await;
            let state = buffer.state.lock().expect("tag lock");
            if !state.loading && state.next.is_none() && state.current.is_empty() {
                if let Some((_, reason)) = &state.failed {
                    return Err(Error::IdSourceUnavailable(format!(
                        "biz tag `{tag}`: segments used up and {reason}"
                    )));
                }
            }
        }
    }

    fn spawn_load(self: &Arc<Self>, buffer: &Arc<TagBuffer>) {
        let segments = self.clone();
        let buffer = buffer.clone();
        tokio::spawn(async move { segments.load(&buffer).await });
    }

    /// The step of the next segment, from how long the latest one lasted.
    fn next_step(&self, step: i64, lasted: Duration) -> i64 {
        adapt(
            step,
            lasted,
            self.segment_duration,
            self.min_step,
            self.max_step,
        )
    }

    async fn load(&self, buffer: &TagBuffer) {
        let step = {
            let state = buffer.state.lock().expect("tag lock");
            match state.loaded_at {
                Some(at) if state.started => Some(self.next_step(state.step, at.elapsed())),
                _ => None,
            }
        };
        let result = take_segment(self.backend.as_ref(), &buffer.tag, step).await;
        {
            let mut state = buffer.state.lock().expect("tag lock");
            state.loading = false;
            match result {
                Ok(segment) => {
                    buffer.loads.fetch_add(1, Relaxed);
                    state.step = segment.end - segment.start;
                    state.loaded_at = Some(Instant::now());
                    state.started = true;
                    state.failed = None;
                    if state.current.is_empty() && state.next.is_none() {
                        state.current_len = segment.end - segment.start;
                        state.current = segment;
                    } else {
                        state.next = Some(segment);
                    }
                }
                Err(Error::UnknownBizTag(_)) => state.unknown = true,
                Err(err) => {
                    tracing::warn!(tag = %buffer.tag, error = %err, "cannot load an id segment");
                    let reason = match &err {
                        Error::Unavailable { cluster, .. } | Error::BreakerOpen { cluster, .. } => {
                            format!("storage cluster `{cluster}` is unavailable")
                        }
                        _ => "the segment table cannot be read".to_string(),
                    };
                    state.failed = Some((Instant::now(), reason));
                }
            }
        }
        buffer.loaded.notify_waiters();
    }

    pub(crate) fn state(&self) -> Vec<SegmentState> {
        let tags = self.tags.read().expect("tags lock");
        let mut out: Vec<SegmentState> = tags
            .values()
            .map(|b| {
                let s = b.state.lock().expect("tag lock");
                SegmentState {
                    tag: b.tag.clone(),
                    current: s.current.clone(),
                    next: s.next.clone(),
                    loading: s.loading,
                    step: s.step,
                }
            })
            .collect();
        out.sort_by(|a, b| a.tag.cmp(&b.tag));
        out
    }

    pub(crate) fn metrics(&self) -> Vec<TagMetrics> {
        let tags = self.tags.read().expect("tags lock");
        let mut out: Vec<TagMetrics> = tags
            .values()
            .map(|b| TagMetrics {
                tag: b.tag.clone(),
                issued: b.issued.load(Relaxed),
                segment_loads: b.loads.load(Relaxed),
                boundary_waits: b.boundary_waits.load(Relaxed),
                step: b.state.lock().expect("tag lock").step,
            })
            .collect();
        out.sort_by(|a, b| a.tag.cmp(&b.tag));
        out
    }
}

/// Leaf's rule: double the step when a segment lasted less than `aim`,
/// keep it up to twice that, halve it beyond; within `min..=max`.
fn adapt(step: i64, lasted: Duration, aim: Duration, min: i64, max: i64) -> i64 {
    let next = if lasted < aim {
        step.saturating_mul(2)
    } else if lasted < aim * 2 {
        step
    } else {
        step / 2
    };
    next.clamp(min, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_aims_at_one_segment_per_period() {
        let aim = Duration::from_secs(900);
        let s = Duration::from_secs;
        assert_eq!(adapt(1000, s(60), aim, 1000, 1_000_000), 2000);
        assert_eq!(adapt(800_000, s(60), aim, 1000, 1_000_000), 1_000_000);
        assert_eq!(adapt(4000, s(1000), aim, 1000, 1_000_000), 4000);
        assert_eq!(adapt(4000, s(3600), aim, 1000, 1_000_000), 2000);
        assert_eq!(adapt(1500, s(3600), aim, 1000, 1_000_000), 1000);
    }

    #[test]
    fn prefetch_starts_at_a_tenth() {
        let mut state = State {
            current: 0..100,
            current_len: 100,
            ..State::default()
        };
        assert!(!state.used_a_tenth());
        state.current = 9..100;
        assert!(!state.used_a_tenth());
        state.current = 10..100;
        assert!(state.used_a_tenth());
    }
}
