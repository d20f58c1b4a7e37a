//! `cellgate.yaml`: where the server listens, where its data lives, the
//! storage topology (clusters and which shards each one holds), the
//! admission limits of the HTTP gateway and what its metrics report.
//!
//! Every struct rejects unknown keys and takes its defaults at struct level,
//! so an empty file is the default configuration, and a typo is an error
//! rather than a silently ignored option. `cellgate.example.yaml` at the
//! repository root is the commented reference; a test checks that it parses
//! to exactly [`Config::default`].
//!
//! ```yaml
//! listen: 127.0.0.1:8080
//! data: ./data
//! datastores: ./datastores
//! storage:
//!   # Secondary clusters a write is buffered to before the primary master
//!   # (0 = no buffering; needs at least two clusters).
//!   buffer_count: 0
//!   clusters:
//!     - name: main
//!       master: sqlite://./data/cellgate.db
//!       replicas: []
//!   # Optional per datastore; default: shards split evenly, in order.
//!   shards:
//!     trips:
//!       - { first: 0, last: 2047, cluster: main }
//!   # Longest wait for a connection or a statement's answer.
//!   timeout_ms: 5000
//! limits:
//!   max_body_bytes: 1048576
//! metrics:
//!   operations: [TripsByDriver]
//! ```
//!
//! With no storage clusters configured everything lives in one embedded
//! SQLite cluster under the data directory.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use cellgate_graphql::auth::ConfigToken;
use cellgate_graphql::GraphqlLimits;
use cellgate_store::ids::IdsOptions;
pub use cellgate_store::StorageConfig;

mod graphql;
mod telemetry;

pub use self::graphql::GraphqlConfig;
pub use self::telemetry::TelemetryConfig;

/// The whole `cellgate.yaml`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address and port the HTTP server binds; port 0 picks a free port.
    ///
    /// ```yaml
    /// listen: 0.0.0.0:8080
    /// ```
    pub listen: SocketAddr,
    /// Directory of the embedded SQLite database (`<data>/cellgate.db`),
    /// used when `storage.clusters` is empty.
    ///
    /// ```yaml
    /// data: /var/lib/cellgate
    /// ```
    pub data: PathBuf,
    /// Directory of the datastore and index definitions.
    ///
    /// ```yaml
    /// datastores: ./datastores
    /// ```
    pub datastores: PathBuf,
    /// Storage topology; see [`StorageConfig`].
    ///
    /// ```yaml
    /// storage:
    ///   clusters:
    ///     - { name: main, master: "postgres://cellgate@db1/cells" }
    /// ```
    pub storage: StorageConfig,
    /// Admission limits of the HTTP gateway; see [`LimitsConfig`].
    ///
    /// ```yaml
    /// limits:
    ///   max_concurrent_requests: 512
    /// ```
    pub limits: LimitsConfig,
    /// Index maintenance; see [`IndexesConfig`].
    ///
    /// ```yaml
    /// indexes:
    ///   lease_time_ms: 10000
    /// ```
    pub indexes: IndexesConfig,
    /// What `GET /metrics` reports; see [`MetricsConfig`].
    ///
    /// ```yaml
    /// metrics:
    ///   operations: [TripsByDriver]
    /// ```
    pub metrics: MetricsConfig,
    /// API tokens and what anonymous clients may see; see [`AuthConfig`].
    ///
    /// ```yaml
    /// auth:
    ///   enabled: true
    /// ```
    pub auth: AuthConfig,
    /// Cross-origin requests from browsers; see [`CorsConfig`].
    ///
    /// ```yaml
    /// cors:
    ///   allowed_origins: ["https://app.example.com"]
    /// ```
    pub cors: CorsConfig,
    /// Which `Host` names the gateway answers to; see [`HttpConfig`].
    ///
    /// ```yaml
    /// http:
    ///   allowed_hosts: [cellgate.internal]
    /// ```
    pub http: HttpConfig,
    /// Persisted documents and which documents run; see [`GraphqlConfig`].
    ///
    /// ```yaml
    /// graphql:
    ///   persisted_documents: ./persisted-documents.json
    /// ```
    pub graphql: GraphqlConfig,
    /// OpenTelemetry traces; see [`TelemetryConfig`].
    ///
    /// ```yaml
    /// telemetry:
    ///   otlp_endpoint: http://127.0.0.1:4318
    /// ```
    pub telemetry: TelemetryConfig,
    /// ID allocation (Leaf segments, snowflake, shard-tagged IDs); see
    /// [`IdsConfig`].
    ///
    /// ```yaml
    /// ids:
    ///   tags: [{ name: order, step: 1000 }]
    /// ```
    pub ids: IdsConfig,
    /// How webhook triggers (`datastores/<ds>/triggers/*.yaml`) run; see
    /// [`TriggersConfig`].
    ///
    /// ```yaml
    /// triggers:
    ///   lease_time_ms: 10000
    /// ```
    pub triggers: TriggersConfig,
}

/// How this gateway runs the webhook triggers of the definitions. Several
/// gateways on one store share each trigger's shards through leases held in
/// the database.
///
/// ```yaml
/// triggers:
///   run: true
///   lease_time_ms: 10000
///   sweep_interval_ms: 1000
///   min_backoff_ms: 100
///   max_backoff_ms: 10000
///   quarantine_limit: 100
/// ```
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TriggersConfig {
    /// Whether this gateway delivers webhook triggers.
    ///
    /// ```yaml
    /// run: true
    /// ```
    pub run: bool,
    /// How long a gateway holds a trigger's shards without renewing them;
    /// when one dies, the others take its shards over within this time.
    ///
    /// ```yaml
    /// lease_time_ms: 10000
    /// ```
    pub lease_time_ms: u64,
    /// How often the log heads are read to find cells other gateways wrote
    /// (and rewinds and quarantine retries).
    ///
    /// ```yaml
    /// sweep_interval_ms: 1000
    /// ```
    pub sweep_interval_ms: u64,
    /// First delay before a failed POST is retried; doubles per attempt up
    /// to `max_backoff_ms`.
    ///
    /// ```yaml
    /// min_backoff_ms: 100
    /// ```
    pub min_backoff_ms: u64,
    /// Longest delay between retries of a failed POST.
    ///
    /// ```yaml
    /// max_backoff_ms: 10000
    /// ```
    pub max_backoff_ms: u64,
    /// Quarantined cells of one trigger past which it stops and says so in
    /// `/metrics` and the logs.
    ///
    /// ```yaml
    /// quarantine_limit: 100
    /// ```
    pub quarantine_limit: u64,
}

impl Default for TriggersConfig {
    fn default() -> Self {
        TriggersConfig {
            run: true,
            lease_time_ms: 10_000,
            sweep_interval_ms: 1000,
            min_backoff_ms: 100,
            max_backoff_ms: 10_000,
            quarantine_limit: 100,
        }
    }
}

/// ID allocation. Segment mode hands out IDs of a biz tag from segments
/// taken from `cellgate_id_segments`; snowflake mode composes time, a
/// leased worker id and a sequence.
///
/// ```yaml
/// ids:
///   cluster: main
///   prefetch: true
///   min_step: 1000
///   max_step: 1000000
///   segment_duration_ms: 900000
///   max_count: 10000
///   tags:
///     - { name: order, step: 1000, start: 1, description: order numbers }
///   snowflake:
///     enabled: true
///     epoch_ms: 1704067200000
///     worker_lease_ms: 600000
///     cache: ""
/// ```
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct IdsConfig {
    /// Cluster holding `cellgate_id_segments` and the worker leases
    /// (empty: the first cluster).
    ///
    /// ```yaml
    /// cluster: main
    /// ```
    pub cluster: String,
    /// Load the next segment in the background once 10% of the current
    /// one is used, so no request waits on the database at a boundary.
    ///
    /// ```yaml
    /// prefetch: true
    /// ```
    pub prefetch: bool,
    /// Smallest segment the adaptive step shrinks to.
    ///
    /// ```yaml
    /// min_step: 1000
    /// ```
    pub min_step: i64,
    /// Largest segment the adaptive step grows to.
    ///
    /// ```yaml
    /// max_step: 1000000
    /// ```
    pub max_step: i64,
    /// How long one segment should last: the step doubles when a segment
    /// lasted less, halves when it lasted more than twice as long.
    ///
    /// ```yaml
    /// segment_duration_ms: 900000
    /// ```
    pub segment_duration_ms: u64,
    /// Most IDs one request may ask for.
    ///
    /// ```yaml
    /// max_count: 10000
    /// ```
    pub max_count: usize,
    /// Biz tags created at start-up if missing (existing ones are left as
    /// they are).
    ///
    /// ```yaml
    /// tags: [{ name: order, step: 1000 }]
    /// ```
    pub tags: Vec<IdTagConfig>,
    /// Snowflake mode; see [`SnowflakeConfig`].
    pub snowflake: SnowflakeConfig,
}

impl Default for IdsConfig {
    /// The store's defaults ([`IdsOptions::default`]).
    fn default() -> Self {
        let options = IdsOptions::default();
        IdsConfig {
            cluster: String::new(),
            prefetch: options.prefetch,
            min_step: options.min_step,
            max_step: options.max_step,
            segment_duration_ms: options.segment_duration.as_millis() as u64,
            max_count: options.max_count,
            tags: Vec::new(),
            snowflake: SnowflakeConfig::default(),
        }
    }
}

/// A biz tag to create at start-up.
///
/// ```yaml
/// { name: order, step: 1000, start: 1, description: order numbers }
/// ```
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct IdTagConfig {
    /// Tag name: letters, digits, `_`, `-`, `.` and `:`, at most 128.
    pub name: String,
    /// First segment length (the adaptive step starts here).
    #[serde(default = "default_step")]
    pub step: i64,
    /// First ID of the tag.
    #[serde(default = "default_start")]
    pub start: i64,
    /// What the IDs are for.
    #[serde(default)]
    pub description: String,
}

fn default_step() -> i64 {
    1000
}

fn default_start() -> i64 {
    1
}

/// Snowflake IDs: 1 sign bit, 41 bits of milliseconds since `epoch_ms`
/// (the top two are the layout version bits and stay 0, so IDs are issued
/// for 17.4 years from the epoch), 10 bits of worker id, 12 bits of
/// sequence.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SnowflakeConfig {
    /// Take a worker id and serve snowflake IDs.
    ///
    /// ```yaml
    /// enabled: true
    /// ```
    pub enabled: bool,
    /// The epoch of the time bits, in Unix milliseconds (default
    /// 2024-01-01T00:00:00Z). Never change it for a running system.
    ///
    /// ```yaml
    /// epoch_ms: 1704067200000
    /// ```
    pub epoch_ms: i64,
    /// How long a worker id lease lasts without renewal; a worker id whose
    /// lease expired is given to the next gateway that needs one.
    ///
    /// ```yaml
    /// worker_lease_ms: 600000
    /// ```
    pub worker_lease_ms: u64,
    /// File caching the leased worker id and the last issued time, so a
    /// restart works while the database is down (empty:
    /// `<data>/snowflake-worker.json`).
    ///
    /// ```yaml
    /// cache: /var/lib/cellgate/snowflake-worker.json
    /// ```
    pub cache: String,
}

impl Default for SnowflakeConfig {
    fn default() -> Self {
        let options = IdsOptions::default();
        SnowflakeConfig {
            enabled: options.snowflake,
            epoch_ms: options.epoch_ms,
            worker_lease_ms: options.worker_lease.as_millis() as u64,
            cache: String::new(),
        }
    }
}

impl IdsConfig {
    /// The allocator settings; `data` is the data directory, home of the
    /// default worker cache.
    pub fn options(&self, data: Option<&Path>) -> cellgate_store::ids::IdsOptions {
        let cache = if !self.snowflake.cache.is_empty() {
            Some(PathBuf::from(&self.snowflake.cache))
        } else {
            data.map(|d| d.join("snowflake-worker.json"))
        };
        cellgate_store::ids::IdsOptions {
            cluster: (!self.cluster.is_empty()).then(|| self.cluster.clone()),
            prefetch: self.prefetch,
            min_step: self.min_step.max(1),
            max_step: self.max_step.max(self.min_step.max(1)),
            segment_duration: std::time::Duration::from_millis(self.segment_duration_ms.max(1)),
            max_count: self.max_count.max(1),
            tags: self
                .tags
                .iter()
                .map(|t| cellgate_store::ids::NewTag {
                    name: t.name.clone(),
                    start: t.start,
                    step: t.step,
                    description: t.description.clone(),
                })
                .collect(),
            snowflake: self.snowflake.enabled,
            epoch_ms: self.snowflake.epoch_ms,
            worker_lease: std::time::Duration::from_millis(self.snowflake.worker_lease_ms.max(100)),
            worker_cache: cache,
            clock: None,
            max_workers: cellgate_store::ids::MAX_WORKERS,
        }
    }
}

/// Authentication with API tokens (`Authorization: Bearer <token>`).
/// Tokens are made with `cellgate token create` and stored hashed in the
/// first cluster, or listed here by their hash.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Whether requests need a token. Unset (the default): on when the
    /// gateway listens on a non-loopback address, off on 127.0.0.1/::1.
    /// `cellgate serve --auth on|off` overrides it.
    ///
    /// ```yaml
    /// enabled: true
    /// ```
    pub enabled: Option<bool>,
    /// Tokens given by their hash (`cellgate token create --no-store`
    /// prints one), for deployments configured from a repository.
    ///
    /// ```yaml
    /// tokens:
    ///   - name: dashboards
    ///     hash: "sha256:6b3a55e0261b0304143f805a24924d0c1c44524821305f31d9277843b8a10f4e"
    ///     scopes: ["trips:read", "payments:read"]
    /// ```
    pub tokens: Vec<ConfigToken>,
    /// Whether `GET /metrics` needs a token with a `*` scope (metrics
    /// name every datastore) when auth is on.
    ///
    /// ```yaml
    /// protect_metrics: true
    /// ```
    pub protect_metrics: bool,
    /// Whether introspection (`__schema`, `__type`) is answered. With auth
    /// on it needs a valid token of any scope.
    ///
    /// ```yaml
    /// introspection: true
    /// ```
    pub introspection: bool,
    /// Whether the GraphiQL playground (`/`) and the explorer (`/ui/`) are
    /// served.
    ///
    /// ```yaml
    /// playground: true
    /// ```
    pub playground: bool,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            enabled: None,
            tokens: Vec::new(),
            protect_metrics: true,
            introspection: true,
            playground: true,
        }
    }
}

impl AuthConfig {
    /// Whether auth is on for a gateway listening on `listen`.
    pub fn enabled_for(&self, listen: SocketAddr) -> bool {
        self.enabled.unwrap_or(!listen.ip().is_loopback())
    }
}

/// Cross-origin resource sharing for `/graphql`, and the origins whose
/// pages may open `/graphql/ws`. No other origin is allowed by default:
/// browsers then refuse pages of other origins to read answers, and the
/// gateway refuses their WebSocket upgrades (403 `ORIGIN_NOT_ALLOWED`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CorsConfig {
    /// Origins whose pages may call the API and open its WebSocket, exactly
    /// as browsers send them (`https://app.example.com`), or `"*"` for any.
    /// The gateway's own origin (its pages) needs no entry.
    ///
    /// ```yaml
    /// allowed_origins: ["https://app.example.com"]
    /// ```
    pub allowed_origins: Vec<String>,
    /// Whether browsers may send credentials (cookies, HTTP auth) with
    /// cross-origin requests. Tokens in `Authorization` do not need it. Not
    /// allowed together with `"*"`, which the CORS spec forbids.
    ///
    /// ```yaml
    /// allow_credentials: false
    /// ```
    pub allow_credentials: bool,
    /// How long browsers may cache a preflight answer, in seconds.
    ///
    /// ```yaml
    /// max_age_seconds: 600
    /// ```
    pub max_age_seconds: u32,
}

impl Default for CorsConfig {
    fn default() -> Self {
        CorsConfig {
            allowed_origins: Vec::new(),
            allow_credentials: false,
            max_age_seconds: 600,
        }
    }
}

/// The `Host` names the gateway answers to, against DNS rebinding: a web
/// page on `evil.example` can point its own name at 127.0.0.1 and then
/// read a loopback gateway through the visitor's browser, with the
/// `Host: evil.example` header. Requests naming a host that is not allowed
/// get 403 `HOST_NOT_ALLOWED`.
///
/// Always allowed: IP addresses (a rebinding page cannot send one as its
/// host), `localhost` and names under `.localhost`, and requests without a
/// `Host`. Other names must be listed, unless auth is on and the list is
/// empty: with auth on a browser holds no token for such a page to use.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Host names (without port) the gateway answers to besides the ones
    /// always allowed; a leading dot allows every name under a domain
    /// (`.example.com`), `"*"` allows any host.
    ///
    /// ```yaml
    /// allowed_hosts: [cellgate.internal, .example.com]
    /// ```
    pub allowed_hosts: Vec<String>,
}

/// Index maintenance: several gateways on one store share the work through
/// leases on buckets of shards.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct IndexesConfig {
    /// Whether this gateway maintains indexes. A gateway that does not
    /// still serves queries and reports the index lag in `/metrics`.
    ///
    /// ```yaml
    /// maintain: true
    /// ```
    pub maintain: bool,
    /// How long a gateway holds its buckets of shards without renewing
    /// them; when one stops, the others take its shards over within this
    /// time.
    ///
    /// ```yaml
    /// lease_time_ms: 10000
    /// ```
    pub lease_time_ms: u64,
    /// How often every shard's log head is compared with the index offsets
    /// (picks up work of other gateways and anything missed).
    ///
    /// ```yaml
    /// sweep_interval_ms: 1000
    /// ```
    pub sweep_interval_ms: u64,
    /// Failed attempts after which an index entry is moved to the
    /// quarantine so its shard keeps flowing.
    ///
    /// ```yaml
    /// quarantine_after: 3
    /// ```
    pub quarantine_after: u32,
    /// Maintenance passes a gateway runs at once per datastore and cluster,
    /// over disjoint groups of shards (0: 2 on SQLite, 4 on a server).
    ///
    /// ```yaml
    /// concurrent_passes: 0
    /// ```
    pub concurrent_passes: usize,
    /// Every this many hours, a sampled verify compares the entries of
    /// `verify_sample_shards` random shards of each datastore with their
    /// cells and counts the drift in `/metrics`
    /// (`cellgate_index_drift_total`); 0 turns it off. A full verify and
    /// repair is `cellgate index verify` / `repair`.
    ///
    /// ```yaml
    /// verify_every_hours: 6
    /// ```
    pub verify_every_hours: f64,
    /// Shards a scheduled verify compares.
    ///
    /// ```yaml
    /// verify_sample_shards: 64
    /// ```
    pub verify_sample_shards: u32,
}

impl Default for IndexesConfig {
    fn default() -> Self {
        let defaults = cellgate_store::indexes::MaintainerOptions::default();
        IndexesConfig {
            maintain: true,
            lease_time_ms: defaults.lease_time.as_millis() as u64,
            sweep_interval_ms: defaults.sweep_every.as_millis() as u64,
            quarantine_after: defaults.quarantine_after,
            concurrent_passes: defaults.passes,
            verify_every_hours: defaults
                .verify_every
                .map_or(0.0, |d| d.as_secs_f64() / 3600.0),
            verify_sample_shards: defaults.verify_sample,
        }
    }
}

impl IndexesConfig {
    /// The maintainer settings.
    pub fn maintainer(&self) -> cellgate_store::indexes::MaintainerOptions {
        cellgate_store::indexes::MaintainerOptions {
            lease_time: std::time::Duration::from_millis(self.lease_time_ms.max(100)),
            sweep_every: std::time::Duration::from_millis(self.sweep_interval_ms.max(10)),
            quarantine_after: self.quarantine_after.max(1),
            passes: self.concurrent_passes.min(64),
            verify_every: (self.verify_every_hours.is_finite() && self.verify_every_hours > 0.0)
                .then(|| {
                    std::time::Duration::from_secs_f64((self.verify_every_hours * 3600.0).max(1.0))
                }),
            verify_sample: self.verify_sample_shards.max(1),
            ..cellgate_store::indexes::MaintainerOptions::default()
        }
    }
}

/// Default address of `cellgate serve`.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)), 8080);

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: DEFAULT_LISTEN,
            data: PathBuf::from("./data"),
            datastores: PathBuf::from("./datastores"),
            storage: StorageConfig::default(),
            limits: LimitsConfig::default(),
            indexes: IndexesConfig::default(),
            metrics: MetricsConfig::default(),
            auth: AuthConfig::default(),
            cors: CorsConfig::default(),
            http: HttpConfig::default(),
            graphql: GraphqlConfig::default(),
            telemetry: TelemetryConfig::default(),
            ids: IdsConfig::default(),
            triggers: TriggersConfig::default(),
        }
    }
}

impl Config {
    /// Parses a `cellgate.yaml` text; `origin` names it in the error.
    pub fn from_yaml(text: &str, origin: &Path) -> cellgate_store::Result<Config> {
        serde_saphyr::from_str::<Config>(text).map_err(|e| {
            cellgate_store::Error::Config(format!("invalid file {}: {e}", origin.display()))
        })
    }

    /// Reads and parses a `cellgate.yaml` file.
    pub fn load(path: &Path) -> cellgate_store::Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            cellgate_store::Error::Config(format!("cannot read {}: {e}", path.display()))
        })?;
        Config::from_yaml(&text, path)
    }
}

/// Admission control of the HTTP gateway: requests beyond a limit are
/// answered at once with an error code instead of queueing.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest accepted request body in bytes; larger ones get 413
    /// `PAYLOAD_TOO_LARGE`.
    ///
    /// ```yaml
    /// max_body_bytes: 1048576
    /// ```
    pub max_body_bytes: usize,
    /// Deepest selection nesting of a GraphQL query. Introspection
    /// (`__schema`, `__type`) counts toward neither this nor
    /// `max_complexity`; it has fixed bounds of its own.
    ///
    /// ```yaml
    /// max_depth: 12
    /// ```
    pub max_depth: usize,
    /// Largest GraphQL query cost. Each selected field costs 1, and what
    /// a list field selects is multiplied by how many items it may return:
    /// its `first` or `limit` argument (or default), or the number of
    /// `rowKeys` of `rows`.
    ///
    /// ```yaml
    /// max_complexity: 25000
    /// ```
    pub max_complexity: usize,
    /// Most aliased fields in one operation.
    ///
    /// ```yaml
    /// max_aliases: 32
    /// ```
    pub max_aliases: usize,
    /// Most fragment spreads expanded in one operation (each spread counts
    /// every time it is expanded), checked before validation.
    ///
    /// ```yaml
    /// max_fragment_spreads: 500
    /// ```
    pub max_fragment_spreads: usize,
    /// Longest `filter` string of an index query, in bytes.
    ///
    /// ```yaml
    /// max_filter_bytes: 4096
    /// ```
    pub max_filter_bytes: usize,
    /// Most comparisons in one `filter` string.
    ///
    /// ```yaml
    /// max_filter_terms: 64
    /// ```
    pub max_filter_terms: usize,
    /// Most values in one `in` list of an index query's `where`.
    ///
    /// ```yaml
    /// max_in_values: 1000
    /// ```
    pub max_in_values: usize,
    /// Longest time, in milliseconds, a GraphQL request may execute; then
    /// its work is cancelled and it is answered 504 `TIMEOUT`.
    ///
    /// ```yaml
    /// request_timeout_ms: 30000
    /// ```
    pub request_timeout_ms: u64,
    /// Longest time, in milliseconds, a client may take to send the
    /// headers of a request; then the connection is closed.
    ///
    /// ```yaml
    /// header_timeout_ms: 10000
    /// ```
    pub header_timeout_ms: u64,
    /// Longest time, in milliseconds, a client may take to send a request
    /// body; then it is answered 408 `BODY_TIMEOUT`, or 413
    /// `PAYLOAD_TOO_LARGE` if what arrived is already over
    /// `max_body_bytes`. Bodies are read before a request takes one of
    /// `max_concurrent_requests`.
    ///
    /// ```yaml
    /// body_timeout_ms: 10000
    /// ```
    pub body_timeout_ms: u64,
    /// Open connections accepted from one client IP address; more are
    /// closed at once (0 = no limit).
    ///
    /// ```yaml
    /// max_connections_per_client: 256
    /// ```
    pub max_connections_per_client: usize,
    /// After SIGTERM or Ctrl-C, how long, in milliseconds, requests in
    /// flight may finish before the process exits anyway.
    ///
    /// ```yaml
    /// shutdown_grace_ms: 10000
    /// ```
    pub shutdown_grace_ms: u64,
    /// GraphQL requests executed at once; one more gets 503 `OVERLOADED`
    /// immediately (0 = no limit).
    ///
    /// ```yaml
    /// max_concurrent_requests: 256
    /// ```
    pub max_concurrent_requests: usize,
    /// GraphQL requests per second accepted from one client IP address
    /// (bursts of the same size allowed); more get 429 `RATE_LIMITED`
    /// (0 = no limit).
    ///
    /// ```yaml
    /// rate_limit_per_second: 1000
    /// ```
    pub rate_limit_per_second: u32,
    /// How much of an IPv6 address names one client for the per-address
    /// rate and connection limits: the leading bits kept, 1 to 128. A host
    /// is usually given a whole /64, so a longer prefix lets one client
    /// escape the limits by changing addresses.
    ///
    /// ```yaml
    /// client_ipv6_prefix: 64
    /// ```
    pub client_ipv6_prefix: u8,
    /// GraphQL requests per second accepted with one API token (bursts of
    /// the same size), in addition to the per-address rate; more get 429
    /// `RATE_LIMITED` with `Retry-After` (0 = no limit).
    ///
    /// ```yaml
    /// rate_limit_per_token_per_second: 1000
    /// ```
    pub rate_limit_per_token_per_second: u32,
    /// Bytes of GraphQL document text whose parsed form is kept, so that a
    /// document sent again is not parsed again (0 = parse every request).
    /// Documents are cached by their exact text; the variables may differ.
    ///
    /// ```yaml
    /// document_cache_bytes: 16777216
    /// ```
    pub document_cache_bytes: u64,
    /// Subscriptions one `/graphql/ws` connection may run at once; one
    /// more is answered with an `error` message `SUBSCRIPTION_LIMIT`.
    ///
    /// ```yaml
    /// max_subscriptions_per_connection: 100
    /// ```
    pub max_subscriptions_per_connection: usize,
    /// Subscriptions one client (API token, or IP address with auth off)
    /// may run at once over all its connections; more are answered like
    /// the per-connection limit.
    ///
    /// ```yaml
    /// max_subscriptions_per_client: 1000
    /// ```
    pub max_subscriptions_per_client: usize,
    /// How often, in milliseconds, the shard counters of a datastore with
    /// subscribers are read to find cells committed by other gateways
    /// (commits of this gateway are pushed at once).
    ///
    /// ```yaml
    /// subscription_sweep_ms: 300
    /// ```
    pub subscription_sweep_ms: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let graphql = GraphqlLimits::default();
        LimitsConfig {
            max_body_bytes: 1024 * 1024,
            max_depth: graphql.depth,
            max_complexity: graphql.complexity,
            max_aliases: graphql.aliases,
            max_fragment_spreads: graphql.fragment_spreads,
            max_filter_bytes: graphql.filter_bytes,
            max_filter_terms: graphql.filter_terms,
            max_in_values: graphql.in_values,
            request_timeout_ms: 30_000,
            header_timeout_ms: 10_000,
            body_timeout_ms: 10_000,
            max_connections_per_client: 256,
            shutdown_grace_ms: 10_000,
            max_concurrent_requests: 256,
            rate_limit_per_second: 1000,
            client_ipv6_prefix: 64,
            rate_limit_per_token_per_second: 1000,
            document_cache_bytes: 16 * 1024 * 1024,
            max_subscriptions_per_connection: 100,
            max_subscriptions_per_client: 1000,
            subscription_sweep_ms: 300,
        }
    }
}

impl LimitsConfig {
    /// The limits the GraphQL schema enforces.
    pub fn graphql(&self) -> GraphqlLimits {
        GraphqlLimits {
            depth: self.max_depth,
            complexity: self.max_complexity,
            aliases: self.max_aliases,
            fragment_spreads: self.max_fragment_spreads,
            filter_bytes: self.max_filter_bytes,
            filter_terms: self.max_filter_terms,
            in_values: self.max_in_values,
        }
    }
}

/// What `GET /metrics` reports. Operation names are chosen by clients, so
/// only a bounded set of them gets its own series in
/// `cellgate_graphql_requests_total`; requests under any other name are
/// counted as `operation="other"`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Operation names (the GraphQL `operationName`) that always get their
    /// own series, e.g. those of the persisted queries of your clients.
    ///
    /// ```yaml
    /// operations: [TripsByDriver, PutTripStatus]
    /// ```
    pub operations: Vec<String>,
    /// How many other distinct operation names get their own series, first
    /// come, first served; later ones are counted as `other` (0: listed
    /// names only). Series are never dropped, so this bounds the size of
    /// `/metrics`.
    ///
    /// ```yaml
    /// max_operations: 20
    /// ```
    pub max_operations: usize,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            operations: Vec::new(),
            max_operations: 20,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_config_is_the_default() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cellgate.example.yaml");
        let text = std::fs::read_to_string(&path).expect("cellgate.example.yaml");
        let config = Config::from_yaml(&text, &path).expect("reference config parses");
        assert_eq!(config, Config::default());
    }

    #[test]
    fn unknown_config_keys_are_errors() {
        let error = Config::from_yaml("limits:\n  max_bodybytes: 10\n", Path::new("cellgate.yaml"))
            .unwrap_err();
        assert!(format!("{error:#}").contains("max_bodybytes"), "{error:#}");
    }

    #[test]
    fn auth_is_on_by_default_off_loopback_only() {
        let auto = AuthConfig::default();
        assert!(!auto.enabled_for(DEFAULT_LISTEN));
        assert!(!auto.enabled_for("[::1]:8080".parse().unwrap()));
        assert!(auto.enabled_for("0.0.0.0:8080".parse().unwrap()));
        assert!(auto.enabled_for("10.1.2.3:8080".parse().unwrap()));
        let off = AuthConfig {
            enabled: Some(false),
            ..AuthConfig::default()
        };
        assert!(!off.enabled_for("0.0.0.0:8080".parse().unwrap()));
        let on = AuthConfig {
            enabled: Some(true),
            ..AuthConfig::default()
        };
        assert!(on.enabled_for(DEFAULT_LISTEN));
    }
}
