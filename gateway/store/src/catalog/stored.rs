//! An index definition as a catalog records it with each table version,
//! so a store started with changed definitions can still serve the
//! version it replaces while the new one is built (`catalog.rs`).
//!
//! What is recorded is what shapes the table and its entries: the fields
//! (name, column, path, type, `sort: false`), the shard field, the columns read and the
//! `where:` predicate in its qualified form. Descriptions are not: a
//! previous version answers queries, it is not documented.

use index_dsl::{
    parse_filter, parse_path, parse_type, Datastore, Index, IndexField, Predicate, PredicateSource,
};
use serde::{Deserialize, Serialize};

use crate::topology::index_signature;

/// The recorded form of an [`Index`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StoredIndex {
    fields: Vec<StoredField>,
    shard_field: usize,
    columns: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    predicate: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct StoredField {
    name: String,
    column: String,
    path: String,
    #[serde(rename = "type")]
    ty: String,
    /// `sort:` (recorded only when false).
    #[serde(default = "sorted", skip_serializing_if = "is_sorted")]
    sort: bool,
}

fn sorted() -> bool {
    true
}

fn is_sorted(sort: &bool) -> bool {
    *sort
}

impl StoredIndex {
    pub(crate) fn of(index: &Index) -> StoredIndex {
        StoredIndex {
            fields: index
                .fields
                .iter()
                .map(|f| StoredField {
                    name: f.name.clone(),
                    column: f.column.clone(),
                    path: f.path.to_string(),
                    ty: f.ty.name().to_string(),
                    sort: f.sorted,
                })
                .collect(),
            shard_field: index.shard_field,
            columns: index.columns.clone(),
            predicate: index.predicate.as_ref().map(|p| p.qualified()),
        }
    }

    /// The index `name` of `datastore` as recorded, if it can still be
    /// served there: every column it reads is declared, and it has the
    /// recorded `signature` (so it is the table's shape, read back
    /// exactly). `None` otherwise.
    pub(crate) fn restore(
        &self,
        datastore: &Datastore,
        name: &str,
        signature: &str,
    ) -> Option<Index> {
        if self.shard_field >= self.fields.len()
            || self.columns.iter().any(|c| datastore.column(c).is_none())
        {
            return None;
        }
        let mut fields = Vec::with_capacity(self.fields.len());
        for f in &self.fields {
            fields.push(IndexField {
                name: f.name.clone(),
                path: parse_path(&f.path).ok()?,
                ty: parse_type(&f.ty).ok()?,
                column: f.column.clone(),
                sorted: f.sort,
            });
        }
        let predicate = match &self.predicate {
            None => None,
            Some(text) => Some(restore_predicate(text)?),
        };
        let index = Index {
            name: name.to_string(),
            datastore: datastore.name.clone(),
            description: None,
            fields,
            shard_field: self.shard_field,
            columns: self.columns.clone(),
            predicate,
        };
        (index_signature(&index) == signature).then_some(index)
    }
}

/// A predicate from its qualified form (`BASE.fare.total > 0 and
/// STATUS.status = "completed"`): each condition's field is
/// `<COLUMN>.<path>`.
fn restore_predicate(text: &str) -> Option<Predicate> {
    let filter = parse_filter(text).ok()?;
    let mut sources = Vec::with_capacity(filter.conditions.len());
    for condition in &filter.conditions {
        let (column, path) = condition.field.split_once('.')?;
        sources.push(PredicateSource {
            column: column.to_string(),
            path: parse_path(path).ok()?,
        });
    }
    Some(Predicate {
        text: text.to_string(),
        filter,
        sources,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DATASTORE: &str = r#"
name: trips
columns:
  - name: BASE
  - name: STATUS
"#;

    fn definitions(index: &str) -> index_dsl::Definitions {
        index_dsl::load_files(
            std::path::Path::new("datastores"),
            [
                ("trips/datastore.yaml", DATASTORE),
                ("trips/indexes/by_city.yaml", index),
            ],
        )
        .expect("definitions load")
    }

    #[test]
    fn a_recorded_index_restores_to_the_same_table_shape() {
        let defs = definitions(
            r#"
table: by_city
datastore: trips
shard_field: city_uuid
column_defs:
  - column_key: BASE
    fields:
      - { field: city_uuid, type: UUID }
      - { field: fare.total, name: fare_total, type: float }
      - { field: requested_at, type: datetime }
  - column_key: STATUS
    fields:
      - { field: status, type: string }
where: 'status = "completed" and fare.total > 2.5 and STATUS.reason != "test"'
"#,
        );
        let ds = defs.datastore("trips").unwrap();
        let index = ds.index("by_city").unwrap();
        let signature = index_signature(index);
        let stored = StoredIndex::of(index);
        let text = serde_json::to_string(&stored).unwrap();
        let read: StoredIndex = serde_json::from_str(&text).unwrap();
        let restored = read.restore(ds, "by_city", &signature).expect("restores");
        let mut expected = (**index).clone();
        expected.description = None;
        assert_eq!(restored.fields, expected.fields);
        assert_eq!(restored.shard_field, expected.shard_field);
        assert_eq!(restored.columns, expected.columns);
        assert_eq!(
            restored.predicate.as_ref().map(|p| p.qualified()),
            expected.predicate.as_ref().map(|p| p.qualified())
        );
        assert_eq!(
            restored.predicate.as_ref().unwrap().sources,
            expected.predicate.as_ref().unwrap().sources
        );
        // Another signature (the table is another shape) restores nothing.
        assert_eq!(read.restore(ds, "by_city", "0000000000000000"), None);
    }
}
