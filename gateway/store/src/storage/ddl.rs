//! Table names and per-dialect DDL: one set of tables per datastore and
//! cluster, with the logical shard as a key column.
//!
//! | table | what it holds | key |
//! |---|---|---|
//! | `<ds>_cells` | every cell written to the cluster's shards (but old versions pruned) | `(shard, added_id)`, unique `(row_key, column_name, ref_key)` |
//! | `<ds>_shards` | one row per owned logical shard: the next `added_id` | `shard` |
//! | `<ds>_offsets` | progress of each log consumer (index maintenance, triggers) per shard | `(shard, consumer)` |
//! | `<ds>_buffer` | buffered writes destined for another cluster's primary | `buffer_id` |
//! | `<ds>_conflicts` | buffered writes that lost to another body of their key on replay | `(row_key, column_name, ref_key, body_hash)` |
//! | `<ds>_quarantine` | index entries that could not be applied | `(index_name, row_key)` |
//! | `<ds>_trigger_quarantine` | cells a trigger consumer's handler kept failing on | `(consumer, shard, added_id)` |
//! | `<ds>_ix_<index>[_v<N>]` | one entry per row key of one index version | `row_key` |
//!
//! and per cluster `cellgate_catalog` (what the tables were built from),
//! `cellgate_topology` (the shard ranges of each datastore and the move in
//! progress, used on the first cluster),
//! `cellgate_leases` (named leases with fencing tokens), `cellgate_tokens`
//! (API tokens, used on the first cluster) and `cellgate_id_segments` (Leaf
//! segments per biz tag, used on the cluster `ids.cluster` names). The number of
//! tables depends on the definitions only, never on the shard count: the
//! embedded default holds a few dozen schema objects however many shards a
//! datastore has, and no read or write ever runs DDL. Every row carries its
//! logical shard (index entries the shard of their shard field), so a shard
//! range can move to another cluster by copying the rows it selects.
//!
//! Index tables have one SQL index per non-shard field on
//! `(shard_field, field, row_key)`, so "shard field = x AND a range or order
//! on another field" is an index range scan with `row_key` as the keyset
//! tie-breaker. PostgreSQL's indexes say `NULLS FIRST` because that is the
//! order the planner asks for (and what SQLite and MySQL do by default);
//! scanned backwards they give the `DESC NULLS LAST` of descending queries.
//!
//! Text that takes part in keys or comparisons is `TEXT` on SQLite,
//! `TEXT COLLATE "C"` on PostgreSQL and `VARBINARY` on MySQL/MariaDB: all
//! three compare bytes with no padding rule, so SQL and the Rust merge agree
//! (`'a'` and `'a '` are different keys everywhere).

use index_dsl::{Datastore, FieldType, Index};

use super::sql::{Dialect, Sql};
use super::value::Value;

/// The cluster catalog: what each datastore's tables were built from.
pub const CATALOG_TABLE: &str = "cellgate_catalog";

/// Named leases with holders, expiry and fencing tokens.
pub const LEASES_TABLE: &str = "cellgate_leases";

/// API tokens (`auth/tokens.rs`): id, hash, name, scopes, revocation. Made
/// on every cluster with the other cluster tables; the gateway uses the one
/// on the first cluster.
pub const TOKENS_TABLE: &str = "cellgate_tokens";
/// Leaf segments of ID allocation: one row per biz tag with the highest
/// ID handed out in a segment so far (`ids/segment.rs`).
pub const ID_SEGMENTS_TABLE: &str = "cellgate_id_segments";

/// The stored topology (`moves/stored.rs`): per datastore, which cluster
/// holds each shard range, its version, and the shard move in progress.
/// Used on the first cluster.
pub const TOPOLOGY_TABLE: &str = "cellgate_topology";

/// The registry of the per-shard layout that preceded this one; its
/// presence marks a store that needs `cellgate migrate --from-v1`.
pub const V1_REGISTRY_TABLE: &str = "cellgate_shards";

/// What `cellgate migrate --from-v1` renames the v1 registry to while it
/// converts; its presence means a conversion is unfinished.
pub const V1_CONVERTING_TABLE: &str = "cellgate_shards_v1";

/// The layout version recorded in the catalog.
pub const LAYOUT_VERSION: i64 = 2;

/// Longest identifier every backend accepts (PostgreSQL: 63 bytes).
const MAX_IDENT: usize = 63;

/// Longest string an index field holds, in characters; longer values are
/// stored as NULL (MySQL's key length limits this, and the rule is the same
/// everywhere).
pub const MAX_INDEXED_STRING: usize = 255;

fn prefix(datastore: &str) -> String {
    datastore.to_ascii_lowercase()
}

/// The columns of a datastore's cell table, in the order every cell query
/// selects them and every insert writes them.
pub const CELL_COLUMNS: [&str; 7] = [
    "shard",
    "added_id",
    "row_key",
    "column_name",
    "ref_key",
    "body",
    "created_at",
];

/// The SQL types of [`CELL_COLUMNS`].
const CELL_COLUMN_TYPES: [Col; 7] = [
    Col::BigInt,
    Col::BigInt,
    Col::Uuid,
    Col::Name,
    Col::BigInt,
    Col::Blob,
    Col::DateTime,
];

pub fn cells_table(datastore: &str) -> String {
    format!("{}_cells", prefix(datastore))
}

pub fn shards_table(datastore: &str) -> String {
    format!("{}_shards", prefix(datastore))
}

pub fn offsets_table(datastore: &str) -> String {
    format!("{}_offsets", prefix(datastore))
}

pub fn buffer_table(datastore: &str) -> String {
    format!("{}_buffer", prefix(datastore))
}

pub fn conflicts_table(datastore: &str) -> String {
    format!("{}_conflicts", prefix(datastore))
}

pub fn quarantine_table(datastore: &str) -> String {
    format!("{}_quarantine", prefix(datastore))
}

pub fn trigger_quarantine_table(datastore: &str) -> String {
    format!("{}_trigger_quarantine", prefix(datastore))
}

/// The table of `version` of an index; version 1 has the plain name.
pub fn index_table(datastore: &str, index: &str, version: u32) -> String {
    let base = format!("{}_ix_{}", prefix(datastore), index.to_ascii_lowercase());
    if version <= 1 {
        base
    } else {
        format!("{base}_v{version}")
    }
}

/// The column of an index table holding the entry's index shard (NULL for
/// a tombstone: the row's shard field is missing or moved to another
/// cluster).
pub const INDEX_SHARD_COLUMN: &str = "_shard";

/// The column of an index table that records the ref key of the cell of
/// `column` the entry was computed from.
pub fn ref_column(column: &str) -> String {
    format!("_ref_{}", column.to_ascii_lowercase())
}

/// A schema-unique name for an SQL index on `table`; hashed when the plain
/// name would be too long for PostgreSQL.
fn sql_index_name(table: &str, suffix: &str) -> String {
    let name = format!("{table}_{suffix}");
    if name.len() <= MAX_IDENT {
        name
    } else {
        let hash = xxhash_rust::xxh3::xxh3_64(table.as_bytes());
        format!("cg_{hash:016x}_{suffix}")
    }
}

/// SQL column types per dialect.
#[derive(Clone, Copy)]
enum Col {
    AutoId,
    BigInt,
    Double,
    Bool,
    /// Short text that is part of keys (column names, consumer names).
    Name,
    /// An indexed string field.
    IndexedText,
    /// Free text that is never compared (catalog values, error messages).
    Text,
    Blob,
    Uuid,
    DateTime,
}

fn col_type(dialect: Dialect, col: Col) -> &'static str {
    use Dialect::*;
    match (dialect, col) {
        (Sqlite, Col::AutoId) => "INTEGER PRIMARY KEY AUTOINCREMENT",
        (MySql, Col::AutoId) => "BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY",
        (Postgres, Col::AutoId) => "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
        (Sqlite, Col::BigInt | Col::Bool | Col::DateTime) => "INTEGER",
        (_, Col::BigInt) => "BIGINT",
        (Sqlite, Col::Double) => "REAL",
        (MySql, Col::Double) => "DOUBLE",
        (Postgres, Col::Double) => "DOUBLE PRECISION",
        (_, Col::Bool) => "BOOLEAN",
        (Sqlite, Col::Name | Col::IndexedText | Col::Text) => "TEXT",
        // Byte strings: compared byte by byte, without the trailing-space
        // padding of MySQL's `_bin` collations.
        (MySql, Col::Name) => "VARBINARY(512)",
        (MySql, Col::IndexedText) => "VARBINARY(1020)",
        (MySql, Col::Text) => "LONGTEXT",
        (Postgres, Col::Name | Col::IndexedText) => "TEXT COLLATE \"C\"",
        (Postgres, Col::Text) => "TEXT",
        (Sqlite, Col::Blob | Col::Uuid) => "BLOB",
        (MySql, Col::Blob) => "LONGBLOB",
        (Postgres, Col::Blob) => "BYTEA",
        (MySql, Col::Uuid) => "BINARY(16)",
        (Postgres, Col::Uuid) => "UUID",
        (MySql, Col::DateTime) => "DATETIME(6)",
        (Postgres, Col::DateTime) => "TIMESTAMPTZ",
    }
}

fn field_col(ty: FieldType) -> Col {
    match ty {
        FieldType::Uuid => Col::Uuid,
        FieldType::String => Col::IndexedText,
        FieldType::Int => Col::BigInt,
        FieldType::Float => Col::Double,
        FieldType::Bool => Col::Bool,
        FieldType::DateTime => Col::DateTime,
    }
}

/// One key column of an SQL index, optionally with PostgreSQL's
/// `NULLS FIRST`.
#[derive(Clone)]
struct KeyCol {
    name: String,
    nulls_first: bool,
}

impl KeyCol {
    fn plain(name: &str) -> KeyCol {
        KeyCol {
            name: name.to_string(),
            nulls_first: false,
        }
    }
}

/// Builds one `CREATE TABLE IF NOT EXISTS` with its secondary indexes: inline
/// on MySQL (which lacks `CREATE INDEX IF NOT EXISTS`), separate statements
/// elsewhere.
struct TableDef<'a> {
    dialect: Dialect,
    name: &'a str,
    columns: Vec<String>,
    constraints: Vec<String>,
    indexes: Vec<(String, Vec<KeyCol>, bool)>,
}

impl<'a> TableDef<'a> {
    fn new(dialect: Dialect, name: &'a str) -> Self {
        TableDef {
            dialect,
            name,
            columns: Vec::new(),
            constraints: Vec::new(),
            indexes: Vec::new(),
        }
    }

    fn col(mut self, name: &str, col: Col, not_null: bool) -> Self {
        let mut text = format!(
            "{} {}",
            self.dialect.quote(name),
            col_type(self.dialect, col)
        );
        if not_null && !matches!(col, Col::AutoId) {
            text.push_str(" NOT NULL");
        }
        self.columns.push(text);
        self
    }

    fn primary_key(mut self, cols: &[&str]) -> Self {
        let cols = cols
            .iter()
            .map(|c| self.dialect.quote(c))
            .collect::<Vec<_>>()
            .join(", ");
        self.constraints.push(format!("PRIMARY KEY ({cols})"));
        self
    }

    fn unique(mut self, suffix: &str, cols: &[&str]) -> Self {
        let cols = cols.iter().map(|c| KeyCol::plain(c)).collect();
        self.indexes.push((suffix.to_string(), cols, true));
        self
    }

    fn index(mut self, suffix: &str, cols: Vec<KeyCol>) -> Self {
        self.indexes.push((suffix.to_string(), cols, false));
        self
    }

    fn key_list(&self, cols: &[KeyCol]) -> String {
        cols.iter()
            .map(|c| {
                let mut text = self.dialect.quote(&c.name);
                if c.nulls_first && self.dialect == Dialect::Postgres {
                    text.push_str(" NULLS FIRST");
                }
                text
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn build(self) -> Vec<String> {
        let d = self.dialect;
        let mut body = self.columns.clone();
        body.extend(self.constraints.iter().cloned());
        if d == Dialect::MySql {
            for (suffix, cols, unique) in &self.indexes {
                body.push(format!(
                    "{}KEY {} ({})",
                    if *unique { "UNIQUE " } else { "" },
                    d.quote(suffix),
                    self.key_list(cols)
                ));
            }
        }
        let mut create = format!(
            "CREATE TABLE IF NOT EXISTS {} (\n  {}\n)",
            d.quote(self.name),
            body.join(",\n  ")
        );
        if d == Dialect::MySql {
            create.push_str(" ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin");
        }
        let mut out = vec![create];
        if d != Dialect::MySql {
            for (suffix, cols, unique) in &self.indexes {
                out.push(format!(
                    "CREATE {}INDEX IF NOT EXISTS {} ON {} ({})",
                    if *unique { "UNIQUE " } else { "" },
                    d.quote(&sql_index_name(self.name, suffix)),
                    d.quote(self.name),
                    self.key_list(cols)
                ));
            }
        }
        out
    }
}

/// Tables every cluster has, whatever its datastores.
pub fn cluster_ddl(dialect: Dialect) -> Vec<String> {
    let mut out = TableDef::new(dialect, CATALOG_TABLE)
        .col("datastore", Col::Name, true)
        .col("item", Col::Name, true)
        .col("value", Col::Text, true)
        .col("updated_at", Col::DateTime, true)
        .primary_key(&["datastore", "item"])
        .build();
    out.extend(
        TableDef::new(dialect, LEASES_TABLE)
            .col("name", Col::Name, true)
            .col("holder", Col::Name, true)
            .col("token", Col::BigInt, true)
            .col("expires_at", Col::DateTime, true)
            .col("acquired_at", Col::DateTime, true)
            .primary_key(&["name"])
            .build(),
    );
    out.extend(
        TableDef::new(dialect, TOKENS_TABLE)
            .col("id", Col::Name, true)
            .col("token_hash", Col::Name, true)
            .col("name", Col::Text, true)
            .col("scopes", Col::Text, true)
            .col("created_at", Col::DateTime, true)
            .col("revoked_at", Col::DateTime, false)
            .primary_key(&["id"])
            .unique("hash", &["token_hash"])
            .build(),
    );
    out.extend(
        TableDef::new(dialect, ID_SEGMENTS_TABLE)
            .col("biz_tag", Col::Name, true)
            .col("max_id", Col::BigInt, true)
            .col("step", Col::BigInt, true)
            .col("description", Col::Text, true)
            .col("update_time", Col::DateTime, true)
            .primary_key(&["biz_tag"])
            .build(),
    );
    out.extend(
        TableDef::new(dialect, TOPOLOGY_TABLE)
            .col("datastore", Col::Name, true)
            .col("version", Col::BigInt, true)
            .col("ranges", Col::Text, true)
            .col("work", Col::Text, true)
            .col("cutover", Col::BigInt, true)
            .col("moving", Col::Text, true)
            .col("updated_at", Col::DateTime, true)
            .primary_key(&["datastore"])
            .build(),
    );
    out
}

/// The tables of one datastore on a cluster, without its index tables
/// (see [`index_ddl`]): entity, shard counters, offsets, buffer, buffer
/// conflicts and quarantine.
pub fn datastore_ddl(dialect: Dialect, datastore: &str) -> Vec<String> {
    let cells = cells_table(datastore);
    let mut table = TableDef::new(dialect, &cells);
    for (name, col) in CELL_COLUMNS.into_iter().zip(CELL_COLUMN_TYPES) {
        table = table.col(name, col, true);
    }
    let mut out = table
        .primary_key(&["shard", "added_id"])
        .unique("key", &["row_key", "column_name", "ref_key"])
        .build();
    let shards = shards_table(datastore);
    out.extend(
        TableDef::new(dialect, &shards)
            .col("shard", Col::BigInt, true)
            .col("next_added_id", Col::BigInt, true)
            .primary_key(&["shard"])
            .build(),
    );
    let offsets = offsets_table(datastore);
    out.extend(
        TableDef::new(dialect, &offsets)
            .col("shard", Col::BigInt, true)
            .col("consumer", Col::Name, true)
            .col("added_id", Col::BigInt, true)
            .col("updated_at", Col::DateTime, true)
            .primary_key(&["shard", "consumer"])
            .build(),
    );
    let buffer = buffer_table(datastore);
    out.extend(
        TableDef::new(dialect, &buffer)
            .col("buffer_id", Col::AutoId, true)
            .col("batch_id", Col::Uuid, true)
            .col("shard", Col::BigInt, true)
            .col("row_key", Col::Uuid, true)
            .col("column_name", Col::Name, true)
            .col("ref_key", Col::BigInt, true)
            .col("body", Col::Blob, true)
            .col("created_at", Col::DateTime, true)
            .index("batch", vec![KeyCol::plain("batch_id")])
            .index(
                "shard",
                vec![KeyCol::plain("shard"), KeyCol::plain("buffer_id")],
            )
            .build(),
    );
    let conflicts = conflicts_table(datastore);
    out.extend(
        TableDef::new(dialect, &conflicts)
            .col("row_key", Col::Uuid, true)
            .col("column_name", Col::Name, true)
            .col("ref_key", Col::BigInt, true)
            .col("body_hash", Col::Name, true)
            .col("body", Col::Blob, true)
            .col("stored_hash", Col::Name, true)
            .col("buffered_on", Col::Name, true)
            .col("buffered_at", Col::DateTime, true)
            .col("recorded_at", Col::DateTime, true)
            .primary_key(&["row_key", "column_name", "ref_key", "body_hash"])
            .build(),
    );
    let quarantine = quarantine_table(datastore);
    out.extend(
        TableDef::new(dialect, &quarantine)
            .col("index_name", Col::Name, true)
            .col("row_key", Col::Uuid, true)
            .col("shard", Col::BigInt, true)
            .col("added_id", Col::BigInt, true)
            .col("code", Col::Name, true)
            .col("message", Col::Text, true)
            .col("attempts", Col::BigInt, true)
            .col("first_seen", Col::DateTime, true)
            .col("last_seen", Col::DateTime, true)
            .primary_key(&["index_name", "row_key"])
            .build(),
    );
    let trigger_quarantine = trigger_quarantine_table(datastore);
    out.extend(
        TableDef::new(dialect, &trigger_quarantine)
            .col("consumer", Col::Name, true)
            .col("shard", Col::BigInt, true)
            .col("added_id", Col::BigInt, true)
            .col("row_key", Col::Uuid, true)
            .col("column_name", Col::Name, true)
            .col("ref_key", Col::BigInt, true)
            .col("attempts", Col::BigInt, true)
            .col("message", Col::Text, true)
            .col("retry", Col::BigInt, true)
            .col("quarantined_at", Col::DateTime, true)
            .primary_key(&["consumer", "shard", "added_id"])
            .build(),
    );
    out
}

/// The table of one version of a secondary index.
pub fn index_ddl(dialect: Dialect, index: &Index, version: u32) -> Vec<String> {
    let table = index_table(&index.datastore, &index.name, version);
    let mut def = TableDef::new(dialect, &table)
        .col("row_key", Col::Uuid, true)
        .col(INDEX_SHARD_COLUMN, Col::BigInt, false);
    for field in &index.fields {
        def = def.col(&field.name, field_col(field.ty), false);
    }
    for column in &index.columns {
        def = def.col(&ref_column(column), Col::BigInt, false);
    }
    def = def
        .col("_updated_at", Col::DateTime, true)
        .primary_key(&["row_key"]);
    let shard_field = index.shard_field().name.clone();
    def = def.index(
        "k0",
        vec![KeyCol::plain(&shard_field), KeyCol::plain("row_key")],
    );
    for (i, field) in index.fields.iter().enumerate() {
        // A field with `sort: false` is only stored: filtered on the
        // entries of the shard field's range, never ordered by.
        if i != index.shard_field && field.sorted {
            def = def.index(
                &format!("k{}", i + 1),
                vec![
                    KeyCol::plain(&shard_field),
                    KeyCol {
                        name: field.name.clone(),
                        nulls_first: true,
                    },
                    KeyCol::plain("row_key"),
                ],
            );
        }
    }
    def.build()
}

/// A secondary index of a datastore's tables that earlier versions
/// created and this one drops at start-up: the cell table's `(shard,
/// created_at)` b-tree. It served only seeks of a shard's log by time
/// (`cellsForShard(since:)`), which read the shard's `(shard, added_id)`
/// range instead, and cost every written cell an index insertion.
pub struct Superseded {
    table: String,
    suffix: &'static str,
}

/// The indexes of `datastore`'s tables that earlier versions created and
/// this one does not.
pub fn superseded_indexes(datastore: &str) -> Vec<Superseded> {
    vec![Superseded {
        table: cells_table(datastore),
        suffix: "created",
    }]
}

impl Superseded {
    /// A statement that counts the rows of the database's catalog that
    /// name the index: more than 0 while it exists.
    pub fn exists(&self, dialect: Dialect) -> Sql {
        let mut sql = Sql::new(dialect);
        match dialect {
            Dialect::Postgres => {
                sql.push("SELECT COUNT(*) FROM pg_indexes WHERE schemaname = current_schema() AND indexname = ")
                    .bind(Value::Text(sql_index_name(&self.table, self.suffix)));
            }
            Dialect::MySql => {
                sql.push("SELECT COUNT(*) FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = ")
                    .bind(Value::Text(self.table.clone()))
                    .push(" AND index_name = ")
                    .bind(Value::Text(self.suffix.to_string()));
            }
            Dialect::Sqlite => {
                sql.push("SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = ")
                    .bind(Value::Text(sql_index_name(&self.table, self.suffix)));
            }
        }
        sql
    }

    /// The statements, in one transaction, that drop the index unless
    /// that waits for a lock on the table longer than `wait`: dropping it
    /// locks the table against every other statement, and statements
    /// queue behind a drop that waits (for a long transaction reading the
    /// table), so the wait is bounded and the drop fails instead.
    /// [`Superseded::restore`] follows them, whatever their outcome.
    pub fn drop(&self, dialect: Dialect, wait: std::time::Duration) -> Vec<Sql> {
        let mut bound = Sql::new(dialect);
        let mut drop = Sql::new(dialect);
        match dialect {
            Dialect::Postgres => {
                bound.push(&format!(
                    "SET LOCAL lock_timeout = {}",
                    wait.as_millis().max(1)
                ));
                drop.push("DROP INDEX ")
                    .ident(&sql_index_name(&self.table, self.suffix));
            }
            Dialect::MySql => {
                bound.push(&format!(
                    "SET SESSION lock_wait_timeout = {}",
                    wait.as_secs().max(1)
                ));
                drop.push("ALTER TABLE ")
                    .ident(&self.table)
                    .push(" DROP INDEX ")
                    .ident(self.suffix);
            }
            // One writer, which waits for the database's busy timeout;
            // readers do not hold the drop up.
            Dialect::Sqlite => {
                drop.push("DROP INDEX ")
                    .ident(&sql_index_name(&self.table, self.suffix));
                return vec![drop];
            }
        }
        vec![bound, drop]
    }

    /// The statement that undoes the bound of [`Superseded::drop`] where
    /// it outlives the transaction (MySQL's session variable).
    pub fn restore(&self, dialect: Dialect) -> Option<Sql> {
        (dialect == Dialect::MySql).then(|| {
            let mut sql = Sql::new(dialect);
            sql.push("SET SESSION lock_wait_timeout = DEFAULT");
            sql
        })
    }
}

/// The statements that drop one index version's table.
pub fn drop_index_ddl(dialect: Dialect, datastore: &str, index: &str, version: u32) -> String {
    format!(
        "DROP TABLE IF EXISTS {}",
        dialect.quote(&index_table(datastore, index, version))
    )
}

/// The reference DDL of a dialect for a set of definitions, written to
/// `schema/sql/<dialect>.sql`: the cluster tables and every datastore's
/// tables, as `cellgate migrate` creates them on each cluster.
pub fn schema_file(dialect: Dialect, defs: &index_dsl::Definitions) -> String {
    let mut out = format!(
        "-- cellgate storage schema for {} (generated by `cellgate ddl`; do not edit)\n\
         -- Every cluster holds these tables for the datastores with shards on it;\n\
         -- logical shards are rows, selected by the `shard` column.\n\n",
        dialect.name()
    );
    for stmt in cluster_ddl(dialect) {
        out.push_str(&stmt);
        out.push_str(";\n\n");
    }
    for datastore in &defs.datastores {
        out.push_str(&format!(
            "-- datastore `{}`: {} logical shards\n\n",
            datastore.name, datastore.shards
        ));
        for stmt in tables_of(dialect, datastore) {
            out.push_str(&stmt);
            out.push_str(";\n\n");
        }
    }
    out
}

/// Every table of a datastore with each index at version 1.
fn tables_of(dialect: Dialect, datastore: &Datastore) -> Vec<String> {
    let mut out = datastore_ddl(dialect, &datastore.name);
    for index in &datastore.indexes {
        out.extend(index_ddl(dialect, index, 1));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(fields: &str) -> Index {
        let defs = index_dsl::load_files(
            std::path::Path::new("defs"),
            [
                ("trips/datastore.yaml", "name: trips\ncolumns:\n  - name: BASE\n".to_string()),
                (
                    "trips/indexes/by_city.yaml",
                    format!("table: by_city\ndatastore: trips\ncolumn_defs:\n  - column_key: BASE\n    fields:\n{fields}"),
                ),
            ],
        )
        .expect("definitions");
        (*defs.datastores[0].indexes[0]).clone()
    }

    #[test]
    fn a_field_with_sort_false_gets_no_b_tree_and_a_new_signature() {
        let plain = index("      - { field: city, type: string }\n      - { field: at, type: datetime }\n      - { field: fare, type: float }\n");
        let sorted = index("      - { field: city, type: string }\n      - { field: at, type: datetime, sort: true }\n      - { field: fare, type: float }\n");
        let stored = index("      - { field: city, type: string }\n      - { field: at, type: datetime }\n      - { field: fare, type: float, sort: false }\n");
        let text = |index: &Index| index_ddl(Dialect::Postgres, index, 1).join(";\n");
        let ddl = text(&plain);
        assert!(ddl.contains("_k2") && ddl.contains("_k3"), "{ddl}");
        let ddl = text(&stored);
        assert!(ddl.contains("_k2") && !ddl.contains("_k3"), "{ddl}");
        assert!(ddl.contains("\"fare\""), "the field is still stored: {ddl}");
        // `sort: true` spells out the default: the same table.
        let signature = crate::topology::index_signature;
        assert_eq!(signature(&plain), signature(&sorted));
        assert_ne!(signature(&plain), signature(&stored));
    }
}
