//! [`Definitions`]: every datastore of a definitions directory, validated.
//!
//! This is the root of the domain model that [`load_dir`](crate::load_dir) produces. Values of
//! these types come only out of validation, so the gateway can trust them: names are SQL-safe
//! identifiers, every index refers to existing columns and has a usable shard field.

use crate::datastore::Datastore;

/// All datastores of a definitions directory, sorted by name.
#[derive(Debug, Clone, PartialEq)]
pub struct Definitions {
    /// The datastores, sorted by name.
    pub datastores: Vec<Datastore>,
}

impl Definitions {
    /// The datastore called `name`, if any.
    pub fn datastore(&self, name: &str) -> Option<&Datastore> {
        self.datastores.iter().find(|d| d.name == name)
    }
}
