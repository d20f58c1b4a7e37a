//! Concurrent writers and readers of the same shards.

use std::collections::BTreeMap;
use std::sync::Arc;

use cellgate_store::cells::{Location, NewCell};
use cellgate_store::shards::row_shard;
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

/// A write's status (`Debug` form) or error code.
type Outcome = Result<String, String>;

/// Writers racing to write the same keys, half of them with another body,
/// in batches that also hold keys of their own: each raced key is written
/// once and reads back with the winner's body, the other writers get a
/// duplicate (same body) or `CELL_CONFLICT` (other body) and never an
/// error of the race itself, and the shards' logs hold every written cell
/// once, numbered without gaps.
pub async fn writers_racing_for_the_same_keys(env: Arc<Env>) {
    const WRITERS: usize = 8;
    const ROUNDS: usize = 10;
    // 15 cells a batch: encoded on the request's task, so that the
    // writers reach the database together.
    const RACED: usize = 10;
    const OWN: usize = 5;
    let store = env.open().await;
    let shards: Vec<u32> = vec![5, 6, 900, 2047, 4094];
    for round in 0..ROUNDS {
        let raced = keys_in(&shards, RACED);
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let store = store.clone();
                let mut keys = raced.clone();
                let own = keys_in(&shards, OWN);
                tokio::spawn(async move {
                    if w % 2 == 1 {
                        keys.reverse();
                    }
                    let body = json!({"side": w % 2, "round": round});
                    let cells: Vec<NewCell> = keys
                        .iter()
                        .chain(own.iter())
                        .map(|row_key| NewCell {
                            row_key: *row_key,
                            column: "NOTES".into(),
                            ref_key: 1,
                            body: body.clone(),
                        })
                        .collect();
                    let results = store.put_cells("trips", cells).await.unwrap();
                    (w, keys, own, results)
                })
            })
            .collect();
        // Per raced key: each writer and its status or error code.
        let mut outcomes: BTreeMap<Uuid, Vec<(usize, Outcome)>> = BTreeMap::new();
        for writer in writers {
            let (w, keys, own, results) = writer.await.unwrap();
            for (key, result) in keys.iter().chain(own.iter()).zip(results) {
                let outcome = match result {
                    Ok(status) => Ok(format!("{status:?}")),
                    Err(err) => Err(err.code().to_string()),
                };
                if own.contains(key) {
                    assert_eq!(outcome, Ok("Written".to_string()), "writer {w}'s own key");
                } else {
                    outcomes.entry(*key).or_default().push((w, outcome));
                }
            }
        }
        for (key, results) in &outcomes {
            let stored = store
                .get_cell_latest("trips", *key, "NOTES")
                .await
                .unwrap()
                .expect("a raced key is stored");
            let winner_side = stored.body["side"].as_u64().unwrap() as usize;
            let written: Vec<usize> = results
                .iter()
                .filter(|(_, r)| r.as_deref() == Ok("Written"))
                .map(|(w, _)| *w)
                .collect();
            assert_eq!(written.len(), 1, "key {key} written once: {results:?}");
            assert_eq!(
                written[0] % 2,
                winner_side,
                "the stored body is the winner's"
            );
            for (w, result) in results {
                let expected = if *w == written[0] {
                    Ok("Written".to_string())
                } else if w % 2 == winner_side {
                    Ok("Duplicate".to_string())
                } else {
                    Err("CELL_CONFLICT".to_string())
                };
                assert_eq!(result, &expected, "writer {w} on key {key}");
            }
        }
    }
    let per_round = RACED + WRITERS * OWN;
    let mut total = 0;
    for shard in &shards {
        let page = store
            .cells_for_shard("trips", *shard, Location::AddedId(0), 10_000)
            .await
            .unwrap();
        let ids: Vec<i64> = page.cells.iter().map(|c| c.added_id).collect();
        let expected: Vec<i64> = (1..=ids.len() as i64).collect();
        assert_eq!(ids, expected, "shard {shard}: added ids without gaps");
        total += ids.len();
    }
    assert_eq!(
        total,
        ROUNDS * per_round,
        "every written cell is in the log once"
    );
}
