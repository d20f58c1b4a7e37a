//! Retrying transactions that lost a race.
//!
//! A transaction can fail only because of a concurrent one: a unique key
//! inserted first, a deadlock, a serialization failure (see
//! [`crate::Error::is_retryable`]). Every write path retries through
//! [`with_retry`], with a jittered backoff that grows with the attempt so
//! racers spread out instead of colliding again.

use std::future::Future;
use std::time::Duration;

use rand::Rng;

use crate::error::Result;

/// Attempts after the first before the error is returned.
const MAX_RETRIES: u32 = 8;

/// Runs `op` until it succeeds, fails with an error that is not a lost
/// race, or has been retried [`MAX_RETRIES`] times.
pub(crate) async fn with_retry<T, F, Fut>(what: &str, mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut attempt = 0;
    loop {
        match op().await {
            Err(err) if err.is_retryable() && attempt < MAX_RETRIES => {
                attempt += 1;
                tracing::debug!(what, attempt, error = %err, "retrying after a lost race");
                backoff(attempt).await;
            }
            other => return other,
        }
    }
}

/// Waits a little before a retry; the delay grows with the attempt and is
/// jittered.
pub(crate) async fn backoff(attempt: u32) {
    let base = 2u64 << attempt.min(6);
    let jitter = rand::thread_rng().gen_range(0..=base);
    tokio::time::sleep(Duration::from_millis(base + jitter)).await;
}
