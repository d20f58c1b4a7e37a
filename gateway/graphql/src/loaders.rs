//! Batched cell reads for `row` fields: every cell a response needs is
//! collected by a per-request DataLoader and fetched with one query per
//! storage cluster (`Store::get_cells_latest` / `Store::get_cells`), so a
//! page of index entries never costs one query per row or per shard.

use std::collections::HashMap;
use std::sync::Arc;

use async_graphql::dataloader::{DataLoader, HashMapCache, Loader};
use uuid::Uuid;

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
    },
    /// One exact version.
    Exact { datastore: Arc<str>, key: CellKey },
}

/// The per-request loader of cells. It caches what it loaded (and what
/// index fields fed it, see `prefetch_rows` in `schema/index.rs`) for the rest
/// of the request: cells are immutable, and a request sees one version of
/// a row's latest cells.
pub type Cells = DataLoader<CellLoader, HashMapCache>;

pub struct CellLoader {
    pub store: Store,
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
        let mut latest: HashMap<Arc<str>, Vec<(Uuid, String)>> = HashMap::new();
        let mut exact: HashMap<Arc<str>, Vec<CellKey>> = HashMap::new();
        for key in keys {
            match key {
                CellRequest::Latest {
                    datastore,
                    row_key,
                    column,
                } => latest
                    .entry(datastore.clone())
                    .or_default()
                    .push((*row_key, column.to_string())),
                CellRequest::Exact { datastore, key } => exact
                    .entry(datastore.clone())
                    .or_default()
                    .push(key.clone()),
            }
        }
        let mut found = HashMap::new();
        for (datastore, wanted) in latest {
            let cells = self
                .store
                .get_cells_latest(&datastore, &wanted)
                .await
                .map_err(Arc::new)?;
            for ((row_key, column), cell) in wanted.into_iter().zip(cells) {
                if let Some(cell) = cell {
                    let request = CellRequest::Latest {
                        datastore: datastore.clone(),
                        row_key,
                        column: column.into(),
                    };
                    found.insert(request, Arc::new(cell));
                }
            }
        }
        for (datastore, wanted) in exact {
            let cells = self
                .store
                .get_cells(&datastore, &wanted)
                .await
                .map_err(Arc::new)?;
            for (key, cell) in wanted.into_iter().zip(cells) {
                if let Some(cell) = cell {
                    found.insert(
                        CellRequest::Exact {
                            datastore: datastore.clone(),
                            key,
                        },
                        Arc::new(cell),
                    );
                }
            }
        }
        Ok(found)
    }
}
