//! Direct answers to the commonest requests: a page of an index, with its
//! entries' fields and their rows' cells, and a write of cells (`put.rs`).
//!
//! async-graphql validates every request's document again, and its
//! executor boxes a future for every field of every entry and builds a
//! `Value` tree that is then serialized; for a 20-entry page that work was
//! most of the gateway's CPU. A [`Direct`] is compiled once per document
//! text, from a document async-graphql has already validated and executed
//! without an error, and answers later requests with the same text by
//! calling the store and writing the response JSON itself.
//!
//! It takes only documents of two shapes, which keeps it equivalent to the
//! executor. A read is one query operation without directives or fragments
//! whose variables are all scalars or lists of scalars without defaults,
//! selecting one index field of one datastore, and under it only `edges {
//! cursor node { rowKey <index fields> row { rowKey <column> { <Cell
//! fields> } } } }` and `pageInfo`. A write is described in `put.rs`.
//! Anything else, and every request it cannot answer as the executor would
//! (a variable missing or of the wrong type, an argument the field refuses),
//! goes to async-graphql as before, which answers it and reports the error
//! in its usual form. A store error is answered here, as the executor
//! would answer it ([`Answer::Failed`]): sending the request on would wait
//! for the failing database a second time (and, for a write, write again).
//! The values come from the functions the schema's resolvers use
//! (`schema/`), and the tests compare both paths' answers byte for byte.

mod put;

use std::collections::HashSet;
use std::sync::Arc;

use async_graphql::parser::types::{
    BaseType, DocumentOperations, ExecutableDocument, Field, OperationDefinition, OperationType,
    Selection, SelectionSet,
};
use async_graphql::{Name, Positioned, Value, Variables};
use index_dsl::{Definitions, Index};
use uuid::Uuid;

use super::scalars;
use crate::consistency::{ReadSpec, Served};
use crate::limits::GraphqlLimits;
use crate::names::camel;
use crate::schema::{index_query, shard_arguments, Arguments, CellField, PAGE_INFO_FIELDS};
use crate::variables::RequestVariables;
use cellgate_store::cells::Cell;
use cellgate_store::indexes::{IndexEntry, IndexPage, IndexQuery};
use cellgate_store::replicas::ReadOptions;
use cellgate_store::Store;

/// The latest cells of a page's rows, bodies as JSON text, by (row,
/// column).
type Cells = std::collections::HashMap<(Uuid, Arc<str>), Cell<Vec<u8>>>;

/// What a compiled document made of a request.
#[derive(Debug)]
pub enum Answer {
    /// The response body.
    Body(Vec<u8>),
    /// The store failed: the response the executor gives for the error.
    Failed(async_graphql::Response),
}

/// A compiled document; see the module doc.
#[derive(Debug)]
pub struct Direct {
    /// The operation's name, which a request may name.
    operation: Option<Name>,
    form: Form,
}

#[derive(Debug)]
enum Form {
    Read(Box<IndexRead>),
    Put(put::PutCells),
}

/// A compiled index read.
#[derive(Debug)]
struct IndexRead {
    variables: Vec<Variable>,
    datastore: Arc<str>,
    index: Arc<Index>,
    /// Response keys of the datastore field and of the index field.
    datastore_key: String,
    index_key: String,
    /// Where the index field stands in the document (error locations).
    index_pos: async_graphql::Pos,
    arguments: Vec<(Name, Positioned<async_graphql_value::Value>)>,
    /// The index field's shard-value arguments (single and list).
    shard_arguments: (String, String),
    /// The GraphQL names of the index fields `node` selects.
    selected: HashSet<String>,
    connection: Vec<ConnectionField>,
    /// The columns whose latest cells `row` selects.
    columns: Vec<Arc<str>>,
}

/// A declared variable: a scalar or a list of scalars, nullable or not.
#[derive(Debug)]
struct Variable {
    name: Name,
    scalar: Name,
    nullable: bool,
    /// For a list, whether its items may be null.
    list: Option<bool>,
}

#[derive(Debug)]
enum ConnectionField {
    Edges(String, Vec<EdgeField>),
    PageInfo(String, Vec<(String, usize)>),
}

#[derive(Debug)]
enum EdgeField {
    Cursor(String),
    Node(String, Vec<NodeField>),
}

#[derive(Debug)]
enum NodeField {
    RowKey(String),
    /// An index field, by its name in the definitions.
    Index(String, String),
    Row(String, Vec<RowField>),
}

#[derive(Debug)]
enum RowField {
    RowKey(String),
    Column(String, Arc<str>, Vec<(String, CellField)>),
}

/// The scalars a compiled document's variables may have.
const SCALARS: [&str; 8] = [
    "UUID", "DateTime", "Int64", "Int", "Float", "String", "Boolean", "ID",
];

impl Direct {
    /// The direct form of `document`, if it has the shape this module
    /// answers.
    pub fn compile(document: &ExecutableDocument, definitions: &Definitions) -> Option<Direct> {
        if !document.fragments.is_empty() {
            return None;
        }
        let (operation, definition) = match &document.operations {
            DocumentOperations::Single(op) => (None, &op.node),
            DocumentOperations::Multiple(ops) if ops.len() == 1 => {
                let (name, op) = ops.iter().next()?;
                (Some(name.clone()), &op.node)
            }
            DocumentOperations::Multiple(_) => return None,
        };
        if !definition.directives.is_empty() {
            return None;
        }
        let form = match definition.ty {
            OperationType::Query => {
                Form::Read(Box::new(IndexRead::compile(definition, definitions)?))
            }
            OperationType::Mutation => Form::Put(put::PutCells::compile(definition, definitions)?),
            OperationType::Subscription => return None,
        };
        Some(Direct { operation, form })
    }

    /// Whether a request naming `operation` runs this document's operation.
    pub fn runs(&self, operation: Option<&str>) -> bool {
        operation.is_none() || operation == self.operation.as_deref()
    }

    /// The variable a compiled write reads from its JSON text: it need
    /// not be parsed into async-graphql's values unless the write goes to
    /// the executor (see `variables.rs`). `None` for a read.
    pub fn text_variable(&self) -> Option<&Name> {
        match &self.form {
            Form::Read(_) => None,
            Form::Put(put) => Some(put.variable()),
        }
    }

    /// The answer for the request's variables, or `None` when the request
    /// is to go through async-graphql (see the module doc). `values` holds
    /// every variable but [`Direct::text_variable`], which is read from
    /// `texts`.
    pub async fn run(
        &self,
        store: &Store,
        values: &Variables,
        texts: &RequestVariables,
        limits: GraphqlLimits,
    ) -> Option<Answer> {
        match &self.form {
            Form::Read(read) => read.run(store, values, limits).await,
            Form::Put(put) => put.run(store, texts).await,
        }
    }
}

impl IndexRead {
    fn compile(definition: &OperationDefinition, definitions: &Definitions) -> Option<IndexRead> {
        let mut variables = Vec::new();
        for variable in &definition.variable_definitions {
            let variable = &variable.node;
            // A scalar, or a list of scalars (an `in` list's values).
            let (scalar, list) = match &variable.var_type.node.base {
                BaseType::Named(scalar) => (scalar, None),
                BaseType::List(item) => match &item.base {
                    BaseType::Named(scalar) => (scalar, Some(item.nullable)),
                    BaseType::List(_) => return None,
                },
            };
            if variable.default_value.is_some()
                || !variable.directives.is_empty()
                || !SCALARS.contains(&scalar.as_str())
            {
                return None;
            }
            variables.push(Variable {
                name: variable.name.node.clone(),
                scalar: scalar.clone(),
                nullable: variable.var_type.node.nullable,
                list,
            });
        }
        let [root] = fields(&definition.selection_set.node)?[..] else {
            return None;
        };
        let datastore = definitions
            .datastores
            .iter()
            .find(|d| camel(&d.name) == root.name.node.as_str())?;
        if !root.arguments.is_empty() {
            return None;
        }
        let [field] = fields(&root.selection_set.node)?[..] else {
            return None;
        };
        let index_pos = root.selection_set.node.items.first()?.pos;
        let index = datastore
            .indexes
            .iter()
            .find(|i| camel(&i.name) == field.name.node.as_str())?;
        let (shard_arg, list_arg) = shard_arguments(index);
        let known = [
            shard_arg.as_str(),
            list_arg.as_str(),
            "where",
            "filter",
            "orderBy",
            "first",
            "after",
            crate::consistency::ARGUMENTS[0],
            crate::consistency::ARGUMENTS[1],
        ];
        let mut arguments = Vec::new();
        for (name, value) in &field.arguments {
            if !known.contains(&name.node.as_str()) {
                return None;
            }
            arguments.push((name.node.clone(), value.clone()));
        }
        let mut columns = Vec::new();
        let mut connection = Vec::new();
        for item in fields(&field.selection_set.node)? {
            let key = item.response_key().node.to_string();
            connection.push(match item.name.node.as_str() {
                "edges" => {
                    ConnectionField::Edges(key, edges(item, datastore, index, &mut columns)?)
                }
                "pageInfo" => ConnectionField::PageInfo(key, page_info(item)?),
                _ => return None,
            });
        }
        let mut direct = IndexRead {
            variables,
            datastore: Arc::from(datastore.name.as_str()),
            index: index.clone(),
            datastore_key: root.response_key().node.to_string(),
            index_key: field.response_key().node.to_string(),
            index_pos,
            arguments,
            shard_arguments: (shard_arg, list_arg),
            selected: HashSet::new(),
            connection,
            columns,
        };
        direct.selected = direct.selected_index_fields();
        Some(direct)
    }

    async fn run(
        &self,
        store: &Store,
        variables: &Variables,
        limits: GraphqlLimits,
    ) -> Option<Answer> {
        let (query, spec) = self.query(variables, limits)?;
        let served = Served::default();
        match self.read(store, &query, &spec.options(&served)).await {
            Ok(body) => body.map(|mut body| {
                if let Some(served) = served.extension() {
                    // `{"data":{…}}` becomes `{"data":{…},"extensions":{"servedBy":…}}`.
                    body.pop();
                    body.extend_from_slice(b",\"extensions\":{\"servedBy\":");
                    serde_json::to_writer(&mut body, &served).unwrap_or_default();
                    body.extend_from_slice(b"}}");
                }
                Answer::Body(body)
            }),
            Err(error) => Some(Answer::Failed(self.failed(&error))),
        }
    }

    /// The index query of a request and where it may be read, or `None`
    /// when its variables or arguments are for async-graphql to report.
    fn query(
        &self,
        variables: &Variables,
        limits: GraphqlLimits,
    ) -> Option<(IndexQuery, ReadSpec)> {
        for variable in &self.variables {
            // A nullable variable that is not given is null.
            let valid = match variables.get(&variable.name).unwrap_or(&Value::Null) {
                Value::Null => variable.nullable,
                // A single value given for a list (coerced to a list of
                // one) is left to async-graphql.
                Value::List(items) => variable.list.is_some_and(|items_nullable| {
                    items.iter().all(|item| match item {
                        Value::Null => items_nullable,
                        item => scalar_input(&variable.scalar, item),
                    })
                }),
                value => variable.list.is_none() && scalar_input(&variable.scalar, value),
            };
            if !valid {
                return None;
            }
        }
        let mut arguments = Arguments::new();
        for (name, value) in &self.arguments {
            let value = value
                .node
                .clone()
                .into_const_with(|name| {
                    Ok::<_, ()>(variables.get(&name).cloned().unwrap_or(Value::Null))
                })
                .ok()?;
            arguments.insert(name.clone(), value);
        }
        let (shard_arg, list_arg) = &self.shard_arguments;
        let query = index_query(
            &arguments,
            limits,
            &|field| self.selected.contains(field),
            &self.index,
            shard_arg,
            list_arg,
        )
        .ok()?;
        let spec = ReadSpec::of(&arguments, &self.datastore).ok()?;
        Some((query, spec))
    }

    /// The response body of `query`; `Ok(None)` for cells the selection
    /// cannot place (async-graphql then answers).
    async fn read(
        &self,
        store: &Store,
        query: &IndexQuery,
        read: &ReadOptions,
    ) -> cellgate_store::Result<Option<Vec<u8>>> {
        if !self.columns.is_empty() {
            let columns: Vec<&str> = self.columns.iter().map(|c| &**c).collect();
            let joined = store
                .query_index_with_cells_json(&self.datastore, query, &columns, read)
                .await?;
            if let Some((page, cells)) = joined {
                let Some(cells) = self.by_row_and_column(cells) else {
                    return Ok(None);
                };
                return Ok(Some(self.write(&page, &cells)));
            }
        }
        let page = store.query_index_with(&self.datastore, query, read).await?;
        let Some(cells) = self.latest_cells(store, &page, read).await? else {
            return Ok(None);
        };
        Ok(Some(self.write(&page, &cells)))
    }

    /// The executor's response to a store error of the index field: the
    /// datastore field null, the error located at the index field (the
    /// executor reports it without a path). The outage tests compare both.
    fn failed(&self, error: &cellgate_store::Error) -> async_graphql::Response {
        let error = super::errors::from_store(error).into_server_error(self.index_pos);
        let data = async_graphql::indexmap::IndexMap::from([(
            Name::new(&self.datastore_key),
            Value::Null,
        )]);
        let mut response = async_graphql::Response::new(Value::Object(data));
        response.errors.push(error);
        response
    }

    /// The GraphQL names of the index fields `node` selects.
    fn selected_index_fields(&self) -> HashSet<String> {
        let mut selected = HashSet::new();
        for field in &self.connection {
            let ConnectionField::Edges(_, edge) = field else {
                continue;
            };
            for field in edge {
                let EdgeField::Node(_, node) = field else {
                    continue;
                };
                for field in node {
                    if let NodeField::Index(_, name) = field {
                        selected.insert(camel(name));
                    }
                }
            }
        }
        selected
    }

    /// The latest cells of the selected columns for every entry of the
    /// page, in one read per cluster, as (row, column) → cell.
    async fn latest_cells(
        &self,
        store: &Store,
        page: &IndexPage,
        read: &ReadOptions,
    ) -> cellgate_store::Result<Option<Cells>> {
        if self.columns.is_empty() || page.entries.is_empty() {
            return Ok(Some(Cells::new()));
        }
        let wanted: Vec<(Uuid, String)> = page
            .entries
            .iter()
            .flat_map(|e| self.columns.iter().map(move |c| (e.row_key, c.to_string())))
            .collect();
        let cells = store
            .get_cells_latest_json(&self.datastore, &wanted, read)
            .await?;
        Ok(self.by_row_and_column(cells.into_iter().flatten().collect()))
    }

    /// `cells` as (row, column) → cell, the column as the selection names
    /// it; `None` for a cell of a column the selection does not hold.
    fn by_row_and_column(&self, cells: Vec<Cell<Vec<u8>>>) -> Option<Cells> {
        let mut found = Cells::with_capacity(cells.len());
        for cell in cells {
            let column = self.columns.iter().find(|c| ***c == *cell.column)?.clone();
            found.insert((cell.row_key, column), cell);
        }
        Some(found)
    }

    fn write(&self, page: &IndexPage, cells: &Cells) -> Vec<u8> {
        let mut out = Vec::with_capacity(256 + page.entries.len() * 256);
        out.extend_from_slice(b"{\"data\":{");
        key(&mut out, &self.datastore_key);
        out.push(b'{');
        key(&mut out, &self.index_key);
        out.push(b'{');
        for (i, field) in self.connection.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            match field {
                ConnectionField::Edges(name, edge) => {
                    key(&mut out, name);
                    out.push(b'[');
                    for (j, entry) in page.entries.iter().enumerate() {
                        if j > 0 {
                            out.push(b',');
                        }
                        write_edge(&mut out, edge, entry, cells);
                    }
                    out.push(b']');
                }
                ConnectionField::PageInfo(name, info) => {
                    key(&mut out, name);
                    out.push(b'{');
                    for (j, (name, field)) in info.iter().enumerate() {
                        if j > 0 {
                            out.push(b',');
                        }
                        key(&mut out, name);
                        value(&mut out, &(PAGE_INFO_FIELDS[*field].1)(page));
                    }
                    out.push(b'}');
                }
            }
        }
        out.extend_from_slice(b"}}}}");
        out
    }
}

fn write_edge(out: &mut Vec<u8>, edge: &[EdgeField], entry: &IndexEntry, cells: &Cells) {
    out.push(b'{');
    for (i, field) in edge.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match field {
            EdgeField::Cursor(name) => {
                key(out, name);
                value(out, &Value::String(entry.cursor()));
            }
            EdgeField::Node(name, node) => {
                key(out, name);
                out.push(b'{');
                for (j, field) in node.iter().enumerate() {
                    if j > 0 {
                        out.push(b',');
                    }
                    match field {
                        NodeField::RowKey(name) => {
                            key(out, name);
                            uuid(out, entry.row_key);
                        }
                        NodeField::Index(name, field) => {
                            key(out, name);
                            index_value(out, entry, field);
                        }
                        NodeField::Row(name, row) => {
                            key(out, name);
                            write_row(out, row, entry.row_key, cells);
                        }
                    }
                }
                out.push(b'}');
            }
        }
    }
    out.push(b'}');
}

/// The index field `name` (as in the definitions) of an entry, as the
/// executor answers it (`schema/index.rs`).
fn index_value(out: &mut Vec<u8>, entry: &IndexEntry, name: &str) {
    match entry.field(name) {
        Some(v) => scalars::write_sql_json(out, v),
        None => out.extend_from_slice(b"null"),
    }
}

fn write_row(out: &mut Vec<u8>, row: &[RowField], row_key: Uuid, cells: &Cells) {
    out.push(b'{');
    for (i, field) in row.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match field {
            RowField::RowKey(name) => {
                key(out, name);
                uuid(out, row_key);
            }
            RowField::Column(name, column, selection) => {
                key(out, name);
                let Some(cell) = cells.get(&(row_key, column.clone())) else {
                    out.extend_from_slice(b"null");
                    continue;
                };
                out.push(b'{');
                for (j, (name, field)) in selection.iter().enumerate() {
                    if j > 0 {
                        out.push(b',');
                    }
                    key(out, name);
                    match field {
                        // The body's JSON text as read: the same text its
                        // `Value` would serialize to (`codec::decode_json`).
                        CellField::Body => out.extend_from_slice(&cell.body),
                        field => value(out, &field.meta(cell)),
                    }
                }
                out.push(b'}');
            }
        }
    }
    out.push(b'}');
}

/// The fields of a selection set, or `None` when it has fragments,
/// directives, or the same response key twice.
fn fields(set: &SelectionSet) -> Option<Vec<&Field>> {
    let mut keys = HashSet::new();
    let mut out = Vec::with_capacity(set.items.len());
    for item in &set.items {
        let Selection::Field(field) = &item.node else {
            return None;
        };
        let field = &field.node;
        if !field.directives.is_empty() || !keys.insert(field.response_key().node.as_str()) {
            return None;
        }
        out.push(field);
    }
    Some(out)
}

/// A field without arguments, and its sub-selection's fields.
fn plain(field: &Field) -> Option<Vec<&Field>> {
    if !field.arguments.is_empty() {
        return None;
    }
    fields(&field.selection_set.node)
}

fn edges(
    field: &Field,
    datastore: &index_dsl::Datastore,
    index: &Index,
    columns: &mut Vec<Arc<str>>,
) -> Option<Vec<EdgeField>> {
    let mut edge = Vec::new();
    for item in plain(field)? {
        let key = item.response_key().node.to_string();
        edge.push(match item.name.node.as_str() {
            "cursor" if plain(item)?.is_empty() => EdgeField::Cursor(key),
            "node" => EdgeField::Node(key, node(item, datastore, index, columns)?),
            _ => return None,
        });
    }
    Some(edge)
}

fn node(
    field: &Field,
    datastore: &index_dsl::Datastore,
    index: &Index,
    columns: &mut Vec<Arc<str>>,
) -> Option<Vec<NodeField>> {
    let mut node = Vec::new();
    for item in plain(field)? {
        let key = item.response_key().node.to_string();
        let name = item.name.node.as_str();
        node.push(if name == "row" {
            NodeField::Row(key, row(item, datastore, columns)?)
        } else if !plain(item)?.is_empty() {
            return None;
        } else if name == "rowKey" {
            NodeField::RowKey(key)
        } else {
            let field = index.fields.iter().find(|f| camel(&f.name) == name)?;
            NodeField::Index(key, field.name.clone())
        });
    }
    Some(node)
}

fn row(
    field: &Field,
    datastore: &index_dsl::Datastore,
    columns: &mut Vec<Arc<str>>,
) -> Option<Vec<RowField>> {
    let mut row = Vec::new();
    for item in plain(field)? {
        let key = item.response_key().node.to_string();
        let name = item.name.node.as_str();
        let selection = plain(item)?;
        if name == "rowKey" && selection.is_empty() {
            row.push(RowField::RowKey(key));
            continue;
        }
        let column = datastore.columns.iter().find(|c| camel(&c.name) == name)?;
        let column: Arc<str> = match columns.iter().find(|c| ***c == *column.name) {
            Some(known) => known.clone(),
            None => {
                let column: Arc<str> = Arc::from(column.name.as_str());
                columns.push(column.clone());
                column
            }
        };
        let mut cell = Vec::new();
        for item in selection {
            if !plain(item)?.is_empty() {
                return None;
            }
            let field = CellField::ALL
                .into_iter()
                .find(|f| f.name() == item.name.node.as_str())?;
            cell.push((item.response_key().node.to_string(), field));
        }
        if cell.is_empty() {
            return None;
        }
        row.push(RowField::Column(key, column, cell));
    }
    Some(row)
}

fn page_info(field: &Field) -> Option<Vec<(String, usize)>> {
    let mut info = Vec::new();
    for item in plain(field)? {
        if !plain(item)?.is_empty() {
            return None;
        }
        let position = PAGE_INFO_FIELDS
            .iter()
            .position(|(name, _)| *name == item.name.node.as_str())?;
        info.push((item.response_key().node.to_string(), position));
    }
    Some(info)
}

/// Whether `value` passes the input check of the scalar `name`, as
/// validation would apply it to a variable. Stricter than validation where
/// that is simpler: the request then takes the executor's path.
fn scalar_input(name: &str, value: &Value) -> bool {
    match name {
        "Int" => {
            matches!(value, Value::Number(n) if n.as_i64().is_some_and(|i| i32::try_from(i).is_ok()))
        }
        "Float" => matches!(value, Value::Number(_)),
        "String" => matches!(value, Value::String(_)),
        "Boolean" => matches!(value, Value::Boolean(_)),
        "ID" => matches!(value, Value::String(_)),
        custom => scalars::valid_input(custom, value),
    }
}

fn key(out: &mut Vec<u8>, name: &str) {
    json(out, name);
    out.push(b':');
}

fn uuid(out: &mut Vec<u8>, id: Uuid) {
    out.push(b'"');
    out.extend_from_slice(
        id.hyphenated()
            .encode_lower(&mut Uuid::encode_buffer())
            .as_bytes(),
    );
    out.push(b'"');
}

fn value(out: &mut Vec<u8>, value: &Value) {
    json(out, value);
}

fn json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // Writing to a `Vec` fails only for values serde_json cannot represent,
    // which `Value` and JSON bodies never hold.
    let _ = serde_json::to_writer(out, value);
}
