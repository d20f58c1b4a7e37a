//! Fields whose value is computed from their parent object's Rust value,
//! the way most generated objects are built.

use std::sync::Arc;

use async_graphql::dynamic::{Field, FieldFuture, FieldValue, ResolverContext, TypeRef};
use async_graphql::Value;

pub(crate) fn parent<'a, T: std::any::Any>(
    ctx: &ResolverContext<'a>,
) -> async_graphql::Result<&'a T> {
    ctx.parent_value.try_downcast_ref::<T>()
}

/// A field computed from the parent value of type `T`.
pub(crate) fn from_parent<T, F>(name: &str, ty: TypeRef, f: F) -> Field
where
    T: std::any::Any + Send + Sync,
    F: Fn(&T) -> Value + Send + Sync + 'static,
{
    let f = Arc::new(f);
    Field::new(name, ty, move |ctx| {
        let f = f.clone();
        FieldFuture::new(async move {
            // `None`, not a null value: the dynamic schema resolves a present
            // value of an object or enum type even when it is null.
            Ok(match f(parent::<T>(&ctx)?) {
                Value::Null => None,
                value => Some(FieldValue::value(value)),
            })
        })
    })
}

/// A field of a metadata object: reads `name` from the parent `Value`.
pub(crate) fn meta_field(name: &'static str, ty: TypeRef) -> Field {
    Field::new(name, ty, move |ctx| {
        FieldFuture::new(async move {
            let value = match ctx.parent_value.as_value() {
                Some(Value::Object(map)) => map.get(name).cloned().unwrap_or(Value::Null),
                _ => Value::Null,
            };
            Ok(match value {
                Value::Null => None,
                value => Some(meta_value(value)),
            })
        })
    })
}

pub(crate) fn meta_value(value: Value) -> FieldValue<'static> {
    match value {
        Value::List(items) => FieldValue::list(items.into_iter().map(meta_value)),
        other => FieldValue::value(other),
    }
}
