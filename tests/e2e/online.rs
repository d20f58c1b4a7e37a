//! A changed index keeps answering from its previous version while the new
//! one is built, on two gateways of one store: clients query it throughout
//! and a writer loads the store, while a field is added and reloaded.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::harness::{Defs, Env, Server, Wait};
use crate::reload::{by_n, put_items, until_answered, write, BY_N, BY_N_V1, BY_N_V2};

/// The `n` of each node, sorted.
fn ns(nodes: &[Value]) -> Vec<i64> {
    let mut ns: Vec<i64> = nodes
        .iter()
        .map(|n| n["n"].as_str().expect("n").parse().expect("an int"))
        .collect();
    ns.sort();
    ns
}

/// Queries `itemsByN` of `owner` on one gateway until stopped: selecting
/// `n` (which both versions have), every answer must be the owner's items
/// exactly; selecting `n x`, it is `INDEX_BUILDING` or the items with
/// `x = n / 2` (the second version, once it is ready), and before the
/// reload a validation error.
struct Reader {
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicU64>,
    /// Answers of `n x` that came from the new version.
    new_answers: Arc<AtomicU64>,
    failures: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Reader {
    fn start(server: Arc<Server>, owner: &'static str, count: i64) -> Reader {
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicU64::new(0));
        let new_answers = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let expected: Vec<i64> = (0..count).collect();
        let task = tokio::spawn({
            let (stop, rounds, new_answers, failures) = (
                stop.clone(),
                rounds.clone(),
                new_answers.clone(),
                failures.clone(),
            );
            async move {
                while !stop.load(Ordering::Relaxed) {
                    match by_n(&server, owner, "n").await {
                        Ok(nodes) if ns(&nodes) == expected => {}
                        other => failures.lock().unwrap().push(format!("n: {other:?}")),
                    }
                    let served_new = new_answers.load(Ordering::Relaxed) > 0;
                    match by_n(&server, owner, "n x").await {
                        Err(codes) if codes == ["INDEX_BUILDING"] => {}
                        // `x` is not in the schema before the reload.
                        Err(codes) if codes == ["GRAPHQL_VALIDATION_FAILED"] && !served_new => {}
                        Ok(nodes)
                            if ns(&nodes) == expected
                                && nodes.iter().all(|n| {
                                    let n_value: f64 = n["n"].as_str().unwrap().parse().unwrap();
                                    n["x"].as_f64() == Some(n_value / 2.0)
                                }) =>
                        {
                            new_answers.fetch_add(1, Ordering::Relaxed);
                        }
                        other => failures.lock().unwrap().push(format!("n x: {other:?}")),
                    }
                    rounds.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        Reader {
            stop,
            rounds,
            new_answers,
            failures,
            task,
        }
    }

    async fn rounds_more(&self, more: u64) {
        let start = self.rounds.load(Ordering::Relaxed);
        let wait = Wait::new(format!("{more} more reader rounds"));
        while self.rounds.load(Ordering::Relaxed) < start + more {
            assert!(!self.task.is_finished(), "the reader stopped");
            wait.tick(&self.rounds.load(Ordering::Relaxed)).await;
        }
    }

    /// Stops the reader; returns its rounds and the answers of the new
    /// version. Every answer must have been right.
    async fn finish(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("the reader task");
        let failures = self.failures.lock().unwrap();
        assert!(
            failures.is_empty(),
            "{} wrong answers, first: {}",
            failures.len(),
            failures[0]
        );
        (
            self.rounds.load(Ordering::Relaxed),
            self.new_answers.load(Ordering::Relaxed),
        )
    }
}

/// Whether `/metrics` of `server` lists a previous version of `itemsByN`
/// serving.
async fn serves_previous(server: &Server) -> bool {
    let (_, text) = server.get_text("/metrics").await;
    text.contains(
        "cellgate_index_version{datastore=\"items\",index=\"items_by_n\",state=\"previous\"} 1",
    )
}

/// Gateway `a` maintains the indexes, `b` only serves (and sweeps, to see
/// builds complete); a sweep every 4 s keeps the new version from being
/// marked ready sooner, so what the previous version answers during the
/// build is seen for certain.
pub async fn a_changed_index_keeps_answering_on_two_gateways(env: Arc<Env>) {
    let configs = env.data_dir().with_file_name("configs");
    std::fs::create_dir_all(&configs).expect("config dir");
    let config = |name: &str, text: &str| {
        let path = configs.join(name);
        std::fs::write(&path, text).expect("write a config");
        path.display().to_string()
    };
    let maintaining = config("a.yaml", "indexes:\n  sweep_interval_ms: 4000\n");
    let serving = config(
        "b.yaml",
        "indexes:\n  sweep_interval_ms: 4000\n  maintain: false\n",
    );
    let a = Arc::new(env.serve(Defs::Small, &["--config", &maintaining]));
    let b = Arc::new(env.serve(Defs::Small, &["--config", &serving]));
    for server in [&a, &b] {
        write(server, BY_N, BY_N_V1);
        server.hangup();
    }
    put_items(&a, "online", 12).await;
    for server in [&a, &b] {
        until_answered(server, "online", "n", 12).await;
    }
    let readers = [
        Reader::start(a.clone(), "online", 12),
        Reader::start(b.clone(), "online", 12),
    ];
    // Load: other owners' items, written throughout.
    let stop_writer = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn({
        let (a, stop) = (a.clone(), stop_writer.clone());
        async move {
            let mut round = 0;
            while !stop.load(Ordering::Relaxed) {
                put_items(&a, &format!("load-{round}"), 20).await;
                round += 1;
            }
            round * 20
        }
    });
    for reader in &readers {
        reader.rounds_more(3).await;
    }

    // A field added, reloaded on both gateways.
    for server in [&a, &b] {
        write(server, BY_N, BY_N_V2);
        server.hangup();
    }
    for server in [&a, &b] {
        let wait = Wait::new("version 1 to serve as the previous version");
        while !serves_previous(server).await {
            wait.tick(&server.base()).await;
        }
    }
    // Version 1 stays maintained during the build: items written now are
    // answered by it, on both gateways, while version 2 is still building.
    put_items(&a, "fresh", 5).await;
    for server in [&a, &b] {
        let nodes = until_answered(server, "fresh", "n", 5).await;
        assert_eq!(ns(&nodes), (0..5).collect::<Vec<_>>());
    }
    assert_eq!(
        by_n(&a, "fresh", "n x").await.map(|n| n.len()),
        Err(vec!["INDEX_BUILDING".to_string()]),
        "version 2 was ready before the items written during its build were read"
    );
    for reader in &readers {
        reader.rounds_more(3).await;
    }

    // Version 2 serves once ready, `x` included, on both gateways.
    for server in [&a, &b] {
        let nodes = until_answered(server, "online", "n x", 12).await;
        assert!(
            nodes.iter().all(|n| {
                let n_value: f64 = n["n"].as_str().unwrap().parse().unwrap();
                n["x"].as_f64() == Some(n_value / 2.0)
            }),
            "{nodes:?}"
        );
        until_answered(server, "fresh", "n x", 5).await;
    }
    for reader in &readers {
        reader.rounds_more(3).await;
    }
    // Then version 1 is retired on each gateway.
    for server in [&a, &b] {
        let wait = Wait::new("version 1 to be retired");
        while serves_previous(server).await {
            wait.tick(&server.base()).await;
        }
    }
    stop_writer.store(true, Ordering::Relaxed);
    let written = writer.await.expect("the writer");
    assert!(written > 0);
    for reader in readers {
        let (rounds, new_answers) = reader.finish().await;
        assert!(rounds > 9 && new_answers > 0, "{rounds} {new_answers}");
    }

    // Its table is dropped on request; a drop right after the switch is
    // refused unless told that every gateway switched.
    let mut drop = vec![
        "index".to_string(),
        "drop".to_string(),
        "items".to_string(),
        "items_by_n".to_string(),
        "--index-version".to_string(),
        "1".to_string(),
    ];
    drop.extend(env.store_flags());
    drop.push("--datastores".to_string());
    drop.push(a.datastores.display().to_string());
    let refused = env.command(&drop);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("was replaced"), "{stderr}");
    drop.push("--now".to_string());
    let dropped = env.command(&drop);
    assert!(
        dropped.status.success(),
        "{}",
        String::from_utf8_lossy(&dropped.stderr)
    );
    assert!(!env.table_exists("items_ix_items_by_n").await);
    assert!(env.table_exists("items_ix_items_by_n_v2").await);
    for server in [&a, &b] {
        let nodes = until_answered(server, "online", "n x", 12).await;
        assert_eq!(ns(&nodes), (0..12).collect::<Vec<_>>());
    }
}
