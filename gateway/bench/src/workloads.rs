//! The requests of each workload, over HTTP and through the Rust API, and
//! the check that an index page's answer is the expected one.

use std::sync::Arc;

use serde_json::{json, Value};
use uuid::Uuid;

use crate::dataset::{cell_input, Dataset, Workload, BASE, DATASTORE, QUERY, ROWS, WRITE};
use crate::http::{truncate, Gateway};
use crate::phase::Op;
use cellgate_store::cells::PutStatus;
use cellgate_store::Store;

pub fn http_op(workload: Workload, gateway: Arc<Gateway>, data: Arc<Dataset>) -> Op {
    Arc::new(move || {
        let (gateway, data) = (gateway.clone(), data.clone());
        Box::pin(async move {
            match workload {
                Workload::Query | Workload::Rows => {
                    let driver = data.random_driver();
                    let document = if workload == Workload::Query {
                        QUERY
                    } else {
                        ROWS
                    };
                    let answer = gateway
                        .graphql(document, data.query_variables(driver))
                        .await?;
                    check_page(workload, driver, &answer)?;
                    Ok(0)
                }
                Workload::Write => {
                    let cells: Vec<Value> = data.write_cells().iter().map(cell_input).collect();
                    let answer = gateway.graphql(WRITE, json!({ "cells": cells })).await?;
                    let results = answer
                        .get("tripsPutCells")
                        .and_then(Value::as_array)
                        .ok_or_else(|| {
                            format!("no results in {}", truncate(&answer.to_string(), 200))
                        })?;
                    let written = results
                        .iter()
                        .filter(|r| r.get("status").and_then(Value::as_str) == Some("WRITTEN"))
                        .count();
                    if written != data.batch {
                        return Err(format!("{written} of {} cells written", data.batch));
                    }
                    Ok(written as u64)
                }
            }
        })
    })
}

/// Checks the `data` of a `query` or `rows` request for `driver`: a page
/// with entries, and with `rows` a BASE body in every entry's row.
pub fn check_page(workload: Workload, driver: Uuid, answer: &Value) -> Result<(), String> {
    let edges = answer
        .pointer("/trips/driverPartnerIndex/edges")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("no edges in {}", truncate(&answer.to_string(), 200)))?;
    if edges.is_empty() {
        return Err(format!("no index entries for driver {driver}"));
    }
    if workload == Workload::Rows
        && !edges.iter().all(|e| {
            e.pointer("/node/row/base/body")
                .is_some_and(Value::is_object)
        })
    {
        return Err(format!("a row of driver {driver} has no BASE body"));
    }
    Ok(())
}

pub fn rust_op(workload: Workload, store: Store, data: Arc<Dataset>) -> Op {
    Arc::new(move || {
        let (store, data) = (store.clone(), data.clone());
        Box::pin(async move {
            match workload {
                Workload::Query | Workload::Rows => {
                    let driver = data.random_driver();
                    let page = store
                        .query_index(DATASTORE, &data.index_query(driver))
                        .await
                        .map_err(|e| e.to_string())?;
                    if page.entries.is_empty() {
                        return Err(format!("no index entries for driver {driver}"));
                    }
                    if workload == Workload::Rows {
                        let wanted: Vec<_> = page
                            .entries
                            .iter()
                            .map(|e| (e.row_key, BASE.to_string()))
                            .collect();
                        let cells = store
                            .get_cells_latest(DATASTORE, &wanted)
                            .await
                            .map_err(|e| e.to_string())?;
                        if !cells.iter().all(Option::is_some) {
                            return Err(format!("a row of driver {driver} has no BASE cell"));
                        }
                    }
                    Ok(0)
                }
                Workload::Write => {
                    let results = store
                        .put_cells(DATASTORE, data.write_cells())
                        .await
                        .map_err(|e| e.to_string())?;
                    let mut written = 0;
                    for result in results {
                        match result {
                            Ok(PutStatus::Written) => written += 1,
                            Ok(_) => {}
                            Err(e) => return Err(e.to_string()),
                        }
                    }
                    if written != data.batch {
                        return Err(format!("{written} of {} cells written", data.batch));
                    }
                    Ok(written as u64)
                }
            }
        })
    })
}
