//! Batched cell reads for `row` fields: every cell a response needs is
//! collected by a per-request DataLoader and fetched with one query per
//! storage cluster (`Store::get_cells_latest` / `Store::get_cells`), so a
//! page of index entries never costs one query per row or per shard.
//! Requests carry the [`ReadSpec`] of the field they come from; reads of
//! one spec are batched together.

use std::collections::HashMap;
use std::sync::Arc;

use async_graphql::dataloader::{DataLoader, HashMapCache, Loader};
use uuid::Uuid;

use crate::consistency::{ReadSpec, Served};
use cellgate_store::cells::{Cell, CellKey};
use cellgate_store::Store;

/// One cell a resolver wants.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CellRequest {
    /// The latest version of a (row, column).
    Latest {
        datastore: Arc<str>,
        row_key: Uuid,
        column: Arc<str>,
        read: ReadSpec,
    },
    /// One exact version.
    Exact {
        datastore: Arc<str>,
        key: CellKey,
        read: ReadSpec,
    },
}

/// The per-request loader of cells. It caches what it loaded (and what
/// index fields fed it, see `prefetch_rows` in `schema/index.rs`) for the rest
/// of the request: cells are immutable, and a request sees one version of
/// a row's latest cells.
pub type Cells = DataLoader<CellLoader, HashMapCache>;

pub struct CellLoader {
    pub store: Store,
    /// The request's record of the replicas that served it.
    pub served: Served,
}

impl Loader<CellRequest> for CellLoader {
    /// Shared: the cache lends a copy of the value to every field that
    /// asks, and a copy of a cell would copy its body.
    type Value = Arc<Cell>;
    type Error = Arc<cellgate_store::Error>;

    async fn load(
        &self,
        keys: &[CellRequest],
    ) -> Result<HashMap<CellRequest, Arc<Cell>>, Self::Error> {
        type Group = (Arc<str>, ReadSpec);
        let mut latest: HashMap<Group, Vec<(Uuid, String)>> = HashMap::new();
        let mut exact: HashMap<Group, Vec<CellKey>> = HashMap::new();
        for key in keys {
            match key {
                CellRequest::Latest {
                    datastore,
                    row_key,
                    column,
                    read,
                } => latest
                    .entry((datastore.clone(), read.clone()))
                    .or_default()
                    .push((*row_key, column.to_string())),
                CellRequest::Exact {
                    datastore,
                    key,
                    read,
                } => exact
                    .entry((datastore.clone(), read.clone()))
                    .or_default()
                    .push(key.clone()),
            }
        }
        let mut found = HashMap::new();
        for ((datastore, read), wanted) in latest {
            let cells = self
                .store
                .get_cells_latest_with(&datastore, &wanted, &read.options(&self.served))
                .await
                .map_err(Arc::new)?;
            for ((row_key, column), cell) in wanted.into_iter().zip(cells) {
                if let Some(cell) = cell {
                    let request = CellRequest::Latest {
                        datastore: datastore.clone(),
                        row_key,
                        column: column.into(),
                        read: read.clone(),
                    };
                    found.insert(request, Arc::new(cell));
                }
            }
        }
        for ((datastore, read), wanted) in exact {
            let cells = self
                .store
                .get_cells_with(&datastore, &wanted, &read.options(&self.served))
                .await
                .map_err(Arc::new)?;
            for (key, cell) in wanted.into_iter().zip(cells) {
                if let Some(cell) = cell {
                    found.insert(
                        CellRequest::Exact {
                            datastore: datastore.clone(),
                            key,
                            read: read.clone(),
                        },
                        Arc::new(cell),
                    );
                }
            }
        }
        Ok(found)
    }
}
