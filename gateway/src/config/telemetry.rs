//! The `telemetry` section of `cellgate.yaml`.

use serde::Deserialize;

/// OpenTelemetry traces, exported over OTLP/HTTP (protobuf). Off unless an
/// endpoint is given here or by `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` /
/// `OTEL_EXPORTER_OTLP_ENDPOINT`; `OTEL_SERVICE_NAME` and
/// `OTEL_TRACES_SAMPLER_ARG` override the name and the ratio.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The collector's base URL; `/v1/traces` is appended.
    ///
    /// ```yaml
    /// otlp_endpoint: http://127.0.0.1:4318
    /// ```
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the spans.
    ///
    /// ```yaml
    /// service_name: cellgate
    /// ```
    pub service_name: String,
    /// The share of traces started here that are recorded, 0 to 1; a
    /// request with a `traceparent` follows its caller's decision.
    ///
    /// ```yaml
    /// sampling_ratio: 1.0
    /// ```
    pub sampling_ratio: f64,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: None,
            service_name: "cellgate".to_string(),
            sampling_ratio: 1.0,
        }
    }
}
