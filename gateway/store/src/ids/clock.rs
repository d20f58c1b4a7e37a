//! The time source of snowflake and tagged IDs, injectable so tests can
//! move the clock backwards (and forwards) at will.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;

/// Milliseconds since the Unix epoch, and waiting on them.
pub trait Clock: Send + Sync + 'static {
    /// Now, in Unix milliseconds.
    fn now_ms(&self) -> i64;

    /// Waits `ms` milliseconds.
    fn sleep(&self, ms: u64) -> BoxFuture<'static, ()>;

    /// Called while spinning for the next millisecond (a sequence ran
    /// out); a manual clock moves itself on here.
    fn spin(&self) {
        std::hint::spin_loop();
    }
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        chrono::Utc::now().timestamp_millis()
    }

    fn sleep(&self, ms: u64) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(Duration::from_millis(ms)))
    }
}

/// A clock that moves only when told to (and by the time slept on it).
#[derive(Debug)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn new(now_ms: i64) -> ManualClock {
        ManualClock(AtomicI64::new(now_ms))
    }

    pub fn set(&self, now_ms: i64) {
        self.0.store(now_ms, Ordering::SeqCst);
    }

    pub fn advance(&self, ms: i64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }

    fn sleep(&self, ms: u64) -> BoxFuture<'static, ()> {
        self.advance(ms as i64);
        Box::pin(async {})
    }

    fn spin(&self) {
        self.advance(1);
    }
}
