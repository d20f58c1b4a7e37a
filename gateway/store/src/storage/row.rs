//! Typed rows at the storage boundary, after sqlx's `FromRow`: a query
//! names the Rust types of its columns, and gets them decoded, instead of
//! destructuring `Vec<Value>` by position at every call site.
//!
//! ```ignore
//! let leases: Vec<(String, i64, Option<DateTime<Utc>>)> = backend.rows(&sql).await?;
//! ```
//!
//! A column type comes from [`FromValue::TYPE`] (so the backend decodes
//! it as such: a UUID from `BINARY(16)` on MySQL, a `BLOB` on SQLite);
//! `Option<T>` takes a NULL. A value of another type is a bug of the
//! statement, answered as [`Error::Internal`], never a panic.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{Backend, ColType, Row, Sql, Tx, Value};
use crate::error::{Error, Result};

/// A Rust type one column decodes into.
pub trait FromValue: Sized {
    /// The column type the backend decodes the column as.
    const TYPE: ColType;

    /// The value, or `None` when it is not of this type.
    fn from_value(value: Value) -> Option<Self>;
}

macro_rules! from_value {
    ($ty:ty, $col:ident, $variant:ident) => {
        impl FromValue for $ty {
            const TYPE: ColType = ColType::$col;
            fn from_value(value: Value) -> Option<Self> {
                match value {
                    Value::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}

from_value!(bool, Bool, Bool);
from_value!(i64, Int, Int);
from_value!(f64, Float, Float);
from_value!(String, Text, Text);
from_value!(Vec<u8>, Bytes, Bytes);
from_value!(Uuid, Uuid, Uuid);
from_value!(DateTime<Utc>, DateTime, DateTime);

impl<T: FromValue> FromValue for Option<T> {
    const TYPE: ColType = T::TYPE;
    fn from_value(value: Value) -> Option<Self> {
        match value {
            Value::Null(_) => Some(None),
            value => T::from_value(value).map(Some),
        }
    }
}

/// A row decoded into a tuple of [`FromValue`]s, one per column.
pub trait FromRow: Sized {
    /// The column types, in order.
    const TYPES: &'static [ColType];

    /// The row, or `None` when it does not have these types.
    fn from_row(row: Row) -> Option<Self>;
}

macro_rules! from_row {
    ($($name:ident),+) => {
        impl<$($name: FromValue),+> FromRow for ($($name,)+) {
            const TYPES: &'static [ColType] = &[$($name::TYPE),+];
            fn from_row(row: Row) -> Option<Self> {
                let mut values = row.into_iter();
                let row = ($($name::from_value(values.next()?)?,)+);
                values.next().is_none().then_some(row)
            }
        }
    };
}

from_row!(A);
from_row!(A, B);
from_row!(A, B, C);
from_row!(A, B, C, D);
from_row!(A, B, C, D, E);
from_row!(A, B, C, D, E, F);
from_row!(A, B, C, D, E, F, G);
from_row!(A, B, C, D, E, F, G, H);
from_row!(A, B, C, D, E, F, G, H, I);
from_row!(A, B, C, D, E, F, G, H, I, J);

/// Decodes every row of a result as `R`. Nothing of a row is formatted
/// unless it fails: a row holds bodies, and formatting each one cost the
/// reads of cells a fifth of their throughput.
pub fn decode<R: FromRow>(rows: Vec<Row>) -> Result<Vec<R>> {
    rows.into_iter()
        .map(|row| {
            let width = row.len();
            R::from_row(row).ok_or_else(|| {
                Error::Internal(format!(
                    "a row of {width} values did not have the types {:?}",
                    R::TYPES
                ))
            })
        })
        .collect()
}

impl dyn Backend + '_ {
    /// Whether the database has a table called `table`.
    pub async fn has_table(&self, table: &str) -> Result<bool> {
        Ok(!self
            .fetch(&self.dialect().table_exists(table), &[ColType::Text])
            .await?
            .is_empty())
    }

    /// Runs a query and decodes its rows as `R`.
    pub async fn rows<R: FromRow>(&self, sql: &Sql) -> Result<Vec<R>> {
        decode(self.fetch(sql, R::TYPES).await?)
    }

    /// Runs a query and decodes its first row as `R`, if it has one.
    pub async fn first_row<R: FromRow>(&self, sql: &Sql) -> Result<Option<R>> {
        Ok(self.rows(sql).await?.into_iter().next())
    }
}

impl dyn Tx + '_ {
    /// Runs a query in the transaction and decodes its rows as `R`.
    pub async fn rows<R: FromRow>(&mut self, sql: &Sql) -> Result<Vec<R>> {
        decode(self.fetch(sql, R::TYPES).await?)
    }

    /// Runs a query in the transaction and decodes its first row as `R`,
    /// if it has one.
    pub async fn first_row<R: FromRow>(&mut self, sql: &Sql) -> Result<Option<R>> {
        Ok(self.rows(sql).await?.into_iter().next())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuples_decode_by_type_and_nulls_only_into_options() {
        let at = Utc::now();
        let id = Uuid::new_v4();
        let rows = vec![vec![
            Value::Text("a".into()),
            Value::Int(7),
            Value::Null(ColType::DateTime),
            Value::Uuid(id),
        ]];
        let decoded: Vec<(String, i64, Option<DateTime<Utc>>, Uuid)> =
            decode(rows.clone()).unwrap();
        assert_eq!(decoded, vec![("a".to_string(), 7, None, id)]);
        assert_eq!(
            <(String, i64, Option<DateTime<Utc>>, Uuid)>::TYPES,
            &[
                ColType::Text,
                ColType::Int,
                ColType::DateTime,
                ColType::Uuid
            ]
        );
        // A NULL where a value is required, a wrong type, a wrong width.
        assert!(decode::<(String, i64, DateTime<Utc>, Uuid)>(rows.clone()).is_err());
        assert!(decode::<(String, String, Option<DateTime<Utc>>, Uuid)>(rows.clone()).is_err());
        assert!(decode::<(String, i64)>(rows).is_err());
        let present: Vec<(Option<DateTime<Utc>>,)> =
            decode(vec![vec![Value::DateTime(at)]]).unwrap();
        assert_eq!(present, vec![(Some(at),)]);
    }
}
