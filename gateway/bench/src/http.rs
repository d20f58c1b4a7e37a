//! The HTTP side of the benchmark: GraphQL requests, `/readyz` and
//! `/metrics` of one gateway, whether this run started it or not.
//!
//! `/metrics` is read as plain Prometheus text with a small parser rather
//! than with a client library: the benchmark needs a handful of series, and
//! a gateway of another version may lack some of them, which must give
//! "not measured" rather than an error.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::{json, Value};

/// Longest wait for `/metrics` or `/readyz`.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The series the benchmark reads.
pub const STATEMENTS: &str = "cellgate_storage_statements_total";
pub const PENDING: &str = "cellgate_index_pending_cells";
pub const LAG_MAX_MS: &str = "cellgate_index_lag_max_ms";
pub const APPLIED: &str = "cellgate_index_applied_cells_total";

/// A GraphQL answer without errors.
pub struct Answer {
    pub data: Value,
    /// `extensions` (e.g. `servedBy`); `Null` when the answer has none.
    pub extensions: Value,
}

/// One gateway's endpoints and a client for them.
pub struct Gateway {
    client: reqwest::Client,
    /// `http://host:port` with any path prefix, without a trailing `/`.
    pub base: String,
    graphql: Arc<str>,
}

/// `base` as `http://host:port[/prefix]`, without `/graphql`.
fn normalized(base: &str) -> anyhow::Result<String> {
    let url = reqwest::Url::parse(base)
        .with_context(|| format!("invalid gateway URL `{base}` (expected http://HOST:PORT)"))?;
    anyhow::ensure!(
        url.scheme() == "http",
        "unsupported gateway URL `{base}`: only http:// is supported"
    );
    anyhow::ensure!(
        url.host_str().is_some() && url.query().is_none() && url.fragment().is_none(),
        "invalid gateway URL `{base}` (expected http://HOST:PORT)"
    );
    let path = url.path().trim_end_matches('/');
    let path = path.strip_suffix("/graphql").unwrap_or(path);
    let authority = match url.port() {
        Some(port) => format!("{}:{port}", url.host_str().unwrap_or_default()),
        None => url.host_str().unwrap_or_default().to_string(),
    };
    Ok(format!("http://{authority}{path}"))
}

impl Gateway {
    /// A client for the gateway at `base`, which may end in `/graphql`,
    /// waiting at most `timeout` for a GraphQL answer.
    pub fn new(base: &str, concurrency: u32, timeout: Duration) -> anyhow::Result<Gateway> {
        Gateway::authenticated(base, concurrency, timeout, None)
    }

    /// Like [`Gateway::new`], sending `Authorization: Bearer <token>` with
    /// every request when a token is given.
    pub fn authenticated(
        base: &str,
        concurrency: u32,
        timeout: Duration,
        token: Option<&str>,
    ) -> anyhow::Result<Gateway> {
        let base = normalized(base)?;
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = token {
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
                .context("the token is not a valid header value")?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let client = reqwest::Client::builder()
            .default_headers(headers)
            .no_proxy()
            .pool_max_idle_per_host(concurrency as usize + 2)
            .tcp_nodelay(true)
            .connect_timeout(PROBE_TIMEOUT)
            .timeout(timeout)
            .build()
            .context("cannot build the HTTP client")?;
        Ok(Gateway {
            client,
            graphql: format!("{base}/graphql").into(),
            base,
        })
    }

    /// Sends one GraphQL request; `Ok` holds `data` of an answer without
    /// errors.
    pub async fn graphql(&self, query: &str, variables: Value) -> Result<Value, String> {
        self.graphql_answer(query, variables)
            .await
            .map(|answer| answer.data)
    }

    /// Like [`Gateway::graphql`], with the answer's `extensions` too.
    pub async fn graphql_answer(&self, query: &str, variables: Value) -> Result<Answer, String> {
        let response = self
            .client
            .post(&*self.graphql)
            .header(reqwest::header::ACCEPT, "application/json")
            .json(&json!({ "query": query, "variables": variables }))
            .send()
            .await
            .map_err(|e| format!("request failed: {}", chain(&e)))?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|e| format!("reading the answer failed: {}", chain(&e)))?;
        if status != reqwest::StatusCode::OK {
            let text = String::from_utf8_lossy(&body);
            return Err(format!("HTTP {status}: {}", truncate(&text, 300)));
        }
        let mut answer: Value =
            serde_json::from_slice(&body).map_err(|e| format!("the answer is not JSON: {e}"))?;
        if let Some(errors) = answer.get("errors").filter(|e| !e.is_null()) {
            return Err(format!(
                "GraphQL errors: {}",
                truncate(&errors.to_string(), 300)
            ));
        }
        let mut part = |name: &str| answer.get_mut(name).map(Value::take).unwrap_or(Value::Null);
        Ok(Answer {
            data: part("data"),
            extensions: part("extensions"),
        })
    }

    /// The status code of `GET /readyz`, or why there was none.
    pub async fn readyz(&self, timeout: Duration) -> Result<u16, String> {
        let response = self
            .client
            .get(format!("{}/readyz", self.base))
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| chain(&e))?;
        Ok(response.status().as_u16())
    }

    /// Reads `/metrics`.
    pub async fn metrics(&self) -> anyhow::Result<Metrics> {
        let url = format!("{}/metrics", self.base);
        let response = self
            .client
            .get(&url)
            .timeout(PROBE_TIMEOUT)
            .send()
            .await
            .with_context(|| format!("cannot read {url}"))?;
        anyhow::ensure!(
            response.status().is_success(),
            "{url} answered {}",
            response.status()
        );
        let text = response
            .text()
            .await
            .with_context(|| format!("cannot read {url}"))?;
        Ok(Metrics::parse(&text))
    }
}

/// An error with its causes, `outer: inner: …` (reqwest's own text names
/// only the outermost, e.g. "error sending request", not why).
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// `text` cut to at most `max` characters.
pub fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// One series of a scrape.
#[derive(Debug, Clone, PartialEq)]
struct Series {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

/// A scrape of `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    series: Vec<Series>,
}

impl Metrics {
    /// Parses the Prometheus/OpenMetrics text format; lines it does not
    /// understand are skipped.
    pub fn parse(text: &str) -> Metrics {
        let series = text
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(parse_line)
            .collect();
        Metrics { series }
    }

    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Series> + 'a {
        self.series.iter().filter(move |s| s.name == name)
    }

    /// The sum of every series of `name`; `None` when there is none.
    pub fn sum(&self, name: &str) -> Option<f64> {
        self.values(name).map(|s| s.value).reduce(|a, b| a + b)
    }

    /// The values of `name` by the value of its label `label`.
    pub fn by_label(&self, name: &str, label: &str) -> Vec<(String, f64)> {
        self.values(name)
            .filter_map(|s| {
                let (_, value) = s.labels.iter().find(|(k, _)| k == label)?;
                Some((value.clone(), s.value))
            })
            .collect()
    }

    /// The largest value of the series of `name`; `None` when there is none.
    pub fn max(&self, name: &str) -> Option<f64> {
        self.values(name).map(|s| s.value).reduce(f64::max)
    }
}

/// `name{label="value",…} value [timestamp]`.
fn parse_line(line: &str) -> Option<Series> {
    let line = line.trim();
    if line.is_empty() {
        return None;
    }
    let (name, labels, rest) = match line.find('{') {
        Some(open) => {
            let close = open + line[open..].rfind('}')?;
            (
                &line[..open],
                parse_labels(&line[open + 1..close])?,
                &line[close + 1..],
            )
        }
        None => {
            let (name, rest) = line.split_once(char::is_whitespace)?;
            (name, Vec::new(), rest)
        }
    };
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Series {
        name: name.trim().to_string(),
        labels,
        value,
    })
}

/// `a="x",b="y"` with `\"`, `\\` and `\n` escapes in the values.
fn parse_labels(text: &str) -> Option<Vec<(String, String)>> {
    let mut labels = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Some(labels);
        }
        let mut key = String::new();
        for c in chars.by_ref() {
            if c == '=' {
                break;
            }
            key.push(c);
        }
        if chars.next()? != '"' {
            return None;
        }
        let mut value = String::new();
        loop {
            match chars.next()? {
                '"' => break,
                '\\' => match chars.next()? {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                c => value.push(c),
            }
        }
        labels.push((key.trim().to_string(), value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_series_the_benchmark_needs() {
        let text = "# HELP cellgate_storage_statements SQL statements\n\
            # TYPE cellgate_storage_statements counter\n\
            cellgate_storage_statements_total{cluster=\"a\"} 10\n\
            cellgate_storage_statements_total{cluster=\"b\"} 5\n\
            cellgate_index_pending_cells{datastore=\"payments\"} 0\n\
            cellgate_index_pending_cells{datastore=\"trips\"} 1200\n\
            cellgate_index_lag_max_ms{datastore=\"trips\"} 350\n\
            cellgate_graphql_requests_total{operation=\"odd \\\"name\\\", {x}\",outcome=\"ok\"} 3\n\
            cellgate_uptime 1.5e3\n\
            # EOF\n";
        let metrics = Metrics::parse(text);
        assert_eq!(metrics.sum(STATEMENTS), Some(15.0));
        assert_eq!(metrics.sum(PENDING), Some(1200.0));
        assert_eq!(metrics.max(LAG_MAX_MS), Some(350.0));
        assert_eq!(metrics.sum(APPLIED), None);
        assert_eq!(metrics.sum("cellgate_uptime"), Some(1500.0));
        assert_eq!(
            metrics.by_label(PENDING, "datastore"),
            vec![("payments".to_string(), 0.0), ("trips".to_string(), 1200.0)]
        );
        let requests = metrics
            .values("cellgate_graphql_requests_total")
            .next()
            .unwrap();
        assert_eq!(
            requests.labels,
            vec![
                ("operation".to_string(), "odd \"name\", {x}".to_string()),
                ("outcome".to_string(), "ok".to_string())
            ]
        );
    }

    #[test]
    fn gateway_urls_are_normalized() {
        for given in [
            "http://127.0.0.1:8080",
            "http://127.0.0.1:8080/",
            "http://127.0.0.1:8080/graphql",
        ] {
            assert_eq!(
                Gateway::new(given, 1, PROBE_TIMEOUT).unwrap().base,
                "http://127.0.0.1:8080"
            );
        }
        assert!(Gateway::new("https://example.org", 1, PROBE_TIMEOUT).is_err());
        assert!(Gateway::new("127.0.0.1:8080", 1, PROBE_TIMEOUT).is_err());
    }
}
