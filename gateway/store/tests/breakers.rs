//! Circuit breakers in front of database servers: a master that accepts
//! connections but never answers costs the requests that find it failing
//! one statement timeout, and those after them nothing, until it answers
//! again.

#[path = "contract/harness.rs"]
#[allow(dead_code)]
mod harness;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellgate_store::cells::{NewCell, PutStatus};
use cellgate_store::storage::breaker::BreakerState;
use cellgate_store::{BreakerConfig, ClusterConfig, StorageConfig, Store, StoreOptions};
use serde_json::json;
use sqlx::Connection;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use uuid::Uuid;

/// A TCP proxy to a database that can stop answering: while it hangs it
/// accepts connections and reads what clients send but answers nothing,
/// as a hung host or a stopped server process would. It counts every
/// contact a client makes while it hangs (a connection accepted, bytes
/// received), so a test can tell whether a request reached the node.
struct Proxy {
    port: u16,
    forward: watch::Sender<bool>,
    touches: Arc<AtomicU64>,
}

impl Proxy {
    async fn start(target: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (forward, mode) = watch::channel(true);
        let touches = Arc::new(AtomicU64::new(0));
        let counter = touches.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(serve(client, target.clone(), mode.clone(), counter.clone()));
            }
        });
        Proxy {
            port,
            forward,
            touches,
        }
    }

    fn hang(&self) {
        self.forward.send_replace(false);
    }

    fn answer(&self) {
        self.forward.send_replace(true);
    }

    fn touches(&self) -> u64 {
        self.touches.load(Ordering::SeqCst)
    }
}

/// Waits until the proxy's mode is `forward`.
async fn until(mode: &mut watch::Receiver<bool>, forward: bool) {
    while *mode.borrow_and_update() != forward {
        if mode.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

async fn serve(
    mut client: TcpStream,
    target: String,
    mut mode: watch::Receiver<bool>,
    touches: Arc<AtomicU64>,
) {
    if !*mode.borrow_and_update() {
        touches.fetch_add(1, Ordering::SeqCst);
        return hold(client, mode, touches).await;
    }
    let Ok(mut db) = TcpStream::connect(&target).await else {
        return;
    };
    let mut hung = mode.clone();
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut db) => {}
        _ = until(&mut hung, false) => {
            drop(db);
            hold(client, mode, touches).await;
        }
    }
}

/// Keeps `client` open without answering, counting what it sends, and
/// closes it once the proxy forwards again.
async fn hold(mut client: TcpStream, mut mode: watch::Receiver<bool>, touches: Arc<AtomicU64>) {
    let mut buf = [0u8; 4096];
    loop {
        tokio::select! {
            read = client.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    touches.fetch_add(1, Ordering::SeqCst);
                }
            },
            _ = until(&mut mode, true) => return,
        }
    }
}

fn cell(row_key: Uuid, body: serde_json::Value) -> NewCell {
    NewCell {
        row_key,
        column: "NOTES".into(),
        ref_key: 1,
        body,
    }
}

/// Rows whose shards live on the third of three clusters.
fn rows_on_third_cluster(count: usize) -> Vec<Uuid> {
    std::iter::repeat_with(Uuid::new_v4)
        .filter(|r| {
            let shard = cellgate_store::shards::row_shard(r, harness::TRIP_SHARDS);
            u64::from(shard) * 3 >= 2 * u64::from(harness::TRIP_SHARDS)
        })
        .take(count)
        .collect()
}

/// Two SQLite clusters, and a MySQL master behind `port` holding the
/// third of the shards.
fn topology(dir: &Path, port: u16, database: &str, breaker: BreakerConfig) -> StorageConfig {
    let sqlite = |name: &str| ClusterConfig {
        name: name.into(),
        master: format!("sqlite://{}", dir.join(format!("{name}.db")).display()),
        replicas: vec![],
    };
    StorageConfig {
        buffer_count: 1,
        clusters: vec![
            sqlite("one"),
            sqlite("two"),
            ClusterConfig {
                name: "far".into(),
                master: format!("mysql://root@127.0.0.1:{port}/{database}"),
                replicas: vec![],
            },
        ],
        timeout_ms: TIMEOUT_MS,
        breaker,
        ..StorageConfig::default()
    }
}

/// The statement timeout: whatever waits for the hung node waits this long.
const TIMEOUT_MS: u64 = 5_000;

#[tokio::test]
async fn an_open_breaker_fails_requests_at_once_and_closes_when_the_node_answers() {
    let Ok(base) = std::env::var("CELLGATE_TEST_MYSQL_URL") else {
        eprintln!("skipped: CELLGATE_TEST_MYSQL_URL is not set");
        return;
    };
    let database = format!("cg_breaker_{}", &Uuid::new_v4().simple().to_string()[..8]);
    let mut admin = sqlx::MySqlConnection::connect(&base).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE {database}"))
        .execute(&mut admin)
        .await
        .unwrap();
    let (server, _) = base.rsplit_once('/').unwrap();
    let target = server.rsplit_once('@').unwrap().1.to_string();
    let proxy = Proxy::start(target).await;

    let dir = tempfile::tempdir().unwrap();
    // The cool-down outlasts the requests the test sends while the breaker
    // is open, so none of them is the half-open probe.
    let breaker = BreakerConfig {
        enabled: true,
        failures: 3,
        open_ms: 8_000,
        max_open_ms: 8_000,
    };
    let mut options = StoreOptions::new(topology(dir.path(), proxy.port, &database, breaker));
    options.maintain_indexes = false;
    let store = Arc::new(
        Store::open(harness::definitions(), options)
            .await
            .expect("the store opens while the node answers"),
    );
    let rows = rows_on_third_cluster(11);
    let (first, later) = rows.split_first().unwrap();
    assert_eq!(
        store
            .put_cell("trips", cell(*first, json!({"n": 0})))
            .await
            .unwrap(),
        PutStatus::Written
    );

    // The node stops answering: the first requests wait the timeout out.
    proxy.hang();
    let waited = futures::future::join_all((0..3).map(|_| {
        let store = store.clone();
        let row = *first;
        async move { store.get_cell_latest("trips", row, "NOTES").await }
    }))
    .await;
    for outcome in &waited {
        let err = outcome.as_ref().expect_err("the node does not answer");
        assert_eq!(err.code(), "STORAGE_UNAVAILABLE");
    }

    // Now requests fail, and writes with their buffer copies are
    // buffered, without reaching the node. Background statements (buffer
    // counts, sweeps, the masters' identities) admitted in the instant
    // before the breaker opened may still be on their way: they are let
    // arrive before the count is taken.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let touches = proxy.touches();
    let started = Instant::now();
    let reads = futures::future::join_all((0..10).map(|_| {
        let store = store.clone();
        let row = *first;
        async move { store.get_cell_latest("trips", row, "NOTES").await }
    }));
    let writes = futures::future::join_all(later.iter().enumerate().map(|(i, row)| {
        let store = store.clone();
        let row = *row;
        async move {
            store
                .put_cell("trips", cell(row, json!({"n": i + 1})))
                .await
        }
    }));
    let (reads, writes) = tokio::join!(reads, writes);
    let elapsed = started.elapsed();
    assert_eq!(
        proxy.touches(),
        touches,
        "no request reached the node while its breaker was open"
    );
    for read in reads {
        let err = read.expect_err("the node is failing");
        assert_eq!(err.code(), "STORAGE_UNAVAILABLE");
        assert!(err.is_transient());
        assert_eq!(err.client_message(), "storage cluster `far` is unavailable");
    }
    for write in writes {
        assert_eq!(write.unwrap(), PutStatus::Buffered);
    }
    // An outcome bound, not a speed claim: any request that waited for the
    // node would alone have taken the whole timeout.
    assert!(
        elapsed < Duration::from_millis(TIMEOUT_MS),
        "20 requests took {elapsed:?}, so some waited for the node"
    );
    let status = store.metrics().clusters[2].breakers.clone();
    assert_eq!(status.len(), 1, "one breaker for the master's two pools");
    assert_eq!(status[0].node, "master");
    assert_eq!(status[0].state, BreakerState::Open);
    assert!(status[0].consecutive_failures >= 3, "{status:?}");
    assert_eq!(status[0].opened, 1);
    assert!(
        store.metrics().clusters[..2]
            .iter()
            .all(|c| c.breakers.is_empty()),
        "SQLite files have no breaker"
    );

    // The node answers again: after the cool-down a probe (a request or
    // the buffer replay's poll) closes the breaker, and the buffered
    // writes are replayed.
    proxy.answer();
    let mut closed = false;
    for _ in 0..240 {
        let status = &store.metrics().clusters[2].breakers[0];
        if status.state == BreakerState::Closed {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(closed, "the breaker closes once the node answers");
    let mut replayed = 0;
    for _ in 0..240 {
        replayed = 0;
        for row in later {
            if let Ok(Some(_)) = store.get_cell_latest("trips", *row, "NOTES").await {
                replayed += 1;
            }
        }
        if replayed == later.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(replayed, later.len(), "every buffered write was replayed");
    let fresh = rows_on_third_cluster(1)[0];
    assert_eq!(
        store
            .put_cell("trips", cell(fresh, json!({"n": 99})))
            .await
            .unwrap(),
        PutStatus::Written
    );
    let status = &store.metrics().clusters[2].breakers[0];
    assert_eq!(status.state, BreakerState::Closed);
    assert_eq!(status.consecutive_failures, 0);
    assert!(status.opened >= 1);

    store.shutdown(Duration::from_secs(5)).await;
    let _ = sqlx::query(&format!("DROP DATABASE {database}"))
        .execute(&mut admin)
        .await;
}

#[tokio::test]
async fn breaker_settings_that_cannot_work_are_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    for (breaker, message) in [
        (
            BreakerConfig {
                failures: 0,
                ..BreakerConfig::default()
            },
            "storage.breaker.failures must be at least 1",
        ),
        (
            BreakerConfig {
                open_ms: 0,
                ..BreakerConfig::default()
            },
            "storage.breaker.open_ms must be at least 1",
        ),
        (
            BreakerConfig {
                open_ms: 2_000,
                max_open_ms: 1_000,
                ..BreakerConfig::default()
            },
            "storage.breaker.max_open_ms (1000) must be at least open_ms (2000)",
        ),
    ] {
        let storage = StorageConfig {
            breaker,
            ..StorageConfig::embedded(dir.path())
        };
        let err = Store::open(harness::definitions(), StoreOptions::new(storage))
            .await
            .err()
            .expect("refused");
        assert_eq!(err.code(), "CONFIG");
        assert!(err.to_string().contains(message), "{err}");
    }
}
