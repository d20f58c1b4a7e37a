//! PostgreSQL storage nodes.
//!
//! Native `UUID`, `TIMESTAMPTZ`, `BOOLEAN` and `BYTEA` columns; text columns
//! use `COLLATE "C"` so ordering matches byte order on every backend. NULL
//! parameters are bound with their type, which PostgreSQL insists on.

use std::str::FromStr;

use sqlx::postgres::PgConnectOptions;
use sqlx::{Postgres, Row as _};

use super::{sqlx_backend, ColType, ConnectOptions, Dialect, Value};

sqlx_backend!(
    PostgresBackend,
    PostgresTx,
    Postgres,
    Dialect::Postgres,
    None
);

impl PostgresBackend {
    /// A pool of its own serves index maintenance on a server
    /// (`storage.maintenance_connections`).
    fn lane(&self) -> Option<std::sync::Arc<dyn super::Backend>> {
        None
    }

    /// Nothing to do before the writer closes.
    async fn closing(_writer: &super::pool::Pool<Postgres>, _background: bool) {}

    pub async fn connect(url: &str, options: &ConnectOptions) -> crate::Result<Self> {
        let connect = PgConnectOptions::from_str(url)
            .map_err(|e| crate::Error::Config(format!("invalid postgres url: {e}")))?
            .statement_cache_capacity(1024)
            // Every statement here is a short indexed one; JIT compilation
            // (triggered by the cost estimates of large `IN`/`VALUES`
            // lists) would add a hundred milliseconds or more to each.
            .options([("jit", "off")]);
        let connect = with_generic_plans(connect);
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
        Ok(PostgresBackend {
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

/// `plan_cache_mode=force_generic_plan`, unless the URL's `options`
/// choose a mode themselves.
///
/// Every statement is prepared once per connection and executed with new
/// values. By default PostgreSQL plans each execution again for its values
/// when the plan it would keep is estimated dearer than those, which for an
/// index page (a range and a residual filter under a `LIMIT`) it always is,
/// though both plans walk the same b-tree: the planning was a third of the
/// server's CPU for such a page. cellgate's statements are index range
/// scans whose b-tree the statement's shape decides, not its values; an
/// index with several sorted fields and a page that ranges on one and
/// sorts by another is where the values could matter, and
/// `?options=-c%20plan_cache_mode%3Dauto` in the URL restores the default.
fn with_generic_plans(connect: PgConnectOptions) -> PgConnectOptions {
    if connect
        .get_options()
        .is_some_and(|options| options.contains("plan_cache_mode"))
    {
        return connect;
    }
    connect.options([("plan_cache_mode", "force_generic_plan")])
}

fn bind<'q>(
    query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    value: &'q Value,
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    match value {
        Value::Null(ty) => match ty {
            ColType::Bool => query.bind(None::<bool>),
            ColType::Int => query.bind(None::<i64>),
            ColType::Float => query.bind(None::<f64>),
            ColType::Text => query.bind(None::<String>),
            ColType::Bytes => query.bind(None::<Vec<u8>>),
            ColType::Uuid => query.bind(None::<uuid::Uuid>),
            ColType::DateTime => query.bind(None::<chrono::DateTime<chrono::Utc>>),
        },
        Value::Bool(v) => query.bind(*v),
        Value::Int(v) => query.bind(*v),
        Value::Float(v) => query.bind(*v),
        Value::Text(v) => query.bind(v.as_str()),
        Value::Bytes(v) => query.bind(v.as_slice()),
        Value::Uuid(v) => query.bind(*v),
        Value::DateTime(v) => query.bind(*v),
        Value::Array(ty, values) => bind_array(query, *ty, values),
    }
}

/// Binds the values as one array of `ty`, NULL elements included (a value
/// of another type is bound as NULL; `Sql` builds arrays of one type).
fn bind_array<'q>(
    query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    ty: ColType,
    values: &'q [Value],
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    fn all<'q, T>(values: &'q [Value], get: impl Fn(&'q Value) -> Option<T>) -> Vec<Option<T>> {
        values.iter().map(get).collect()
    }
    match ty {
        ColType::Bool => query.bind(all(values, |v| match v {
            Value::Bool(b) => Some(*b),
            _ => None,
        })),
        ColType::Int => query.bind(all(values, Value::as_int)),
        ColType::Float => query.bind(all(values, |v| match v {
            Value::Float(f) => Some(*f),
            _ => None,
        })),
        ColType::Text => query.bind(all(values, Value::as_text)),
        ColType::Bytes => query.bind(all(values, |v| match v {
            Value::Bytes(b) => Some(b.as_slice()),
            _ => None,
        })),
        ColType::Uuid => query.bind(all(values, Value::as_uuid)),
        ColType::DateTime => query.bind(all(values, Value::as_datetime)),
    }
}

fn decode(row: &sqlx::postgres::PgRow, i: usize, ty: ColType) -> Result<Value, sqlx::Error> {
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
        ColType::Uuid => row
            .try_get::<Option<uuid::Uuid>, _>(i)?
            .map_or(null, Value::Uuid),
        ColType::DateTime => row
            .try_get::<Option<chrono::DateTime<chrono::Utc>>, _>(i)?
            .map_or(null, Value::DateTime),
    })
}
