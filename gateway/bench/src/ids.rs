//! `cellgate-bench ids`: IDs per second and latency percentiles of the
//! allocator, in process through the Rust API and over HTTP through the
//! Leaf-style routes (`GET /api/segment/get/bench`,
//! `GET /api/snowflake/get/bench` with `?count=`), of a `cellgate serve`
//! it starts on a temporary SQLite store (or `--database`) or of a running
//! gateway (`--url`). Run it with `--log warn`: request logging at info
//! level costs more than an ID.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use cellgate_store::ids::{IdsOptions, NewTag};
use cellgate_store::{Store, StoreOptions};
use clap::Args;

use crate::database::Database;
use crate::server::Server;

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

fn client_error(error: cellgate_store::Error) -> anyhow::Error {
    anyhow::anyhow!("{}: {}", error.code(), error.client_message())
}

/// Runs `op` (returning IDs taken) on `tasks` tasks for `duration`;
/// returns IDs per second.
async fn in_process<F, Fut>(tasks: usize, duration: Duration, op: F) -> anyhow::Result<f64>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = cellgate_store::Result<u64>> + Send,
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
                Ok::<_, cellgate_store::Error>(())
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

/// Runs the ID benchmark.
pub async fn run(args: IdsBenchArgs) -> anyhow::Result<ExitCode> {
    let duration = Duration::from_secs_f64(args.duration.max(0.1));
    println!(
        "cellgate-bench ids: {:.1} s per measurement, HTTP concurrency {:?}, {} IDs per HTTP request",
        duration.as_secs_f64(),
        args.concurrency,
        args.batch
    );
    let mut _server: Option<(Server, Store, tempfile::TempDir)> = None;
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
            let dir = crate::server::work_dir()?;
            let database = match &args.database {
                Some(url) => Database::server(url)?,
                None => Database::embedded(&dir.path().join("store")),
            };
            let mut options = StoreOptions::new(database.storage());
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
                description: "cellgate-bench ids".into(),
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

            // The gateway is `cellgate serve` on the same database, with no
            // datastores and no admission limits: the benchmark is its only
            // client.
            let datastores = dir.path().join("datastores");
            std::fs::create_dir_all(&datastores)?;
            let concurrency = args.concurrency.iter().copied().max().unwrap_or(1) as u32;
            let server = Server::start(
                &database,
                &datastores,
                dir.path(),
                concurrency,
                Duration::from_secs(10),
                false,
            )
            .await?;
            let base = server.gateway.base.clone();
            _server = Some((server, store, dir));
            base
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
