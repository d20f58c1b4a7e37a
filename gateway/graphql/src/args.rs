//! Argument values as resolvers receive them, and the argument helpers
//! that several parts of the schema share (a leaf: it uses nothing of the
//! schema, so the schema's files and the admin fields can all use it).

use async_graphql::Value;

use crate::errors::coded;

/// The arguments of a field, coerced: variables replaced by their values
/// and defaults filled in.
pub(crate) type Arguments = async_graphql::indexmap::IndexMap<async_graphql::Name, Value>;

/// The `first` argument of an admin list (default 100), refused with
/// `LIMIT_EXCEEDED` outside `0..=max`.
pub(crate) fn first_argument(
    ctx: &async_graphql::dynamic::ResolverContext<'_>,
    max: usize,
) -> async_graphql::Result<usize> {
    let first = ctx
        .args
        .get("first")
        .map(|v| v.i64())
        .transpose()?
        .unwrap_or(100);
    if !(0..=max as i64).contains(&first) {
        return Err(coded(
            "LIMIT_EXCEEDED",
            format!("first must be between 0 and {max}"),
        ));
    }
    Ok(first as usize)
}
