//! cellgate definitions: datastores and their secondary indexes, declared in YAML.
//!
//! This crate owns the definitions model ([`Definitions`], [`Datastore`], [`Index`],
//! [`Trigger`]), loading it from a `datastores/` directory ([`load_dir`]), the pest grammar of
//! the expression sub-language (field paths, type names, filter expressions and partial-index
//! predicates), their evaluation against JSON bodies ([`Filter::matches_json`],
//! [`Predicate::matches`]) and all validation. It is pure: the only I/O is reading definition
//! files, it knows no SQL dialect and nothing async, so the gateway can trust a loaded
//! [`Definitions`] without re-checking it.
//!
//! ```
//! let filter = index_dsl::parse_filter(r#"status in ("completed", "canceled") and fare_total < 30.5"#)?;
//! assert_eq!(filter.conditions.len(), 2);
//! # Ok::<(), index_dsl::FilterError>(())
//! ```

mod datastore;
mod definitions;
mod diagnostic;
mod error;
mod field_path;
mod field_type;
mod filter;
mod filter_error;
mod grammar;
mod identifier;
mod index;
mod json_match;
mod load;
mod predicate;
mod raw;
mod source;
mod trigger;
mod validate;

pub use datastore::{Column, Datastore};
pub use definitions::Definitions;
pub use diagnostic::{Diagnostic, Diagnostics};
pub use error::{Error, Result};
pub use field_path::{parse_path, FieldPath};
pub use field_type::{parse_type, FieldType};
pub use filter::{parse_filter, CompareOp, Condition, Filter, Literal};
pub use filter_error::FilterError;
pub use identifier::is_identifier;
pub use index::{Index, IndexField};
pub use load::{digest, load_dir, load_dir_with_files, load_files};
pub use predicate::{Predicate, PredicateSource};
pub use trigger::{is_env_name, Template, TemplatePart, Trigger, Webhook};

/// Shard count of a datastore whose definition gives none.
pub const DEFAULT_SHARDS: u32 = 4096;

/// Largest shard count a datastore may declare.
pub const MAX_SHARDS: u32 = 65536;
