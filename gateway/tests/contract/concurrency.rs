//! Concurrent writers and readers of the same shards.

use std::collections::BTreeMap;
use std::sync::Arc;

use cellgate::cells::{Location, NewCell};
use cellgate::shards::row_shard;
use serde_json::json;
use uuid::Uuid;

use crate::harness::{Env, TRIP_SHARDS};

/// Random row keys whose shards are all in `shards`.
fn keys_in(shards: &[u32], n: usize) -> Vec<Uuid> {
    let mut keys = Vec::with_capacity(n);
    while keys.len() < n {
        let key = Uuid::new_v4();
        if shards.contains(&row_shard(&key, TRIP_SHARDS)) {
            keys.push(key);
        }
    }
    keys
}

/// Batches from 8 writers over the same 8 shards, in random orders, while
/// a reader tails the log of those shards: no deadlock or lost race
/// reaches a client, every shard's `added_id`s run 1, 2, 3… with no gap,
/// and the tailing reader, which resumes after the last `added_id` it saw,
/// sees every cell: none commits behind a reader's back.
pub async fn concurrent_batches_on_overlapping_shards(env: Arc<Env>) {
    const WRITERS: usize = 8;
    const BATCHES: usize = 12;
    const CELLS: usize = 40;
    let store = env.open().await;
    let shards: Vec<u32> = vec![3, 700, 701, 1500, 2048, 3000, 4000, 4095];
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let store = store.clone();
        let shards = shards.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let mut seen: BTreeMap<u32, Vec<i64>> = BTreeMap::new();
            loop {
                let finished = done.load(std::sync::atomic::Ordering::Acquire);
                for shard in &shards {
                    let ids = seen.entry(*shard).or_default();
                    loop {
                        let after = ids.last().copied().unwrap_or(0);
                        let page = store
                            .cells_for_shard("trips", *shard, Location::AddedId(after), 100)
                            .await
                            .unwrap();
                        if page.cells.is_empty() {
                            break;
                        }
                        ids.extend(page.cells.iter().map(|c| c.added_id));
                    }
                }
                if finished {
                    return seen;
                }
                tokio::task::yield_now().await;
            }
        })
    };
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = store.clone();
            let shards = shards.clone();
            tokio::spawn(async move {
                for b in 0..BATCHES {
                    let mut keys = keys_in(&shards, CELLS);
                    // Different writers see the shards in different orders.
                    if (w + b) % 2 == 1 {
                        keys.reverse();
                    }
                    let cells = keys
                        .into_iter()
                        .map(|row_key| NewCell {
                            row_key,
                            column: "NOTES".into(),
                            ref_key: 1,
                            body: json!({"writer": w, "batch": b}),
                        })
                        .collect();
                    for result in store.put_cells("trips", cells).await.unwrap() {
                        result.unwrap();
                    }
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    let seen = reader.await.unwrap();
    let total: usize = seen.values().map(Vec::len).sum();
    assert_eq!(
        total,
        WRITERS * BATCHES * CELLS,
        "the reader saw every cell"
    );
    for (shard, ids) in &seen {
        let expected: Vec<i64> = (1..=ids.len() as i64).collect();
        assert_eq!(
            ids, &expected,
            "shard {shard}: added ids without gaps, in order"
        );
    }
}
