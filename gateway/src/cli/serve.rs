//! `cellgate serve`: the GraphQL gateway over HTTP.
//!
//! Settings come from three layers, strongest first: command-line flags
//! (and their `CELLGATE_*` twins), the `--config` file, and the defaults of
//! [`Config`]. Flags therefore have no clap defaults: an absent flag must
//! not override a value from the file; `--help` names the defaults in text.
//!
//! Start-up is ordered so that every mistake is reported before the port is
//! bound: definitions (printed as diagnostics, exit 1), storage, the
//! optional demo data, the schema. The line announcing the address is the
//! signal that the server is ready; tests and scripts wait for it, so it is
//! flushed at once and names the bound port, also when `--listen` asked for
//! port 0.
//!
//! While it serves, SIGHUP, `cellgate reload` and (with `--watch`) a change
//! under the datastores directory reload the definitions
//! (`http/reload.rs`).

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use crate::config::{Config, StorageConfig};
use crate::http::Gateway;
use cellgate_store::{Store, StoreOptions};

use super::{load_definitions, plural};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address and port to listen on; port 0 picks a free port (the
    /// address printed at start-up has the real one).
    /// [default: 127.0.0.1:8080]
    #[arg(long, value_name = "ADDR", env = "CELLGATE_LISTEN")]
    pub listen: Option<SocketAddr>,

    /// Data directory of the embedded SQLite database (`<DIR>/cellgate.db`,
    /// created if missing). Ignored when `--database` is given or the
    /// configuration file lists storage clusters. [default: ./data]
    #[arg(long, value_name = "DIR", env = "CELLGATE_DATA")]
    pub data: Option<PathBuf>,

    /// Directory of the datastore and index definitions.
    /// [default: ./datastores]
    #[arg(long, value_name = "DIR", env = "CELLGATE_DATASTORES")]
    pub datastores: Option<PathBuf>,

    /// URL of the one database cluster to use instead of the embedded
    /// SQLite database or the configured clusters: `sqlite://PATH`,
    /// `mysql://USER:PASS@HOST/DB`, `mariadb://…` or
    /// `postgres://USER:PASS@HOST/DB`.
    // The URL may hold a password: `--help` must not print it.
    #[arg(
        long,
        value_name = "URL",
        env = "CELLGATE_DATABASE_URL",
        hide_env_values = true
    )]
    pub database: Option<String>,

    /// Load a small sample of trips and payments if the store is empty.
    #[arg(
        long,
        env = "CELLGATE_DEMO",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub demo: bool,

    /// Whether requests need an API token (`Authorization: Bearer …`):
    /// `on`, `off`, or `auto` (on unless listening on a loopback address).
    /// [default: auth.enabled of the configuration, else auto]
    #[arg(long, value_name = "on|off|auto", env = "CELLGATE_AUTH")]
    pub auth: Option<AuthMode>,

    /// Configuration file (`cellgate.yaml`; see `cellgate.example.yaml`).
    /// Flags and their environment variables override its values.
    #[arg(long, value_name = "FILE", env = "CELLGATE_CONFIG")]
    pub config: Option<PathBuf>,

    /// Reload the definitions when a file under the datastores directory
    /// changes (after half a second without further changes), as on
    /// SIGHUP or `cellgate reload`.
    #[arg(
        long,
        env = "CELLGATE_WATCH",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub watch: bool,

    /// A manifest of persisted documents (`persisted-documents.json` of
    /// graphql-codegen's client preset). [default: graphql.persisted_documents
    /// of the configuration]
    #[arg(long, value_name = "FILE", env = "CELLGATE_PERSISTED_DOCUMENTS")]
    pub persisted_documents: Option<PathBuf>,

    /// Which documents run: `any`, or `only_persisted` (the manifest's, and
    /// any for a `*:admin` token). [default: graphql.documents of the
    /// configuration, else any]
    #[arg(long, value_name = "MODE", env = "CELLGATE_DOCUMENTS")]
    pub documents: Option<DocumentsFlag>,
}

/// `--documents`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DocumentsFlag {
    Any,
    #[value(name = "only_persisted")]
    OnlyPersisted,
}

/// `--auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthMode {
    On,
    Off,
    Auto,
}

/// The file's configuration with the flags applied.
fn resolve(args: &ServeArgs) -> anyhow::Result<Config> {
    let mut config = match &args.config {
        Some(path) => Config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?,
        None => Config::default(),
    };
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(data) = &args.data {
        config.data = data.clone();
    }
    if let Some(datastores) = &args.datastores {
        config.datastores = datastores.clone();
    }
    if let Some(file) = &args.persisted_documents {
        config.graphql.persisted_documents = Some(file.clone());
    }
    match args.documents {
        Some(DocumentsFlag::Any) => config.graphql.documents = cellgate_graphql::DocumentsMode::Any,
        Some(DocumentsFlag::OnlyPersisted) => {
            config.graphql.documents = cellgate_graphql::DocumentsMode::OnlyPersisted
        }
        None => {}
    }
    match args.auth {
        Some(AuthMode::On) => config.auth.enabled = Some(true),
        Some(AuthMode::Off) => config.auth.enabled = Some(false),
        Some(AuthMode::Auto) => config.auth.enabled = None,
        None => {}
    }
    let file_storage = std::mem::take(&mut config.storage);
    config.storage = if let Some(url) = &args.database {
        StorageConfig {
            clusters: StorageConfig::single(url).clusters,
            buffer_count: 0,
            shards: Default::default(),
            ..file_storage
        }
    } else if file_storage.clusters.is_empty() {
        StorageConfig {
            clusters: StorageConfig::embedded(&config.data).clusters,
            ..file_storage
        }
    } else {
        file_storage
    };
    Ok(config)
}

pub async fn run(args: ServeArgs, log: Option<&str>) -> anyhow::Result<ExitCode> {
    let config = resolve(&args)?;
    let telemetry = crate::telemetry::Telemetry::start(&config.telemetry)?;
    let (telemetry, tracer) = telemetry.unzip();
    super::init_logging(log, tracer)?;
    if let Some(endpoint) = telemetry
        .as_ref()
        .and(config.telemetry.otlp_endpoint.as_deref())
    {
        tracing::info!(endpoint, "exporting traces over OTLP/HTTP");
    }
    let Some(defs) = load_definitions(&config.datastores, "--datastores")? else {
        return Ok(ExitCode::FAILURE);
    };
    let clusters: Vec<&str> = config
        .storage
        .clusters
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    let clusters = clusters.join(", ");
    let mut options = StoreOptions::new(config.storage.clone());
    options.maintain_indexes = config.indexes.maintain;
    options.maintenance = config.indexes.maintainer();
    options.ids = config.ids.options(Some(&config.data));
    options.tail.sweep_every =
        std::time::Duration::from_millis(config.limits.subscription_sweep_ms.clamp(10, 60_000));
    let store = Store::open(defs.clone(), options)
        .await
        .map_err(|e| anyhow::anyhow!("cannot open storage (clusters {clusters}): {e}"))?;

    if args.demo {
        let loaded = crate::demo::load_demo(&store)
            .await
            .map_err(|e| anyhow::anyhow!("cannot load the demo data: {e}"))?;
        match loaded {
            Some(summary) => println!(
                "demo data loaded: {}, {} ({})",
                plural(summary.trips, "trip", "trips"),
                plural(summary.payments, "payment", "payments"),
                plural(summary.cells, "cell", "cells"),
            ),
            None => println!("demo data not loaded: the store already holds cells"),
        }
    }

    if config.ids.snowflake.enabled {
        // Serve snowflake IDs from the first request when the database
        // answers; without it, requests say so until a worker id is leased.
        if let Err(error) = store.ids().wait_for_worker(Duration::from_secs(3)).await {
            tracing::warn!(%error, "serving without a snowflake worker id for now");
        }
    }

    // Started before the port is bound, so that a trigger whose header or
    // secret names a missing environment variable stops the start.
    // `store.shutdown` stops them and gives their shards up.
    let webhooks = if config.triggers.run {
        crate::triggers::start(&store, &defs, &config.triggers)?
    } else {
        Vec::new()
    };
    if !webhooks.is_empty() {
        println!(
            "delivering {}",
            plural(webhooks.len(), "webhook trigger", "webhook triggers")
        );
    }

    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let address = listener
        .local_addr()
        .context("cannot read the bound address")?;
    let gateway = Gateway::new(store.clone(), &config).map_err(|e| anyhow::anyhow!("{e}"))?;
    if !gateway.auth_enabled() && !address.ip().is_loopback() {
        eprintln!(
            "WARNING: authentication is OFF while listening on {address}: anyone who can reach \
             this address can read and write every datastore. Use --auth on (or remove \
             auth.enabled: false) outside local development."
        );
        tracing::warn!(%address, "authentication is off on a non-loopback address");
    }
    let gateway = Arc::new(gateway);
    gateway.record_deployed().await;
    // Installed before the listening line, like the shutdown handlers: a
    // SIGHUP sent once the gateway announced itself must not kill it.
    spawn_reloads(&gateway, &config.datastores, args.watch)?;
    let grace = std::time::Duration::from_millis(config.limits.shutdown_grace_ms);
    let shutdown = shutdown_signal(grace)?;
    let options = crate::http::ServerOptions {
        header_timeout: std::time::Duration::from_millis(config.limits.header_timeout_ms.max(1)),
        max_connections_per_client: config.limits.max_connections_per_client,
        client_ipv6_prefix: config.limits.client_ipv6_prefix,
        shutdown_grace: grace,
    };

    println!("cellgate listening on http://{address} — GraphQL playground at http://{address}/");
    std::io::stdout()
        .flush()
        .context("cannot write to stdout")?;
    tracing::info!(%address, "serving");

    let served = crate::http::serve(listener, gateway, shutdown, options).await;
    // Leases released now let other gateways take the shards over at once.
    store.shutdown(std::time::Duration::from_secs(5)).await;
    if let Some(telemetry) = telemetry {
        // It waits for the export thread, which needs the runtime.
        let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    }
    served.context("the HTTP server failed")?;
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// Reloads the definitions on SIGHUP and, with `watch`, when a file under
/// `dir` changes (debounced by half a second, so an editor's or a
/// deployment's burst of writes is one reload). Reloads run one at a time
/// (`http/reload.rs`); one asked for while another runs follows it.
fn spawn_reloads(gateway: &Arc<Gateway>, dir: &std::path::Path, watch: bool) -> anyhow::Result<()> {
    let (wake, mut woken) = tokio::sync::mpsc::unbounded_channel::<&'static str>();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangup = signal(SignalKind::hangup()).context("cannot handle SIGHUP")?;
        let wake = wake.clone();
        tokio::spawn(async move {
            while hangup.recv().await.is_some() {
                if wake.send("SIGHUP").is_err() {
                    return;
                }
            }
        });
    }
    let watcher = if watch {
        use notify_debouncer_mini::{new_debouncer, notify::RecursiveMode};
        let wake = wake.clone();
        let mut debouncer = new_debouncer(
            Duration::from_millis(500),
            move |events: notify_debouncer_mini::DebounceEventResult| match events {
                Ok(_) => {
                    let _ = wake.send("a change under the datastores directory");
                }
                Err(error) => {
                    tracing::warn!(%error, "watching the datastores directory failed");
                }
            },
        )
        .context("cannot watch the datastores directory")?;
        debouncer
            .watcher()
            .watch(dir, RecursiveMode::Recursive)
            .with_context(|| format!("cannot watch `{}`", dir.display()))?;
        tracing::info!(dir = %dir.display(), "reloading the definitions when they change");
        Some(debouncer)
    } else {
        None
    };
    drop(wake);
    let gateway = Arc::downgrade(gateway);
    tokio::spawn(async move {
        // The watcher lives as long as this task.
        let _watcher = watcher;
        while let Some(cause) = woken.recv().await {
            // Causes that came meanwhile are served by this reload.
            while woken.try_recv().is_ok() {}
            let Some(gateway) = gateway.upgrade() else {
                return;
            };
            gateway.reload(cause).await;
        }
    });
    Ok(())
}

/// A future that resolves on Ctrl-C or SIGTERM. The handlers are installed
/// now, not when the future is first polled, so a signal sent right after
/// the listening line is printed is not lost (it would kill the process).
///
/// The signal also starts a watchdog on a thread of its own: if the
/// process has not exited `grace` plus a few seconds later (requests that
/// do not yield, a runtime whose workers are all busy, index workers that
/// do not stop), it exits anyway, so SIGTERM is honoured under any load.
fn shutdown_signal(
    grace: std::time::Duration,
) -> anyhow::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    let (mut interrupt, mut terminate) = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::interrupt()).context("cannot handle SIGINT")?,
            signal(SignalKind::terminate()).context("cannot handle SIGTERM")?,
        )
    };
    Ok(async move {
        #[cfg(unix)]
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutting down: finishing requests in flight");
        let deadline = grace + std::time::Duration::from_secs(7);
        std::thread::spawn(move || {
            std::thread::sleep(deadline);
            eprintln!("cellgate: still running {deadline:?} after the shutdown signal; exiting");
            std::process::exit(1);
        });
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(config: Option<PathBuf>) -> ServeArgs {
        ServeArgs {
            listen: None,
            data: None,
            datastores: None,
            database: None,
            demo: false,
            auth: None,
            config,
            watch: false,
            persisted_documents: None,
            documents: None,
        }
    }

    #[test]
    fn without_flags_or_file_the_store_is_embedded_in_the_data_directory() {
        let config = resolve(&args(None)).unwrap();
        assert_eq!(config.listen, crate::config::DEFAULT_LISTEN);
        assert_eq!(
            config.storage,
            StorageConfig::embedded(std::path::Path::new("./data"))
        );
    }

    #[test]
    fn flags_override_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cellgate.yaml");
        std::fs::write(
            &file,
            "listen: 0.0.0.0:9000\ndata: /srv/cells\nlimits:\n  max_depth: 5\n",
        )
        .unwrap();
        let from_file = resolve(&args(Some(file.clone()))).unwrap();
        assert_eq!(from_file.listen.port(), 9000);
        assert_eq!(from_file.limits.max_depth, 5);
        assert_eq!(
            from_file.storage,
            StorageConfig::embedded(std::path::Path::new("/srv/cells"))
        );

        let mut flags = args(Some(file));
        flags.listen = Some("127.0.0.1:0".parse().unwrap());
        flags.database = Some("sqlite://other.db".into());
        let overridden = resolve(&flags).unwrap();
        assert_eq!(overridden.listen.port(), 0);
        assert_eq!(
            overridden.storage,
            StorageConfig::single("sqlite://other.db")
        );
        assert_eq!(overridden.limits.max_depth, 5);
    }
}
