//! The YAML shapes of definition files, exactly as written, with source positions.
//!
//! These structs mirror the files one to one and check nothing but structure: unknown keys are
//! rejected (`deny_unknown_fields`) and every value a later check may complain about is wrapped
//! in [`Spanned`] so the complaint can point at it. Turning them into domain types is the job of
//! `validate`, which is the only consumer.

use serde::Deserialize;
use serde_saphyr::Spanned;

/// `datastores/<name>/datastore.yaml`.
///
/// ```yaml
/// name: trips
/// shards: 4096
/// description: one row per trip
/// columns:
///   - name: BASE
///     description: the trip as requested
/// ```
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDatastore {
    /// The datastore name; must equal the directory name.
    ///
    /// ```yaml
    /// name: trips
    /// ```
    pub name: Spanned<String>,
    /// Number of logical shards, `1..=65536`, default 4096. Fixed at creation.
    ///
    /// ```yaml
    /// shards: 256
    /// ```
    #[serde(default)]
    pub shards: Option<Spanned<i64>>,
    /// Free text.
    ///
    /// ```yaml
    /// description: one row per trip
    /// ```
    #[serde(default)]
    pub description: Option<String>,
    /// The columns cells can be written to; at least one.
    ///
    /// ```yaml
    /// columns:
    ///   - name: BASE
    /// ```
    pub columns: Spanned<Vec<RawColumn>>,
}

/// One entry of `columns`.
///
/// ```yaml
/// - name: STATUS
///   description: status changes of the trip
/// ```
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawColumn {
    /// The column name.
    pub name: Spanned<String>,
    /// Free text.
    #[serde(default)]
    pub description: Option<String>,
}

/// `datastores/<datastore>/indexes/<table>.yaml`.
///
/// ```yaml
/// table: driver_partner_index
/// datastore: trips
/// shard_field: driver_partner_uuid
/// column_defs:
///   - column_key: BASE
///     fields:
///       - { field: driver_partner_uuid, type: UUID }
/// ```
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawIndex {
    /// The index name; must equal the file name without `.yaml`.
    ///
    /// ```yaml
    /// table: driver_partner_index
    /// ```
    pub table: Spanned<String>,
    /// The datastore indexed; must be the datastore whose directory holds the file.
    ///
    /// ```yaml
    /// datastore: trips
    /// ```
    pub datastore: Spanned<String>,
    /// Free text.
    ///
    /// ```yaml
    /// description: trips by driver
    /// ```
    #[serde(default)]
    pub description: Option<String>,
    /// The field (by name, or by path as written) whose value picks the shard. Defaults to the
    /// first field.
    ///
    /// ```yaml
    /// shard_field: city_uuid
    /// ```
    #[serde(default)]
    pub shard_field: Option<Spanned<String>>,
    /// Which fields to copy from which columns; at least one entry.
    ///
    /// ```yaml
    /// column_defs:
    ///   - column_key: BASE
    ///     fields:
    ///       - { field: city_uuid, type: UUID }
    /// ```
    pub column_defs: Spanned<Vec<RawColumnDef>>,
    /// Makes the index partial: only rows whose latest cells satisfy this filter have an entry.
    /// Names are fields of the index (by name or path), `<COLUMN>.<path>` into one of its
    /// columns, or, when the index reads one column, any path into that column's body.
    ///
    /// ```yaml
    /// where: status = "completed" and fare.total > 0
    /// ```
    #[serde(default, rename = "where")]
    pub predicate: Option<Spanned<String>>,
}

/// One entry of `column_defs`: the fields copied from one column's latest cell.
///
/// ```yaml
/// - column_key: BASE
///   fields:
///     - { field: fare.total, name: fare_total, type: float }
/// ```
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawColumnDef {
    /// The datastore column to read.
    pub column_key: Spanned<String>,
    /// The fields to copy; at least one.
    pub fields: Spanned<Vec<RawField>>,
}

/// One denormalized field.
///
/// ```yaml
/// { field: fare.total, name: fare_total, type: float }
/// ```
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawField {
    /// Dotted path into the cell's JSON body.
    pub field: Spanned<String>,
    /// The name in the index; defaults to the path with `.` replaced by `_`.
    #[serde(default)]
    pub name: Option<Spanned<String>>,
    /// One of `UUID`, `string`, `int`, `float`, `bool`, `datetime` (case-insensitive).
    #[serde(rename = "type")]
    pub ty: Spanned<String>,
    /// `false`: no b-tree on the field; it is stored, returned and filtered on, but pages
    /// cannot be ordered by it. Default `true`.
    #[serde(default)]
    pub sort: Option<Spanned<bool>>,
}

/// `datastores/<datastore>/triggers/<name>.yaml`: a webhook trigger.
///
/// ```yaml
/// name: trip_events
/// datastore: trips
/// columns: [BASE, STATUS]
/// filter: status = "completed" and fare.total > 0
/// webhook:
///   url: http://127.0.0.1:9000/hooks/trips
///   headers: { X-Team: dispatch, Authorization: "Bearer ${TRIP_HOOK_TOKEN}" }
///   secret_env: TRIP_HOOK_SECRET
///   timeout_ms: 5000
/// batch_size: 100
/// max_attempts: 5
/// ```
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTrigger {
    /// The trigger name, unique per datastore; must equal the file name without `.yaml`.
    ///
    /// ```yaml
    /// name: trip_events
    /// ```
    pub name: Spanned<String>,
    /// The datastore followed; must be the datastore whose directory holds the file.
    ///
    /// ```yaml
    /// datastore: trips
    /// ```
    pub datastore: Spanned<String>,
    /// The columns whose cells are delivered; at least one.
    ///
    /// ```yaml
    /// columns: [BASE, STATUS]
    /// ```
    pub columns: Spanned<Vec<Spanned<String>>>,
    /// Only cells whose body matches are posted, in the filter syntax of index queries with
    /// field names that are paths into the body. Cells that do not match are acknowledged.
    ///
    /// ```yaml
    /// filter: status = "completed" and fare.total > 0
    /// ```
    #[serde(default)]
    pub filter: Option<Spanned<String>>,
    /// Where and how cells are posted.
    pub webhook: RawWebhook,
    /// Most cells per POST, `1..=10000`; default 100.
    ///
    /// ```yaml
    /// batch_size: 100
    /// ```
    #[serde(default)]
    pub batch_size: Option<Spanned<i64>>,
    /// Failed attempts after which a cell is quarantined, `1..=1000`; default 5.
    ///
    /// ```yaml
    /// max_attempts: 5
    /// ```
    #[serde(default)]
    pub max_attempts: Option<Spanned<i64>>,
}

/// The `webhook:` of a trigger.
///
/// ```yaml
/// url: http://127.0.0.1:9000/hooks/trips
/// headers: { X-Team: dispatch }
/// secret_env: TRIP_HOOK_SECRET
/// timeout_ms: 5000
/// ```
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawWebhook {
    /// An `http://` or `https://` URL.
    pub url: Spanned<String>,
    /// Extra request headers; `${NAME}` in a value is replaced by environment variable `NAME`.
    #[serde(default)]
    pub headers: Option<std::collections::BTreeMap<String, Spanned<String>>>,
    /// The environment variable holding the HMAC-SHA256 secret; without it requests are not
    /// signed.
    #[serde(default)]
    pub secret_env: Option<Spanned<String>>,
    /// Request timeout, `1..=600000`; default 5000.
    #[serde(default)]
    pub timeout_ms: Option<Spanned<i64>>,
    /// A PEM file of certificate authorities trusted for this `https://` URL besides the
    /// system's (`SSL_CERT_FILE`/`SSL_CERT_DIR` are honoured too); a relative path is taken
    /// from the directory of the trigger's file.
    ///
    /// ```yaml
    /// ca_file: ../../certs/internal-ca.pem
    /// ```
    #[serde(default)]
    pub ca_file: Option<Spanned<String>>,
}
