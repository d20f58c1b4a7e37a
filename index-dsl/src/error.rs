//! [`Error`]: the one error type of the crate, for callers that want a single type.
//!
//! The loaders and parsers return their specific error ([`Diagnostics`], [`FilterError`]) because
//! callers usually render those; this enum lets a caller use `?` across both.

use crate::diagnostic::Diagnostics;
use crate::filter_error::FilterError;

/// Any error of this crate.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A definitions directory holds invalid definitions; every problem found is listed.
    #[error(transparent)]
    Definitions(#[from] Diagnostics),
    /// A filter expression, field path or type name did not parse.
    #[error(transparent)]
    Expression(#[from] FilterError),
}

/// `Result` with this crate's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
