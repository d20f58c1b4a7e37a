//! [`Index`] and [`IndexField`]: a secondary index denormalizing fields of latest cells.
//!
//! An index comes from `datastores/<datastore>/indexes/<table>.yaml`. It copies chosen fields of
//! the latest cell of one or more columns into one entry per row key, and stores that entry in
//! the shard given by hashing its shard field, so a query naming the shard field touches one
//! shard only. With a `where:` predicate the index is *partial*: rows that do not satisfy it
//! have no entry.

use crate::field_path::FieldPath;
use crate::field_type::FieldType;
use crate::predicate::Predicate;

/// A validated secondary index.
#[derive(Debug, Clone, PartialEq)]
pub struct Index {
    /// The index name (the YAML `table`); at most 32 characters.
    pub name: String,
    /// The datastore the index belongs to.
    pub datastore: String,
    /// Free text from the definition.
    pub description: Option<String>,
    /// The denormalized fields, in declaration order across all `column_defs`.
    pub fields: Vec<IndexField>,
    /// Position of the shard field in `fields`.
    pub shard_field: usize,
    /// The distinct columns the fields come from, in declaration order.
    pub columns: Vec<String>,
    /// The `where:` of a partial index: only rows that satisfy it have an entry. It reads only
    /// `columns`.
    pub predicate: Option<Predicate>,
}

impl Index {
    /// The field whose value picks the shard of an entry.
    pub fn shard_field(&self) -> &IndexField {
        &self.fields[self.shard_field]
    }

    /// The top-level body members the index reads, for its fields and its predicate (with
    /// repeats): a reader that decodes only some members of a body must decode these.
    pub fn members(&self) -> impl Iterator<Item = &str> {
        let fields = self
            .fields
            .iter()
            .filter_map(|f| f.path.segments().first().map(String::as_str));
        let predicate = self
            .predicate
            .iter()
            .flat_map(|p| p.members().map(|(_, member)| member));
        fields.chain(predicate)
    }

    /// The field called `name`, or failing that the field whose path is written `name`
    /// (`fare.total`).
    pub fn field(&self, name: &str) -> Option<&IndexField> {
        self.fields
            .iter()
            .find(|f| f.name == name)
            .or_else(|| self.fields.iter().find(|f| f.path.to_string() == name))
    }
}

/// One denormalized field of an index.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexField {
    /// The field's name in the index (a SQL column name); at most 48 characters.
    pub name: String,
    /// Where the value is in the cell's JSON body.
    pub path: FieldPath,
    /// The value type.
    pub ty: FieldType,
    /// The datastore column whose latest cell the value is read from.
    pub column: String,
    /// Whether the index keeps a b-tree on the field (after the shard field), so that pages
    /// can be ordered by it and ranges on it read only their entries; `sort: false` stores it
    /// only, for returning and for conditions checked on the entries the query reads anyway.
    /// Always true for the shard field.
    pub sorted: bool,
}

impl IndexField {
    /// Whether `other` holds the same values: the same name, column, path and type (whether
    /// either has a b-tree aside).
    pub fn same_values(&self, other: &IndexField) -> bool {
        self.name == other.name
            && self.column == other.column
            && self.path == other.path
            && self.ty == other.ty
    }
}
