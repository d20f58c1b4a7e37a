//! What a change of the generated schema does to its clients: the changes
//! between two SDL texts, each classified with the rules of
//! graphql-inspector (`@graphql-inspector/core`'s `diff`), which frontend
//! teams already run on pull requests:
//!
//! - **breaking**: a type, field, argument, input field, enum value, union
//!   member or interface removed; a type's kind changed; a field's type
//!   changed except to a non-null form of it; an argument's or input
//!   field's type changed except to a nullable form of it; a required
//!   argument or input field (non-null, no default) added to an existing
//!   field or input type;
//! - **dangerous**: an optional argument added to an existing field, an
//!   input field with a default added to an existing input type, a default
//!   value changed, an enum value or union member added to an existing
//!   type, an interface added to an existing object type;
//! - **safe**: a type or field added, a nullable input field without a
//!   default added, a safe type change, a description changed.
//!
//! Changes come in the order of the new schema's types (then removed
//! types), each with the path graphql-inspector gives it (`Type.field.arg`).

use std::collections::BTreeMap;
use std::fmt;

use async_graphql::parser::types::{
    BaseType, FieldDefinition, InputValueDefinition, Type, TypeDefinition, TypeKind,
    TypeSystemDefinition,
};
use async_graphql::Positioned;
use serde::Serialize;

/// How a change affects clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Criticality {
    Safe,
    Dangerous,
    Breaking,
}

impl fmt::Display for Criticality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Criticality::Safe => "safe",
            Criticality::Dangerous => "dangerous",
            Criticality::Breaking => "breaking",
        })
    }
}

/// One change of the schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SchemaChange {
    pub criticality: Criticality,
    /// graphql-inspector's change type, e.g. `FIELD_REMOVED`.
    pub kind: &'static str,
    /// `Type`, `Type.field` or `Type.field.argument`.
    pub path: String,
    pub message: String,
}

/// The changes from the schema `old` to `new` (both SDL).
pub fn diff_sdl(old: &str, new: &str) -> Result<Vec<SchemaChange>, String> {
    let (old, new) = (types(old)?, types(new)?);
    let before: BTreeMap<&str, &TypeDefinition> =
        old.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let after: BTreeMap<&str, &TypeDefinition> = new.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut out = Changes::default();
    for (name, now) in &new {
        match before.get(name.as_str()) {
            None => out.push(
                Criticality::Safe,
                "TYPE_ADDED",
                name,
                format!("Type '{name}' was added"),
            ),
            Some(was) => compare_types(&mut out, name, was, now),
        }
    }
    for (name, _) in old.iter().filter(|(n, _)| !after.contains_key(n.as_str())) {
        out.push(
            Criticality::Breaking,
            "TYPE_REMOVED",
            name,
            format!("Type '{name}' was removed"),
        );
    }
    Ok(out.0)
}

#[derive(Default)]
struct Changes(Vec<SchemaChange>);

impl Changes {
    fn push(&mut self, criticality: Criticality, kind: &'static str, path: &str, message: String) {
        self.0.push(SchemaChange {
            criticality,
            kind,
            path: path.to_string(),
            message,
        });
    }
}

/// The named types of `sdl`, in its order.
fn types(sdl: &str) -> Result<Vec<(String, TypeDefinition)>, String> {
    let document = async_graphql::parser::parse_schema(sdl).map_err(|e| e.to_string())?;
    Ok(document
        .definitions
        .into_iter()
        .filter_map(|d| match d {
            TypeSystemDefinition::Type(t) => Some((t.node.name.node.to_string(), t.node)),
            _ => None,
        })
        .collect())
}

fn kind_name(kind: &TypeKind) -> &'static str {
    match kind {
        TypeKind::Scalar => "scalar",
        TypeKind::Object(_) => "object",
        TypeKind::Interface(_) => "interface",
        TypeKind::Union(_) => "union",
        TypeKind::Enum(_) => "enum",
        TypeKind::InputObject(_) => "input object",
    }
}

fn description(d: &Option<Positioned<String>>) -> Option<&str> {
    d.as_ref().map(|d| d.node.as_str())
}

fn compare_types(out: &mut Changes, name: &str, before: &TypeDefinition, after: &TypeDefinition) {
    if description(&before.description) != description(&after.description) {
        out.push(
            Criticality::Safe,
            "TYPE_DESCRIPTION_CHANGED",
            name,
            format!("Description of type '{name}' changed"),
        );
    }
    match (&before.kind, &after.kind) {
        (TypeKind::Object(b), TypeKind::Object(a)) => {
            compare_fields(out, name, &b.fields, &a.fields);
            compare_names(
                out,
                name,
                &b.implements,
                &a.implements,
                (
                    "OBJECT_TYPE_INTERFACE_REMOVED",
                    "OBJECT_TYPE_INTERFACE_ADDED",
                ),
                "interface",
            );
        }
        (TypeKind::Interface(b), TypeKind::Interface(a)) => {
            compare_fields(out, name, &b.fields, &a.fields)
        }
        (TypeKind::Union(b), TypeKind::Union(a)) => compare_names(
            out,
            name,
            &b.members,
            &a.members,
            ("UNION_MEMBER_REMOVED", "UNION_MEMBER_ADDED"),
            "member",
        ),
        (TypeKind::Enum(b), TypeKind::Enum(a)) => {
            let values = |e: &async_graphql::parser::types::EnumType| {
                e.values
                    .iter()
                    .map(|v| {
                        (
                            v.node.value.node.to_string(),
                            description(&v.node.description).map(str::to_string),
                        )
                    })
                    .collect::<BTreeMap<_, _>>()
            };
            let (b, a) = (values(b), values(a));
            for (value, described) in &a {
                let path = format!("{name}.{value}");
                match b.get(value) {
                    None => out.push(
                        Criticality::Dangerous,
                        "ENUM_VALUE_ADDED",
                        &path,
                        format!("Enum value '{value}' was added to enum '{name}'"),
                    ),
                    Some(was) if was != described => out.push(
                        Criticality::Safe,
                        "ENUM_VALUE_DESCRIPTION_CHANGED",
                        &path,
                        format!("Description of enum value '{path}' changed"),
                    ),
                    Some(_) => {}
                }
            }
            for value in b.keys().filter(|v| !a.contains_key(*v)) {
                out.push(
                    Criticality::Breaking,
                    "ENUM_VALUE_REMOVED",
                    &format!("{name}.{value}"),
                    format!("Enum value '{value}' was removed from enum '{name}'"),
                );
            }
        }
        (TypeKind::InputObject(b), TypeKind::InputObject(a)) => {
            compare_inputs(out, name, &b.fields, &a.fields, InputOf::Type)
        }
        (TypeKind::Scalar, TypeKind::Scalar) => {}
        (b, a) => out.push(
            Criticality::Breaking,
            "TYPE_KIND_CHANGED",
            name,
            format!(
                "'{name}' kind changed from '{}' to '{}'",
                kind_name(b),
                kind_name(a)
            ),
        ),
    }
}

fn compare_names(
    out: &mut Changes,
    name: &str,
    before: &[Positioned<async_graphql::Name>],
    after: &[Positioned<async_graphql::Name>],
    (removed, added): (&'static str, &'static str),
    what: &str,
) {
    let has = |list: &[Positioned<async_graphql::Name>], n: &str| list.iter().any(|x| x.node == n);
    for a in after.iter().filter(|a| !has(before, &a.node)) {
        out.push(
            Criticality::Dangerous,
            added,
            name,
            format!("'{name}' gained {what} '{}'", a.node),
        );
    }
    for b in before.iter().filter(|b| !has(after, &b.node)) {
        out.push(
            Criticality::Breaking,
            removed,
            name,
            format!("'{name}' lost {what} '{}'", b.node),
        );
    }
}

fn compare_fields(
    out: &mut Changes,
    name: &str,
    before: &[Positioned<FieldDefinition>],
    after: &[Positioned<FieldDefinition>],
) {
    fn find<'a>(list: &'a [Positioned<FieldDefinition>], n: &str) -> Option<&'a FieldDefinition> {
        list.iter().find(|f| f.node.name.node == n).map(|f| &f.node)
    }
    for field in after.iter().map(|f| &f.node) {
        let path = format!("{name}.{}", field.name.node);
        let Some(was) = find(before, &field.name.node) else {
            out.push(
                Criticality::Safe,
                "FIELD_ADDED",
                &path,
                format!("Field '{}' was added to '{name}'", field.name.node),
            );
            continue;
        };
        if description(&was.description) != description(&field.description) {
            out.push(
                Criticality::Safe,
                "FIELD_DESCRIPTION_CHANGED",
                &path,
                format!("Description of field '{path}' changed"),
            );
        }
        if was.ty.node != field.ty.node {
            let criticality = if safe_for_field(&was.ty.node, &field.ty.node) {
                Criticality::Safe
            } else {
                Criticality::Breaking
            };
            out.push(
                criticality,
                "FIELD_TYPE_CHANGED",
                &path,
                format!(
                    "Field '{path}' changed type from '{}' to '{}'",
                    was.ty.node, field.ty.node
                ),
            );
        }
        compare_inputs(out, &path, &was.arguments, &field.arguments, InputOf::Field);
    }
    for field in before
        .iter()
        .filter(|f| find(after, &f.node.name.node).is_none())
    {
        out.push(
            Criticality::Breaking,
            "FIELD_REMOVED",
            &format!("{name}.{}", field.node.name.node),
            format!("Field '{}' was removed from '{name}'", field.node.name.node),
        );
    }
}

/// Whose input values are compared: a field's arguments or an input
/// type's fields.
#[derive(Clone, Copy)]
enum InputOf {
    Field,
    Type,
}

fn compare_inputs(
    out: &mut Changes,
    owner: &str,
    before: &[Positioned<InputValueDefinition>],
    after: &[Positioned<InputValueDefinition>],
    of: InputOf,
) {
    fn find<'a>(
        list: &'a [Positioned<InputValueDefinition>],
        n: &str,
    ) -> Option<&'a InputValueDefinition> {
        list.iter().find(|v| v.node.name.node == n).map(|v| &v.node)
    }
    let (what, added, removed, type_changed, default_changed, described) = match of {
        InputOf::Field => (
            "Argument",
            "FIELD_ARGUMENT_ADDED",
            "FIELD_ARGUMENT_REMOVED",
            "FIELD_ARGUMENT_TYPE_CHANGED",
            "FIELD_ARGUMENT_DEFAULT_CHANGED",
            "FIELD_ARGUMENT_DESCRIPTION_CHANGED",
        ),
        InputOf::Type => (
            "Input field",
            "INPUT_FIELD_ADDED",
            "INPUT_FIELD_REMOVED",
            "INPUT_FIELD_TYPE_CHANGED",
            "INPUT_FIELD_DEFAULT_VALUE_CHANGED",
            "INPUT_FIELD_DESCRIPTION_CHANGED",
        ),
    };
    for value in after.iter().map(|v| &v.node) {
        let path = format!("{owner}.{}", value.name.node);
        let default = value.default_value.as_ref().map(|d| d.node.to_string());
        let Some(was) = find(before, &value.name.node) else {
            let required = !value.ty.node.nullable && default.is_none();
            let criticality = match (of, required, default.is_some()) {
                (_, true, _) => Criticality::Breaking,
                // A nullable input field without a default is safe; an
                // optional argument is dangerous (graphql-inspector).
                (InputOf::Type, false, false) => Criticality::Safe,
                _ => Criticality::Dangerous,
            };
            out.push(
                criticality,
                added,
                &path,
                format!(
                    "{what} '{}: {}' was added to '{owner}'",
                    value.name.node, value.ty.node
                ),
            );
            continue;
        };
        if description(&was.description) != description(&value.description) {
            out.push(
                Criticality::Safe,
                described,
                &path,
                format!("Description of '{path}' changed"),
            );
        }
        if was.ty.node != value.ty.node {
            let criticality = if safe_for_input(&was.ty.node, &value.ty.node) {
                Criticality::Safe
            } else {
                Criticality::Breaking
            };
            out.push(
                criticality,
                type_changed,
                &path,
                format!(
                    "{what} '{path}' changed type from '{}' to '{}'",
                    was.ty.node, value.ty.node
                ),
            );
        }
        let had = was.default_value.as_ref().map(|d| d.node.to_string());
        if had != default {
            out.push(
                Criticality::Dangerous,
                default_changed,
                &path,
                format!(
                    "Default value of '{path}' changed from '{}' to '{}'",
                    had.as_deref().unwrap_or("none"),
                    default.as_deref().unwrap_or("none")
                ),
            );
        }
    }
    for value in before
        .iter()
        .filter(|v| find(after, &v.node.name.node).is_none())
    {
        out.push(
            Criticality::Breaking,
            removed,
            &format!("{owner}.{}", value.node.name.node),
            format!(
                "{what} '{}' was removed from '{owner}'",
                value.node.name.node
            ),
        );
    }
}

/// A type as graphql-inspector walks it: wrappers outside in.
enum Wrapped {
    NonNull(Box<Wrapped>),
    List(Box<Wrapped>),
    Named(String),
}

fn wrapped(ty: &Type) -> Wrapped {
    let inner = match &ty.base {
        BaseType::Named(name) => Wrapped::Named(name.to_string()),
        BaseType::List(of) => Wrapped::List(Box::new(wrapped(of))),
    };
    if ty.nullable {
        inner
    } else {
        Wrapped::NonNull(Box::new(inner))
    }
}

/// An output type change no client notices: to a non-null form of the
/// same type (graphql-inspector's `safeChangeForField`).
fn safe_for_field(old: &Type, new: &Type) -> bool {
    fn safe(old: &Wrapped, new: &Wrapped) -> bool {
        match (old, new) {
            (Wrapped::Named(a), Wrapped::Named(b)) => a == b,
            (_, Wrapped::NonNull(new)) => match old {
                Wrapped::NonNull(old) => safe(old, new),
                old => safe(old, new),
            },
            (Wrapped::List(old), Wrapped::List(new)) => safe(old, new),
            _ => false,
        }
    }
    safe(&wrapped(old), &wrapped(new))
}

/// An input type change no client notices: to a nullable form of the same
/// type (graphql-inspector's `safeChangeForInputValue`).
fn safe_for_input(old: &Type, new: &Type) -> bool {
    fn safe(old: &Wrapped, new: &Wrapped) -> bool {
        match (old, new) {
            (Wrapped::Named(a), Wrapped::Named(b)) => a == b,
            (Wrapped::List(old), Wrapped::List(new)) => safe(old, new),
            (Wrapped::NonNull(old), new) => match new {
                Wrapped::NonNull(new) => safe(old, new),
                new => safe(old, new),
            },
            _ => false,
        }
    }
    safe(&wrapped(old), &wrapped(new))
}

#[cfg(test)]
mod tests {
    use super::{diff_sdl, Criticality};

    fn changes(old: &str, new: &str) -> Vec<(Criticality, &'static str, String)> {
        diff_sdl(old, new)
            .unwrap()
            .into_iter()
            .map(|c| (c.criticality, c.kind, c.path))
            .collect()
    }

    #[test]
    fn output_and_input_types_follow_graphql_inspector() {
        use Criticality::*;
        let old = "type Query { a: String b: String! c: [Int] d(x: Int!, y: Int): Int }\n\
                   input I { p: Int! q: Int }\nenum E { A B }";
        let new = "type Query { a: String! b: String c: [Int!] d(x: Int, y: Int = 1, z: Int!, w: Int): Int e: Int }\n\
                   input I { p: Int q: Int! r: Int s: Int = 2 t: Int! }\nenum E { A C }";
        assert_eq!(
            changes(old, new),
            vec![
                (Safe, "FIELD_TYPE_CHANGED", "Query.a".into()),
                (Breaking, "FIELD_TYPE_CHANGED", "Query.b".into()),
                (Safe, "FIELD_TYPE_CHANGED", "Query.c".into()),
                (Safe, "FIELD_ARGUMENT_TYPE_CHANGED", "Query.d.x".into()),
                (
                    Dangerous,
                    "FIELD_ARGUMENT_DEFAULT_CHANGED",
                    "Query.d.y".into()
                ),
                (Breaking, "FIELD_ARGUMENT_ADDED", "Query.d.z".into()),
                (Dangerous, "FIELD_ARGUMENT_ADDED", "Query.d.w".into()),
                (Safe, "FIELD_ADDED", "Query.e".into()),
                (Safe, "INPUT_FIELD_TYPE_CHANGED", "I.p".into()),
                (Breaking, "INPUT_FIELD_TYPE_CHANGED", "I.q".into()),
                (Safe, "INPUT_FIELD_ADDED", "I.r".into()),
                (Dangerous, "INPUT_FIELD_ADDED", "I.s".into()),
                (Breaking, "INPUT_FIELD_ADDED", "I.t".into()),
                (Dangerous, "ENUM_VALUE_ADDED", "E.C".into()),
                (Breaking, "ENUM_VALUE_REMOVED", "E.B".into()),
            ]
        );
    }

    #[test]
    fn removed_and_added_types() {
        use Criticality::*;
        assert_eq!(
            changes(
                "type Query { a: A } type A { x: Int }",
                "type Query { a: Int } type B { y: Int }"
            ),
            vec![
                (Breaking, "FIELD_TYPE_CHANGED", "Query.a".into()),
                (Safe, "TYPE_ADDED", "B".into()),
                (Breaking, "TYPE_REMOVED", "A".into()),
            ]
        );
    }
}
