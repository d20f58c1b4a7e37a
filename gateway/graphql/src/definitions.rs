//! `Query.definitions`: whether the gateway serves the latest definitions
//! on disk, and how the last reload went (an admin field: a token with a
//! `*:admin` scope). The gateway keeps one [`DefinitionsStatus`], updates it
//! on every reload and hands it to each request as data; without it (a
//! schema served by something else than `cellgate serve`) the field
//! answers that the definitions were loaded once and never reloaded.

use std::sync::{Arc, Mutex};

use async_graphql::dynamic::{Enum, EnumItem, Field, FieldFuture, FieldValue, Object, TypeRef};
use async_graphql::{Name, Value};
use chrono::{DateTime, Utc};

use crate::fields::from_parent;
use crate::scalars::{datetime_value, DATETIME};

/// The root field of this module, for name clash checks and the access
/// check.
pub(crate) const QUERY_FIELD: &str = "definitions";

/// How a reload ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadResult {
    /// The definitions changed and are served now.
    Applied,
    /// The definitions on disk were those served already.
    Unchanged,
    /// The definitions on disk do not load (syntax, validation): the
    /// previous ones stay.
    Invalid,
    /// They load, but the running store cannot apply them (a removed
    /// datastore, a new shard count, a catalog mismatch, an unreachable
    /// database): the previous ones stay.
    Refused,
}

impl ReloadResult {
    /// The label of the result in `/metrics` and the enum value in GraphQL.
    pub fn as_str(self) -> &'static str {
        match self {
            ReloadResult::Applied => "applied",
            ReloadResult::Unchanged => "unchanged",
            ReloadResult::Invalid => "invalid",
            ReloadResult::Refused => "refused",
        }
    }

    pub const ALL: [ReloadResult; 4] = [
        ReloadResult::Applied,
        ReloadResult::Unchanged,
        ReloadResult::Invalid,
        ReloadResult::Refused,
    ];
}

/// The last reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastReload {
    pub at: DateTime<Utc>,
    pub result: ReloadResult,
    /// What changed (applied), or why nothing did (invalid, refused: the
    /// diagnostics with file, line and column).
    pub details: Vec<String>,
}

/// What `Query.definitions` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefinitionsState {
    /// When the definitions served now were loaded.
    pub loaded_at: DateTime<Utc>,
    /// Whether they are the latest on disk: false after a reload that
    /// failed, until one succeeds.
    pub latest: bool,
    pub last_reload: Option<LastReload>,
    /// Reloads since start, per result, in the order of [`ReloadResult::ALL`].
    pub reloads: [u64; 4],
}

/// The shared, updatable [`DefinitionsState`].
#[derive(Debug, Clone)]
pub struct DefinitionsStatus(Arc<Mutex<DefinitionsState>>);

impl Default for DefinitionsStatus {
    fn default() -> Self {
        DefinitionsStatus(Arc::new(Mutex::new(DefinitionsState {
            loaded_at: Utc::now(),
            latest: true,
            last_reload: None,
            reloads: [0; 4],
        })))
    }
}

impl DefinitionsStatus {
    pub fn get(&self) -> DefinitionsState {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Records a reload.
    pub fn record(&self, result: ReloadResult, details: Vec<String>) {
        let mut state = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let now = Utc::now();
        match result {
            ReloadResult::Applied => {
                state.loaded_at = now;
                state.latest = true;
            }
            ReloadResult::Unchanged => state.latest = true,
            ReloadResult::Invalid | ReloadResult::Refused => state.latest = false,
        }
        let position = ReloadResult::ALL
            .iter()
            .position(|r| *r == result)
            .expect("a known result");
        state.reloads[position] += 1;
        state.last_reload = Some(LastReload {
            at: now,
            result,
            details,
        });
    }
}

/// The types of this module.
pub(crate) fn types() -> (Vec<Object>, Enum) {
    let result = Enum::new("ReloadResult")
        .description("How a reload of the definitions ended.")
        .item(EnumItem::new("APPLIED").description("the definitions changed and are served now"))
        .item(EnumItem::new("UNCHANGED").description("the definitions on disk were those served"))
        .item(
            EnumItem::new("INVALID")
                .description("the definitions on disk do not load; the previous ones stay"),
        )
        .item(EnumItem::new("REFUSED").description(
            "the running store cannot apply them (see `details`); the previous ones stay",
        ));
    let last = Object::new("DefinitionsReload")
        .description("The last reload of the definitions.")
        .field(from_parent::<LastReload, _>(
            "at",
            TypeRef::named_nn(DATETIME),
            |r| datetime_value(r.at),
        ))
        .field(from_parent::<LastReload, _>(
            "result",
            TypeRef::named_nn("ReloadResult"),
            |r| Value::Enum(Name::new(r.result.as_str().to_ascii_uppercase())),
        ))
        .field(
            from_parent::<LastReload, _>(
                "details",
                TypeRef::named_nn_list_nn(TypeRef::STRING),
                |r| Value::List(r.details.iter().cloned().map(Value::String).collect()),
            )
            .description(
                "what changed, or why nothing did (diagnostics with file, line and column)",
            ),
        );
    let state = Object::new("DefinitionsStatus")
        .description("The definitions the gateway serves.")
        .field(
            from_parent::<DefinitionsState, _>(
                "latest",
                TypeRef::named_nn(TypeRef::BOOLEAN),
                |s| Value::Boolean(s.latest),
            )
            .description(
                "whether they are the latest on disk: false after a failed reload, until one \
                 succeeds",
            ),
        )
        .field(
            from_parent::<DefinitionsState, _>("loadedAt", TypeRef::named_nn(DATETIME), |s| {
                datetime_value(s.loaded_at)
            })
            .description("when the definitions served now were loaded"),
        )
        .field(Field::new(
            "lastReload",
            TypeRef::named("DefinitionsReload"),
            |ctx| {
                FieldFuture::new(async move {
                    let state = ctx.parent_value.try_downcast_ref::<DefinitionsState>()?;
                    Ok(state.last_reload.clone().map(FieldValue::owned_any))
                })
            },
        ));
    (vec![last, state], result)
}

/// `Query.definitions`.
pub(crate) fn query_field() -> Field {
    Field::new(QUERY_FIELD, TypeRef::named_nn("DefinitionsStatus"), |ctx| {
        FieldFuture::new(async move {
            let state = ctx
                .data_opt::<DefinitionsStatus>()
                .map(DefinitionsStatus::get)
                .unwrap_or_else(|| DefinitionsStatus::default().get());
            Ok(Some(FieldValue::owned_any(state)))
        })
    })
    .description(
        "Whether the definitions served are the latest on disk, and the last reload \
         (needs a `*:admin` scope).",
    )
}
