//! `cellgate-bench subscriptions`: what idle GraphQL subscriptions cost a
//! gateway, and how fast a commit reaches every subscriber.
//!
//! Starts `cellgate serve` (default configuration, with the subscription
//! limits raised so that `--subscriptions` fit: `--per-connection` per
//! connection, all of them for the one client) on an empty store, then:
//!
//! 1. **Idle, no subscription**: for `--idle` seconds, the server's CPU
//!    (`utime + stime` of `/proc/<pid>/stat`), its RSS (`VmRSS` of
//!    `/proc/<pid>/status`) and the SQL statements it sent
//!    (`cellgate_storage_statements` and `_maintenance_statements` of
//!    `/metrics`).
//! 2. **Idle, `--subscriptions` subscriptions**: opens them over
//!    `graphql-transport-ws` connections to `/graphql/ws`
//!    (`tripsCells(columns: [BASE])`, selecting the cell and, with
//!    `--cursor`, the resume cursor), waits until the server counts them
//!    all (`cellgate_subscription_followers`), and measures the same for
//!    `--idle` seconds.
//! 3. **Delivery**: writes `--rate` BASE cells per second for `--duration`
//!    seconds through `tripsPutCells` (up to 10 per write) and records, for
//!    a sample of `--sample` subscribers, the time from each cell's
//!    `createdAt` (taken just before its commit) to its arrival; checks that
//!    every subscriber got every cell.
//!
//! With `--two-gateways` the writes go through a second gateway on the
//! same store, so the delay is that of the wake-up across gateways. With
//! `--webhook` a webhook trigger of BASE, declared on every gateway, posts
//! to a receiver in this process, which records the delay per delivering
//! gateway. `cellgate-bench push` is both at once, at 400 cells/s.
//!
//! Prints a table; exits 1 if a subscriber missed a cell or got an error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use futures::{SinkExt as _, StreamExt as _};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;

use crate::database::Database;
use crate::dataset::{cell_input, Dataset, WRITE};
use crate::http::STATEMENTS;
use crate::server::Server;
use crate::{load_definitions, DEFAULT_DATASTORES};

/// The server's count of its subscriptions' followers.
const FOLLOWERS: &str = "cellgate_subscription_followers";
/// Statements through the maintenance pools (server backends).
const MAINTENANCE_STATEMENTS: &str = "cellgate_storage_maintenance_statements_total";
/// Log reads of the shared tails.
const TAIL_READS: &str = "cellgate_subscription_tail_reads_total";

#[derive(Debug, Args)]
pub struct SubscriptionsBenchArgs {
    /// An empty database. [default: an SQLite store in a temporary
    /// directory]
    #[arg(long, value_name = "URL", env = "CELLGATE_BENCH_DATABASE")]
    pub database: Option<String>,
    /// Directory of the datastore and index definitions.
    #[arg(long, env = "CELLGATE_DATASTORES", default_value = DEFAULT_DATASTORES)]
    pub datastores: PathBuf,
    /// Subscriptions to open.
    #[arg(long, default_value_t = 10_000)]
    pub subscriptions: usize,
    /// Subscriptions per WebSocket connection (the server's
    /// `max_subscriptions_per_connection` is set to it).
    #[arg(long, default_value_t = 100)]
    pub per_connection: usize,
    /// Seconds of each idle measurement.
    #[arg(long, default_value_t = 20)]
    pub idle: u64,
    /// Cells written per second during the delivery measurement (each
    /// reaches every subscriber).
    #[arg(long, default_value_t = 5)]
    pub rate: u64,
    /// Seconds of writing.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// Subscribers whose delivery lag is recorded.
    #[arg(long, default_value_t = 100)]
    pub sample: usize,
    /// Select the resume `cursor` in every event too.
    #[arg(long)]
    pub cursor: bool,
    /// Write through a second gateway on the same store, so that every
    /// cell reaches the subscribers from another gateway (the wake-up
    /// across gateways: `LISTEN/NOTIFY` on PostgreSQL, the poll of the
    /// shard counters elsewhere).
    #[arg(long)]
    pub two_gateways: bool,
    /// Start the gateways with `storage.notify: false`: on PostgreSQL,
    /// other gateways' writes are then found by the poll of the shard
    /// counters, as on the other backends.
    #[arg(long)]
    pub no_notify: bool,
    /// Also declare a webhook trigger of the BASE column on every gateway,
    /// delivering to a receiver in this process, and report the delay from
    /// commit to POST per delivering gateway (with `--two-gateways`, the
    /// writer delivers the shards whose leases it holds, the other gateway
    /// the rest, woken across gateways).
    #[arg(long)]
    pub webhook: bool,
}

/// `cellgate-bench push`: how fast a write through one gateway reaches the
/// subscriptions and the webhook of another.
#[derive(Debug, Args)]
pub struct PushBenchArgs {
    /// An empty database. [default: an SQLite store in a temporary
    /// directory]
    #[arg(long, value_name = "URL", env = "CELLGATE_BENCH_DATABASE")]
    pub database: Option<String>,
    /// Directory of the datastore and index definitions.
    #[arg(long, env = "CELLGATE_DATASTORES", default_value = DEFAULT_DATASTORES)]
    pub datastores: PathBuf,
    /// Subscriptions on the follower gateway.
    #[arg(long, default_value_t = 100)]
    pub subscriptions: usize,
    /// Cells written per second through the writer gateway.
    #[arg(long, default_value_t = 400)]
    pub rate: u64,
    /// Seconds of writing.
    #[arg(long, default_value_t = 20)]
    pub duration: u64,
    /// Start the gateways with `storage.notify: false`: on PostgreSQL they
    /// then poll the shard counters as on the other backends.
    #[arg(long)]
    pub no_notify: bool,
}

impl From<PushBenchArgs> for SubscriptionsBenchArgs {
    fn from(args: PushBenchArgs) -> SubscriptionsBenchArgs {
        SubscriptionsBenchArgs {
            database: args.database,
            datastores: args.datastores,
            subscriptions: args.subscriptions,
            per_connection: 100,
            idle: 2,
            rate: args.rate,
            duration: args.duration,
            sample: args.subscriptions,
            cursor: false,
            two_gateways: true,
            no_notify: args.no_notify,
            webhook: true,
        }
    }
}

/// What one idle window cost the server.
struct Idle {
    cpu_percent: f64,
    rss_mib: f64,
    statements: f64,
    tail_reads: f64,
}

/// What the subscribers saw.
struct Seen {
    /// Events per subscription.
    events: Vec<AtomicU64>,
    /// Commit-to-arrival delays in microseconds, of the sampled ones.
    lag_us: Mutex<hdrhistogram::Histogram<u64>>,
    /// Every 1 in `every` subscriptions is sampled.
    every: usize,
    errors: Mutex<Vec<String>>,
}

pub async fn run(args: SubscriptionsBenchArgs) -> anyhow::Result<ExitCode> {
    let Some(defs) = load_definitions(&args.datastores, "--datastores")? else {
        return Ok(ExitCode::FAILURE);
    };
    crate::dataset::check_definitions(&defs, false)?;
    anyhow::ensure!(args.subscriptions > 0, "--subscriptions must be at least 1");
    anyhow::ensure!(
        args.per_connection > 0,
        "--per-connection must be at least 1"
    );
    let dir = crate::server::work_dir()?;
    let database = match &args.database {
        Some(url) => Database::server(url)?,
        None => Database::embedded(&dir.path().join("data")),
    };
    database.ensure_empty().await?;
    let connections = args.subscriptions.div_ceil(args.per_connection);
    println!(
        "cellgate-bench subscriptions: database {}; {} subscriptions over {connections} connections; \
         idle {} s; {} cells/s for {} s; cursor {}",
        cellgate_store::storage::redact_url(&database.url),
        args.subscriptions,
        args.idle,
        args.rate,
        args.duration,
        if args.cursor { "selected" } else { "not selected" },
    );
    let mut limits = format!(
        "  max_subscriptions_per_connection: {}\n  max_subscriptions_per_client: {}\n",
        args.per_connection, args.subscriptions
    );
    if args.no_notify {
        limits.push_str("storage:\n  notify: false\n");
    }
    let receiver = if args.webhook {
        Some(crate::receiver::start().await?)
    } else {
        None
    };
    // Each gateway's definitions, with the webhook to its own path.
    let definitions = |gateway: &str| -> anyhow::Result<PathBuf> {
        match &receiver {
            Some((url, _)) => with_webhook(
                &args.datastores,
                &dir.path().join(format!("definitions-{gateway}")),
                &format!("{url}/{gateway}"),
            ),
            None => Ok(args.datastores.clone()),
        }
    };
    let server = Server::start_with_limits(
        &database,
        &limits,
        &definitions("follower")?,
        dir.path(),
        16,
        Duration::from_secs(30),
    )
    .await?;
    let writer = if args.two_gateways {
        let second = dir.path().join("writer");
        std::fs::create_dir_all(&second)?;
        Some(
            Server::start_with_limits(
                &database,
                &limits,
                &definitions("writer")?,
                &second,
                16,
                Duration::from_secs(30),
            )
            .await?,
        )
    } else {
        None
    };
    let result = measure(
        &args,
        &server,
        writer.as_ref().unwrap_or(&server),
        connections,
        receiver.as_ref().map(|(_, received)| received.as_ref()),
    )
    .await;
    if let Some(writer) = writer {
        writer.stop().await?;
    }
    server.stop().await?;
    result
}

async fn measure(
    args: &SubscriptionsBenchArgs,
    server: &Server,
    writer: &Server,
    connections: usize,
    received: Option<&crate::receiver::Received>,
) -> anyhow::Result<ExitCode> {
    let pid = server.pid().context("the server has no process id")?;
    let idle_window = Duration::from_secs(args.idle);
    // Let start-up work (index maintenance taking its leases) settle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let bare = idle(server, pid, idle_window).await?;

    let seen = Arc::new(Seen {
        events: (0..args.subscriptions).map(|_| AtomicU64::new(0)).collect(),
        lag_us: Mutex::new(hdrhistogram::Histogram::new(3)?),
        every: (args.subscriptions / args.sample.max(1)).max(1),
        errors: Mutex::new(Vec::new()),
    });
    let query = if args.cursor {
        "subscription BenchFollow { tripsCells(columns: [BASE]) { cursor cell { rowKey addedId createdAt } } }"
    } else {
        "subscription BenchFollow { tripsCells(columns: [BASE]) { cell { rowKey addedId createdAt } } }"
    };
    let ws_url = format!("{}/graphql/ws", server.gateway.base).replacen("http", "ws", 1);
    let opened = Instant::now();
    let mut clients = Vec::new();
    for c in 0..connections {
        let first = c * args.per_connection;
        let count = args.per_connection.min(args.subscriptions - first);
        let socket = connect(&ws_url).await?;
        clients.push(tokio::spawn(follow(
            socket,
            query,
            first,
            count,
            seen.clone(),
        )));
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let followers = server
            .gateway
            .metrics()
            .await?
            .sum(FOLLOWERS)
            .unwrap_or(0.0);
        if followers as usize >= args.subscriptions {
            break;
        }
        if let Some(error) = seen.errors.lock().expect("errors").first() {
            anyhow::bail!("a subscription failed: {error}");
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the server counts {followers} of {} subscriptions after 120 s",
            args.subscriptions
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let open_seconds = opened.elapsed().as_secs_f64();
    let subscribed = idle(server, pid, idle_window).await?;

    // Delivery.
    let data = Dataset::new(1, 1, false, 31, 10);
    // Ten writes a second (fewer cells per write at low rates), at most 10
    // cells per write.
    let per_write = args.rate.div_ceil(10).clamp(1, 10);
    let writes = (args.rate * args.duration).div_ceil(per_write);
    let every = Duration::from_secs_f64(per_write as f64 / args.rate.max(1) as f64);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sent = 0u64;
    let mut pending = Vec::new();
    for _ in 0..writes {
        tick.tick().await;
        let cells: Vec<Value> = data
            .write_cells()
            .iter()
            .take(per_write as usize)
            .map(cell_input)
            .collect();
        sent += cells.len() as u64;
        let gateway = writer.gateway.clone();
        pending.push(tokio::spawn(async move {
            gateway.graphql(WRITE, json!({ "cells": cells })).await
        }));
    }
    for write in pending {
        write
            .await?
            .map_err(|e| anyhow::anyhow!("a write failed: {e}"))?;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let complete = |seen: &Seen| {
        seen.events
            .iter()
            .all(|n| n.load(Ordering::Relaxed) >= sent)
    };
    while !complete(&seen) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let webhook_short = match received {
        Some(received) => {
            while received.distinct() < sent as usize && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            sent as usize - received.distinct().min(sent as usize)
        }
        None => 0,
    };
    let short = seen
        .events
        .iter()
        .filter(|n| n.load(Ordering::Relaxed) < sent)
        .count();
    let extra = seen
        .events
        .iter()
        .filter(|n| n.load(Ordering::Relaxed) > sent)
        .count();
    for client in &clients {
        client.abort();
    }
    let histogram = seen.lag_us.lock().expect("lag").clone();
    let ms = |q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;

    println!();
    println!("| subscriptions | server CPU | RSS | SQL statements | tail reads |");
    println!("|---:|---:|---:|---:|---:|");
    for (n, figures) in [(0, &bare), (args.subscriptions, &subscribed)] {
        println!(
            "| {n} idle for {} s | {:.1} % | {:.0} MiB | {:.0} | {:.0} |",
            args.idle, figures.cpu_percent, figures.rss_mib, figures.statements, figures.tail_reads
        );
    }
    println!();
    println!(
        "opened {} subscriptions in {open_seconds:.1} s; {sent} cells written at {} cells/s{}: \
         {} of {} subscribers got every cell ({extra} got some twice); commit to subscriber \
         ({} sampled) p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        args.subscriptions,
        args.rate,
        if args.two_gateways {
            " through another gateway"
        } else {
            ""
        },
        args.subscriptions - short,
        args.subscriptions,
        histogram.len(),
        ms(0.5),
        ms(0.99),
        histogram.max() as f64 / 1000.0
    );
    if let Some(received) = received {
        println!(
            "webhook: {} of {sent} cells received ({} again); commit to POST:",
            sent as usize - webhook_short,
            received.repeated()
        );
        println!();
        println!("| delivered by | cells | p50 | p99 | max |");
        println!("|---|---:|---:|---:|---:|");
        for (gateway, lag) in received.lags() {
            let ms = |q: f64| lag.value_at_quantile(q) as f64 / 1000.0;
            println!(
                "| {gateway} | {} | {:.1} ms | {:.1} ms | {:.1} ms |",
                lag.len(),
                ms(0.5),
                ms(0.99),
                lag.max() as f64 / 1000.0
            );
        }
    }
    let errors = seen.errors.lock().expect("errors");
    for error in errors.iter().take(5) {
        eprintln!("subscription error: {error}");
    }
    Ok(if short > 0 || webhook_short > 0 || !errors.is_empty() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// A copy of the definitions in `from`, at `to`, with a webhook trigger
/// of every BASE cell posting to `url`.
fn with_webhook(
    from: &std::path::Path,
    to: &std::path::Path,
    url: &str,
) -> anyhow::Result<PathBuf> {
    copy_dir(from, to)?;
    let triggers = to.join(crate::dataset::DATASTORE).join("triggers");
    std::fs::create_dir_all(&triggers)?;
    std::fs::write(
        triggers.join("bench_push.yaml"),
        format!(
            "name: bench_push\ndatastore: {}\ncolumns: [BASE]\nwebhook:\n  url: {url}\n",
            crate::dataset::DATASTORE
        ),
    )?;
    Ok(to.to_path_buf())
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in
        std::fs::read_dir(from).with_context(|| format!("cannot read `{}`", from.display()))?
    {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// The server's CPU, RSS, statements and tail reads over `window`.
async fn idle(server: &Server, pid: u32, window: Duration) -> anyhow::Result<Idle> {
    let ticks = clock_ticks().await;
    let metrics = server.gateway.metrics().await?;
    let (cpu, started) = (cpu_ticks(pid)?, Instant::now());
    tokio::time::sleep(window).await;
    let cpu_after = cpu_ticks(pid)?;
    let seconds = started.elapsed().as_secs_f64();
    let after = server.gateway.metrics().await?;
    let delta = |name: &str| after.sum(name).unwrap_or(0.0) - metrics.sum(name).unwrap_or(0.0);
    Ok(Idle {
        cpu_percent: (cpu_after - cpu) as f64 / ticks / seconds * 100.0,
        rss_mib: rss_kib(pid)? as f64 / 1024.0,
        // The scrape itself sends none: `/metrics` reads counters.
        statements: delta(STATEMENTS) + delta(MAINTENANCE_STATEMENTS),
        tail_reads: delta(TAIL_READS),
    })
}

/// `utime + stime` of a process, in clock ticks.
pub(crate) fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    // Fields after the command name, which is in parentheses and may hold
    // spaces: state is field 3, utime 14, stime 15.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("unexpected /proc/<pid>/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> anyhow::Result<u64> {
        fields
            .get(n - 3)
            .and_then(|f| f.parse().ok())
            .context("unexpected /proc/<pid>/stat")
    };
    Ok(field(14)? + field(15)?)
}

/// `VmRSS` of a process, in KiB.
fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS in /proc/<pid>/status")
}

/// Clock ticks per second (`getconf CLK_TCK`, else 100).
pub(crate) async fn clock_ticks() -> f64 {
    let out = tokio::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .await;
    out.ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A `graphql-transport-ws` connection, acknowledged.
async fn connect(url: &str) -> anyhow::Result<Socket> {
    let mut request = url.into_client_request()?;
    request.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        HeaderValue::from_static("graphql-transport-ws"),
    );
    let (mut socket, _) = tokio_tungstenite::connect_async(request)
        .await
        .with_context(|| format!("cannot connect to {url}"))?;
    socket
        .send(Message::text(
            json!({"type": "connection_init"}).to_string(),
        ))
        .await?;
    loop {
        match socket.next().await {
            Some(Ok(Message::Text(text))) => {
                let message: Value = serde_json::from_str(&text)?;
                anyhow::ensure!(
                    message["type"] == "connection_ack",
                    "the server answered connection_init with {message}"
                );
                return Ok(socket);
            }
            Some(Ok(Message::Close(frame))) => anyhow::bail!("the server closed: {frame:?}"),
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(e.into()),
            None => anyhow::bail!("the server closed the connection"),
        }
    }
}

/// Runs subscriptions `first..first + count` on `socket` and counts their
/// events until aborted.
async fn follow(mut socket: Socket, query: &str, first: usize, count: usize, seen: Arc<Seen>) {
    for n in first..first + count {
        let subscribe = json!({
            "type": "subscribe",
            "id": n.to_string(),
            "payload": { "query": query },
        });
        if let Err(e) = socket.send(Message::text(subscribe.to_string())).await {
            seen.errors.lock().expect("errors").push(e.to_string());
            return;
        }
    }
    while let Some(message) = socket.next().await {
        let text = match message {
            Ok(Message::Text(text)) => text,
            Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_) | Message::Binary(_)) => {
                continue
            }
            Ok(Message::Close(frame)) => {
                seen.errors
                    .lock()
                    .expect("errors")
                    .push(format!("the server closed a connection: {frame:?}"));
                return;
            }
            Err(e) => {
                seen.errors.lock().expect("errors").push(e.to_string());
                return;
            }
        };
        let arrived = chrono::Utc::now();
        let Ok(message) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        let id = message["id"]
            .as_str()
            .and_then(|id| id.parse::<usize>().ok());
        match (message["type"].as_str(), id) {
            (Some("next"), Some(id)) if id < seen.events.len() => {
                if let Some(errors) = message["payload"].get("errors") {
                    seen.errors.lock().expect("errors").push(errors.to_string());
                    continue;
                }
                seen.events[id].fetch_add(1, Ordering::Relaxed);
                if id % seen.every == 0 {
                    let created = &message["payload"]["data"]["tripsCells"]["cell"]["createdAt"];
                    if let Some(us) = crate::receiver::delay_us(created, arrived) {
                        let _ = seen.lag_us.lock().expect("lag").record(us);
                    }
                }
            }
            (Some("error" | "complete"), _) => {
                seen.errors
                    .lock()
                    .expect("errors")
                    .push(message.to_string());
            }
            _ => {}
        }
    }
}
