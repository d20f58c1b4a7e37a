//! SQLite, the embedded default store.
//!
//! SQLite allows one writer per file, so writes go through a pool of exactly
//! one connection (transactions queue in-process instead of failing with
//! `SQLITE_BUSY`), while reads use a separate pool that WAL lets run beside
//! the writer. `synchronous = NORMAL` in WAL mode keeps every committed
//! transaction across a process crash; only an operating-system crash can
//! lose the last commits. UUIDs are 16-byte BLOBs and datetimes integer
//! microseconds since the Unix epoch, so both sort correctly.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{Row as _, Sqlite};

use super::pool::Pool;
use super::value::uuid_from_bytes;
use super::{sqlx_backend, ColType, ConnectOptions, Dialect, Value};

// `BEGIN IMMEDIATE` takes the write lock at the start: a transaction that
// reads and then writes can otherwise fail with SQLITE_BUSY_SNAPSHOT when
// another process wrote in between, and the busy timeout cannot help it.
sqlx_backend!(
    SqliteBackend,
    SqliteTx,
    Sqlite,
    Dialect::Sqlite,
    Some("BEGIN IMMEDIATE")
);

impl SqliteBackend {
    /// Index maintenance shares the one writer with requests. Its write
    /// transactions go ahead of the requests' queued ones: otherwise at a
    /// write rate the writer cannot sustain for both, every pass waits
    /// behind the whole queue, the backlog of unapplied cells grows
    /// without bound, and so does index lag. Ahead of the queue, the
    /// writes slow down instead (back-pressure), and the rate the store
    /// sustains is one its indexes keep up with.
    fn lane(&self) -> Option<std::sync::Arc<dyn super::Backend>> {
        Some(std::sync::Arc::new(SqliteBackend {
            writer: self.writer.clone(),
            reader: self.reader.clone(),
            cluster: self.cluster.clone(),
            statement_timeout: None,
            statements: Default::default(),
            // Closing it closes nothing the store's own backend does not.
            stop: std::sync::Mutex::new(None),
            first: true,
            background: self.background,
        }))
    }

    /// Before the writer closes: the WAL copied back, so the next process
    /// neither replays it nor waits for this one's closing checkpoint.
    /// Not for background connections: the foreground's backend, still
    /// open, checkpoints when it closes.
    async fn closing(writer: &Pool<Sqlite>, background: bool) {
        if !background {
            truncate_on_close(writer).await;
        }
    }

    pub async fn connect(url: &str, options: &ConnectOptions) -> crate::Result<Self> {
        let connect = SqliteConnectOptions::from_str(url)
            .map_err(|e| crate::Error::Config(format!("invalid sqlite url `{url}`: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(BUSY_TIMEOUT)
            .statement_cache_capacity(1024)
            // Statement journals (the rollback of one multi-row statement
            // inside a transaction, written for every page an upsert
            // changes) and temporary B-trees stay in memory instead of
            // going to temporary files page by page.
            .pragma("temp_store", "memory")
            // Checkpoints run in the background (see `checkpoint_in_background`),
            // not inside whichever commit crosses the WAL size threshold.
            .pragma("wal_autocheckpoint", "0")
            // The WAL file is cut back to this size when it starts over.
            .pragma("journal_size_limit", (WAL_RESET_PAGES * 4096).to_string());
        let connect = if options.background {
            sqlx::ConnectOptions::disable_statement_logging(connect)
        } else {
            connect
        };
        if let Some(parent) = connect.get_filename().parent() {
            if !parent.as_os_str().is_empty() {
                std::fs::create_dir_all(parent).map_err(|e| {
                    crate::Error::Config(format!(
                        "cannot create data directory `{}`: {e}",
                        parent.display()
                    ))
                })?;
            }
        }
        let err = |e| crate::Error::from_sqlx(&options.cluster, e);
        // The writer's page cache holds the pages a write transaction
        // touches: the cell table's and every index table's B-trees at
        // random keys. At SQLite's default (2 MiB) a batch of 50 rows in a
        // store of 100k+ cells spills dirty pages mid-transaction and
        // reads most pages back from the OS. Both caches fill only as
        // pages are read.
        let writer = Pool::new(
            connect
                .clone()
                .pragma("cache_size", format!("-{}", WRITER_CACHE_KIB)),
            1,
            options.acquire_timeout.max(Duration::from_secs(30)),
            None,
        )
        .with_lane();
        let reader = Pool::new(
            connect.pragma("cache_size", format!("-{}", READER_CACHE_KIB)),
            options.max_connections.clamp(1, 8),
            options.acquire_timeout,
            None,
        );
        // Opening the file now reports a bad path or a locked database at
        // start-up rather than at the first request.
        drop(writer.acquire().await.map_err(err)?);
        drop(reader.acquire().await.map_err(err)?);
        let (stop, stopped) = tokio::sync::oneshot::channel();
        // Background connections leave the checkpoints to the foreground's
        // backend of the same file: one checkpointer is enough, and it
        // copies back what both wrote.
        if !options.background {
            checkpoint_in_background(&writer, &reader, stopped);
        }
        Ok(SqliteBackend {
            writer,
            reader,
            cluster: options.cluster.clone(),
            // A local file: lock waits are bounded by the busy timeout,
            // and writes queue for the one writer connection.
            statement_timeout: None,
            statements: Default::default(),
            stop: std::sync::Mutex::new(Some(stop)),
            first: false,
            background: options.background,
        })
    }
}

/// Page cache of the writer connection, in KiB.
const WRITER_CACHE_KIB: u32 = 64 * 1024;
/// Page cache of each reader connection, in KiB.
const READER_CACHE_KIB: u32 = 8 * 1024;

/// Longest wait for a lock another process holds.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// WAL pages (4 KiB each, 64 MiB) past which the WAL is made to start
/// over. Passive checkpoints copy frames back but, under steady writes,
/// never catch up with the writer, so the WAL would never be reused and
/// would grow for as long as the process runs. Also the size the WAL file
/// is cut back to when it starts over (`journal_size_limit`).
const WAL_RESET_PAGES: i64 = 16_384;

/// Copies the WAL back into the database file every few hundred
/// milliseconds with a passive checkpoint, which never blocks writers.
/// Left to SQLite, the commit that crosses the WAL threshold would do it
/// inline and stall every writer behind it.
///
/// Once the WAL has grown past [`WAL_RESET_PAGES`], a second passive
/// checkpoint copies what the writer added during the first, and a third
/// runs on the writer connection: no frame can be added while it runs, so
/// it copies the last few and leaves the WAL fully copied back, and the
/// next write transaction starts the WAL over from its beginning (cutting
/// the file back to the limit). Only that third one holds up writers, for
/// the frames of a few milliseconds and one `fsync` (30–40 ms at 3,000
/// cells/s on a virtual disk). A `TRUNCATE` checkpoint did the same but
/// also waited for every reader to leave the WAL and truncated the file:
/// 40–200 ms with the writer held, about once a second at that rate, and
/// the main cause of the write and index-lag tail. Stops when the backend
/// is dropped.
fn checkpoint_in_background(
    writer: &Pool<Sqlite>,
    reader: &Pool<Sqlite>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let writer = writer.clone();
    let reader = reader.clone();
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(Duration::from_millis(250));
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut stopped => return,
                _ = interval.tick() => {}
            }
            let outcome = async {
                let (_, pages, _) = checkpoint_with(&reader, passive()).await?;
                if pages >= WAL_RESET_PAGES {
                    checkpoint_with(&reader, passive()).await?;
                    checkpoint_with(&writer, passive()).await?;
                }
                Ok::<_, sqlx::Error>(())
            }
            .await;
            if let Err(err) = outcome {
                tracing::debug!(error = %err, "background WAL checkpoint failed");
            }
        }
    });
}

/// A passive checkpoint: copies back what no reader still needs, without
/// waiting for anyone; answers (busy, WAL frames, frames copied back).
fn passive<'q>(
) -> sqlx::query::QueryAs<'q, Sqlite, (i64, i64, i64), sqlx::sqlite::SqliteArguments<'q>> {
    sqlx::query_as("PRAGMA wal_checkpoint(PASSIVE)")
}

/// Runs a checkpoint on a connection of `pool`.
async fn checkpoint_with<'q>(
    pool: &Pool<Sqlite>,
    checkpoint: sqlx::query::QueryAs<
        'q,
        Sqlite,
        (i64, i64, i64),
        sqlx::sqlite::SqliteArguments<'q>,
    >,
) -> Result<(i64, i64, i64), sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let row = checkpoint.fetch_one(conn.start()).await;
    conn.settled();
    row
}

/// Copies the WAL back and truncates it on the last open connection when
/// the backend closes. A connection closing beside it can hold the
/// checkpoint lock for a moment (the checkpoint then reports busy at
/// once), so it is tried again for up to a second.
async fn truncate_on_close(writer: &Pool<Sqlite>) {
    for _ in 0..20 {
        let checkpoint = sqlx::query_as::<_, (i64, i64, i64)>("PRAGMA wal_checkpoint(TRUNCATE)");
        match checkpoint_with(writer, checkpoint).await {
            Ok((0, _, _)) => return,
            Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(err) => {
                tracing::debug!(error = %err, "closing WAL checkpoint failed");
                return;
            }
        }
    }
    tracing::debug!("closing WAL checkpoint stayed busy; the next open replays the WAL");
}

fn bind<'q>(
    query: sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
    value: &'q Value,
) -> sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>> {
    match value {
        Value::Null(_) => query.bind(None::<i64>),
        Value::Bool(v) => query.bind(*v),
        Value::Int(v) => query.bind(*v),
        Value::Float(v) => query.bind(*v),
        Value::Text(v) => query.bind(v.as_str()),
        Value::Bytes(v) => query.bind(v.as_slice()),
        Value::Uuid(v) => query.bind(v.as_bytes().as_slice()),
        Value::DateTime(v) => query.bind(v.timestamp_micros()),
        // Arrays are built for PostgreSQL only (`Sql::in_list`, `Sql::rows`).
        Value::Array(..) => {
            debug_assert!(
                false,
                "an array parameter in a statement for another backend"
            );
            query.bind(None::<i64>)
        }
    }
}

fn decode(row: &sqlx::sqlite::SqliteRow, i: usize, ty: ColType) -> Result<Value, sqlx::Error> {
    let null = Value::Null(ty);
    Ok(match ty {
        ColType::Bool => row.try_get::<Option<bool>, _>(i)?.map_or(null, Value::Bool),
        ColType::Int => row.try_get::<Option<i64>, _>(i)?.map_or(null, Value::Int),
        ColType::Float => row.try_get::<Option<f64>, _>(i)?.map_or(null, Value::Float),
        ColType::Text => row
            .try_get::<Option<String>, _>(i)?
            .map_or(null, Value::Text),
        ColType::Bytes => row
            .try_get::<Option<Vec<u8>>, _>(i)?
            .map_or(null, Value::Bytes),
        ColType::Uuid => uuid_from_bytes(row.try_get(i)?)?,
        ColType::DateTime => match row.try_get::<Option<i64>, _>(i)? {
            None => null,
            Some(micros) => Value::DateTime(
                chrono::DateTime::from_timestamp_micros(micros)
                    .ok_or_else(|| sqlx::Error::Decode("datetime out of range".into()))?,
            ),
        },
    })
}
