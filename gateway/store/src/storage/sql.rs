//! SQL text per dialect: identifier quoting, placeholders and the few clauses
//! that differ between SQLite, MySQL/MariaDB and PostgreSQL.
//!
//! Statements are assembled with [`Sql`], which appends the dialect's
//! placeholder for every value and keeps the values beside the text, so a
//! value can never end up inside the SQL string. Identifiers come from
//! validated definitions (see `index-dsl`) and are quoted on top of that.

use super::value::{ColType, Value};

/// The SQL dialect a backend speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    Sqlite,
    MySql,
    Postgres,
}

impl Dialect {
    pub const ALL: [Dialect; 3] = [Dialect::Sqlite, Dialect::MySql, Dialect::Postgres];

    pub fn name(self) -> &'static str {
        match self {
            Dialect::Sqlite => "sqlite",
            Dialect::MySql => "mysql",
            Dialect::Postgres => "postgres",
        }
    }

    /// Quotes an identifier that has already been validated against
    /// `[A-Za-z_][A-Za-z0-9_]*`; quoting guards against reserved words.
    pub fn quote(self, ident: &str) -> String {
        let mut quoted = String::with_capacity(ident.len() + 2);
        self.quote_into(&mut quoted, ident);
        quoted
    }

    /// Appends `ident`, quoted as [`Dialect::quote`] quotes it, to `out`.
    fn quote_into(self, out: &mut String, ident: &str) {
        debug_assert!(ident
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_'));
        let quote = match self {
            Dialect::MySql => '`',
            Dialect::Sqlite | Dialect::Postgres => '"',
        };
        out.push(quote);
        out.push_str(ident);
        out.push(quote);
    }

    /// `FOR UPDATE` where the database has row locks; SQLite has a single
    /// writer, which already serializes write transactions.
    pub fn for_update(self) -> &'static str {
        match self {
            Dialect::Sqlite => "",
            Dialect::MySql | Dialect::Postgres => " FOR UPDATE",
        }
    }

    /// The conditions of an `UPDATE` of several rows whose other lockers
    /// take them in key order (`SELECT … ORDER BY key FOR UPDATE`) start
    /// with this, and [`Dialect::update_order`] ends the statement, so that
    /// the `UPDATE` takes their locks in that order too: two statements
    /// that lock the same rows in different orders can each wait for the
    /// other, a deadlock that PostgreSQL finds only after its
    /// `deadlock_timeout` (a second by default). PostgreSQL locks the rows
    /// of an `UPDATE` in the order its scan finds them, so they are locked
    /// first, in order, by `key IN (SELECT key FROM table WHERE key IN
    /// (…) ORDER BY key FOR UPDATE) AND `; nothing elsewhere.
    pub fn lock_in_order(
        self,
        sql: &mut Sql,
        table: &str,
        key: &str,
        keys: impl IntoIterator<Item = Value>,
    ) {
        if self == Dialect::Postgres {
            sql.ident(key)
                .push(" IN (SELECT ")
                .ident(key)
                .push(" FROM ")
                .ident(table)
                .push(" WHERE ")
                .ident(key)
                .in_list(keys)
                .push(" ORDER BY ")
                .ident(key)
                .push(" FOR UPDATE) AND ");
        }
    }

    /// Ends an `UPDATE` begun with [`Dialect::lock_in_order`]: ` ORDER BY
    /// key` on MySQL, which locks an `UPDATE`'s rows in the order it
    /// updates them; nothing elsewhere (SQLite has a single writer and no
    /// row locks).
    pub fn update_order(self, sql: &mut Sql, key: &str) {
        if self == Dialect::MySql {
            sql.push(" ORDER BY ").ident(key);
        }
    }

    /// Appends the database's clock, `before` earlier, in the form a
    /// `DateTime` column stores (microseconds since the epoch on SQLite):
    /// lease expiry is judged by the one clock every gateway shares, not by
    /// each gateway's own. The time is taken when the statement runs (not
    /// when its transaction began), so a check late in a transaction sees
    /// the time of the check.
    pub fn push_clock_minus(self, sql: &mut Sql, before: std::time::Duration) {
        let micros = i64::try_from(before.as_micros()).unwrap_or(i64::MAX);
        match self {
            Dialect::Sqlite => {
                sql.push("(CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER) - ")
                    .bind(Value::Int(micros))
                    .push(")");
            }
            Dialect::MySql => {
                sql.push("(UTC_TIMESTAMP(6) - INTERVAL ")
                    .bind(Value::Int(micros))
                    .push(" MICROSECOND)");
            }
            Dialect::Postgres => {
                sql.push("(clock_timestamp() - ")
                    .bind(Value::Int(micros))
                    .push(" * INTERVAL '1 microsecond')");
            }
        }
    }

    /// Most `OR`ed terms one statement carries: SQLite nests an `OR` chain
    /// into an expression tree at most 1000 deep; MariaDB's cost grows with
    /// the square of the terms (a log page over 1024 ranges took 915 ms as
    /// one statement, 4 × 29 ms as four of 256).
    pub fn max_or_terms(self) -> usize {
        match self {
            Dialect::Sqlite => 300,
            Dialect::MySql => 256,
            Dialect::Postgres => 2000,
        }
    }

    /// The verb of an `INSERT` that skips rows whose key exists; pair it
    /// with [`Dialect::on_conflict_do_nothing`].
    pub fn insert_ignore(self) -> &'static str {
        match self {
            Dialect::Sqlite => "INSERT OR IGNORE INTO ",
            Dialect::MySql => "INSERT IGNORE INTO ",
            Dialect::Postgres => "INSERT INTO ",
        }
    }

    /// The tail of an `INSERT` that skips rows whose key exists.
    pub fn on_conflict_do_nothing(self) -> &'static str {
        match self {
            Dialect::Postgres => " ON CONFLICT DO NOTHING",
            Dialect::Sqlite | Dialect::MySql => "",
        }
    }

    /// The tail of an `INSERT … VALUES …` that updates `updates` from the
    /// new row when a row with the same `key` exists.
    pub fn upsert(self, key: &[&str], updates: &[&str]) -> String {
        let quoted = |cols: &[&str]| {
            cols.iter()
                .map(|c| self.quote(c))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Dialect::MySql => format!(
                " ON DUPLICATE KEY UPDATE {}",
                updates
                    .iter()
                    .map(|c| format!("{0} = VALUES({0})", self.quote(c)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Dialect::Sqlite | Dialect::Postgres => format!(
                " ON CONFLICT ({}) DO UPDATE SET {}",
                quoted(key),
                updates
                    .iter()
                    .map(|c| format!("{0} = excluded.{0}", self.quote(c)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    /// A query returning one row when table `name` exists in the current
    /// database (schema, on PostgreSQL).
    pub fn table_exists(self, name: &str) -> Sql {
        let mut sql = Sql::new(self);
        match self {
            Dialect::Sqlite => {
                sql.push("SELECT name FROM sqlite_master WHERE type = 'table' AND name = ")
            }
            Dialect::MySql => sql.push(
                "SELECT table_name FROM information_schema.tables \
                 WHERE table_schema = DATABASE() AND table_name = ",
            ),
            Dialect::Postgres => sql.push(
                "SELECT table_name FROM information_schema.tables \
                 WHERE table_schema = current_schema() AND table_name = ",
            ),
        };
        sql.bind(Value::Text(name.to_string()));
        sql
    }

    /// A query listing the tables of the current database (schema, on
    /// PostgreSQL) whose names start with `prefix`.
    pub fn tables_with_prefix(self, prefix: &str) -> Sql {
        let pattern = format!(
            "{}%",
            prefix
                .replace('\\', "\\\\")
                .replace('%', "\\%")
                .replace('_', "\\_")
        );
        let mut sql = Sql::new(self);
        match self {
            Dialect::Sqlite => {
                sql.push("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE ")
                    .bind(Value::Text(pattern))
                    .push(" ESCAPE '\\'");
            }
            Dialect::MySql => {
                sql.push(
                    "SELECT table_name FROM information_schema.tables \
                     WHERE table_schema = DATABASE() AND table_name LIKE ",
                )
                .bind(Value::Text(pattern));
            }
            Dialect::Postgres => {
                sql.push(
                    "SELECT table_name FROM information_schema.tables \
                     WHERE table_schema = current_schema() AND table_name LIKE ",
                )
                .bind(Value::Text(pattern))
                .push(" ESCAPE '\\'");
            }
        }
        sql
    }

    /// Whether the backend is a file of this process (SQLite): one writer,
    /// no network between, so no circuit breaker and few concurrent passes.
    pub fn is_embedded(self) -> bool {
        self == Dialect::Sqlite
    }

    /// Whether a statement may carry arrays as parameters (`= ANY($n)`,
    /// `unnest`), so that its text does not depend on how many values it
    /// carries (PostgreSQL).
    pub fn binds_arrays(self) -> bool {
        self == Dialect::Postgres
    }

    /// Whether a `WITH` may hold `UPDATE … RETURNING` and an `INSERT` may
    /// read its rows (PostgreSQL): a write then locks, advances and inserts
    /// in one statement.
    pub fn has_data_modifying_ctes(self) -> bool {
        self == Dialect::Postgres
    }

    /// Whether a commit can notify other connections (`LISTEN/NOTIFY`,
    /// PostgreSQL): how gateways wake each other (`topology/wake.rs`).
    pub fn has_notify(self) -> bool {
        self == Dialect::Postgres
    }

    /// What turns a query into the database's plan of it: the prefix, the
    /// column types of the plan's rows, and the column of its text.
    pub fn explain(self) -> (&'static str, Vec<ColType>, usize) {
        match self {
            Dialect::Postgres => ("EXPLAIN ", vec![ColType::Text], 0),
            Dialect::MySql => ("EXPLAIN FORMAT=JSON ", vec![ColType::Text], 0),
            Dialect::Sqlite => (
                "EXPLAIN QUERY PLAN ",
                vec![ColType::Int, ColType::Int, ColType::Int, ColType::Text],
                3,
            ),
        }
    }

    /// Whether the backend has `LATERAL` joins (PostgreSQL): a subquery of
    /// the `FROM` clause that reads the tables before it, such as a pair's
    /// latest cell read with one backward step on the unique key.
    pub fn has_lateral_joins(self) -> bool {
        self == Dialect::Postgres
    }

    /// Whether a `DELETE` may read the table it deletes from in a subquery
    /// (MySQL refuses; there the statement joins the table with itself).
    pub fn deletes_with_subqueries_on_their_table(self) -> bool {
        self != Dialect::MySql
    }

    /// Whether `VALUES (…), (…)` can stand as a table in a `FROM` clause
    /// (MariaDB's cannot be aliased with column names; rows are then
    /// `SELECT … UNION ALL SELECT …`).
    pub fn has_values_tables(self) -> bool {
        self != Dialect::MySql
    }

    /// The operator that compares two values as equal when both are NULL.
    pub fn null_safe_eq(self) -> &'static str {
        match self {
            Dialect::Sqlite => " IS ",
            Dialect::Postgres => " IS NOT DISTINCT FROM ",
            Dialect::MySql => " <=> ",
        }
    }

    /// The type a `CAST` to a 64-bit integer names (a `SUM` of `BIGINT`s
    /// is a `NUMERIC` on PostgreSQL and a `DECIMAL` on MySQL).
    pub fn integer_cast(self) -> &'static str {
        match self {
            Dialect::MySql => "SIGNED",
            Dialect::Sqlite | Dialect::Postgres => "BIGINT",
        }
    }

    /// The query of what identifies the database server a connection
    /// reached as the master it is: another answer later means another
    /// server took its place (a replica promoted behind the same address).
    /// MySQL/MariaDB: host, port and `server_id` (which replication needs
    /// to differ); PostgreSQL: the timeline, which a promotion advances.
    /// `None` for an embedded file.
    pub fn master_identity_query(self) -> Option<&'static str> {
        match self {
            Dialect::MySql => Some("SELECT CONCAT(@@hostname, ':', @@port, '/', @@server_id)"),
            Dialect::Postgres => {
                Some("SELECT 'timeline ' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)")
            }
            Dialect::Sqlite => None,
        }
    }

    /// The database server's current time, as a `DateTime` column holds
    /// it (UTC; microseconds since the epoch on SQLite). Timestamps that
    /// one server writes and compares with its own clock do not depend on
    /// the clocks of the gateways that wrote and read them.
    pub fn now(self) -> &'static str {
        match self {
            Dialect::MySql => "UTC_TIMESTAMP(6)",
            Dialect::Postgres => "CURRENT_TIMESTAMP",
            Dialect::Sqlite => {
                "CAST(ROUND((julianday('now') - 2440587.5) * 86400000000) AS INTEGER)"
            }
        }
    }

    /// [`Dialect::now`] less `millis` milliseconds.
    pub fn now_minus_millis(self, millis: u64) -> String {
        match self {
            Dialect::MySql => format!(
                "(UTC_TIMESTAMP(6) - INTERVAL {} MICROSECOND)",
                millis * 1000
            ),
            Dialect::Postgres => format!("(CURRENT_TIMESTAMP - INTERVAL '{millis} milliseconds')"),
            Dialect::Sqlite => format!("({} - {})", self.now(), millis * 1000),
        }
    }

    /// The clause after a `LIKE` pattern that makes the backslash its
    /// escape character. MySQL's default escape character is already the
    /// backslash, and writing it in SQL text would need escaping of its own.
    pub fn like_escape(self) -> &'static str {
        match self {
            Dialect::MySql => "",
            Dialect::Sqlite | Dialect::Postgres => " ESCAPE '\\'",
        }
    }

    /// The query of the database server's buffer pool size in bytes, where
    /// its default is too small for a store (MySQL/MariaDB's InnoDB).
    pub fn buffer_pool_size_query(self) -> Option<&'static str> {
        (self == Dialect::MySql).then_some("SELECT CAST(@@innodb_buffer_pool_size AS SIGNED)")
    }

    /// The alias an `INSERT` gives its table where the backend takes one
    /// (` AS t`; MariaDB has none), so that [`Dialect::upsert_with`] can name
    /// the stored row.
    pub fn insert_alias(self) -> &'static str {
        match self {
            Dialect::MySql => "",
            Dialect::Sqlite | Dialect::Postgres => " AS t",
        }
    }

    /// The tail of an `INSERT INTO <table>` [`insert_alias`](Dialect::insert_alias)
    /// `(…) VALUES …` that, where a row with the same `key` exists, sets its
    /// columns as `assigns` say, and only where the new row is not older in
    /// any of `not_older` (a NULL stored value counts as older, a NULL new
    /// value as older than a stored one). MySQL applies assignments in
    /// order, each seeing the earlier ones: list the `not_older` columns
    /// last.
    pub fn upsert_with(self, key: &[&str], assigns: &[Assign<'_>], not_older: &[&str]) -> String {
        let q = |c: &str| self.quote(c);
        let guard = not_older
            .iter()
            .map(|c| {
                let (new, stored) = new_and_stored(self, c);
                format!("({stored} IS NULL OR ({new} IS NOT NULL AND {new} >= {stored}))")
            })
            .collect::<Vec<_>>()
            .join(" AND ");
        let sets = assigns
            .iter()
            .map(|assign| {
                let column = assign.column();
                let (new, stored) = new_and_stored(self, column);
                let value = match (assign, self) {
                    (Assign::New(_), _) => new,
                    (Assign::Greatest(_), Dialect::Sqlite) => format!("MAX({stored}, {new})"),
                    (Assign::Greatest(_), _) => format!("GREATEST({stored}, {new})"),
                    (Assign::Increment(_), _) => format!("{stored} + 1"),
                };
                match self {
                    Dialect::MySql if !guard.is_empty() => {
                        format!("{} = IF({guard}, {value}, {stored})", q(column))
                    }
                    _ => format!("{} = {value}", q(column)),
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
        match self {
            Dialect::MySql => format!(" ON DUPLICATE KEY UPDATE {sets}"),
            Dialect::Sqlite | Dialect::Postgres => {
                let key = key.iter().map(|c| q(c)).collect::<Vec<_>>().join(", ");
                let mut tail = format!(" ON CONFLICT ({key}) DO UPDATE SET {sets}");
                if !guard.is_empty() {
                    tail.push_str(&format!(" WHERE {guard}"));
                }
                tail
            }
        }
    }

    /// Ordering modifiers that make NULL sort first ascending and last
    /// descending on every backend (the default of SQLite and MySQL).
    pub fn nulls(self, descending: bool) -> &'static str {
        match (self, descending) {
            (Dialect::Postgres, false) => " NULLS FIRST",
            (Dialect::Postgres, true) => " NULLS LAST",
            _ => "",
        }
    }
}

/// How an upsert ([`Dialect::upsert_with`]) sets a column of the row that
/// exists already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assign<'a> {
    /// To the new row's value.
    New(&'a str),
    /// To the greater of the stored and the new value.
    Greatest(&'a str),
    /// To the stored value plus one.
    Increment(&'a str),
}

impl Assign<'_> {
    fn column(&self) -> &str {
        match self {
            Assign::New(c) | Assign::Greatest(c) | Assign::Increment(c) => c,
        }
    }
}

/// The new row's and the stored row's value of `column` in an upsert.
fn new_and_stored(dialect: Dialect, column: &str) -> (String, String) {
    let quoted = dialect.quote(column);
    match dialect {
        Dialect::MySql => (format!("VALUES({quoted})"), quoted),
        Dialect::Sqlite | Dialect::Postgres => {
            (format!("excluded.{quoted}"), format!("t.{quoted}"))
        }
    }
}

/// Most bind parameters one statement carries: below SQLite's limit of
/// 32,766 (PostgreSQL and MySQL allow 65,535), so a chunk of a batch fits
/// every backend.
pub const MAX_PARAMS: usize = 30_000;

/// A statement under construction: SQL text plus its bind values.
#[derive(Debug, Clone)]
pub struct Sql {
    dialect: Dialect,
    text: String,
    params: Vec<Value>,
}

impl Sql {
    pub fn new(dialect: Dialect) -> Self {
        Sql {
            dialect,
            text: String::with_capacity(128),
            params: Vec::new(),
        }
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// Appends literal SQL text (never user data).
    pub fn push(&mut self, text: &str) -> &mut Self {
        self.text.push_str(text);
        self
    }

    /// Appends a quoted identifier.
    pub fn ident(&mut self, ident: &str) -> &mut Self {
        self.dialect.quote_into(&mut self.text, ident);
        self
    }

    /// Appends a placeholder bound to `value`.
    pub fn bind(&mut self, value: Value) -> &mut Self {
        self.params.push(value);
        match self.dialect {
            Dialect::Postgres => {
                self.text.push('$');
                self.text.push_str(&self.params.len().to_string());
            }
            Dialect::Sqlite | Dialect::MySql => self.text.push('?'),
        }
        self
    }

    /// Binds `value` cast to the column type `ty` (`CAST(? AS …)`), for a
    /// row of a `SELECT … UNION ALL` whose columns must have one type.
    pub fn bind_as(&mut self, value: Value, ty: ColType) -> &mut Self {
        let name = match (self.dialect, ty) {
            (Dialect::MySql, ColType::Bool | ColType::Int) => "SIGNED",
            (Dialect::MySql, ColType::Float) => "DOUBLE",
            (Dialect::MySql, ColType::Text | ColType::Bytes) => "BINARY",
            (Dialect::MySql, ColType::Uuid) => "BINARY(16)",
            (Dialect::MySql, ColType::DateTime) => "DATETIME(6)",
            (Dialect::Postgres, ColType::Bool) => "BOOLEAN",
            (Dialect::Postgres, ColType::Int) => "BIGINT",
            (Dialect::Postgres, ColType::Float) => "DOUBLE PRECISION",
            (Dialect::Postgres, ColType::Text) => "TEXT",
            (Dialect::Postgres, ColType::Bytes) => "BYTEA",
            (Dialect::Postgres, ColType::Uuid) => "UUID",
            (Dialect::Postgres, ColType::DateTime) => "TIMESTAMPTZ",
            (Dialect::Sqlite, ColType::Bool | ColType::Int | ColType::DateTime) => "INTEGER",
            (Dialect::Sqlite, ColType::Float) => "REAL",
            (Dialect::Sqlite, ColType::Text) => "TEXT",
            (Dialect::Sqlite, ColType::Bytes | ColType::Uuid) => "BLOB",
        };
        self.push("CAST(").bind(value).push(&format!(" AS {name})"))
    }

    /// Appends `(?, ?, …)` for the values.
    pub fn bind_list(&mut self, values: impl IntoIterator<Item = Value>) -> &mut Self {
        self.text.push('(');
        for (i, value) in values.into_iter().enumerate() {
            if i > 0 {
                self.text.push_str(", ");
            }
            self.bind(value);
        }
        self.text.push(')');
        self
    }

    /// Appends ` IN (?, …)` for the values (at least one). On PostgreSQL it
    /// is ` = ANY($n)` with the values as one array parameter: the same
    /// text, parsed and planned once per connection, whatever their number,
    /// and the same index scan as the list.
    pub fn in_list(&mut self, values: impl IntoIterator<Item = Value>) -> &mut Self {
        if self.dialect != Dialect::Postgres {
            return self.push(" IN ").bind_list(values);
        }
        let values: Vec<Value> = values.into_iter().collect();
        let ty = values.first().map_or(ColType::Text, Value::col_type);
        self.push(" = ANY(").bind_array(ty, values).push(")")
    }

    /// Appends the rows (at least one, all of the same column types) as a
    /// source of rows: `VALUES (?, …), (?, …)`, which an `INSERT` takes
    /// and which, in parentheses and with column names, is a table of a
    /// `FROM`. On PostgreSQL it is `SELECT * FROM unnest($1::…[], …)`, one
    /// array parameter per column: a text that does not depend on the
    /// number of rows, so that PostgreSQL parses and plans it once per
    /// connection instead of once per batch size, with a parameter per
    /// column instead of one per value.
    pub fn rows(&mut self, rows: impl IntoIterator<Item = Vec<Value>>) -> &mut Self {
        self.rows_and(rows, None)
    }

    /// As [`Sql::rows`], each row followed by one more column: the
    /// database server's clock ([`Dialect::now`]), so the rows carry the
    /// time of the server that stores them, not of the gateway.
    pub fn rows_stamped(&mut self, rows: impl IntoIterator<Item = Vec<Value>>) -> &mut Self {
        let now = self.dialect.now();
        self.rows_and(rows, Some(now))
    }

    fn rows_and(
        &mut self,
        rows: impl IntoIterator<Item = Vec<Value>>,
        last: Option<&str>,
    ) -> &mut Self {
        if self.dialect != Dialect::Postgres {
            self.push("VALUES ");
            let Some(last) = last else {
                return self.values(rows);
            };
            for (i, row) in rows.into_iter().enumerate() {
                if i > 0 {
                    self.text.push_str(", ");
                }
                self.text.push('(');
                for value in row {
                    self.bind(value);
                    self.text.push_str(", ");
                }
                self.text.push_str(last);
                self.text.push(')');
            }
            return self;
        }
        let mut columns: Vec<Vec<Value>> = Vec::new();
        for row in rows {
            if columns.is_empty() {
                columns = row.iter().map(|_| Vec::new()).collect();
            }
            for (column, value) in columns.iter_mut().zip(row) {
                column.push(value);
            }
        }
        self.push("SELECT *");
        if let Some(last) = last {
            self.push(", ").push(last);
        }
        self.push(" FROM unnest(");
        for (i, column) in columns.into_iter().enumerate() {
            if i > 0 {
                self.push(", ");
            }
            let ty = column
                .iter()
                .find(|v| !v.is_null())
                .or(column.first())
                .map_or(ColType::Text, Value::col_type);
            self.bind_array(ty, column);
        }
        self.push(")")
    }

    /// Appends `$n::<type>[]` bound to the values as one array.
    fn bind_array(&mut self, ty: ColType, values: Vec<Value>) -> &mut Self {
        self.bind(Value::Array(ty, values));
        let name = match ty {
            ColType::Bool => "boolean",
            ColType::Int => "int8",
            ColType::Float => "float8",
            ColType::Text => "text",
            ColType::Bytes => "bytea",
            ColType::Uuid => "uuid",
            ColType::DateTime => "timestamptz",
        };
        self.push("::").push(name).push("[]")
    }

    /// Appends `(?, …), (?, …)`: one parenthesized group per row, for a
    /// multi-row `VALUES`.
    pub fn values(&mut self, rows: impl IntoIterator<Item = Vec<Value>>) -> &mut Self {
        for (i, row) in rows.into_iter().enumerate() {
            if i > 0 {
                self.text.push_str(", ");
            }
            self.bind_list(row);
        }
        self
    }

    /// Appends the values (at least one, all of one type) as a table of one
    /// column named `column`, aliased `alias`, for a `FROM` clause. On
    /// PostgreSQL it is `unnest($n::…[]) AS alias(column)`, one array
    /// parameter whatever the number of values; on SQLite a `VALUES` list
    /// (which, unlike a `UNION ALL`, has no limit on its rows); on MariaDB,
    /// whose `VALUES` tables lose bound values and cannot name their
    /// columns, a `SELECT … UNION ALL SELECT …` of values cast to their
    /// type.
    pub fn one_column_table(&mut self, alias: &str, column: &str, values: Vec<Value>) -> &mut Self {
        let ty = values.first().map_or(ColType::Text, Value::col_type);
        match self.dialect {
            Dialect::Postgres => {
                self.push("unnest(")
                    .bind_array(ty, values)
                    .push(") AS ")
                    .push(alias)
                    .push("(")
                    .ident(column)
                    .push(")");
            }
            Dialect::Sqlite => {
                self.push("(SELECT column1 AS ")
                    .ident(column)
                    .push(" FROM (VALUES ")
                    .values(values.into_iter().map(|value| vec![value]))
                    .push(")) ")
                    .push(alias);
            }
            Dialect::MySql => {
                self.push("(");
                for (i, value) in values.into_iter().enumerate() {
                    self.push(if i == 0 {
                        "SELECT "
                    } else {
                        " UNION ALL SELECT "
                    })
                    .bind_as(value, ty);
                    if i == 0 {
                        self.push(" AS ").ident(column);
                    }
                }
                self.push(") ").push(alias);
            }
        }
        self
    }

    /// Appends a comma-separated list of quoted identifiers.
    pub fn idents<'a>(&mut self, idents: impl IntoIterator<Item = &'a str>) -> &mut Self {
        for (i, ident) in idents.into_iter().enumerate() {
            if i > 0 {
                self.text.push_str(", ");
            }
            self.ident(ident);
        }
        self
    }

    /// Appends `part`, a statement built on its own, renumbering its
    /// placeholders after the ones already here.
    pub fn append(&mut self, part: &Sql) -> &mut Self {
        let text = part.text();
        let params = part.params();
        match self.dialect {
            Dialect::Postgres => {
                let mut rest = text;
                let mut next = 0;
                while let Some(at) = rest.find('$') {
                    self.push(&rest[..at]);
                    let digits = rest[at + 1..]
                        .bytes()
                        .take_while(u8::is_ascii_digit)
                        .count();
                    self.bind(params[next].clone());
                    next += 1;
                    rest = &rest[at + 1 + digits..];
                }
                self.push(rest);
            }
            Dialect::Sqlite | Dialect::MySql => {
                let mut pieces = text.split('?');
                if let Some(first) = pieces.next() {
                    self.push(first);
                }
                for (piece, value) in pieces.zip(params) {
                    self.bind(value.clone());
                    self.push(piece);
                }
            }
        }
        self
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether the statement only reads (a `SELECT` without a locking
    /// clause), so that running it twice has the effect of running it once.
    pub fn is_plain_read(&self) -> bool {
        let text = self.text.trim_start();
        text.get(..6)
            .is_some_and(|verb| verb.eq_ignore_ascii_case("SELECT"))
            && !text.contains(" FOR UPDATE")
            && !text.contains(" FOR SHARE")
    }

    pub fn params(&self) -> &[Value] {
        &self.params
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_rows_are_arrays_on_postgres_only() {
        let keys = || [Value::Int(1), Value::Int(2), Value::Int(3)];
        let mut sql = Sql::new(Dialect::Postgres);
        sql.ident("shard").in_list(keys());
        assert_eq!(sql.text(), "\"shard\" = ANY($1::int8[])");
        assert_eq!(sql.params(), &[Value::Array(ColType::Int, keys().to_vec())]);
        let mut sql = Sql::new(Dialect::Sqlite);
        sql.ident("shard").in_list(keys());
        assert_eq!(sql.text(), "\"shard\" IN (?, ?, ?)");
        assert_eq!(sql.params(), &keys());

        // A column's type is that of its first non-NULL value.
        let rows = || {
            vec![
                vec![Value::Int(1), Value::Null(ColType::Text)],
                vec![Value::Int(2), Value::Text("a".into())],
            ]
        };
        let mut sql = Sql::new(Dialect::Postgres);
        sql.push("INSERT INTO t (a, b) ").rows(rows());
        assert_eq!(
            sql.text(),
            "INSERT INTO t (a, b) SELECT * FROM unnest($1::int8[], $2::text[])"
        );
        assert_eq!(
            sql.params(),
            &[
                Value::Array(ColType::Int, vec![Value::Int(1), Value::Int(2)]),
                Value::Array(
                    ColType::Text,
                    vec![Value::Null(ColType::Text), Value::Text("a".into())]
                ),
            ]
        );
        let mut sql = Sql::new(Dialect::MySql);
        sql.push("INSERT INTO t (a, b) ").rows(rows());
        assert_eq!(sql.text(), "INSERT INTO t (a, b) VALUES (?, ?), (?, ?)");
        assert_eq!(sql.params().len(), 4);
    }

    #[test]
    fn only_selects_without_locks_are_plain_reads() {
        let read = |text: &str| {
            let mut sql = Sql::new(Dialect::Postgres);
            sql.push(text);
            sql.is_plain_read()
        };
        assert!(read("SELECT 1"));
        assert!(read("  select \"row_key\" FROM \"t\""));
        assert!(!read(
            "SELECT \"shard\" FROM \"s\" WHERE \"shard\" = 1 FOR UPDATE"
        ));
        assert!(!read("SELECT 1 FOR SHARE"));
        assert!(!read("UPDATE \"t\" SET \"a\" = 1"));
        assert!(!read(
            "WITH x AS (DELETE FROM \"t\" RETURNING 1) SELECT * FROM x"
        ));
        assert!(!read("SEL"));
    }
}
