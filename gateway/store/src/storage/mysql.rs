//! MySQL and MariaDB storage nodes.
//!
//! UUIDs are `BINARY(16)`, datetimes `DATETIME(6)` in UTC (sqlx sets the
//! session time zone to `+00:00`), text uses the binary `utf8mb4_bin`
//! collation so ordering matches byte order on every backend.

use sqlx::mysql::MySqlConnectOptions;
use sqlx::{MySql, Row as _};
use std::str::FromStr;

use super::value::uuid_from_bytes;
use super::{sqlx_backend, ColType, ConnectOptions, Dialect, Value};

sqlx_backend!(MySqlBackend, MySqlTx, MySql, Dialect::MySql, None);

impl MySqlBackend {
    /// A pool of its own serves index maintenance on a server
    /// (`storage.maintenance_connections`).
    fn lane(&self) -> Option<std::sync::Arc<dyn super::Backend>> {
        None
    }

    /// Nothing to do before the writer closes.
    async fn closing(_writer: &super::pool::Pool<MySql>, _background: bool) {}

    pub async fn connect(url: &str, options: &ConnectOptions) -> crate::Result<Self> {
        let url = url.replacen("mariadb:", "mysql:", 1);
        let connect = MySqlConnectOptions::from_str(&url)
            .map_err(|e| crate::Error::Config(format!("invalid mysql url: {e}")))?
            .charset("utf8mb4")
            .statement_cache_capacity(1024);
        let connect = if options.background {
            sqlx::ConnectOptions::disable_statement_logging(connect)
        } else {
            connect
        };
        let pool = super::pool::Pool::new(
            connect,
            options.max_connections,
            options.acquire_timeout,
            Some(options.statement_timeout),
        );
        Ok(MySqlBackend {
            writer: pool.clone(),
            reader: pool,
            cluster: options.cluster.clone(),
            statement_timeout: Some(options.statement_timeout),
            statements: Default::default(),
            stop: Default::default(),
            first: false,
            background: options.background,
        })
    }
}

fn bind<'q>(
    query: sqlx::query::Query<'q, MySql, sqlx::mysql::MySqlArguments>,
    value: &'q Value,
) -> sqlx::query::Query<'q, MySql, sqlx::mysql::MySqlArguments> {
    match value {
        Value::Null(_) => query.bind(None::<i64>),
        Value::Bool(v) => query.bind(*v),
        Value::Int(v) => query.bind(*v),
        Value::Float(v) => query.bind(*v),
        Value::Text(v) => query.bind(v.as_str()),
        Value::Bytes(v) => query.bind(v.as_slice()),
        Value::Uuid(v) => query.bind(v.as_bytes().as_slice()),
        // As a DATETIME: sqlx sends `DateTime<Utc>` as a TIMESTAMP, whose
        // range ends in 2038, and the server turns later values into NULL.
        Value::DateTime(v) => query.bind(v.naive_utc()),
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

fn decode(row: &sqlx::mysql::MySqlRow, i: usize, ty: ColType) -> Result<Value, sqlx::Error> {
    let null = Value::Null(ty);
    Ok(match ty {
        ColType::Bool => row.try_get::<Option<bool>, _>(i)?.map_or(null, Value::Bool),
        ColType::Int => row.try_get::<Option<i64>, _>(i)?.map_or(null, Value::Int),
        ColType::Float => row.try_get::<Option<f64>, _>(i)?.map_or(null, Value::Float),
        // Binary-collated text reaches the driver flagged as VARBINARY.
        ColType::Text => match row.try_get_unchecked::<Option<Vec<u8>>, _>(i)? {
            None => null,
            Some(bytes) => {
                Value::Text(String::from_utf8(bytes).map_err(|e| sqlx::Error::Decode(Box::new(e)))?)
            }
        },
        ColType::Bytes => row
            .try_get::<Option<Vec<u8>>, _>(i)?
            .map_or(null, Value::Bytes),
        ColType::Uuid => uuid_from_bytes(row.try_get(i)?)?,
        ColType::DateTime => row
            .try_get::<Option<chrono::DateTime<chrono::Utc>>, _>(i)?
            .map_or(null, Value::DateTime),
    })
}
