//! The store's cell API: writes, reads by key, latest cells, history,
//! the cell log, retention and the buffer's conflicts (`cells/`).

use super::*;

impl Store {
    /// Whether any reachable cluster holds a cell of `datastore`.
    pub async fn has_cells(&self, datastore: &str) -> Result<bool> {
        let ds = self.topology_ref().datastore(datastore)?;
        cells::has_cells(self.topology_ref(), &ds).await
    }

    /// The top-level body members the indexes of `datastore` read: what
    /// [`codec::PackBody`] should keep of a body for this process's index
    /// maintenance.
    pub fn index_members(
        &self,
        datastore: &str,
    ) -> Result<Arc<std::collections::BTreeSet<String>>> {
        Ok(self
            .topology_ref()
            .datastore(datastore)?
            .indexed_members
            .clone())
    }

    /// Writes one cell.
    pub async fn put_cell(&self, datastore: &str, cell: NewCell) -> Result<PutStatus> {
        let mut results = self.put_cells(datastore, vec![cell]).await?;
        results
            .pop()
            .expect("one result per cell")
            .map_err(Error::unshare)
    }

    /// Writes a batch of cells: one transaction per cluster, clusters in
    /// parallel. Returns one result per cell, in input order. An `Err` for
    /// the whole call means nothing was attempted (unknown datastore, batch
    /// too large).
    pub async fn put_cells(&self, datastore: &str, cells: Vec<NewCell>) -> Result<Vec<PutResult>> {
        Ok(self.put_cells_with_token(datastore, cells).await?.0)
    }

    /// [`Store::put_cells`], with the read token of what it wrote: a read
    /// given it ([`ReadOptions::after`]) sees these cells, even from a
    /// replica.
    pub async fn put_cells_with_token(
        &self,
        datastore: &str,
        cells: Vec<NewCell>,
    ) -> Result<(Vec<PutResult>, ReadToken)> {
        cells::write::put_cells(self.topology_ref(), datastore, cells).await
    }

    /// [`Store::put_cells_with_token`] for bodies already read from JSON
    /// text into MessagePack ([`codec::PackBody`]): each is stored as the
    /// value the text parses to would be, byte for byte, without that
    /// value being built. A body that is not a JSON object is the cell's
    /// `InvalidBody`.
    pub async fn put_packed_cells_with_token(
        &self,
        datastore: &str,
        cells: Vec<NewCell<codec::Packed>>,
    ) -> Result<(Vec<PutResult>, ReadToken)> {
        cells::write::put_cells(self.topology_ref(), datastore, cells).await
    }

    /// The cell at `key`, if it exists.
    pub async fn get_cell(&self, datastore: &str, key: &CellKey) -> Result<Option<Cell>> {
        self.get_cell_with(datastore, key, &ReadOptions::default())
            .await
    }

    /// [`Store::get_cell`], served as `read` allows (a replica, see
    /// [`crate::replicas`]).
    pub async fn get_cell_with(
        &self,
        datastore: &str,
        key: &CellKey,
        read: &ReadOptions,
    ) -> Result<Option<Cell>> {
        cells::get_cell(
            self.topology_ref(),
            &self.inner.cell_cache,
            datastore,
            key,
            read,
        )
        .await
    }

    /// The cell of `(row_key, column)` with the highest ref key.
    pub async fn get_cell_latest(
        &self,
        datastore: &str,
        row_key: Uuid,
        column: &str,
    ) -> Result<Option<Cell>> {
        Ok(self
            .history(datastore, row_key, column, 1, None)
            .await?
            .pop())
    }

    /// Deletes old versions of the cells of `datastore` (retention): those
    /// `options` allow — beyond the newest `keep` of each `(row, column)`,
    /// stored before `created_before`, or both — except the latest version
    /// of every `(row, column)`, cells a log consumer (index maintenance,
    /// triggers) has not read yet and cells a quarantine record names.
    /// Works shard range by shard range on each cluster, a handful of
    /// statements per chunk, calling `on_progress` after each; safe while
    /// gateways write (the deletes are guarded, see
    /// [`cells::PruneOptions`] and the `cells::prune` module). Afterwards
    /// `history` and the log no longer return the deleted versions.
    pub async fn prune_cells(
        &self,
        datastore: &str,
        options: &cells::PruneOptions,
        on_progress: &mut (dyn FnMut(&cells::PruneProgress) + Send),
    ) -> Result<cells::PruneReport> {
        let ds = self.topology_ref().datastore(datastore)?;
        cells::prune(self.topology_ref(), &ds, options, on_progress).await
    }

    /// Versions of `(row_key, column)`, newest first, at most `limit`, with
    /// ref keys below `before` when given.
    pub async fn history(
        &self,
        datastore: &str,
        row_key: Uuid,
        column: &str,
        limit: u32,
        before: Option<i64>,
    ) -> Result<Vec<Cell>> {
        self.history_with(
            datastore,
            row_key,
            column,
            limit,
            before,
            &ReadOptions::default(),
        )
        .await
    }

    /// [`Store::history`], served as `read` allows.
    pub async fn history_with(
        &self,
        datastore: &str,
        row_key: Uuid,
        column: &str,
        limit: u32,
        before: Option<i64>,
        read: &ReadOptions,
    ) -> Result<Vec<Cell>> {
        cells::history(
            self.topology_ref(),
            datastore,
            row_key,
            column,
            limit,
            before,
            read,
        )
        .await
    }

    /// Cells by key; one statement per cluster. Results follow the input
    /// order.
    pub async fn get_cells(&self, datastore: &str, keys: &[CellKey]) -> Result<Vec<Option<Cell>>> {
        self.get_cells_with(datastore, keys, &ReadOptions::default())
            .await
    }

    /// [`Store::get_cells`], served as `read` allows.
    pub async fn get_cells_with(
        &self,
        datastore: &str,
        keys: &[CellKey],
        read: &ReadOptions,
    ) -> Result<Vec<Option<Cell>>> {
        cells::get_cells(
            self.topology_ref(),
            &self.inner.cell_cache,
            datastore,
            keys,
            read,
        )
        .await
    }

    /// The latest cell of each `(row_key, column)`; one statement per
    /// cluster.
    pub async fn get_cells_latest(
        &self,
        datastore: &str,
        wanted: &[(Uuid, String)],
    ) -> Result<Vec<Option<Cell>>> {
        self.get_cells_latest_with(datastore, wanted, &ReadOptions::default())
            .await
    }

    /// [`Store::get_cells_latest`], served as `read` allows.
    pub async fn get_cells_latest_with(
        &self,
        datastore: &str,
        wanted: &[(Uuid, String)],
        read: &ReadOptions,
    ) -> Result<Vec<Option<Cell>>> {
        cells::get_cells_latest(self.topology_ref(), datastore, wanted, &codec::decode, read).await
    }

    /// [`Store::get_cells_latest`] with each body as its JSON text,
    /// transcoded from storage without building a JSON value. With the
    /// cell cache on (`storage.cell_cache_bytes`), only each pair's latest
    /// ref key is read from the database and the bodies the cache keeps
    /// come from it. Served as `read` allows.
    pub async fn get_cells_latest_json(
        &self,
        datastore: &str,
        wanted: &[(Uuid, String)],
        read: &ReadOptions,
    ) -> Result<Vec<Option<Cell<Vec<u8>>>>> {
        cells::get_cells_latest_json(
            self.topology_ref(),
            &self.inner.cell_cache,
            datastore,
            wanted,
            read,
        )
        .await
    }

    /// Up to `limit` cells of `shard` after `location`, in insertion order.
    pub async fn cells_for_shard(
        &self,
        datastore: &str,
        shard: u32,
        location: Location,
        limit: u32,
    ) -> Result<LogPage> {
        self.cells_for_shard_with(datastore, shard, location, limit, &ReadOptions::default())
            .await
    }

    /// [`Store::cells_for_shard`], served as `read` allows.
    pub async fn cells_for_shard_with(
        &self,
        datastore: &str,
        shard: u32,
        location: Location,
        limit: u32,
        read: &ReadOptions,
    ) -> Result<LogPage> {
        cells::cells_for_shard(self.topology_ref(), datastore, shard, location, limit, read).await
    }

    /// The buffered copies of `datastore` whose bodies cannot be decoded,
    /// on every cluster: replay leaves them in place.
    pub async fn buffer_undecodable(&self, datastore: &str) -> Result<Vec<cells::UndecodableCopy>> {
        cells::replay::list_undecodable(self.topology_ref(), datastore).await
    }

    /// Moves one undecodable buffered copy to the conflicts table on its
    /// primary, bytes kept; returns its cell's key.
    pub async fn buffer_set_aside(
        &self,
        datastore: &str,
        cluster: &str,
        buffer_id: i64,
    ) -> Result<cells::CellKey> {
        cells::replay::set_aside(self.topology_ref(), datastore, cluster, buffer_id).await
    }

    pub async fn buffer_conflicts(
        &self,
        datastore: &str,
        limit: usize,
    ) -> Result<Vec<cells::Conflict>> {
        cells::replay::list_conflicts(self.topology_ref(), datastore, limit).await
    }
}
