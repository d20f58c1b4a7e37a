//! Fuzzing on stable Rust: the pest grammar, the definition loader, the
//! filter compiler and the cell body codec, each driven by mutations of a
//! seed corpus in `tests/fuzz/<target>/`.
//!
//! cargo-fuzz needs a nightly compiler, which this project does not use;
//! this harness is a plain test that mutates the seeds (bit flips, byte
//! and token insertions, deletions, duplications, splices between seeds)
//! with a seeded xorshift generator and runs each input under
//! `catch_unwind`. Any panic fails the test, names the seed to replay it
//! (`CELLGATE_FUZZ_SEED`) and writes the input to
//! `target/fuzz-crashes/<target>-<n>`. Each target runs for
//! `CELLGATE_FUZZ_SECONDS` (default 1 s, so that `cargo test` stays quick;
//! CI sets 30). Errors are fine: only panics and hangs are bugs.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cellgate_store::cells::codec;
use cellgate_store::indexes::{IndexQuery, QueryPlan};

/// Seeded xorshift64*: reproducible without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// Tokens of the languages under test, inserted whole by the mutator.
const DICTIONARY: &[&str] = &[
    " and ",
    " in ",
    "(",
    ")",
    ",",
    "\"",
    "\\",
    "=",
    "!=",
    "<=",
    ">=",
    "<",
    ">",
    "null",
    "true",
    "false",
    "-",
    ".",
    "1e309",
    "9223372036854775808",
    "\u{0}",
    "é",
    "\n",
    ": ",
    "- ",
    "{",
    "}",
    "[",
    "]",
    "type: ",
    "field: ",
    "uuid",
    "datetime",
    "string",
    "int",
    "float",
    "bool",
    "&a ",
    "*a",
    "!!binary ",
    "\t",
    "#",
    "'",
    "~",
    "column_key: ",
    "table: ",
    "shards: 0",
];

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>], input: &[u8]) -> Vec<u8> {
    let mut data = input.to_vec();
    for _ in 0..=rng.below(4) {
        let at = rng.below(data.len() + 1);
        match rng.below(7) {
            0 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] ^= 1 << rng.below(8);
            }
            1 => data.insert(at, rng.next() as u8),
            2 => {
                let token = DICTIONARY[rng.below(DICTIONARY.len())];
                data.splice(at..at, token.bytes());
            }
            3 if !data.is_empty() => {
                let end = (at + rng.below(16)).min(data.len());
                data.drain(at.min(end)..end);
            }
            4 if !data.is_empty() => {
                let start = rng.below(data.len());
                let end = (start + rng.below(32)).min(data.len());
                let copy = data[start..end].to_vec();
                data.splice(at..at, copy);
            }
            5 => {
                let other = &seeds[rng.below(seeds.len())];
                let start = rng.below(other.len());
                let end = (start + rng.below(64)).min(other.len());
                data.splice(at..at, other[start..end].iter().copied());
            }
            _ => {
                let repeat = 1 + rng.below(50);
                let token = DICTIONARY[rng.below(DICTIONARY.len())].repeat(repeat);
                data.splice(at..at, token.bytes());
            }
        }
    }
    data.truncate(8192);
    data
}

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fuzz")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("seed corpus {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    let seeds: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    seeds
}

fn budget() -> Duration {
    let seconds = std::env::var("CELLGATE_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(1.0);
    Duration::from_secs_f64(seconds)
}

/// Runs `target` on its seeds and then on mutations of them until the
/// time budget is spent; panics on the first input that panics or runs
/// for more than a second.
fn fuzz(target: &str, run: impl Fn(&[u8])) {
    let seeds = corpus(target);
    let seed = std::env::var("CELLGATE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    let mut rng = Rng(seed);
    let budget = budget();
    let start = Instant::now();
    let mut executions = 0u64;
    let mut pool = seeds.clone();
    let mut slowest = Duration::ZERO;
    let mut index = 0;
    while index < seeds.len() || start.elapsed() < budget {
        let input = if index < seeds.len() {
            seeds[index].clone()
        } else {
            let base = pool[rng.below(pool.len())].clone();
            mutate(&mut rng, &seeds, &base)
        };
        index += 1;
        let began = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| run(&input)));
        let took = began.elapsed();
        slowest = slowest.max(took);
        executions += 1;
        if outcome.is_err() || took > Duration::from_secs(1) {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/fuzz-crashes");
            let _ = std::fs::create_dir_all(&dir);
            let file = dir.join(format!("{target}-{executions}"));
            let _ = std::fs::write(&file, &input);
            panic!(
                "{target}: {} on input {:?} after {executions} runs (CELLGATE_FUZZ_SEED={seed}; saved to {})",
                if outcome.is_err() { "panic" } else { "hang" },
                String::from_utf8_lossy(&input),
                file.display()
            );
        }
        // Keep some mutants as bases, so that mutations stack.
        if index > seeds.len() && rng.below(16) == 0 && pool.len() < 256 {
            pool.push(input);
        }
    }
    println!(
        "{target}: {executions} runs in {:?}, slowest {slowest:?}, 0 crashes (seed {seed})",
        start.elapsed()
    );
}

#[test]
fn fuzz_grammar() {
    fuzz("grammar", |input| {
        let text = String::from_utf8_lossy(input);
        let _ = index_dsl::parse_filter(&text);
        let _ = index_dsl::parse_path(&text);
        let _ = index_dsl::parse_type(&text);
    });
}

#[test]
fn fuzz_definitions() {
    let seeds = corpus("definitions");
    let texts: Vec<String> = seeds
        .iter()
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    let names = [
        "trips/datastore.yaml",
        "trips/indexes/city_trips_index.yaml",
        "trips/indexes/driver_partner_index.yaml",
    ];
    fuzz("definitions", |input| {
        // The mutated text replaces the file it came closest to (by its
        // first key); the other files stay as in the corpus.
        let text = String::from_utf8_lossy(input).into_owned();
        let which = if text.contains("columns:") {
            0
        } else if text.contains("city") {
            1
        } else {
            2
        };
        let mut files: Vec<(&str, String)> = vec![
            (names[0], texts[0].clone()),
            (names[1], texts[1].clone()),
            (names[2], texts[2].clone()),
        ];
        files[which].1 = text;
        let _ = index_dsl::load_files(Path::new("datastores"), files);
    });
}

#[test]
fn fuzz_filter_compiler() {
    let defs = index_dsl::load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../datastores"))
        .expect("the repository's definitions");
    let trips = defs
        .datastores
        .iter()
        .find(|d| d.name == "trips")
        .expect("trips")
        .clone();
    fuzz("filter", |input| {
        let filter = String::from_utf8_lossy(input).into_owned();
        for index in ["driver_partner_index", "city_trips_index"] {
            let query = IndexQuery {
                index: index.to_string(),
                filter: Some(filter.clone()),
                ..IndexQuery::default()
            };
            let _ = QueryPlan::build(&trips, &query);
        }
    });
}

#[test]
fn fuzz_body_codec() {
    fuzz("codec", |input| {
        // Arbitrary bytes must decode to a value or an error.
        let _ = codec::decode(input);
        // A JSON body that encodes must decode to itself.
        if let Ok(body) = serde_json::from_slice::<serde_json::Value>(input) {
            if let Ok(bytes) = codec::encode(&body) {
                let back = codec::decode(&bytes).expect("an encoded body decodes");
                assert_eq!(back, body, "round trip");
            }
        }
        // And so must bytes that start like an encoded body.
        let mut framed = vec![1u8];
        framed.extend_from_slice(input);
        let _ = codec::decode(&framed);
    });
}
