//! The depth and complexity limits of a request, with introspection counted
//! apart.
//!
//! async-graphql's own `limit_depth`/`limit_complexity` count every field,
//! those under `__schema` and `__type` included. The introspection query of
//! graphql-js (`getIntrospectionQuery()`, which GraphiQL, graphql-codegen,
//! Apollo tooling and schemathesis send) nests about fifteen fields deep
//! through its `TypeRef` fragment, so it was refused with `QUERY_TOO_DEEP`
//! and clients could not generate code from a live server. Here the part of
//! an operation outside introspection is held to the configured
//! [`GraphqlLimits`], and introspection subtrees to fixed bounds of their
//! own that admit every variant of the standard query but not the known
//! ways to make introspection expensive:
//!
//! - list fields of `__Type` (`fields`, `inputFields`, `interfaces`,
//!   `possibleTypes`) nested in one another: each level multiplies the
//!   answer by the size of the schema. Like graphql-js's
//!   `MaxIntrospectionDepthRule`, at most [`MAX_INTROSPECTION_LISTS`]
//!   levels (the standard query uses one);
//! - introspection repeated under many aliases: at most
//!   [`MAX_INTROSPECTION_FIELDS`] fields, twice the largest standard query.
//!
//! User fields cost 1 each, multiplied by the page sizes of the list
//! fields above them (`first`, `limit`, the number of `rowKeys`, or a
//! default page), so aliases × `first: 1000` × `row` fan-out is seen; the
//! number of aliases is capped too. Refusals carry `extensions.limit`,
//! `extensions.limitName` and, for the cost, `extensions.cost`.
//!
//! The check runs in the HTTP handler on the parsed document, before
//! async-graphql's own preparation (whose recursion check walks every
//! fragment spread) and validation. It is not an async-graphql extension:
//! a registered extension wraps the resolution of every field in a boxed
//! future of its own, which cost several percent of a simple query.
//! Each fragment is
//! counted where it is spread (as async-graphql counts). Every expansion
//! of a spread counts toward `max_fragment_spreads` and fragment cycles
//! are refused, so a document whose fragments spread each other
//! exponentially is refused after a few hundred steps; unknown fragments
//! are skipped here and refused by validation.

use async_graphql::parser::types::{
    DocumentOperations, ExecutableDocument, Field, OperationDefinition, Selection, SelectionSet,
};
use async_graphql::{ErrorExtensionValues, Name, ServerError, Variables};
use async_graphql_value::{ConstValue, Value};

/// Deepest nesting of the list fields of `__Type` inside introspection.
const MAX_INTROSPECTION_LISTS: usize = 2;

/// Most fields selected under `__schema` and `__type` in one operation.
/// The largest standard introspection query (every option on) selects 230
/// once its fragments are expanded; each further field can repeat the
/// schema-sized answer of a list, so the bound stays near that.
const MAX_INTROSPECTION_FIELDS: usize = 500;

/// The list fields of `__Type`.
const INTROSPECTION_LISTS: [&str; 4] = ["fields", "inputFields", "interfaces", "possibleTypes"];

/// Checks a parsed request against `limits` before it runs: the selected
/// operation against the configured limits, every other operation of the
/// document against the bounds on fragment expansion (which async-graphql's
/// parse step walks for all of them). The error carries the stable code.
pub fn check_limits(
    document: &ExecutableDocument,
    operation_name: Option<&str>,
    variables: &Variables,
    limits: GraphqlLimits,
) -> Result<(), ServerError> {
    check(document, operation_name, limits, variables).map_err(|e| e.into_error(limits))
}

/// The code of an error async-graphql reports while preparing a request:
/// `QUERY_TOO_DEEP` for its own guard against deep recursion, which runs
/// on the parsed document before validation; `None` for the others.
pub fn prepare_error_code(error: &ServerError) -> Option<&'static str> {
    error
        .message
        .starts_with("The recursion depth of the query")
        .then_some("QUERY_TOO_DEEP")
}

/// Holds the operation the request selects to `limits`, and every other
/// operation of the document to the bounds on fragment expansion (which
/// async-graphql's parse step walks for all of them).
fn check(
    document: &ExecutableDocument,
    name: Option<&str>,
    limits: GraphqlLimits,
    variables: &Variables,
) -> Result<(), Exceeded> {
    let selected = selected_operation(document, name);
    let unbounded = GraphqlLimits {
        depth: usize::MAX,
        complexity: usize::MAX,
        aliases: usize::MAX,
        ..limits
    };
    for (_, operation) in document.operations.iter() {
        let operation = &operation.node;
        let is_selected = selected.is_some_and(|s| std::ptr::eq(s, operation));
        let limits = if is_selected { limits } else { unbounded };
        measure(document, operation, limits, variables)?;
    }
    Ok(())
}

/// The operation a request runs; `None` when the name is unknown or
/// needed, which execution reports.
fn selected_operation<'d>(
    document: &'d ExecutableDocument,
    name: Option<&str>,
) -> Option<&'d OperationDefinition> {
    match (&document.operations, name) {
        (DocumentOperations::Single(operation), _) => Some(&operation.node),
        (DocumentOperations::Multiple(operations), Some(name)) => {
            operations.get(name).map(|operation| &operation.node)
        }
        (DocumentOperations::Multiple(operations), None) if operations.len() == 1 => {
            operations.values().next().map(|operation| &operation.node)
        }
        (DocumentOperations::Multiple(_), None) => None,
    }
}

/// Which bound an operation passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exceeded {
    Depth,
    /// The cost (exact, or a lower bound when counting stopped early).
    Complexity {
        cost: u64,
    },
    Aliases,
    FragmentSpreads,
    /// A fragment spreads itself, directly or through others.
    FragmentCycle,
    IntrospectionLists,
    IntrospectionFields,
}

impl Exceeded {
    fn into_error(self, limits: GraphqlLimits) -> ServerError {
        let (code, message, limit, cost) = match self {
            Exceeded::Depth => (
                "QUERY_TOO_DEEP",
                format!(
                    "the query nests fields more than {} deep (introspection not counted)",
                    limits.depth
                ),
                limits.depth,
                None,
            ),
            Exceeded::Complexity { cost } => (
                "QUERY_TOO_COMPLEX",
                format!(
                    "the query costs {cost}, more than {}: each field costs 1 and list fields multiply what they select by their `first`, `limit` or number of `rowKeys` (introspection not counted)",
                    limits.complexity
                ),
                limits.complexity,
                Some(cost),
            ),
            Exceeded::Aliases => (
                "QUERY_TOO_COMPLEX",
                format!("the query has more than {} aliases", limits.aliases),
                limits.aliases,
                None,
            ),
            Exceeded::FragmentSpreads => (
                "QUERY_TOO_COMPLEX",
                format!(
                    "the query expands more than {} fragment spreads",
                    limits.fragment_spreads
                ),
                limits.fragment_spreads,
                None,
            ),
            Exceeded::FragmentCycle => (
                "GRAPHQL_VALIDATION_FAILED",
                "a fragment spreads itself, directly or through other fragments".to_string(),
                0,
                None,
            ),
            Exceeded::IntrospectionLists => (
                "QUERY_TOO_DEEP",
                format!(
                    "introspection nests `fields`, `inputFields`, `interfaces` or `possibleTypes` more than {MAX_INTROSPECTION_LISTS} deep"
                ),
                MAX_INTROSPECTION_LISTS,
                None,
            ),
            Exceeded::IntrospectionFields => (
                "QUERY_TOO_COMPLEX",
                format!("introspection selects more than {MAX_INTROSPECTION_FIELDS} fields"),
                MAX_INTROSPECTION_FIELDS,
                None,
            ),
        };
        let mut error = coded(message, code);
        if let Some(extensions) = &mut error.extensions {
            extensions.set("limit", limit as u64);
            extensions.set("limitName", self.limit_name());
            if let Some(cost) = cost {
                extensions.set("cost", cost);
            }
        }
        error
    }

    /// The name of the configuration option (without `max_`), camel-cased.
    fn limit_name(self) -> &'static str {
        match self {
            Exceeded::Depth => "depth",
            Exceeded::Complexity { .. } => "complexity",
            Exceeded::Aliases => "aliases",
            Exceeded::FragmentSpreads => "fragmentSpreads",
            Exceeded::FragmentCycle => "fragmentCycle",
            Exceeded::IntrospectionLists => "introspectionLists",
            Exceeded::IntrospectionFields => "introspectionFields",
        }
    }
}

fn coded(message: String, code: &str) -> ServerError {
    let mut error = ServerError::new(message, None);
    let mut extensions = ErrorExtensionValues::default();
    extensions.set("code", code);
    error.extensions = Some(extensions);
    error
}

/// What an operation within the limits selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Measure {
    /// The cost of the fields outside introspection.
    cost: u64,
    /// Fields under `__schema` and `__type`.
    introspection_fields: usize,
}

/// Most selections visited while measuring, so that measuring stays cheap
/// whatever the document: past it the operation is refused, with the cost
/// found so far as a lower bound.
const MAX_VISITS: usize = 100_000;

/// Largest multiplier of one list field: no field returns more than 1000
/// items, and a larger argument is refused by its resolver with
/// `LIMIT_EXCEEDED`, which says more than a cost would.
const MAX_MULTIPLIER: u64 = 1000;

/// Measures `operation` of `document`, or tells which limit it passes.
fn measure(
    document: &ExecutableDocument,
    operation: &OperationDefinition,
    limits: GraphqlLimits,
    variables: &Variables,
) -> Result<Measure, Exceeded> {
    let mut count = Count {
        document,
        limits,
        variables,
        expanding: Vec::new(),
        cost: 0,
        visits: 0,
        aliases: 0,
        spreads: 0,
        introspection_fields: 0,
    };
    let walked = count.walk(
        &operation.selection_set.node,
        Level::User {
            depth: 0,
            factor: 1,
        },
    );
    match walked {
        Err(Stop::Exceeded(exceeded)) => return Err(exceeded),
        // Nothing legitimate selects this much; the cost so far is a lower
        // bound, reported as such.
        Err(Stop::TooLong) => {
            return Err(Exceeded::Complexity {
                cost: count.cost.max((limits.complexity as u64).saturating_add(1)),
            })
        }
        Ok(()) => {}
    }
    if count.cost > limits.complexity as u64 {
        return Err(Exceeded::Complexity { cost: count.cost });
    }
    Ok(Measure {
        cost: count.cost,
        introspection_fields: count.introspection_fields,
    })
}

/// Where in the operation a selection set is.
#[derive(Debug, Clone, Copy)]
enum Level {
    /// Outside introspection, `depth` fields deep; each field here costs
    /// `factor` (the product of the multipliers of the lists above).
    User { depth: usize, factor: u64 },
    /// Inside `__schema` or `__type`, under `lists` nested list fields.
    Introspection { lists: usize },
}

/// Why a walk stopped.
enum Stop {
    Exceeded(Exceeded),
    /// [`MAX_VISITS`] reached: the cost so far is a lower bound.
    TooLong,
}

impl From<Exceeded> for Stop {
    fn from(exceeded: Exceeded) -> Stop {
        Stop::Exceeded(exceeded)
    }
}

struct Count<'d> {
    document: &'d ExecutableDocument,
    limits: GraphqlLimits,
    variables: &'d Variables,
    /// Fragments being expanded, to step over cycles.
    expanding: Vec<&'d Name>,
    /// The cost of the fields outside introspection.
    cost: u64,
    visits: usize,
    aliases: usize,
    spreads: usize,
    introspection_fields: usize,
}

impl<'d> Count<'d> {
    fn walk(&mut self, set: &'d SelectionSet, level: Level) -> Result<(), Stop> {
        for selection in &set.items {
            self.visits += 1;
            if self.visits > MAX_VISITS {
                return Err(Stop::TooLong);
            }
            match &selection.node {
                Selection::Field(field) => {
                    let field = &field.node;
                    if field.alias.is_some() {
                        self.aliases += 1;
                        if self.aliases > self.limits.aliases {
                            return Err(Exceeded::Aliases.into());
                        }
                    }
                    let name = field.name.node.as_str();
                    let inner = match level {
                        Level::User { .. } if name == "__schema" || name == "__type" => {
                            self.count_introspection()?;
                            Level::Introspection { lists: 0 }
                        }
                        Level::User { depth, factor } => {
                            if depth + 1 > self.limits.depth {
                                return Err(Exceeded::Depth.into());
                            }
                            self.cost = self.cost.saturating_add(factor);
                            let factor = factor.saturating_mul(self.multiplier(field));
                            Level::User {
                                depth: depth + 1,
                                factor,
                            }
                        }
                        Level::Introspection { lists } => {
                            self.count_introspection()?;
                            let lists = lists + usize::from(INTROSPECTION_LISTS.contains(&name));
                            if lists > MAX_INTROSPECTION_LISTS {
                                return Err(Exceeded::IntrospectionLists.into());
                            }
                            Level::Introspection { lists }
                        }
                    };
                    self.walk(&field.selection_set.node, inner)?;
                }
                Selection::InlineFragment(fragment) => {
                    self.walk(&fragment.node.selection_set.node, level)?;
                }
                Selection::FragmentSpread(spread) => {
                    // Every expansion counts, so a document whose fragments
                    // spread each other twice over is refused after a few
                    // hundred steps instead of expanding 2^n times.
                    self.spreads += 1;
                    if self.spreads > self.limits.fragment_spreads {
                        return Err(Exceeded::FragmentSpreads.into());
                    }
                    let name = &spread.node.fragment_name.node;
                    let Some(fragment) = self.document.fragments.get(name) else {
                        continue;
                    };
                    // Refused here rather than left to validation: the
                    // parse step before validation expands cycles until
                    // its recursion limit, 2^32 times for two fragments
                    // that spread each other twice.
                    if self.expanding.contains(&name) {
                        return Err(Exceeded::FragmentCycle.into());
                    }
                    self.expanding.push(name);
                    let result = self.walk(&fragment.node.selection_set.node, level);
                    self.expanding.pop();
                    result?;
                }
            }
        }
        Ok(())
    }

    /// How many items `field` may return, each of which costs what the
    /// field selects: its `first` or `limit` argument, the length of
    /// `rowKeys`, the default page of a connection (a field selecting
    /// `edges`) or of the cell log and history, and 1 for anything else.
    fn multiplier(&self, field: &'d Field) -> u64 {
        let argument = |name: &str| {
            field
                .arguments
                .iter()
                .find(|(n, _)| n.node.as_str() == name)
                .map(|(_, value)| self.resolve(&value.node))
        };
        let items = if let Some(value) = argument("first").or_else(|| argument("limit")) {
            match value {
                Some(ConstValue::Number(n)) => n.as_u64().unwrap_or(MAX_MULTIPLIER),
                _ => self.default_page(field),
            }
        } else if let Some(keys) = argument("rowKeys") {
            match keys {
                Some(ConstValue::List(keys)) => keys.len() as u64,
                _ => 1,
            }
        } else {
            self.default_page(field)
        };
        items.clamp(1, MAX_MULTIPLIER)
    }

    fn default_page(&self, field: &Field) -> u64 {
        match field.name.node.as_str() {
            "history" => 20,
            "cellsForShard" => 100,
            _ if field.selection_set.node.items.iter().any(
                |s| matches!(&s.node, Selection::Field(f) if f.node.name.node.as_str() == "edges"),
            ) =>
            {
                u64::from(cellgate_store::indexes::plan::DEFAULT_PAGE)
            }
            _ => 1,
        }
    }

    /// The value of an argument, with variables replaced by theirs.
    fn resolve(&self, value: &Value) -> Option<ConstValue> {
        match value {
            Value::Variable(name) => self.variables.get(name).cloned(),
            other => other.clone().into_const(),
        }
    }

    fn count_introspection(&mut self) -> Result<(), Exceeded> {
        self.introspection_fields += 1;
        if self.introspection_fields > MAX_INTROSPECTION_FIELDS {
            return Err(Exceeded::IntrospectionFields);
        }
        Ok(())
    }
}

/// Limits enforced by the schema on every request (see `limits.rs`);
/// fields under `__schema` and `__type` do not count toward them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphqlLimits {
    /// Deepest selection nesting accepted.
    pub depth: usize,
    /// Largest query cost accepted: each field costs 1, and what a list
    /// field selects is multiplied by the items it may return.
    pub complexity: usize,
    /// Most aliased fields in one operation.
    pub aliases: usize,
    /// Most fragment spread expansions in one operation.
    pub fragment_spreads: usize,
    /// Longest `filter` string, in bytes.
    pub filter_bytes: usize,
    /// Most comparisons in one `filter` string.
    pub filter_terms: usize,
    /// Most values in one `in` list.
    pub in_values: usize,
}

impl Default for GraphqlLimits {
    fn default() -> Self {
        GraphqlLimits {
            // Introspection does not count (see `limits.rs`), so GraphiQL's
            // schema query, which nests 15 levels, passes at any depth.
            depth: 12,
            // A page of 1000 index entries with a `row` and a cell body
            // costs about 5000; eight such aliases do not pass.
            complexity: 25_000,
            aliases: 32,
            fragment_spreads: 500,
            filter_bytes: 4096,
            filter_terms: 64,
            in_values: 1000,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use async_graphql::parser::parse_query;

    use super::*;

    fn measured(query: &str, limits: GraphqlLimits) -> Result<Measure, Exceeded> {
        let document = parse_query(query).expect("query parses");
        let operation = selected_operation(&document, None).expect("one operation");
        measure(&document, operation, limits, &Variables::default())
    }

    const TIGHT: GraphqlLimits = GraphqlLimits {
        depth: 2,
        complexity: 3,
        aliases: 32,
        fragment_spreads: 500,
        filter_bytes: 4096,
        filter_terms: 64,
        in_values: 1000,
    };

    /// The fixtures of `tests/fixtures/introspection`: `(name, query)`.
    fn standard_queries() -> Vec<(String, String)> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/introspection");
        let mut queries = Vec::new();
        for version in std::fs::read_dir(&root).expect("fixtures") {
            let version = version.expect("entry").path();
            if !version.is_dir() {
                continue;
            }
            for file in std::fs::read_dir(&version).expect("version dir") {
                let file = file.expect("entry").path();
                let text = std::fs::read_to_string(&file).expect("fixture");
                queries.push((file.display().to_string(), text));
            }
        }
        assert!(queries.len() >= 20, "{} fixtures", queries.len());
        queries
    }

    #[test]
    fn standard_introspection_is_not_counted_and_fits_its_own_bounds() {
        for (name, query) in standard_queries() {
            let measure = measured(&query, TIGHT).unwrap_or_else(|e| panic!("{name}: {e:?}"));
            assert_eq!(measure.cost, 0, "{name}");
            // A margin below the bound, for options graphql-js may add.
            assert!(
                measure.introspection_fields * 2 < MAX_INTROSPECTION_FIELDS,
                "{name}: {measure:?}"
            );
        }
    }

    #[test]
    fn user_fields_keep_their_limits_beside_introspection() {
        let deep = "{ __schema { types { name } } a { b { c } } }";
        assert_eq!(measured(deep, TIGHT), Err(Exceeded::Depth));
        let wide = "{ __typename a b c d }";
        assert_eq!(measured(wide, TIGHT), Err(Exceeded::Complexity { cost: 5 }));
        let fits = "{ __type(name: \"Query\") { fields { name } } a { b } }";
        assert_eq!(
            measured(fits, TIGHT),
            Ok(Measure {
                cost: 2,
                introspection_fields: 3
            })
        );
        // A fragment counts where it is spread, an inline fragment is transparent.
        let spread = "query { a { ...F } } fragment F on T { ... on T { b { c } } }";
        assert_eq!(measured(spread, TIGHT), Err(Exceeded::Depth));
    }

    #[test]
    fn only_the_selected_operation_counts() {
        let document = parse_query("query Deep { a { b { c } } } query Flat { a }").unwrap();
        let deep = selected_operation(&document, Some("Deep")).unwrap();
        let none = Variables::default();
        assert_eq!(measure(&document, deep, TIGHT, &none), Err(Exceeded::Depth));
        let flat = selected_operation(&document, Some("Flat")).unwrap();
        assert!(measure(&document, flat, TIGHT, &none).is_ok());
        assert!(selected_operation(&document, None).is_none());
        assert!(selected_operation(&document, Some("Other")).is_none());
    }

    #[test]
    fn nested_introspection_lists_are_refused() {
        let two = "{ __schema { types { fields { type { fields { name } } } } } }";
        assert!(measured(two, TIGHT).is_ok());
        let three = "{ __schema { types { fields { type { fields { type { inputFields { name } } } } } } } }";
        assert_eq!(measured(three, TIGHT), Err(Exceeded::IntrospectionLists));
        let through_fragments = "{ __type(name: \"Q\") { ...A } }
            fragment A on __Type { fields { type { ...B } } }
            fragment B on __Type { interfaces { ...C } }
            fragment C on __Type { possibleTypes { name } }";
        assert_eq!(
            measured(through_fragments, TIGHT),
            Err(Exceeded::IntrospectionLists)
        );
    }

    #[test]
    fn aliased_introspection_is_bounded() {
        let aliases: String = (0..MAX_INTROSPECTION_FIELDS)
            .map(|i| format!("t{i}: __type(name: \"Query\") {{ name }} "))
            .collect();
        let query = format!("{{ {aliases} }}");
        let limits = GraphqlLimits {
            aliases: usize::MAX,
            ..GraphqlLimits::default()
        };
        assert_eq!(measured(&query, limits), Err(Exceeded::IntrospectionFields));
    }

    #[test]
    fn exponential_fragments_stop_at_the_limit() {
        // F0 spreads F1 twice, F1 spreads F2 twice, …: 2^40 fields expanded.
        let mut query = String::from("{ ...F0 }");
        for i in 0..40 {
            query.push_str(&format!(
                " fragment F{i} on Query {{ ...F{n} ...F{n} }}",
                n = i + 1
            ));
        }
        query.push_str(" fragment F40 on Query { a }");
        assert_eq!(
            measured(&query, GraphqlLimits::default()),
            Err(Exceeded::FragmentSpreads)
        );
        // Ten spreads of the next fragment, ten levels deep: 10^10
        // expansions, few fields before the limit on spreads.
        let mut bomb = String::from("{ ...F0 }");
        for i in 0..10 {
            let spreads = format!("...F{} ", i + 1).repeat(10);
            bomb.push_str(&format!(" fragment F{i} on Query {{ {spreads}}}"));
        }
        bomb.push_str(" fragment F10 on Query { __typename }");
        assert_eq!(
            measured(&bomb, GraphqlLimits::default()),
            Err(Exceeded::FragmentSpreads)
        );
        // Regression: spreads that only lead into cycles select no field,
        // so counting fields alone let 10^10 expansions through.
        let cyclic = bomb.replace("{ __typename }", "{ ...F0 }");
        assert_eq!(
            measured(&cyclic, GraphqlLimits::default()),
            Err(Exceeded::FragmentCycle)
        );
        // Regression: a cycle was left to validation, but the parse step
        // before it expanded two fragments spreading each other twice 2^32
        // times.
        let cycle = "{ ...A } fragment A on Query { ...B ...B } fragment B on Query { ...A ...A }";
        assert_eq!(measured(cycle, TIGHT), Err(Exceeded::FragmentCycle));
        // Operations that are not run are bounded too.
        let document = parse_query(format!("query Run {{ a }} query Other {bomb}")).unwrap();
        assert_eq!(
            check(&document, Some("Run"), TIGHT, &Variables::default()),
            Err(Exceeded::FragmentSpreads)
        );
    }

    #[test]
    fn huge_documents_stop_at_the_visit_bound() {
        let fields = "__typename ".repeat(MAX_VISITS + 1);
        let query = format!("{{ {fields} }}");
        let unbounded = GraphqlLimits {
            complexity: usize::MAX,
            ..GraphqlLimits::default()
        };
        assert!(matches!(
            measured(&query, unbounded),
            Err(Exceeded::Complexity { .. })
        ));
    }

    #[test]
    fn list_fields_multiply_what_they_select() {
        let limits = GraphqlLimits::default();
        let page =
            "{ trips { byDriver(first: 1000) { edges { node { row { base { body } } } } } } }";
        // trips 1, byDriver 1, then 1000 × (edges, node, row, base, body).
        assert_eq!(measured(page, limits).map(|m| m.cost), Ok(5002));
        let aliased: String = (0..8)
            .map(|i| format!("p{i}: byDriver(first: 1000) {{ edges {{ node {{ row {{ base {{ body }} }} }} }} }} "))
            .collect();
        let fan_out = format!("{{ trips {{ {aliased} }} }}");
        assert_eq!(
            measured(&fan_out, limits),
            Err(Exceeded::Complexity { cost: 40_009 })
        );
        // Variables count as their values; a connection without `first`
        // counts its default page.
        let document =
            parse_query("query($n: Int, $k: [UUID!]!) { t { a(limit: $n) { x } rows(rowKeys: $k) { y z } c { edges { node { w } } } } }")
                .unwrap();
        let operation = selected_operation(&document, None).unwrap();
        let variables = Variables::from_json(serde_json::json!({"n": 7, "k": ["a", "b", "c"]}));
        let cost = measure(&document, operation, limits, &variables).map(|m| m.cost);
        assert_eq!(cost, Ok(1 + (1 + 7) + (1 + 3 * 2) + (1 + 50 * 3)));
    }
}
