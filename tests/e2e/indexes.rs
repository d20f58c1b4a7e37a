//! Index queries over GraphQL: every operator on every field type (typed
//! `where` and `filter` text), projection, pagination and `row` fetches.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::cells::{cell, put_trips};
use reqwest::StatusCode;

use crate::harness::{Accept, Defs, Env, Server, Wait};

/// A typed value of an `items_index` field, as the model sees it.
#[derive(Debug, Clone, PartialEq)]
enum V {
    I(i64),
    F(f64),
    S(String),
    T(DateTime<Utc>),
    U(Uuid),
    B(bool),
}

impl V {
    fn compare(&self, other: &V) -> Option<Ordering> {
        match (self, other) {
            (V::I(a), V::I(b)) => a.partial_cmp(b),
            (V::F(a), V::F(b)) => a.partial_cmp(b),
            (V::S(a), V::S(b)) => a.partial_cmp(b),
            (V::T(a), V::T(b)) => a.partial_cmp(b),
            (V::U(a), V::U(b)) => a.partial_cmp(b),
            (V::B(a), V::B(b)) => a.partial_cmp(b),
            _ => None,
        }
    }

    /// The value in a `where` input (Int64 alternates number and string).
    fn graphql(&self) -> Value {
        match self {
            V::I(i) if i.unsigned_abs() < (1 << 53) => json!(i),
            V::I(i) => json!(i.to_string()),
            V::F(f) => json!(f),
            V::S(s) => json!(s),
            V::T(t) => json!(t.to_rfc3339_opts(SecondsFormat::AutoSi, true)),
            V::U(u) => json!(u.to_string()),
            V::B(b) => json!(b),
        }
    }

    /// The value as a filter-string literal.
    fn text(&self) -> String {
        match self {
            V::I(i) => i.to_string(),
            V::F(f) => format!("{f:?}"),
            V::S(s) => format!("{s:?}"),
            V::T(t) => format!("\"{}\"", t.to_rfc3339_opts(SecondsFormat::AutoSi, true)),
            V::U(u) => format!("\"{u}\""),
            V::B(b) => b.to_string(),
        }
    }

    /// Whether `value` from a response is this value.
    fn matches(&self, value: &Value) -> bool {
        match self {
            V::I(i) => value.as_str() == Some(i.to_string().as_str()),
            V::F(f) => value.as_f64() == Some(*f),
            V::S(s) => value.as_str() == Some(s.as_str()),
            V::T(t) => value
                .as_str()
                .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
                .is_some_and(|d| d == *t && value.as_str().is_some_and(|s| s.ends_with('Z'))),
            V::U(u) => value.as_str() == Some(u.to_string().as_str()),
            V::B(b) => value.as_bool() == Some(*b),
        }
    }
}

fn t(s: &str) -> V {
    V::T(
        DateTime::parse_from_rfc3339(s)
            .expect("test datetime")
            .with_timezone(&Utc),
    )
}

/// The fields of `items_index` (the shard field `owner` aside).
const FIELDS: [&str; 6] = ["n", "x", "s", "t", "u", "b"];

/// One row of `items`: its DATA body (values as written) and FLAGS body.
struct Item {
    key: Uuid,
    values: BTreeMap<&'static str, V>,
    data: Value,
    flags: Option<Value>,
}

fn item(owner: &str, fields: Vec<(&'static str, V, Value)>) -> Item {
    let mut data = json!({ "owner": owner });
    let mut flags = None;
    let mut values = BTreeMap::new();
    for (name, value, written) in fields {
        if name == "b" {
            flags = Some(json!({ "b": written }));
        } else {
            data[name] = written;
        }
        values.insert(name, value);
    }
    Item {
        key: Uuid::new_v4(),
        values,
        data,
        flags,
    }
}

fn item_cells(items: &[Item]) -> Vec<Value> {
    let mut cells = Vec::new();
    for item in items {
        cells.push(json!({"rowKey": item.key, "column": "DATA", "refKey": 1, "body": item.data}));
        if let Some(flags) = &item.flags {
            cells.push(json!({"rowKey": item.key, "column": "FLAGS", "refKey": 1, "body": flags}));
        }
    }
    cells
}

async fn put_items(server: &Server, items: &[Item]) {
    let cells = item_cells(items);
    let count = cells.len();
    let data = server
        .data(
            "mutation($cells: [ItemsCellInput!]!) { itemsPutCells(cells: $cells) { status } }",
            json!({ "cells": cells }),
        )
        .await;
    assert_eq!(
        data["itemsPutCells"],
        json!(vec![json!({"status": "WRITTEN"}); count])
    );
}

const ALL_FIELDS: &str = "rowKey owner n x s t u b";

/// The index entries of `owner`, selecting `selection`.
async fn entries(server: &Server, owner: &str, selection: &str) -> Vec<Value> {
    let data = server
        .data(
            &format!(
                "query($owner: String!) {{ items {{ itemsIndex(owner: $owner, first: 1000) {{ edges {{ node {{ {selection} }} }} pageInfo {{ hasNextPage }} }} }} }}"
            ),
            json!({ "owner": owner }),
        )
        .await;
    let index = &data["items"]["itemsIndex"];
    assert_eq!(index["pageInfo"]["hasNextPage"], false, "{index}");
    index["edges"]
        .as_array()
        .expect("edges")
        .iter()
        .map(|e| e["node"].clone())
        .collect()
}

/// Whether the entry is exactly the item's latest state.
fn entry_is(node: &Value, item: &Item, owner: &str) -> bool {
    node["rowKey"] == json!(item.key.to_string())
        && node["owner"] == json!(owner)
        && FIELDS.iter().all(|f| match item.values.get(f) {
            Some(v) => v.matches(&node[*f]),
            None => node[*f].is_null(),
        })
}

/// Waits until the index holds exactly `items`, every field up to date.
async fn wait_indexed(server: &Server, owner: &str, items: &[Item]) {
    let wait = Wait::new(format!("{} entries of owner {owner}", items.len()));
    loop {
        let nodes = entries(server, owner, ALL_FIELDS).await;
        let complete = nodes.len() == items.len()
            && items
                .iter()
                .all(|item| nodes.iter().any(|node| entry_is(node, item, owner)));
        if complete {
            return;
        }
        wait.tick(&nodes).await;
    }
}

/// Rows with a value of every type, ties, missing values and an offset
/// datetime (stored in UTC).
fn operator_items(owner: &str) -> Vec<Item> {
    let u: Vec<Uuid> = (0..4).map(|_| Uuid::new_v4()).collect();
    let row = |n: i64, x: f64, s: &str, (tv, tw): (&str, &str), u: Uuid, b: bool| {
        vec![
            ("n", V::I(n), json!(n)),
            ("x", V::F(x), json!(x)),
            ("s", V::S(s.into()), json!(s)),
            ("t", t(tv), json!(tw)),
            ("u", V::U(u), json!(u.to_string())),
            ("b", V::B(b), json!(b)),
        ]
    };
    vec![
        item(
            owner,
            row(
                -5,
                -1.25,
                "alpha",
                ("2024-01-01T00:00:00Z", "2024-01-01T00:00:00Z"),
                u[0],
                true,
            ),
        ),
        item(
            owner,
            row(
                0,
                0.5,
                "beta",
                ("2024-01-01T12:30:00.25Z", "2024-01-01T12:30:00.250Z"),
                u[1],
                false,
            ),
        ),
        item(
            owner,
            row(
                7,
                2.5,
                "Beta",
                ("2024-02-29T23:59:59Z", "2024-02-29T23:59:59Z"),
                u[2],
                false,
            ),
        ),
        item(
            owner,
            row(
                9_007_199_254_740_993,
                1e10,
                "ümlaut",
                ("2023-12-31T23:00:00Z", "2024-01-01T00:00:00+01:00"),
                u[3],
                true,
            ),
        ),
        // Ties with the first and third rows.
        item(
            owner,
            row(
                7,
                2.5,
                "alpha",
                ("2024-01-01T00:00:00Z", "2024-01-01T00:00:00Z"),
                u[1],
                true,
            ),
        ),
        // No values at all: no FLAGS cell, nothing but the owner in DATA.
        item(owner, vec![]),
        // Some values missing, some explicitly null.
        {
            let mut partial = item(
                owner,
                vec![
                    ("n", V::I(-1), json!(-1)),
                    ("s", V::S("gamma".into()), json!("gamma")),
                ],
            );
            partial.data["x"] = Value::Null;
            partial.data["t"] = Value::Null;
            partial.flags = Some(json!({ "b": null }));
            partial
        },
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Eq,
    Ne,
    In,
    Gt,
    Gte,
    Lt,
    Lte,
    IsNull(bool),
}

struct Case {
    field: &'static str,
    op: Op,
    values: Vec<V>,
}

impl Case {
    fn holds(&self, item: &Item) -> bool {
        let value = item.values.get(self.field);
        let cmp = |v: &V| value.and_then(|x| x.compare(v));
        match self.op {
            Op::Eq => cmp(&self.values[0]) == Some(Ordering::Equal),
            Op::Ne => cmp(&self.values[0]) != Some(Ordering::Equal),
            Op::In => self.values.iter().any(|v| cmp(v) == Some(Ordering::Equal)),
            Op::Gt => cmp(&self.values[0]) == Some(Ordering::Greater),
            Op::Gte => matches!(
                cmp(&self.values[0]),
                Some(Ordering::Greater | Ordering::Equal)
            ),
            Op::Lt => cmp(&self.values[0]) == Some(Ordering::Less),
            Op::Lte => matches!(cmp(&self.values[0]), Some(Ordering::Less | Ordering::Equal)),
            Op::IsNull(null) => value.is_none() == null,
        }
    }

    fn where_input(&self) -> Value {
        let (op, value) = match self.op {
            Op::Eq => ("eq", self.values[0].graphql()),
            Op::Ne => ("ne", self.values[0].graphql()),
            Op::In => ("in", self.values.iter().map(V::graphql).collect()),
            Op::Gt => ("gt", self.values[0].graphql()),
            Op::Gte => ("gte", self.values[0].graphql()),
            Op::Lt => ("lt", self.values[0].graphql()),
            Op::Lte => ("lte", self.values[0].graphql()),
            Op::IsNull(null) => ("isNull", Value::Bool(null)),
        };
        json!({ self.field: { op: value } })
    }

    fn filter(&self) -> String {
        let f = self.field;
        let one = || self.values[0].text();
        match self.op {
            Op::Eq => format!("{f} = {}", one()),
            Op::Ne => format!("{f} != {}", one()),
            Op::In => format!(
                "{f} in ({})",
                self.values
                    .iter()
                    .map(V::text)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Op::Gt => format!("{f} > {}", one()),
            Op::Gte => format!("{f} >= {}", one()),
            Op::Lt => format!("{f} < {}", one()),
            Op::Lte => format!("{f} <= {}", one()),
            Op::IsNull(true) => format!("{f} = null"),
            Op::IsNull(false) => format!("{f} != null"),
        }
    }
}

const MATCHING: &str = "query($owner: String!, $where: ItemsItemsIndexWhere, $filter: String) {
  items { itemsIndex(owner: $owner, where: $where, filter: $filter, first: 100) {
    edges { node { rowKey } } pageInfo { hasNextPage }
  } }
}";

async fn matching(server: &Server, owner: &str, where_: Value, filter: Value) -> BTreeSet<String> {
    let data = server
        .data(
            MATCHING,
            json!({ "owner": owner, "where": where_, "filter": filter }),
        )
        .await;
    let index = &data["items"]["itemsIndex"];
    assert_eq!(index["pageInfo"]["hasNextPage"], false, "{index}");
    let keys: Vec<String> = index["edges"]
        .as_array()
        .expect("edges")
        .iter()
        .map(|e| e["node"]["rowKey"].as_str().expect("rowKey").to_string())
        .collect();
    let set: BTreeSet<String> = keys.iter().cloned().collect();
    assert_eq!(set.len(), keys.len(), "repeated entries: {keys:?}");
    set
}

pub async fn every_operator_on_every_type_where_and_filter_agree(env: Arc<Env>) {
    let server = env.serve(Defs::Small, &[]);
    let owner = format!("owner-{}", Uuid::new_v4());
    let items = operator_items(&owner);
    put_items(&server, &items).await;
    wait_indexed(&server, &owner, &items).await;

    // Operands: a value with a tie, an extreme value and one nobody has.
    let mut cases = Vec::new();
    let operands: Vec<(&str, Vec<V>, V)> = vec![
        (
            "n",
            vec![V::I(7), V::I(9_007_199_254_740_993), V::I(-5)],
            V::I(9_007_199_254_740_992),
        ),
        ("x", vec![V::F(2.5), V::F(-1.25), V::F(1e10)], V::F(1.0)),
        (
            "s",
            vec![
                V::S("alpha".into()),
                V::S("Beta".into()),
                V::S("ümlaut".into()),
            ],
            V::S("alphA".into()),
        ),
        (
            "t",
            vec![
                t("2024-01-01T00:00:00Z"),
                t("2024-01-01T12:30:00.25Z"),
                t("2023-12-31T23:00:00Z"),
            ],
            t("2024-01-01T00:00:00.000001Z"),
        ),
        (
            "u",
            vec![
                items[1].values["u"].clone(),
                items[0].values["u"].clone(),
                items[3].values["u"].clone(),
            ],
            V::U(Uuid::new_v4()),
        ),
    ];
    for (field, present, absent) in &operands {
        for value in present.iter().chain([absent]) {
            for op in [Op::Eq, Op::Ne, Op::Gt, Op::Gte, Op::Lt, Op::Lte] {
                cases.push(Case {
                    field,
                    op,
                    values: vec![value.clone()],
                });
            }
        }
        cases.push(Case {
            field,
            op: Op::In,
            values: vec![present[0].clone(), absent.clone(), present[1].clone()],
        });
        cases.push(Case {
            field,
            op: Op::In,
            values: vec![absent.clone()],
        });
    }
    for value in [true, false] {
        for op in [Op::Eq, Op::Ne] {
            cases.push(Case {
                field: "b",
                op,
                values: vec![V::B(value)],
            });
        }
        cases.push(Case {
            field: "b",
            op: Op::In,
            values: vec![V::B(value)],
        });
    }
    for field in FIELDS {
        for null in [true, false] {
            cases.push(Case {
                field,
                op: Op::IsNull(null),
                values: vec![],
            });
        }
    }

    let name = |key: &str| {
        items
            .iter()
            .position(|i| i.key.to_string() == key)
            .map_or(key.to_string(), |p| format!("#{p}"))
    };
    let mut failures = Vec::new();
    for case in &cases {
        let expected: BTreeSet<String> = items
            .iter()
            .filter(|i| case.holds(i))
            .map(|i| i.key.to_string())
            .collect();
        let by_where = matching(&server, &owner, case.where_input(), Value::Null).await;
        let by_filter = matching(&server, &owner, Value::Null, json!(case.filter())).await;
        let names = |set: &BTreeSet<String>| set.iter().map(|k| name(k)).collect::<Vec<_>>();
        if by_where != expected {
            failures.push(format!(
                "where {}: got {:?}, expected {:?}",
                case.where_input(),
                names(&by_where),
                names(&expected)
            ));
        }
        if by_filter != expected {
            failures.push(format!(
                "filter `{}`: got {:?}, expected {:?}",
                case.filter(),
                names(&by_filter),
                names(&expected)
            ));
        }
    }

    // Conditions on several fields are combined with AND, in both forms.
    let expected: BTreeSet<String> = [&items[2], &items[4]]
        .iter()
        .map(|i| i.key.to_string())
        .collect();
    let by_where = matching(
        &server,
        &owner,
        json!({"n": {"gte": "0", "lt": 8}, "x": {"gt": 1.0}, "b": {"isNull": false}}),
        Value::Null,
    )
    .await;
    let by_filter = matching(
        &server,
        &owner,
        Value::Null,
        json!("n >= 0 and n < 8 and x > 1.0 and b != null"),
    )
    .await;
    if by_where != expected || by_filter != expected {
        failures.push(format!(
            "AND of conditions: where {:?}, filter {:?}, expected {:?}",
            by_where, by_filter, expected
        ));
    }
    assert!(
        failures.is_empty(),
        "{} of {} operator cases failed:\n{}",
        failures.len(),
        cases.len() * 2 + 2,
        failures.join("\n")
    );
}

pub async fn projection_returns_only_selected_fields(env: Arc<Env>) {
    let server = env.serve(Defs::Small, &[]);
    let owner = format!("owner-{}", Uuid::new_v4());
    let items = operator_items(&owner);
    put_items(&server, &items[..3]).await;
    wait_indexed(&server, &owner, &items[..3]).await;

    for selection in ["n s", "rowKey t", "b", "u x owner"] {
        let wanted: BTreeSet<&str> = selection.split(' ').collect();
        let nodes = entries(&server, &owner, selection).await;
        assert_eq!(nodes.len(), 3, "{nodes:?}");
        for node in &nodes {
            let keys: BTreeSet<&str> = node
                .as_object()
                .expect("node")
                .keys()
                .map(String::as_str)
                .collect();
            assert_eq!(keys, wanted, "selection `{selection}`: {node}");
        }
        // The values are the items' own, whichever fields were asked.
        for field in FIELDS.iter().filter(|f| wanted.contains(*f)) {
            let mut unused: Vec<&Item> = items[..3].iter().collect();
            for node in &nodes {
                let found = unused
                    .iter()
                    .position(|i| i.values[*field].matches(&node[*field]))
                    .unwrap_or_else(|| panic!("`{field}` of {node} is no item's value"));
                unused.remove(found);
            }
        }
    }
}

/// Collects every page of `itemsIndex` ordered by `order`, checking each.
async fn all_pages(server: &Server, owner: &str, order: Value, page: usize) -> Vec<Value> {
    let mut nodes = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..100 {
        let data = server
            .data(
                "query($owner: String!, $order: [ItemsItemsIndexOrder!], $first: Int, $after: String) {
                  items { itemsIndex(owner: $owner, orderBy: $order, first: $first, after: $after) {
                    edges { cursor node { rowKey n s } } pageInfo { hasNextPage endCursor }
                  } }
                }",
                json!({ "owner": owner, "order": order, "first": page, "after": after }),
            )
            .await;
        let connection = &data["items"]["itemsIndex"];
        let edges = connection["edges"].as_array().expect("edges");
        let info = &connection["pageInfo"];
        assert!(edges.len() <= page, "{connection}");
        if let Some(last) = edges.last() {
            assert_eq!(info["endCursor"], last["cursor"], "{connection}");
        }
        nodes.extend(edges.iter().map(|e| e["node"].clone()));
        if info["hasNextPage"] == false {
            return nodes;
        }
        assert_eq!(
            edges.len(),
            page,
            "a short page before the end: {connection}"
        );
        after = Some(info["endCursor"].as_str().expect("endCursor").to_string());
    }
    panic!("more than 100 pages");
}

pub async fn pagination_has_no_gaps_or_repeats(env: Arc<Env>) {
    let server = env.serve(Defs::Small, &[]);
    let owner = format!("owner-{}", Uuid::new_v4());
    // 55 entries: `n` has ties (i % 7) and five entries have no `n`.
    let items: Vec<Item> = (0..55)
        .map(|i| {
            let mut fields = vec![("s", V::S(format!("s{:02}", i)), json!(format!("s{:02}", i)))];
            if i % 11 != 10 {
                fields.push(("n", V::I(i % 7), json!(i % 7)));
            }
            item(&owner, fields)
        })
        .collect();
    put_items(&server, &items).await;
    wait_indexed(&server, &owner, &items).await;
    let all: BTreeSet<String> = items.iter().map(|i| i.key.to_string()).collect();

    type Check = fn(&[Option<i64>], &[&str]) -> bool;
    let n_asc: Check = |n, _| {
        n.iter()
            .flatten()
            .collect::<Vec<_>>()
            .windows(2)
            .all(|w| w[0] <= w[1])
    };
    let n_desc: Check = |n, _| {
        n.iter()
            .flatten()
            .collect::<Vec<_>>()
            .windows(2)
            .all(|w| w[0] >= w[1])
    };
    let n_then_s_desc: Check = |n, s| {
        let pairs: Vec<(i64, &str)> = n
            .iter()
            .zip(s)
            .filter_map(|(n, s)| n.map(|n| (n, *s)))
            .collect();
        pairs
            .windows(2)
            .all(|w| w[0].0 < w[1].0 || (w[0].0 == w[1].0 && w[0].1 > w[1].1))
    };
    let s_desc: Check = |_, s| s.windows(2).all(|w| w[0] > w[1]);
    let s_asc: Check = |_, s| s.windows(2).all(|w| w[0] < w[1]);
    let any: Check = |_, _| true;
    for (order, page, check) in [
        (json!([{"field": "N", "direction": "ASC"}]), 10, n_asc),
        (json!([{"field": "N", "direction": "DESC"}]), 10, n_desc),
        (
            json!([{"field": "N"}, {"field": "S", "direction": "DESC"}]),
            10,
            n_then_s_desc,
        ),
        (json!([{"field": "S", "direction": "DESC"}]), 10, s_desc),
        (json!(null), 10, any),
        (json!([{"field": "N", "direction": "ASC"}]), 55, n_asc),
        (json!([{"field": "S"}]), 7, s_asc),
    ] {
        let nodes = all_pages(&server, &owner, order.clone(), page).await;
        let keys: Vec<String> = nodes
            .iter()
            .map(|n| n["rowKey"].as_str().expect("rowKey").to_string())
            .collect();
        let unique: BTreeSet<String> = keys.iter().cloned().collect();
        assert_eq!(keys.len(), unique.len(), "repeats with order {order}");
        assert_eq!(unique, all, "gaps with order {order}");

        // The order holds across pages; entries without `n` stay together.
        let n: Vec<Option<i64>> = nodes
            .iter()
            .map(|node| node["n"].as_str().map(|s| s.parse().expect("n")))
            .collect();
        let s: Vec<&str> = nodes
            .iter()
            .map(|node| node["s"].as_str().expect("s"))
            .collect();
        assert!(
            check(&n, &s),
            "out of order with order {order}: {n:?} {s:?}"
        );
        if order.to_string().contains("\"N\"") {
            let first_null = n.iter().position(Option::is_none).expect("a null n");
            assert!(
                n.get(first_null..first_null + 5)
                    .is_some_and(|w| w.iter().all(Option::is_none)),
                "entries without `n` are spread out with order {order}: {n:?}"
            );
        }
    }
}

pub async fn index_entries_fetch_their_rows(env: Arc<Env>) {
    let server = env.serve(Defs::Small, &[]);
    let driver = Uuid::new_v4();
    let city = Uuid::new_v4();
    let trips: Vec<Uuid> = (0..15).map(|_| Uuid::new_v4()).collect();
    let base = |i: usize| {
        json!({
            "driver_partner_uuid": driver.to_string(),
            "city_uuid": city.to_string(),
            "trip_created_at": format!("2024-05-{:02}T08:00:00Z", i + 1),
            "fare": {"total": 10.0 + i as f64},
        })
    };
    let mut cells = Vec::new();
    for (i, key) in trips.iter().enumerate() {
        cells.push(cell(*key, "BASE", 1, base(i)));
        if i % 3 != 0 {
            cells.push(cell(*key, "STATUS", 1, json!({"status": "requested"})));
        }
        if i % 3 == 2 {
            cells.push(cell(
                *key,
                "STATUS",
                2,
                json!({"status": "completed", "is_completed": true}),
            ));
        }
    }
    put_trips(&server, cells).await;

    let query = "query($driver: UUID!) { trips { driverPartnerIndex(driverPartnerUuid: $driver, orderBy: [{field: TRIP_CREATED_AT}]) {
        edges { node { rowKey tripCreatedAt row { rowKey base { body } status { body refKey } } } }
    } } }";
    let wait = Wait::new("15 driver_partner_index entries");
    let edges = loop {
        let data = server.data(query, json!({ "driver": driver })).await;
        let edges = data["trips"]["driverPartnerIndex"]["edges"].clone();
        if edges.as_array().expect("edges").len() == trips.len() {
            break edges;
        }
        wait.tick(&edges).await;
    };
    for (i, (edge, key)) in edges
        .as_array()
        .expect("edges")
        .iter()
        .zip(&trips)
        .enumerate()
    {
        let node = &edge["node"];
        assert_eq!(node["rowKey"], key.to_string(), "entry {i}: {node}");
        assert_eq!(
            node["tripCreatedAt"],
            format!("2024-05-{:02}T08:00:00Z", i + 1)
        );
        assert_eq!(node["row"]["rowKey"], key.to_string(), "entry {i}: {node}");
        assert_eq!(node["row"]["base"]["body"], base(i), "entry {i}: {node}");
        let status = match i % 3 {
            0 => Value::Null,
            1 => json!({"body": {"status": "requested"}, "refKey": "1"}),
            _ => json!({"body": {"status": "completed", "is_completed": true}, "refKey": "2"}),
        };
        assert_eq!(node["row"]["status"], status, "entry {i}: {node}");
    }

    // An index over two columns follows the latest cell of each.
    let query = "query($city: UUID!) { trips { cityTripsIndex(cityUuid: $city) {
        edges { node { rowKey status isCompleted fareTotal } }
    } } }";
    let expected: BTreeMap<String, Value> = trips
        .iter()
        .enumerate()
        .map(|(i, key)| {
            let (status, completed) = match i % 3 {
                0 => (Value::Null, Value::Null),
                1 => (json!("requested"), Value::Null),
                _ => (json!("completed"), json!(true)),
            };
            (
                key.to_string(),
                json!({"rowKey": key.to_string(), "status": status, "isCompleted": completed, "fareTotal": 10.0 + i as f64}),
            )
        })
        .collect();
    let wait = Wait::new("city_trips_index entries with their latest status");
    loop {
        let data = server.data(query, json!({ "city": city })).await;
        let got: BTreeMap<String, Value> = data["trips"]["cityTripsIndex"]["edges"]
            .as_array()
            .expect("edges")
            .iter()
            .map(|e| {
                (
                    e["node"]["rowKey"].as_str().expect("rowKey").to_string(),
                    e["node"].clone(),
                )
            })
            .collect();
        if got == expected {
            break;
        }
        wait.tick(&got).await;
    }
}

/// The response to `query` with `variables` from the executor and from the
/// document's direct form (`graphql/direct.rs`), as sent, and whether the
/// second came from the direct form. The executor's answer is asked for
/// with a comment appended that no other request has sent: a text the
/// server has not seen before always goes through async-graphql.
async fn both_paths(
    server: &Server,
    query: &str,
    variables: &Value,
    run: usize,
) -> ((StatusCode, String), (StatusCode, String), bool) {
    let body = |text: &str| json!({ "query": text, "variables": variables }).to_string();
    let fresh = format!("{query}\n# executor {run}");
    let executor = server.post_text(&body(&fresh), Accept::Json).await;
    // Once: the text passes validation on the executor's path.
    server.post_text(&body(query), Accept::Json).await;
    let before = server
        .metric("cellgate_graphql_direct_requests_total")
        .await;
    let direct = server.post_text(&body(query), Accept::Json).await;
    let after = server
        .metric("cellgate_graphql_direct_requests_total")
        .await;
    (executor, direct, after - before == 1.0)
}

pub async fn direct_answers_equal_the_executors(env: Arc<Env>) {
    let server = env.serve(Defs::Small, &[]);
    let driver = Uuid::new_v4();
    let city = Uuid::new_v4();
    let trips: Vec<Uuid> = (0..12).map(|_| Uuid::new_v4()).collect();
    let mut cells = Vec::new();
    for (i, key) in trips.iter().enumerate() {
        let mut base = json!({
            "driver_partner_uuid": driver.to_string(),
            "trip_created_at": format!("2024-05-{:02}T08:00:00.{:03}+02:00", i + 1, i * 7),
            "fare": {"total": 10.0 + i as f64 / 3.0, "currency": "EUR"},
            "notes": ["ünïcode \u{1F697}", "quote \" and \\ backslash", "nul \u{0000}", i],
            "nested": {"a": {"b": {"c": [null, true, false, -0.0, 1e300]}}},
        });
        if i % 4 != 3 {
            base["city_uuid"] = json!(city.to_string());
        }
        cells.push(cell(*key, "BASE", 1, base));
        if i % 3 != 0 {
            cells.push(cell(*key, "STATUS", 1, json!({"status": "requested"})));
        }
        if i % 3 == 2 {
            cells.push(cell(*key, "STATUS", 7, json!({"status": "completed"})));
        }
    }
    put_trips(&server, cells).await;
    let wait = Wait::new("12 driver_partner_index entries");
    loop {
        let data = server
            .data(
                "query($d: UUID!) { trips { driverPartnerIndex(driverPartnerUuid: $d, first: 100) { edges { cursor } } } }",
                json!({ "d": driver }),
            )
            .await;
        let edges = data["trips"]["driverPartnerIndex"]["edges"].clone();
        if edges.as_array().expect("edges").len() == trips.len() {
            break;
        }
        wait.tick(&edges).await;
    }

    let page = "query Page($driver: UUID!, $since: DateTime!, $first: Int) {
      trips { driverPartnerIndex(driverPartnerUuid: $driver, where: {tripCreatedAt: {gte: $since}}, first: $first) {
        edges { cursor node { rowKey driverPartnerUuid cityUuid tripCreatedAt } }
        pageInfo { hasNextPage endCursor }
      } }
    }";
    let rows = "query Rows($driver: UUID!, $after: String) {
      t: trips { p: driverPartnerIndex(driverPartnerUuid: $driver, orderBy: [{field: TRIP_CREATED_AT, direction: DESC}], first: 5, after: $after) {
        info: pageInfo { endCursor more: hasNextPage }
        edges { node {
          row { status { refKey body createdAt shard addedId rowKey column } key: rowKey base { body } again: base { refKey } }
          rowKey
          city: cityUuid
        } }
      } }
    }";
    let filtered = r#"query($driver: UUID!) {
      trips { driverPartnerIndex(driverPartnerUuid: $driver, filter: "trip_created_at >= \"2024-05-03T00:00:00Z\"", first: 3) {
        pageInfo { hasNextPage } edges { node { row { base { body } } } }
      } }
    }"#;
    let tokened = "query($driver: UUID!, $token: String) {
      trips { driverPartnerIndex(driverPartnerUuid: $driver, first: 3, consistency: REPLICA, readAfter: $token) {
        edges { node { rowKey row { base { refKey } } } }
      } }
    }";
    let listed = "query($drivers: [UUID!]!, $since: DateTime!) {
      trips { driverPartnerIndex(driverPartnerUuidIn: $drivers, where: {tripCreatedAt: {gte: $since}}, first: 5) {
        edges { node { rowKey driverPartnerUuid row { base { body } } } }
      } }
    }";
    let token = server
        .data(
            "mutation($c: [TripsCellInput!]!) { tripsPutCells(cells: $c) { readToken } }",
            json!({ "c": [cell(trips[0], "STATUS", 9, json!({"status": "rated"}))] }),
        )
        .await["tripsPutCells"][0]["readToken"]
        .clone();
    assert!(
        token.as_str().is_some_and(|t| t.starts_with("rt1.")),
        "{token}"
    );
    let mut second_page = None;
    let mut run = 0;
    // (document, variables, whether the direct form answers it)
    let mut cases: Vec<(&str, Value, bool)> = vec![
        (
            page,
            json!({"driver": driver, "since": "2024-05-04T00:00:00Z", "first": 4}),
            true,
        ),
        (
            page,
            json!({"driver": driver, "since": "2024-05-04T00:00:00+09:00"}),
            true,
        ),
        (
            page,
            json!({"driver": driver, "since": "2030-01-01T00:00:00Z", "first": 0}),
            true,
        ),
        (
            page,
            json!({"driver": Uuid::new_v4(), "since": "2024-01-01T00:00:00Z", "first": null}),
            true,
        ),
        (rows, json!({"driver": driver}), true),
        (
            listed,
            json!({"drivers": [Uuid::new_v4(), driver], "since": "2024-05-02T00:00:00Z"}),
            true,
        ),
        // A single value for a list (a list of one), a null item, an item
        // of the wrong type: the executor's.
        (
            listed,
            json!({"drivers": driver, "since": "2024-05-02T00:00:00Z"}),
            false,
        ),
        (
            listed,
            json!({"drivers": [driver, null], "since": "2024-05-02T00:00:00Z"}),
            false,
        ),
        (
            listed,
            json!({"drivers": [driver, "nope"], "since": "2024-05-02T00:00:00Z"}),
            false,
        ),
        (filtered, json!({"driver": driver}), true),
        (tokened, json!({"driver": driver, "token": token}), true),
        (tokened, json!({"driver": driver, "token": null}), true),
        (
            tokened,
            json!({"driver": driver, "token": "rt1.bm9wZQ"}),
            false,
        ),
        // Refused by validation, by the field, or missing: the executor's
        // answer, from the executor.
        (
            page,
            json!({"driver": "not-a-uuid", "since": "2024-05-04T00:00:00Z"}),
            false,
        ),
        (page, json!({"driver": driver, "since": "yesterday"}), false),
        (page, json!({"driver": driver, "since": null}), false),
        (
            page,
            json!({"driver": driver, "since": "2024-05-04T00:00:00Z", "first": 5000}),
            false,
        ),
        (
            page,
            json!({"driver": driver, "since": "2024-05-04T00:00:00Z", "first": -1}),
            false,
        ),
        (
            page,
            json!({"driver": driver, "since": "2024-05-04T00:00:00Z", "first": "4"}),
            false,
        ),
        (page, json!({"driver": driver}), false),
        (
            rows,
            json!({"driver": driver, "after": "not a cursor"}),
            false,
        ),
    ];
    while let Some((query, variables, direct)) = cases.pop() {
        run += 1;
        let (executor, answer, was_direct) = both_paths(&server, query, &variables, run).await;
        assert_eq!(answer, executor, "{query}\nvariables {variables}");
        assert_eq!(
            was_direct, direct,
            "{query}\nvariables {variables}\n{}",
            answer.1
        );
        if query == rows && variables.get("after").is_none() {
            let data: Value = serde_json::from_str(&answer.1).expect("JSON");
            let info = &data["data"]["t"]["p"]["info"];
            assert_eq!(info["more"], true, "{data}");
            let after = info["endCursor"].as_str().expect("endCursor").to_string();
            second_page = Some(after.clone());
            cases.push((rows, json!({"driver": driver, "after": after}), true));
        }
    }
    assert!(
        second_page.is_some(),
        "the rows document was never answered"
    );

    // Shapes the direct form does not take are answered by the executor
    // every time.
    for query in [
        "query($driver: UUID!) { trips { driverPartnerIndex(driverPartnerUuid: $driver) { edges { node { __typename rowKey } } } } }",
        "query($driver: UUID!) { trips { driverPartnerIndex(driverPartnerUuid: $driver) { edges { node { rowKey @include(if: true) } } } } }",
        "query($driver: UUID!) { trips { driverPartnerIndex(driverPartnerUuid: $driver) { edges { node { ...F } } } } } fragment F on TripsDriverPartnerIndexEntry { rowKey }",
        "query($driver: UUID!) { trips { driverPartnerIndex(driverPartnerUuid: $driver) { edges { node { row { status(refKey: 1) { body } } } } } } }",
        "query($driver: UUID!) { trips { driverPartnerIndex(driverPartnerUuid: $driver) { edges { node { rowKey } } } latestCell(rowKey: $driver, column: BASE) { body } } }",
    ] {
        run += 1;
        let variables = json!({"driver": driver});
        let (executor, answer, was_direct) = both_paths(&server, query, &variables, run).await;
        assert_eq!(answer, executor, "{query}");
        assert_eq!(answer.0, StatusCode::OK, "{query}: {}", answer.1);
        assert!(!was_direct, "{query} was answered directly");
    }
}
