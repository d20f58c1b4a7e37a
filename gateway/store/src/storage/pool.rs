//! Connection pools of the backends: deadpool holding sqlx connections.
//!
//! sqlx's own pool sends a test round trip on every connection handed back
//! to it, so each statement cost the database two round trips. Here a
//! connection goes back to the pool as it is, unless its last use did not
//! end cleanly: a statement cancelled while it ran (its caller gave up) or
//! a transaction dropped without a commit (its `ROLLBACK` is queued). Such a
//! connection is settled first in a task of its own, by a round trip that
//! drains what is still in flight and sends what is queued, as sqlx does for
//! every connection; one that does not answer within the statement timeout
//! is closed. A connection whose statement got no answer in time
//! ([`Conn::discard`]) is closed instead of going back at all.
//!
//! A connection lost while idle in the pool (the database restarted) fails
//! its next statement; `Backend::fetch` and `Backend::begin` repeat that on
//! another connection ([`Pool::max_size`] bounds how often).

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use deadpool::managed::{self, Metrics, Object, PoolError, RecycleResult};
use sqlx::{ConnectOptions as _, Connection, Database};

/// Opens the connections of a [`Pool`].
pub(crate) struct Manager<DB: Database> {
    options: <DB::Connection as Connection>::Options,
}

impl<DB: Database> managed::Manager for Manager<DB> {
    type Type = DB::Connection;
    type Error = sqlx::Error;

    async fn create(&self) -> Result<DB::Connection, sqlx::Error> {
        self.options.connect().await
    }

    /// Nothing to check: connections come back settled (see the module
    /// documentation).
    async fn recycle(&self, _: &mut DB::Connection, _: &Metrics) -> RecycleResult<sqlx::Error> {
        Ok(())
    }
}

/// A bounded pool of connections to one database, opened on demand;
/// clones share it.
pub(crate) struct Pool<DB: Database> {
    inner: managed::Pool<Manager<DB>>,
    max_size: u32,
    /// Longest wait for a connection, opening one included.
    acquire_timeout: Duration,
    /// Longest wait for the round trip that settles a connection.
    settle_timeout: Option<Duration>,
    /// With a lane ([`Pool::with_lane`]), ordinary callers wait their turn
    /// on it, so that at most one of them waits in the pool's own queue
    /// and [`Pool::acquire_first`] goes ahead of the rest.
    lane: Option<std::sync::Arc<tokio::sync::Mutex<()>>>,
}

impl<DB: Database> Clone for Pool<DB> {
    fn clone(&self) -> Self {
        Pool {
            inner: self.inner.clone(),
            max_size: self.max_size,
            acquire_timeout: self.acquire_timeout,
            settle_timeout: self.settle_timeout,
            lane: self.lane.clone(),
        }
    }
}

impl<DB: Database> Pool<DB> {
    pub(crate) fn new(
        options: <DB::Connection as Connection>::Options,
        max_size: u32,
        acquire_timeout: Duration,
        settle_timeout: Option<Duration>,
    ) -> Pool<DB> {
        let max_size = max_size.max(1);
        let inner = managed::Pool::builder(Manager { options })
            .max_size(max_size as usize)
            .build()
            // Only a pool with timeouts of its own needs a runtime, and
            // the waits here are bounded around it instead.
            .expect("a pool without timeouts builds");
        Pool {
            inner,
            max_size,
            acquire_timeout,
            settle_timeout,
            lane: None,
        }
    }

    /// The pool with a lane for [`Pool::acquire_first`]: callers of it
    /// wait for at most the connection in use and one ordinary caller,
    /// however many others queue.
    pub(crate) fn with_lane(mut self) -> Pool<DB> {
        self.lane = Some(Default::default());
        self
    }

    /// Lends a connection, opening one if none is idle and the pool has
    /// room. After the acquire timeout: sqlx's `PoolTimedOut` when every
    /// connection the pool may hold is open and lent out (the node answers,
    /// its callers are too many: `Error::PoolBusy`, which no circuit
    /// breaker counts), or a timed-out I/O error when a connection was
    /// still being opened (the node is slow to accept one: a node failure).
    /// `PoolClosed` once the pool is closed.
    pub(crate) async fn acquire(&self) -> Result<Conn<DB>, sqlx::Error> {
        self.lend(false).await
    }

    /// As [`Pool::acquire`], ahead of the ordinary callers still waiting
    /// when the pool has a lane.
    pub(crate) async fn acquire_first(&self) -> Result<Conn<DB>, sqlx::Error> {
        self.lend(true).await
    }

    async fn lend(&self, first: bool) -> Result<Conn<DB>, sqlx::Error> {
        let get = async {
            let _turn = match (&self.lane, first) {
                (Some(lane), false) => Some(lane.lock().await),
                _ => None,
            };
            self.inner.get().await
        };
        let object = match tokio::time::timeout(self.acquire_timeout, get).await {
            Err(_) | Ok(Err(PoolError::Timeout(_))) => return Err(self.timed_out()),
            Ok(Err(PoolError::Backend(e))) => return Err(e),
            Ok(Err(_)) => return Err(sqlx::Error::PoolClosed),
            Ok(Ok(object)) => object,
        };
        Ok(Conn {
            object: Some(object),
            unsettled: false,
            discard: false,
            settle_timeout: self.settle_timeout,
        })
    }

    /// Why an acquire ran out of time: waiting for a connection in use, or
    /// opening one (see [`Pool::acquire`]). A connection counts in the
    /// pool's size once it is open.
    fn timed_out(&self) -> sqlx::Error {
        if self.inner.status().size >= self.max_size as usize {
            sqlx::Error::PoolTimedOut
        } else {
            sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "opening a connection took longer than the acquire timeout",
            ))
        }
    }

    /// The most connections the pool holds at once.
    pub(crate) fn max_size(&self) -> u32 {
        self.max_size
    }

    /// Closes the idle connections gracefully and the pool for good: later
    /// acquires fail with `PoolClosed`, and connections still lent out are
    /// closed when they come back.
    pub(crate) async fn close(&self) {
        let idle = self.inner.retain(|_, _| false).removed;
        self.inner.close();
        for conn in idle {
            let _ = conn.close().await;
        }
    }
}

/// A connection lent by a [`Pool`]; it goes back when dropped.
pub(crate) struct Conn<DB: Database> {
    object: Option<Object<Manager<DB>>>,
    /// Its last use may have left work in flight or queued.
    unsettled: bool,
    /// Closed on drop instead of going back to the pool.
    discard: bool,
    settle_timeout: Option<Duration>,
}

impl<DB: Database> Conn<DB> {
    /// The connection, for one statement: until [`Conn::settled`] is
    /// called it counts as interrupted, so a caller that gives up on the
    /// statement leaves a connection that is settled before reuse.
    pub(crate) fn start(&mut self) -> &mut DB::Connection {
        self.unsettled = true;
        self
    }

    /// The statement begun with [`Conn::start`] has its answer.
    pub(crate) fn settled(&mut self) {
        self.unsettled = false;
    }

    /// Work was queued on the connection (a rollback) without waiting for
    /// it: it is sent and answered before the connection is lent again.
    pub(crate) fn queued(&mut self) {
        self.unsettled = true;
    }

    /// Closes the connection when it is dropped: it stopped answering.
    pub(crate) fn discard(&mut self) {
        self.discard = true;
    }
}

impl<DB: Database> Deref for Conn<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        self.object.as_ref().expect("a lent connection")
    }
}

impl<DB: Database> DerefMut for Conn<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        self.object.as_mut().expect("a lent connection")
    }
}

impl<DB: Database> Drop for Conn<DB> {
    fn drop(&mut self) {
        let Some(mut object) = self.object.take() else {
            return;
        };
        if self.discard {
            drop(Object::take(object));
            return;
        }
        if !self.unsettled && !object.should_flush() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            drop(Object::take(object));
            return;
        };
        let limit = self.settle_timeout;
        runtime.spawn(async move {
            let answered = match limit {
                Some(limit) => tokio::time::timeout(limit, object.ping()).await.ok(),
                None => Some(object.ping().await),
            };
            if !matches!(answered, Some(Ok(()))) {
                drop(Object::take(object));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;
    use std::sync::{Arc, Mutex};

    use sqlx::sqlite::SqliteConnectOptions;

    use super::*;

    /// Who got the one connection, in order.
    async fn take(pool: Pool<sqlx::Sqlite>, who: &'static str, order: Arc<Mutex<Vec<&str>>>) {
        let conn = if who.starts_with("first") {
            pool.acquire_first().await
        } else {
            pool.acquire().await
        }
        .expect("a connection");
        order.lock().unwrap().push(who);
        tokio::time::sleep(Duration::from_millis(5)).await;
        drop(conn);
    }

    /// The order in which `a`, `b`, `c` and then `first` (by
    /// `acquire_first`), each queued before the next asks, get the one
    /// connection of `pool` once it is given back.
    async fn served_order(pool: Pool<sqlx::Sqlite>) -> Vec<&'static str> {
        let held = pool.acquire().await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for who in ["a", "b", "c", "first"] {
            tasks.push(tokio::spawn(take(pool.clone(), who, order.clone())));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(held);
        for task in tasks {
            task.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        order
    }

    fn one_connection() -> Pool<sqlx::Sqlite> {
        let options = SqliteConnectOptions::from_str("sqlite::memory:").unwrap();
        Pool::new(options, 1, Duration::from_secs(10), None)
    }

    #[tokio::test]
    async fn a_caller_of_the_lane_goes_ahead_of_queued_callers() {
        // `a` was already waiting for the connection itself; `first`
        // passes `b` and `c`, which wait for their turn in the lane.
        assert_eq!(
            served_order(one_connection().with_lane()).await,
            ["a", "first", "b", "c"]
        );
    }

    #[tokio::test]
    async fn without_a_lane_callers_are_served_in_order() {
        assert_eq!(
            served_order(one_connection()).await,
            ["a", "b", "c", "first"]
        );
    }
}
