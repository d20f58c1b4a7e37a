//! Trigger consumers (`triggers/`): every cell of the followed columns
//! delivered in per-shard order, progress kept across restarts, rewinds,
//! the quarantine of a cell the handler keeps refusing (and its retry), a
//! consumer that stops past its quarantine limit, two gateways sharing
//! one consumer's shards, one taking over when the other goes, and a
//! dropped store that stops delivering.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellgate_store::cells::{Location, NewCell};
use cellgate_store::triggers::{ConsumerOptions, Delivery, Handler};
use cellgate_store::Store;
use serde_json::json;
use uuid::Uuid;

use crate::harness::Env;

/// `(shard, added_id)` of a delivered cell, with its row and column.
type Seen = (u32, i64, Uuid, String);

/// A handler recording what it is given; it refuses (every time) the cells
/// whose body says `"poison": true` while `poisoned` is set.
fn recorder(poisoned: Arc<AtomicBool>) -> (Handler, Arc<Mutex<Vec<Seen>>>) {
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let record = seen.clone();
    let handler: Handler = Arc::new(move |delivery: Delivery| {
        let record = record.clone();
        let poisoned = poisoned.clone();
        Box::pin(async move {
            if poisoned.load(Ordering::Relaxed)
                && delivery
                    .cells
                    .iter()
                    .any(|c| c.body["poison"] == json!(true))
            {
                return Err("refused a poison cell".to_string());
            }
            let mut seen = record.lock().unwrap();
            for cell in &delivery.cells {
                seen.push((cell.shard, cell.added_id, cell.row_key, cell.column.clone()));
            }
            Ok(())
        })
    });
    (handler, seen)
}

fn options(name: &str) -> ConsumerOptions {
    ConsumerOptions {
        columns: vec!["BASE".into()],
        min_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(20),
        max_attempts: 3,
        lease_time: Duration::from_secs(3),
        sweep_every: Duration::from_millis(200),
        ..ConsumerOptions::new(name, "trips")
    }
}

/// Writes `rows` new rows with a BASE and a STATUS cell each; the stored
/// BASE cells as `(shard, added_id)`.
async fn write(store: &Store, rows: usize, body: serde_json::Value) -> BTreeSet<(u32, i64)> {
    let rows: Vec<Uuid> = (0..rows).map(|_| Uuid::new_v4()).collect();
    write_rows(store, &rows, body).await
}

/// [`write`] for the rows `rows`.
async fn write_rows(store: &Store, rows: &[Uuid], body: serde_json::Value) -> BTreeSet<(u32, i64)> {
    let mut cells = Vec::new();
    for row in rows.iter().copied() {
        for column in ["BASE", "STATUS"] {
            cells.push(NewCell {
                row_key: row,
                column: column.into(),
                ref_key: 1,
                body: body.clone(),
            });
        }
    }
    let keys: Vec<_> = cells
        .iter()
        .filter(|c| c.column == "BASE")
        .map(|c| cellgate_store::cells::CellKey {
            row_key: c.row_key,
            column: c.column.clone(),
            ref_key: c.ref_key,
        })
        .collect();
    for result in store.put_cells("trips", cells).await.unwrap() {
        result.unwrap();
    }
    store
        .get_cells("trips", &keys)
        .await
        .unwrap()
        .into_iter()
        .map(|c| {
            let c = c.unwrap();
            (c.shard, c.added_id)
        })
        .collect()
}

/// Waits (bounded) until `done` holds.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn delivered(seen: &Mutex<Vec<Seen>>) -> BTreeSet<(u32, i64)> {
    seen.lock().unwrap().iter().map(|s| (s.0, s.1)).collect()
}

/// Fails unless every shard's cells came in increasing `added_id` order.
fn assert_shard_order(seen: &[Seen]) {
    let mut last: BTreeMap<u32, i64> = BTreeMap::new();
    for (shard, added_id, ..) in seen {
        let previous = last.insert(*shard, *added_id);
        assert!(
            previous.is_none_or(|p| p < *added_id),
            "shard {shard}: {added_id} after {previous:?}"
        );
    }
}

pub async fn a_consumer_gets_every_cell_of_its_columns_in_shard_order(env: Arc<Env>) {
    let store = env.open().await;
    let before = write(&store, 150, json!({"n": 1})).await;
    let (handler, seen) = recorder(Arc::default());
    let consumer = store.start_consumer(options("follow"), handler).unwrap();
    until("the cells written before the start are delivered", || {
        delivered(&seen) == before
    })
    .await;
    // Pushed: written now, delivered without a restart.
    let after = write(&store, 150, json!({"n": 2})).await;
    let all: BTreeSet<_> = before.union(&after).copied().collect();
    until("the cells written after the start are delivered", || {
        delivered(&seen) == all
    })
    .await;
    let seen = seen.lock().unwrap().clone();
    assert!(seen.iter().all(|s| s.3 == "BASE"), "only BASE cells");
    assert_eq!(seen.len(), all.len(), "each cell once");
    assert_shard_order(&seen);
    until("the delivered count follows the offsets", || {
        consumer.status().delivered == all.len() as u64
    })
    .await;
    let status = consumer.status();
    assert_eq!((status.quarantined, status.stopped.clone()), (0, None));
    consumer.stop().await;
    store.shutdown(Duration::from_secs(5)).await;
}

pub async fn a_consumer_resumes_from_its_offsets_and_can_be_rewound(env: Arc<Env>) {
    let store = env.open().await;
    let first = write(&store, 100, json!({"n": 1})).await;
    let (handler, seen) = recorder(Arc::default());
    let consumer = store.start_consumer(options("resume"), handler).unwrap();
    until("the first cells are delivered", || {
        delivered(&seen) == first
    })
    .await;
    consumer.stop().await;
    store.shutdown(Duration::from_secs(5)).await;

    // A new gateway process: only what came after is delivered.
    let store = env.open().await;
    let second = write(&store, 100, json!({"n": 2})).await;
    let (handler, again) = recorder(Arc::default());
    let consumer = store.start_consumer(options("resume"), handler).unwrap();
    until("the later cells are delivered", || {
        delivered(&again) == second
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        delivered(&again),
        second,
        "cells acknowledged before the restart are not delivered again"
    );

    // Rewound to the beginning: everything again, in shard order.
    let moved = store
        .rewind_consumer("trips", "resume", Location::AddedId(0))
        .await
        .unwrap();
    assert_eq!(moved, 4096, "every shard's offset moves");
    let all: BTreeSet<_> = first.union(&second).copied().collect();
    let mark = again.lock().unwrap().len();
    until("the rewound consumer delivers every cell again", || {
        again.lock().unwrap()[mark..]
            .iter()
            .map(|s| (s.0, s.1))
            .collect::<BTreeSet<_>>()
            == all
    })
    .await;
    assert_shard_order(&again.lock().unwrap()[mark..]);
    consumer.stop().await;
    store.shutdown(Duration::from_secs(5)).await;
}

pub async fn a_refused_cell_is_quarantined_and_its_shard_moves_on(env: Arc<Env>) {
    let store = env.open().await;
    let poisoned = Arc::new(AtomicBool::new(true));
    let (handler, seen) = recorder(poisoned.clone());
    let consumer = store.start_consumer(options("poison"), handler).unwrap();
    let good = write(&store, 40, json!({"n": 1})).await;
    let poison = write(&store, 1, json!({"poison": true})).await;
    let &(shard, poison_id) = poison.iter().next().unwrap();
    // A later cell of the poison cell's shard.
    let row = std::iter::repeat_with(Uuid::new_v4)
        .find(|r| store.row_shard("trips", r).unwrap() == shard)
        .unwrap();
    let later = write_rows(&store, &[row], json!({"n": 2})).await;
    until("the shard moves on past the poison cell", || {
        delivered(&seen).is_superset(&later) && delivered(&seen).is_superset(&good)
    })
    .await;
    let quarantined = store.trigger_quarantine("trips", "poison").await.unwrap();
    assert_eq!(
        quarantined
            .iter()
            .map(|q| (q.shard, q.added_id))
            .collect::<Vec<_>>(),
        vec![(shard, poison_id)]
    );
    assert_eq!(quarantined[0].message, "refused a poison cell");
    assert!(quarantined[0].attempts >= 3);
    assert!(!delivered(&seen).contains(&(shard, poison_id)));
    assert_eq!(consumer.status().quarantined, 1);

    // Fixed handler: a retry delivers it and empties the quarantine.
    poisoned.store(false, Ordering::Relaxed);
    assert_eq!(
        store
            .retry_trigger_quarantine("trips", "poison")
            .await
            .unwrap(),
        1
    );
    until("the quarantined cell is delivered on retry", || {
        delivered(&seen).contains(&(shard, poison_id))
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !store
        .trigger_quarantine("trips", "poison")
        .await
        .unwrap()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the quarantine empties");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    consumer.stop().await;
    store.shutdown(Duration::from_secs(5)).await;
}

pub async fn a_consumer_stops_past_its_quarantine_limit(env: Arc<Env>) {
    let store = env.open().await;
    let (handler, _seen) = recorder(Arc::new(AtomicBool::new(true)));
    let consumer = store
        .start_consumer(
            ConsumerOptions {
                quarantine_limit: 1,
                ..options("limited")
            },
            handler,
        )
        .unwrap();
    write(&store, 3, json!({"poison": true})).await;
    until("the consumer stops", || consumer.status().stopped.is_some()).await;
    let status = consumer.status();
    assert!(
        status
            .stopped
            .as_deref()
            .is_some_and(|s| s.contains("quarantined")),
        "{status:?}"
    );
    assert_eq!(status.quarantined, 2, "it stops at the cell past the limit");
    assert_eq!(
        store
            .consumers()
            .iter()
            .filter(|c| c.stopped.is_some())
            .count(),
        1
    );
    consumer.stop().await;
    store.shutdown(Duration::from_secs(5)).await;
}

pub async fn two_gateways_share_a_consumer_and_one_takes_over_when_the_other_goes(env: Arc<Env>) {
    let a = env.open().await;
    let b = env.open().await;
    let (handler_a, seen_a) = recorder(Arc::default());
    let (handler_b, seen_b) = recorder(Arc::default());
    let consumer_a = a.start_consumer(options("shared"), handler_a).unwrap();
    let consumer_b = b.start_consumer(options("shared"), handler_b).unwrap();
    until("both gateways hold buckets", || {
        consumer_a.status().held_buckets > 0 && consumer_b.status().held_buckets > 0
    })
    .await;
    let first = write(&a, 200, json!({"n": 1})).await;
    let both = || {
        delivered(&seen_a)
            .union(&delivered(&seen_b))
            .copied()
            .collect::<BTreeSet<_>>()
    };
    until("the two gateways deliver every cell between them", || {
        both().is_superset(&first)
    })
    .await;
    // Both share the work. On a loaded machine a lease can change hands
    // while the first batch is delivered (a renewal late past its expiry),
    // so a gateway without a delivery yet gets a few more batches, each
    // of which the two must again deliver between them.
    for n in 0..20 {
        if !delivered(&seen_a).is_empty() && !delivered(&seen_b).is_empty() {
            break;
        }
        let more = write(&a, 50, json!({"n": 1, "more": n})).await;
        until("the two gateways deliver every cell between them", || {
            both().is_superset(&more)
        })
        .await;
    }
    assert!(!delivered(&seen_a).is_empty() && !delivered(&seen_b).is_empty());
    assert_shard_order(&seen_a.lock().unwrap());
    assert_shard_order(&seen_b.lock().unwrap());

    // `a` goes away (its store dropped; it may or may not give up its
    // leases first): `b` takes its shards over, at the latest once they
    // expire, and delivers what `a` would have.
    drop(consumer_a);
    drop(a);
    let died = Instant::now();
    let second = write(&b, 200, json!({"n": 2})).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !delivered(&seen_b).is_superset(&second) {
        assert!(
            Instant::now() < deadline,
            "the survivor delivers every later cell: {} of {} delivered, {:?}",
            delivered(&seen_b).intersection(&second).count(),
            second.len(),
            consumer_b.status()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "{:?}: taken over and delivered {:?} after the death",
        env.kind,
        died.elapsed()
    );
    assert_shard_order(&seen_b.lock().unwrap());
    consumer_b.stop().await;
    b.shutdown(Duration::from_secs(5)).await;
}

/// A store dropped without a shutdown (a gateway that dies) stops its
/// consumer's workers once the batch in flight is handled, though cells
/// are still waiting: the gateway that takes the shards over delivers
/// them, not the one that went.
pub async fn a_dropped_store_delivers_nothing_after_the_batch_in_flight(env: Arc<Env>) {
    let a = env.open().await;
    write(&a, 200, json!({"n": 1})).await;
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (entered, mut first_call) = tokio::sync::mpsc::channel::<()>(1);
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let handler: Handler = {
        let (calls, release) = (calls.clone(), release.clone());
        Arc::new(move |_delivery: Delivery| {
            let (calls, release, entered) = (calls.clone(), release.clone(), entered.clone());
            Box::pin(async move {
                if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    let _ = entered.send(()).await;
                    let _ = release.acquire().await.map(|p| p.forget());
                }
                Ok(())
            })
        })
    };
    let consumer = a
        .start_consumer(
            ConsumerOptions {
                batch_size: 10,
                ..options("dropped")
            },
            handler,
        )
        .unwrap();
    tokio::time::timeout(Duration::from_secs(60), first_call.recv())
        .await
        .expect("the first batch is delivered");
    // The gateway dies while its handler holds a batch of 10 with 190 cells
    // still to deliver.
    drop(consumer);
    drop(a);
    release.add_permits(1);
    // Long enough for several more batches if the workers went on.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "a dropped store's consumer handed its handler more batches"
    );
}
