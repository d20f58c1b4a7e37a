//! Circuit breakers: one per database server node, so that a node that
//! stops answering costs the requests that find it failing one statement
//! timeout each, and the requests after them nothing.
//!
//! A breaker is *closed* while its node answers. After
//! `storage.breaker.failures` consecutive statements fail in a way that
//! says the node is unavailable (the errors `Error::from_sqlx` classifies
//! as [`Error::Unavailable`]: refused or reset connections, no answer
//! within `storage.timeout_ms`, a server shutting down), it *opens*: every
//! statement then fails at once with [`Error::BreakerOpen`]
//! (`STORAGE_UNAVAILABLE`, transient), and the write path answers
//! `BUFFERED` at once when the write has its buffer copies. Errors about
//! the statement itself (a unique key, a conflict, bad SQL) mean the node
//! answered, so they count as successes. After the cool-down
//! (`open_ms`) the breaker is *half-open*: the next statement is let
//! through as the probe, every other one still fails at once. A probe that
//! succeeds closes the breaker; one that fails opens it again for twice the
//! previous cool-down, at most `max_open_ms`. Whoever asks first after the
//! cool-down probes, a request or the buffer replay's poll, so a node that
//! answers again is back in use within one cool-down of the next statement
//! for it, with no background task of its own.
//!
//! Why a wrapper implementing [`Backend`] around each driver backend
//! rather than code in the pool layer: every caller (cells, indexes,
//! leases, IDs, the catalog) already reaches databases through the trait,
//! so they all get the breaker without knowing of it, and the state machine
//! sees whole statements — a pool sees connections, and a connection that
//! opens fine on a host whose database then hangs is exactly the failure
//! this guards against. Transactions are wrapped too, so a statement that
//! times out inside one counts. The master's request pool and its
//! maintenance pool are two backends on one node: they share one breaker.
//! SQLite is not wrapped: it is a local file, its "unavailable" errors are
//! lock contention past the busy timeout, and failing fast would not save
//! any waiting.
//!
//! Why hand-written rather than the `failsafe` crate, the maintained Rust
//! circuit breaker: its half-open state lets every call through, so a node
//! that still hangs would hold every request for `timeout_ms` again at
//! each probe; it does not expose the consecutive failures or how often
//! the breaker opened (which `/metrics` reports); and its clock cannot be
//! given to the state machine, which here takes the time as an argument so
//! its tests need no waiting. The machine below is a few dozen lines.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{Backend, ColType, Dialect, Row, Sql, Tx};
use crate::error::{Error, Result};

/// The settings of every breaker (`storage.breaker`), validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Consecutive failures that open a closed breaker (at least 1).
    pub failures: u32,
    /// The first cool-down after the breaker opens.
    pub open: Duration,
    /// The longest cool-down, reached by doubling after failed probes.
    pub max_open: Duration,
}

/// Where a breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Statements go through.
    Closed,
    /// One probe statement is in flight (or is let through next, once the
    /// cool-down has passed); the others fail at once.
    HalfOpen,
    /// Statements fail at once until the cool-down has passed.
    Open,
}

impl BreakerState {
    /// `closed`, `half_open` or `open`.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::HalfOpen => "half_open",
            BreakerState::Open => "open",
        }
    }
}

/// A snapshot of one node's breaker, for monitoring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerStatus {
    /// `master`, or `replica<i>` for the `i`-th replica URL (from 0).
    pub node: String,
    pub state: BreakerState,
    /// Failures in a row since the last success.
    pub consecutive_failures: u32,
    /// How many times the breaker opened (a failed probe included) since
    /// the store was opened.
    pub opened: u64,
}

/// What the machine lets a statement do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Run it; its outcome counts while the breaker is closed.
    Pass,
    /// Run it as the half-open probe; its outcome decides the state.
    Probe,
    /// Fail it at once.
    Reject,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed,
    Open { until: Instant },
    HalfOpen,
}

/// The state machine, with time passed in.
#[derive(Debug)]
pub(crate) struct Machine {
    settings: Settings,
    state: State,
    consecutive: u32,
    opened: u64,
    /// The cool-down of the current or the next opening.
    cool_down: Duration,
}

impl Machine {
    pub(crate) fn new(settings: Settings) -> Machine {
        Machine {
            settings,
            state: State::Closed,
            consecutive: 0,
            opened: 0,
            cool_down: settings.open,
        }
    }

    pub(crate) fn admit(&mut self, now: Instant) -> Admission {
        match self.state {
            State::Closed => Admission::Pass,
            State::Open { until } if now >= until => {
                self.state = State::HalfOpen;
                Admission::Probe
            }
            State::Open { .. } | State::HalfOpen => Admission::Reject,
        }
    }

    /// Records the outcome of a statement admitted as `admission`:
    /// `failed` when it said the node is unavailable.
    pub(crate) fn record(&mut self, admission: Admission, failed: bool, now: Instant) {
        match (admission, self.state) {
            (Admission::Probe, State::HalfOpen) if failed => {
                self.consecutive = self.consecutive.saturating_add(1);
                self.cool_down = self.cool_down.saturating_mul(2).min(self.settings.max_open);
                self.open(now);
            }
            (Admission::Probe, State::HalfOpen) => self.close(),
            (Admission::Pass, State::Closed) if failed => {
                self.consecutive = self.consecutive.saturating_add(1);
                if self.consecutive >= self.settings.failures {
                    self.cool_down = self.settings.open;
                    self.open(now);
                }
            }
            (Admission::Pass, State::Closed) => self.consecutive = 0,
            // Statements that started before the breaker opened, finishing
            // now, tell nothing the probe will not.
            _ => {}
        }
    }

    /// A probe that ended without an outcome (its request was cancelled):
    /// the next statement probes instead, with the same cool-down.
    pub(crate) fn abandon(&mut self, now: Instant) {
        if self.state == State::HalfOpen {
            self.state = State::Open { until: now };
        }
    }

    fn open(&mut self, now: Instant) {
        self.state = State::Open {
            until: now + self.cool_down,
        };
        self.opened += 1;
    }

    fn close(&mut self) {
        self.state = State::Closed;
        self.consecutive = 0;
        self.cool_down = self.settings.open;
    }

    pub(crate) fn state(&self) -> BreakerState {
        match self.state {
            State::Closed => BreakerState::Closed,
            State::Open { .. } => BreakerState::Open,
            State::HalfOpen => BreakerState::HalfOpen,
        }
    }
}

/// One node's breaker, shared by the backends that reach the node.
#[derive(Debug)]
pub struct Breaker {
    cluster: String,
    node: String,
    machine: Mutex<Machine>,
}

impl Breaker {
    pub fn new(cluster: &str, node: &str, settings: Settings) -> Arc<Breaker> {
        Arc::new(Breaker {
            cluster: cluster.to_string(),
            node: node.to_string(),
            machine: Mutex::new(Machine::new(settings)),
        })
    }

    fn machine(&self) -> std::sync::MutexGuard<'_, Machine> {
        // The machine is consistent after every method, so a panic while
        // the lock was held leaves nothing half-done.
        self.machine.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks to run one statement.
    fn permit(&self) -> Result<Permit<'_>> {
        let admission = self.machine().admit(Instant::now());
        match admission {
            Admission::Reject => Err(Error::BreakerOpen {
                cluster: self.cluster.clone(),
                node: self.node.clone(),
            }),
            Admission::Probe => {
                tracing::info!(cluster = %self.cluster, node = %self.node, "circuit breaker half-open: probing the node");
                Ok(Permit {
                    breaker: self,
                    admission,
                    done: false,
                })
            }
            Admission::Pass => Ok(Permit {
                breaker: self,
                admission,
                done: false,
            }),
        }
    }

    /// Counts the outcome of a statement run inside a transaction: it
    /// reaches a node the breaker let through, so it only counts while the
    /// breaker is closed.
    fn observe<T>(&self, result: &Result<T>) {
        self.record(Admission::Pass, result);
    }

    fn record<T>(&self, admission: Admission, result: &Result<T>) {
        if matches!(result, Err(Error::PoolBusy { .. })) {
            // It waited for a connection of this process and never reached
            // the node: no outcome, as for a cancelled request.
            if admission == Admission::Probe {
                self.machine().abandon(Instant::now());
            }
            return;
        }
        let failed = matches!(result, Err(Error::Unavailable { .. }));
        let mut machine = self.machine();
        let before = machine.state();
        machine.record(admission, failed, Instant::now());
        let after = machine.state();
        drop(machine);
        if before != after {
            match after {
                BreakerState::Open => {
                    tracing::warn!(cluster = %self.cluster, node = %self.node, "circuit breaker open: statements to the node fail at once until a probe succeeds")
                }
                BreakerState::Closed => {
                    tracing::info!(cluster = %self.cluster, node = %self.node, "circuit breaker closed: the node answers again")
                }
                BreakerState::HalfOpen => {}
            }
        }
    }

    /// A snapshot for monitoring.
    pub fn status(&self) -> BreakerStatus {
        let machine = self.machine();
        BreakerStatus {
            node: self.node.clone(),
            state: machine.state(),
            consecutive_failures: machine.consecutive,
            opened: machine.opened,
        }
    }
}

/// Leave to run one statement; dropped without an outcome (the request was
/// cancelled), a probe lets the next statement probe.
struct Permit<'a> {
    breaker: &'a Breaker,
    admission: Admission,
    done: bool,
}

impl Permit<'_> {
    fn finish<T>(mut self, result: Result<T>) -> Result<T> {
        self.done = true;
        self.breaker.record(self.admission, &result);
        result
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if !self.done && self.admission == Admission::Probe {
            self.breaker.machine().abandon(Instant::now());
        }
    }
}

/// `backend` behind `breaker`.
pub fn guard(backend: Arc<dyn Backend>, breaker: Arc<Breaker>) -> Arc<dyn Backend> {
    Arc::new(Guarded {
        inner: backend,
        breaker,
    })
}

/// A backend whose statements pass its node's breaker.
struct Guarded {
    inner: Arc<dyn Backend>,
    breaker: Arc<Breaker>,
}

#[async_trait]
impl Backend for Guarded {
    fn dialect(&self) -> Dialect {
        self.inner.dialect()
    }

    fn cluster(&self) -> &str {
        self.inner.cluster()
    }

    async fn fetch(&self, sql: &Sql, cols: &[ColType]) -> Result<Vec<Row>> {
        let permit = self.breaker.permit()?;
        permit.finish(self.inner.fetch(sql, cols).await)
    }

    async fn execute(&self, sql: &Sql) -> Result<u64> {
        let permit = self.breaker.permit()?;
        permit.finish(self.inner.execute(sql).await)
    }

    async fn begin(&self) -> Result<Box<dyn Tx>> {
        let permit = self.breaker.permit()?;
        let tx = permit.finish(self.inner.begin().await)?;
        Ok(Box::new(GuardedTx {
            inner: tx,
            breaker: self.breaker.clone(),
        }))
    }

    async fn ping(&self) -> Result<()> {
        let permit = self.breaker.permit()?;
        permit.finish(self.inner.ping().await)
    }

    fn statements(&self) -> u64 {
        self.inner.statements()
    }

    async fn close(&self) {
        self.inner.close().await
    }

    fn breaker(&self) -> Option<BreakerStatus> {
        Some(self.breaker.status())
    }
}

/// A transaction on a guarded backend: its statements count towards the
/// breaker, but are never refused, since the transaction holds a
/// connection the breaker already let through.
struct GuardedTx {
    inner: Box<dyn Tx>,
    breaker: Arc<Breaker>,
}

#[async_trait]
impl Tx for GuardedTx {
    async fn fetch(&mut self, sql: &Sql, cols: &[ColType]) -> Result<Vec<Row>> {
        let result = self.inner.fetch(sql, cols).await;
        self.breaker.observe(&result);
        result
    }

    async fn execute(&mut self, sql: &Sql) -> Result<u64> {
        let result = self.inner.execute(sql).await;
        self.breaker.observe(&result);
        result
    }

    async fn commit(self: Box<Self>) -> Result<()> {
        let result = self.inner.commit().await;
        self.breaker.observe(&result);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            failures: 3,
            open: Duration::from_secs(1),
            max_open: Duration::from_secs(5),
        }
    }

    fn fail(machine: &mut Machine, now: Instant) {
        let admission = machine.admit(now);
        assert_eq!(admission, Admission::Pass);
        machine.record(admission, true, now);
    }

    #[test]
    fn consecutive_failures_open_the_breaker_and_a_success_resets_the_count() {
        let t0 = Instant::now();
        let mut m = Machine::new(settings());
        fail(&mut m, t0);
        fail(&mut m, t0);
        m.record(Admission::Pass, false, t0);
        assert_eq!(m.consecutive, 0);
        fail(&mut m, t0);
        fail(&mut m, t0);
        assert_eq!(m.state(), BreakerState::Closed);
        fail(&mut m, t0);
        assert_eq!(m.state(), BreakerState::Open);
        assert_eq!(m.opened, 1);
        for _ in 0..20 {
            assert_eq!(m.admit(t0 + Duration::from_millis(999)), Admission::Reject);
        }
    }

    #[test]
    fn after_the_cool_down_one_probe_passes_and_its_success_closes() {
        let t0 = Instant::now();
        let mut m = Machine::new(settings());
        (0..3).for_each(|_| fail(&mut m, t0));
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(m.admit(t1), Admission::Probe);
        assert_eq!(m.state(), BreakerState::HalfOpen);
        // Only one probe at a time.
        assert_eq!(m.admit(t1), Admission::Reject);
        // A late failure of a statement let through before the breaker
        // opened decides nothing.
        m.record(Admission::Pass, true, t1);
        assert_eq!(m.state(), BreakerState::HalfOpen);
        m.record(Admission::Probe, false, t1);
        assert_eq!(m.state(), BreakerState::Closed);
        assert_eq!(m.consecutive, 0);
        assert_eq!(m.admit(t1), Admission::Pass);
    }

    #[test]
    fn failed_probes_reopen_with_a_doubling_cool_down_up_to_the_maximum() {
        let t0 = Instant::now();
        let mut m = Machine::new(settings());
        (0..3).for_each(|_| fail(&mut m, t0));
        let mut now = t0 + Duration::from_secs(1);
        let mut expected = [2, 4, 5, 5].into_iter();
        for _ in 0..4 {
            assert_eq!(m.admit(now), Admission::Probe);
            m.record(Admission::Probe, true, now);
            assert_eq!(m.state(), BreakerState::Open);
            let cool_down = Duration::from_secs(expected.next().unwrap());
            assert_eq!(
                m.admit(now + cool_down - Duration::from_millis(1)),
                Admission::Reject
            );
            now += cool_down;
        }
        assert_eq!(m.opened, 5);
        assert_eq!(m.admit(now), Admission::Probe);
        m.record(Admission::Probe, false, now);
        // Closed again, the next opening starts from the first cool-down.
        (0..3).for_each(|_| fail(&mut m, now));
        assert_eq!(m.admit(now + Duration::from_millis(999)), Admission::Reject);
        assert_eq!(m.admit(now + Duration::from_secs(1)), Admission::Probe);
    }

    #[test]
    fn an_abandoned_probe_lets_the_next_statement_probe() {
        let t0 = Instant::now();
        let mut m = Machine::new(settings());
        (0..3).for_each(|_| fail(&mut m, t0));
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(m.admit(t1), Admission::Probe);
        m.abandon(t1);
        assert_eq!(m.state(), BreakerState::Open);
        assert_eq!(m.admit(t1), Admission::Probe);
        assert_eq!(m.opened, 1);
    }

    #[test]
    fn statement_errors_are_not_failures_of_the_node() {
        let breaker = Breaker::new("main", "master", settings());
        let conflict: Result<()> = Err(Error::Storage(sqlx::Error::RowNotFound));
        for _ in 0..10 {
            let permit = breaker.permit().unwrap();
            let _ = permit.finish(Err::<(), _>(Error::Storage(sqlx::Error::RowNotFound)));
            breaker.observe(&conflict);
        }
        assert_eq!(breaker.status().state, BreakerState::Closed);
        let unavailable = || -> Result<()> {
            Err(Error::Unavailable {
                cluster: "main".into(),
                source: crate::storage::no_answer(Duration::from_secs(5)),
            })
        };
        for _ in 0..3 {
            let permit = breaker.permit().unwrap();
            let _ = permit.finish(unavailable());
        }
        let status = breaker.status();
        assert_eq!(status.state, BreakerState::Open);
        assert_eq!(status.consecutive_failures, 3);
        assert_eq!(status.opened, 1);
        let refused = breaker.permit().err().expect("the breaker is open");
        assert_eq!(refused.code(), "STORAGE_UNAVAILABLE");
        assert!(!matches!(refused, Error::PoolBusy { .. }));
        assert!(refused.is_transient());
        assert_eq!(
            refused.client_message(),
            "storage cluster `main` is unavailable"
        );
    }

    // A burst that keeps callers waiting for a pooled connection says
    // nothing about the node: counted as failures, such waits opened a
    // healthy master's breaker and turned its writes `BUFFERED`.
    #[tokio::test]
    async fn waiting_for_a_pooled_connection_is_not_a_failure_of_the_node() {
        use crate::storage::pool::Pool;
        let dir = tempfile::tempdir().unwrap();
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(dir.path().join("pool.db"))
            .create_if_missing(true);
        let pool: Pool<sqlx::Sqlite> = Pool::new(options, 1, Duration::from_millis(50), None);
        let _held = pool.acquire().await.unwrap();
        let breaker = Breaker::new("main", "master", settings());
        for _ in 0..5 {
            let waited = pool
                .acquire()
                .await
                .err()
                .expect("the only connection is lent");
            let err = Error::from_sqlx("main", waited);
            assert!(matches!(err, Error::PoolBusy { .. }), "{err:?}");
            assert_eq!(err.code(), "STORAGE_UNAVAILABLE");
            assert!(err.is_transient());
            let permit = breaker.permit().unwrap();
            let _ = permit.finish(Err::<(), _>(err));
        }
        let status = breaker.status();
        assert_eq!(status.state, BreakerState::Closed);
        assert_eq!(status.consecutive_failures, 0);

        // A node that accepts the connection and never answers it: opening
        // one runs out of time, and that is the node's failure.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let options: sqlx::mysql::MySqlConnectOptions =
            format!("mysql://root@127.0.0.1:{port}/x").parse().unwrap();
        let silent: Pool<sqlx::MySql> = Pool::new(options, 1, Duration::from_millis(200), None);
        let err = Error::from_sqlx("main", silent.acquire().await.err().expect("no answer"));
        assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
        for _ in 0..3 {
            let permit = breaker.permit().unwrap();
            let _ = permit.finish(Err::<(), _>(Error::from_sqlx(
                "main",
                silent.acquire().await.err().expect("no answer"),
            )));
        }
        assert_eq!(breaker.status().state, BreakerState::Open);
        drop(listener);
    }
}
