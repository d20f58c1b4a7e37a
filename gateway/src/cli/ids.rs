//! `cellgate ids`: create biz tags, take IDs, show the segment table,
//! decode IDs, and measure the allocator (`ids bench`).
//!
//! The commands open the store like `migrate` and `index` do (index
//! maintenance off). `bench` measures in process through the Rust API
//! and over HTTP through the Leaf-style routes, either of a gateway it
//! starts in the same process on a temporary SQLite store (or
//! `--database`) or of a running one (`--url`).

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Args, Subcommand};

use super::store_args::StoreArgs;
use crate::config::{Config, StorageConfig};
use crate::ids::{IdKind, IdsOptions, NewTag};
use crate::{Store, StoreOptions};

#[derive(Debug, Args)]
pub struct IdsArgs {
    #[command(subcommand)]
    pub command: IdsCommand,
}

#[derive(Debug, Subcommand)]
pub enum IdsCommand {
    /// Create a biz tag for segment IDs (left unchanged if it exists).
    CreateTag(CreateTagArgs),
    /// Print the next IDs of a biz tag, one per line.
    Next(NextArgs),
    /// Print snowflake IDs, one per line (leases a worker id for the run).
    Snowflake(SnowflakeArgs),
    /// Print the biz tags as stored: max_id, step, description, update time.
    Tags(TagsArgs),
    /// Split an ID into version, shard, time, worker and sequence.
    Decode(DecodeArgs),
    /// Measure IDs per second in process and over HTTP, with latency
    /// percentiles.
    ///
    /// In process: segment and snowflake IDs taken one at a time and in
    /// batches by two tasks. Over HTTP: `GET /api/segment/get/bench` and
    /// `GET /api/snowflake/get/bench` with `?count=` at each
    /// `--concurrency`, against a gateway started in this process (on a
    /// temporary SQLite store, or `--database`) or `--url`. Run it with
    /// `--log warn`: request logging at info level costs more than an ID.
    Bench(IdsBenchArgs),
}

#[derive(Debug, Args)]
pub struct CreateTagArgs {
    /// The biz tag: letters, digits, `_`, `-`, `.`, `:` (at most 128).
    pub tag: String,
    /// Length of the first segment (the adaptive step starts here).
    #[arg(long, default_value_t = 1000, env = "CELLGATE_IDS_STEP")]
    pub step: i64,
    /// The first ID.
    #[arg(long, default_value_t = 1, env = "CELLGATE_IDS_START")]
    pub start: i64,
    /// What the IDs are for.
    #[arg(long, default_value = "", env = "CELLGATE_IDS_DESCRIPTION")]
    pub description: String,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct NextArgs {
    /// The biz tag.
    pub tag: String,
    /// How many IDs.
    #[arg(long, default_value_t = 1, env = "CELLGATE_IDS_COUNT")]
    pub count: usize,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct SnowflakeArgs {
    /// How many IDs.
    #[arg(long, default_value_t = 1, env = "CELLGATE_IDS_COUNT")]
    pub count: usize,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct TagsArgs {
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct DecodeArgs {
    /// The ID, in decimal.
    pub id: i64,
    /// The snowflake epoch in Unix milliseconds.
    #[arg(long, default_value_t = crate::ids::DEFAULT_EPOCH_MS, env = "CELLGATE_IDS_EPOCH_MS")]
    pub epoch_ms: i64,
}

#[derive(Debug, Args)]
pub struct IdsBenchArgs {
    /// Seconds per measurement.
    #[arg(long, default_value_t = 3.0, env = "CELLGATE_BENCH_DURATION")]
    pub duration: f64,
    /// HTTP client concurrencies, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "8,64",
        env = "CELLGATE_BENCH_CONCURRENCY"
    )]
    pub concurrency: Vec<usize>,
    /// IDs per HTTP request (`?count=`).
    #[arg(long, default_value_t = 100, env = "CELLGATE_BENCH_BATCH")]
    pub batch: usize,
    /// A running gateway to measure over HTTP (in-process figures are then
    /// skipped), e.g. `http://127.0.0.1:8080`.
    #[arg(long, value_name = "URL", env = "CELLGATE_BENCH_URL")]
    pub url: Option<String>,
    /// Database of the gateway started here (default: a temporary SQLite
    /// store).
    #[arg(
        long,
        value_name = "URL",
        env = "CELLGATE_DATABASE_URL",
        hide_env_values = true
    )]
    pub database: Option<String>,
}

pub async fn run(args: IdsArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        IdsCommand::CreateTag(args) => {
            let Some(store) = open(&args.store, false).await? else {
                return Ok(ExitCode::FAILURE);
            };
            let tag = NewTag {
                name: args.tag.clone(),
                start: args.start,
                step: args.step,
                description: args.description,
            };
            let created = store.ids().create_tag(&tag).await.map_err(client_error)?;
            if created {
                println!(
                    "created biz tag `{}` (first id {}, step {})",
                    args.tag, args.start, args.step
                );
            } else {
                println!("biz tag `{}` exists; left unchanged", args.tag);
            }
            Ok(ExitCode::SUCCESS)
        }
        IdsCommand::Next(args) => {
            let Some(store) = open(&args.store, false).await? else {
                return Ok(ExitCode::FAILURE);
            };
            let ids = store
                .ids()
                .next_ids(&args.tag, args.count)
                .await
                .map_err(client_error)?;
            print_ids(&ids);
            Ok(ExitCode::SUCCESS)
        }
        IdsCommand::Snowflake(args) => {
            let Some(store) = open(&args.store, true).await? else {
                return Ok(ExitCode::FAILURE);
            };
            store
                .ids()
                .wait_for_worker(Duration::from_secs(10))
                .await
                .map_err(client_error)?;
            let ids = store
                .ids()
                .snowflake_ids(args.count)
                .await
                .map_err(client_error)?;
            print_ids(&ids);
            Ok(ExitCode::SUCCESS)
        }
        IdsCommand::Tags(args) => {
            let Some(store) = open(&args.store, false).await? else {
                return Ok(ExitCode::FAILURE);
            };
            let tags = store.ids().tags().await.map_err(client_error)?;
            println!(
                "{:<32} {:>20} {:>10}  {:<27} description",
                "biz_tag", "max_id", "step", "update_time"
            );
            for t in tags {
                println!(
                    "{:<32} {:>20} {:>10}  {:<27} {}",
                    t.tag,
                    t.max_id,
                    t.step,
                    t.update_time
                        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                    t.description
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        IdsCommand::Decode(args) => {
            let d = crate::ids::decode(args.id, args.epoch_ms).map_err(client_error)?;
            let kind = match d.kind {
                IdKind::Snowflake => "snowflake",
                IdKind::Tagged => "tagged",
            };
            println!("kind: {kind}\nversion: {}", d.version);
            if let Some(shard) = d.shard {
                println!("shard: {shard}");
            }
            println!(
                "time: {}\nworker: {}\nsequence: {}",
                d.time.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                d.worker,
                d.sequence
            );
            Ok(ExitCode::SUCCESS)
        }
        IdsCommand::Bench(args) => bench(args).await,
    }
}

fn client_error(error: crate::Error) -> anyhow::Error {
    anyhow::anyhow!("{}: {}", error.code(), error.client_message())
}

fn print_ids(ids: &[i64]) {
    use std::io::Write as _;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for id in ids {
        let _ = writeln!(out, "{id}");
    }
}

/// Opens the store of `args` with the `ids:` section of its configuration.
async fn open(args: &StoreArgs, snowflake: bool) -> anyhow::Result<Option<Store>> {
    let Some(defs) = super::load_definitions(&args.datastores, "--datastores")? else {
        return Ok(None);
    };
    let config = match &args.config {
        Some(path) => Config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?,
        None => Config::default(),
    };
    let mut options = StoreOptions::new(args.storage()?);
    options.maintain_indexes = false;
    options.ids = IdsOptions {
        snowflake,
        // A command holds its worker id briefly; it is free again soon after.
        worker_lease: Duration::from_secs(30),
        worker_cache: None,
        ..config.ids.options(None)
    };
    let store = Store::open(defs, options)
        .await
        .map_err(|e| anyhow::anyhow!("cannot open storage: {e}"))?;
    Ok(Some(store))
}

/// Runs `op` (returning IDs taken) on `tasks` tasks for `duration`;
/// returns IDs per second.
async fn in_process<F, Fut>(tasks: usize, duration: Duration, op: F) -> anyhow::Result<f64>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = crate::Result<u64>> + Send,
{
    let op = Arc::new(op);
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (op, stop, total) = (op.clone(), stop.clone(), total.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..256 {
                        n += op().await?;
                    }
                    // IDs come from memory without a suspension point;
                    // let the timer that ends the run have a thread.
                    tokio::task::yield_now().await;
                }
                total.fetch_add(n, Ordering::Relaxed);
                Ok::<_, crate::Error>(())
            })
        })
        .collect();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    for handle in handles {
        handle.await?.map_err(client_error)?;
    }
    Ok(total.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

/// One HTTP measurement.
struct HttpFigures {
    ids_per_second: f64,
    requests_per_second: f64,
    errors: u64,
    p50_us: u64,
    p99_us: u64,
    p999_us: u64,
}

async fn over_http(
    url: String,
    concurrency: usize,
    duration: Duration,
) -> anyhow::Result<HttpFigures> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .timeout(Duration::from_secs(10))
        .build()?;
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let handles: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, url, stop) = (client.clone(), url.clone(), stop.clone());
            tokio::spawn(async move {
                let mut histogram =
                    hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)
                        .expect("histogram");
                let (mut ids, mut errors) = (0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    let sent = Instant::now();
                    let answer = match client.get(&url).send().await {
                        Ok(response) if response.status().is_success() => {
                            response.text().await.ok()
                        }
                        _ => None,
                    };
                    let _ = histogram.record(sent.elapsed().as_micros().max(1) as u64);
                    match answer {
                        Some(body) => ids += body.lines().count() as u64,
                        None => errors += 1,
                    }
                }
                (histogram, ids, errors)
            })
        })
        .collect();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut histogram = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let (mut ids, mut errors) = (0u64, 0u64);
    for handle in handles {
        let (h, i, e) = handle.await?;
        histogram.add(h)?;
        ids += i;
        errors += e;
    }
    let elapsed = start.elapsed().as_secs_f64();
    Ok(HttpFigures {
        ids_per_second: ids as f64 / elapsed,
        requests_per_second: histogram.len() as f64 / elapsed,
        errors,
        p50_us: histogram.value_at_quantile(0.5),
        p99_us: histogram.value_at_quantile(0.99),
        p999_us: histogram.value_at_quantile(0.999),
    })
}

fn rate(n: f64) -> String {
    if n >= 1e6 {
        format!("{:.1}M", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1}k", n / 1e3)
    } else {
        format!("{n:.0}")
    }
}

async fn bench(args: IdsBenchArgs) -> anyhow::Result<ExitCode> {
    let duration = Duration::from_secs_f64(args.duration.max(0.1));
    println!(
        "cellgate ids bench: {:.1} s per measurement, HTTP concurrency {:?}, {} IDs per HTTP request",
        duration.as_secs_f64(),
        args.concurrency,
        args.batch
    );
    let mut _server = None;
    let base = match &args.url {
        Some(url) => {
            let created: serde_json::Value = reqwest::Client::new()
                .post(format!("{}/graphql", url.trim_end_matches('/')))
                .json(&serde_json::json!({
                    "query": "mutation { createIdTag(bizTag: \"bench\", step: 100000) }"
                }))
                .send()
                .await
                .context("cannot reach the gateway")?
                .json()
                .await?;
            if created.get("errors").is_some() {
                anyhow::bail!("cannot create the biz tag `bench`: {created}");
            }
            url.trim_end_matches('/').to_string()
        }
        None => {
            let dir = tempfile::tempdir()?;
            let storage = match &args.database {
                Some(url) => StorageConfig::single(url),
                None => StorageConfig::embedded(dir.path()),
            };
            let mut options = StoreOptions::new(storage);
            options.maintain_indexes = false;
            options.ids = IdsOptions {
                snowflake: true,
                worker_cache: Some(dir.path().join("snowflake-worker.json")),
                ..IdsOptions::default()
            };
            let defs = index_dsl::Definitions {
                datastores: Vec::new(),
            };
            let store = Store::open(defs, options)
                .await
                .map_err(|e| anyhow::anyhow!("cannot open the bench store: {e}"))?;
            let ids = store.ids().clone();
            ids.create_tag(&NewTag {
                name: "bench".into(),
                start: 1,
                // Leaf's advice: a segment of about ten minutes of peak
                // demand. A request larger than a segment always waits.
                step: 100_000,
                description: "cellgate ids bench".into(),
            })
            .await
            .map_err(client_error)?;
            ids.wait_for_worker(Duration::from_secs(10))
                .await
                .map_err(client_error)?;

            println!("\nin process (2 tasks)");
            let measured: [(&str, usize, bool); 4] = [
                ("segment, 1 ID per call", 1, false),
                ("segment, 1000 IDs per call", 1000, false),
                ("snowflake, 1 ID per call", 1, true),
                ("snowflake, 4096 IDs per call", 4096, true),
            ];
            for (what, count, snowflake) in measured {
                let ids = ids.clone();
                let per_second = in_process(2, duration, move || {
                    let ids = ids.clone();
                    async move {
                        if snowflake {
                            ids.snowflake_ids(count).await.map(|v| v.len() as u64)
                        } else {
                            ids.next_id_ranges("bench", count)
                                .await
                                .map(|r| r.iter().map(|r| (r.end - r.start) as u64).sum())
                        }
                    }
                })
                .await?;
                println!("  {what:<30} {:>10} IDs/s", rate(per_second));
            }
            let metrics = &ids.metrics().tags[0];
            println!(
                "  segment loads {}, boundary waits {}, step now {}",
                metrics.segment_loads, metrics.boundary_waits, metrics.step
            );

            let schema = crate::graphql::build_schema(&store, Default::default())
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let config = Config {
                limits: crate::config::LimitsConfig {
                    max_concurrent_requests: 0,
                    rate_limit_per_second: 0,
                    ..Default::default()
                },
                ..Config::default()
            };
            let gateway = Arc::new(
                crate::http::Gateway::new(store.clone(), schema, &config)
                    .map_err(|e| anyhow::anyhow!("{e}"))?,
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let address = listener.local_addr()?;
            let options = crate::http::ServerOptions {
                header_timeout: std::time::Duration::from_secs(10),
                // Every benchmark connection comes from this address.
                max_connections_per_client: 0,
                client_ipv6_prefix: 64,
                shutdown_grace: std::time::Duration::from_secs(1),
            };
            tokio::spawn(crate::http::serve(
                listener,
                gateway,
                std::future::pending(),
                options,
            ));
            _server = Some((dir, store));
            format!("http://{address}")
        }
    };
    for route in ["segment", "snowflake"] {
        println!(
            "\nover HTTP: GET /api/{route}/get/bench?count={}",
            args.batch
        );
        println!(
            "  {:>11} {:>12} {:>12} {:>9} {:>9} {:>9} {:>7}",
            "concurrency", "IDs/s", "requests/s", "p50 ms", "p99 ms", "p999 ms", "errors"
        );
        for &concurrency in &args.concurrency {
            let url = format!("{base}/api/{route}/get/bench?count={}", args.batch);
            let f = over_http(url, concurrency.max(1), duration).await?;
            println!(
                "  {:>11} {:>12} {:>12} {:>9.3} {:>9.3} {:>9.3} {:>7}",
                concurrency,
                rate(f.ids_per_second),
                rate(f.requests_per_second),
                f.p50_us as f64 / 1000.0,
                f.p99_us as f64 / 1000.0,
                f.p999_us as f64 / 1000.0,
                f.errors
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
