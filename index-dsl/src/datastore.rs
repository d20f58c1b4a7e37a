//! [`Datastore`] and [`Column`]: a named set of cells with fixed columns and shard count.
//!
//! A datastore comes from `datastores/<name>/datastore.yaml` plus its index and trigger files. The shard count
//! is part of the definition because it is fixed at creation: changing it would move every cell.

use std::sync::Arc;

use crate::index::Index;
use crate::trigger::Trigger;

/// A validated datastore.
#[derive(Debug, Clone, PartialEq)]
pub struct Datastore {
    /// The datastore name, equal to its directory name; at most 20 characters.
    pub name: String,
    /// Number of logical shards, in `1..=MAX_SHARDS`.
    pub shards: u32,
    /// Free text from the definition.
    pub description: Option<String>,
    /// The declared columns, in declaration order.
    pub columns: Vec<Column>,
    /// The secondary indexes, sorted by name; shared, so a query plan
    /// holds its index without copying it.
    pub indexes: Vec<Arc<Index>>,
    /// The webhook triggers, sorted by name.
    pub triggers: Vec<Trigger>,
}

impl Datastore {
    /// The column called `name` (exact match), if any.
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// The index called `name` (its `table`), if any.
    pub fn index(&self, name: &str) -> Option<&Arc<Index>> {
        self.indexes.iter().find(|i| i.name == name)
    }

    /// The trigger called `name`, if any.
    pub fn trigger(&self, name: &str) -> Option<&Trigger> {
        self.triggers.iter().find(|t| t.name == name)
    }
}

/// A column of a datastore, such as `BASE`.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    /// The column name; at most 48 characters.
    pub name: String,
    /// Free text from the definition.
    pub description: Option<String>,
}
