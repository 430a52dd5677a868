//! The router's view equals each replica's own, in every dialect: after every step of a random
//! run of several replicas (prompts sharing prefixes in several namespaces, decode steps
//! registering pages, retractions and re-admissions, releases, evictions, stream restarts),
//! Dynamo's overlap score of each replica, fed only by the replicas' encoded event batches,
//! equals the replica's own prefix match in whole pages, for every prompt seen so far.

use kvown_events::{Dialect, EventEncoder, NamespaceField, NamespaceLabels};
use kvown_fleet::indexer::{FleetIndexer, dynamo_labels};
use kvown_fleet::replica::Replica;
use kvown_runtime::batch::Req;
use kvown_runtime::radix::{CacheEvent, Namespace};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const REPLICAS: usize = 3;

/// A prompt of a few shared stems and a tail of a small alphabet, so prompts share prefixes
/// of every length, in one of three namespaces.
fn random_prompt(rng: &mut SmallRng, stems: &[Vec<u32>]) -> (Namespace, Vec<u32>) {
    let namespace = Namespace(rng.gen_range(0..3));
    let mut prompt = stems[rng.gen_range(0..stems.len())].clone();
    let tail = rng.gen_range(1..24);
    prompt.extend((0..tail).map(|_| rng.gen_range(0..3)));
    (namespace, prompt)
}

/// Runs `steps` random steps; after each, checks every replica's score for every key seen.
/// Returns how many comparisons were made and how many of them found a non-empty prefix.
/// Asserts that the run retracted requests, removed pages and restarted streams.
fn run(
    seed: u64,
    page_size: usize,
    dialect: Dialect,
    labels: NamespaceLabels,
    steps: usize,
) -> (usize, usize) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let stems: Vec<Vec<u32>> = (0..4)
        .map(|stem| {
            (0..stem * page_size + 1)
                .map(|_| rng.gen_range(0..3))
                .collect()
        })
        .collect();
    let mut replicas: Vec<Replica> = (0..REPLICAS)
        .map(|index| Replica::new(40 * page_size, page_size, 6, 512, index % 2 == 0))
        .collect();
    let encoder = EventEncoder::new(page_size)
        .unwrap()
        .with_dialect(dialect)
        .with_namespaces(labels.clone());
    let mut index = FleetIndexer::new(REPLICAS, encoder.block_size(), labels, dialect);
    let mut retracted: Vec<Vec<Req>> = (0..REPLICAS).map(|_| Vec::new()).collect();
    let mut keys: Vec<(Namespace, Vec<u32>)> = Vec::new();
    let mut payload = Vec::new();
    let (mut compared, mut non_empty) = (0, 0);
    let (mut retractions, mut removals, mut restarts) = (0, 0, 0);
    for step in 0..steps {
        let at = rng.gen_range(0..REPLICAS);
        let replica = &mut replicas[at];
        let op = rng.gen_range(0..100);
        match op {
            0..=34 | 88..=99 => {
                let (namespace, prompt) = random_prompt(&mut rng, &stems);
                let reply: Vec<u32> = (0..rng.gen_range(1..8))
                    .map(|_| rng.gen_range(0..3))
                    .collect();
                keys.push((namespace, [prompt.clone(), reply.clone()].concat()));
                keys.push((namespace, prompt.clone()));
                // Refused admissions (no room, no row) leave nothing held: fine either way.
                let _ = if op >= 88 {
                    replica.serve(namespace, prompt, reply)
                } else {
                    replica.admit(namespace, prompt, reply)
                };
            }
            35..=64 => {
                if let Some(req) = replica.decode_step().unwrap() {
                    retractions += 1;
                    retracted[at].push(req);
                }
            }
            65..=71 if replica.running() > 0 => {
                retractions += 1;
                retracted[at].push(replica.retract_last().unwrap());
            }
            72..=79 if !retracted[at].is_empty() => {
                let req = retracted[at].swap_remove(0);
                let _ = replica.readmit(req);
            }
            80..=85 => {
                replica.evict(rng.gen_range(1..20) * page_size).unwrap();
            }
            86..=87 => replica.restart_events(),
            _ => {}
        }
        for (number, replica) in replicas.iter_mut().enumerate() {
            let events = replica.take_events();
            if events.is_empty() {
                continue;
            }
            for event in &events {
                match event {
                    CacheEvent::Removed { .. } => removals += 1,
                    CacheEvent::Cleared => restarts += 1,
                    CacheEvent::Stored { .. } => {}
                }
            }
            encoder.encode(step as f64, &events, &mut payload).unwrap();
            index
                .apply_batch(number, &payload)
                .unwrap_or_else(|error| panic!("{dialect} seed {seed} step {step}: {error}"));
        }
        keys.sort_unstable();
        keys.dedup();
        for (namespace, key) in &keys {
            let scores = index.overlaps(index.block_hashes(*namespace, key), REPLICAS);
            for (number, replica) in replicas.iter_mut().enumerate() {
                let matched = replica.probe(*namespace, key).unwrap();
                assert_eq!(matched % page_size, 0, "a match ends on a page boundary");
                assert_eq!(
                    scores[number] as usize,
                    matched / page_size,
                    "{dialect} seed {seed} step {step} replica {number} {namespace}: router \
                     score vs the replica's match of {key:?}"
                );
                compared += 1;
                non_empty += usize::from(matched > 0);
            }
        }
    }
    assert!(
        retractions > 0 && removals > 0 && restarts > REPLICAS,
        "seed {seed}: {retractions} retractions, {removals} removals, {restarts} restarts"
    );
    (compared, non_empty)
}

/// Runs `(seed, page size)` pairs with `labels` and checks that the runs found prefixes.
fn check(dialect: Dialect, labels: &NamespaceLabels, runs: &[(u64, usize)]) {
    for &(seed, page_size) in runs {
        let (compared, non_empty) = run(seed, page_size, dialect, labels.clone(), 250);
        assert!(
            non_empty * 4 > compared / 10,
            "{dialect}: {non_empty} of {compared}: too few hits to prove much"
        );
    }
}

#[test]
fn the_routers_score_equals_each_replicas_own_match_with_lora_names() {
    let runs = [(1, 1), (2, 2), (3, 4), (4, 4)];
    check(Dialect::Vllm, &NamespaceLabels::lora_names(), &runs);
    for dialect in [Dialect::VllmLegacy, Dialect::Sglang] {
        let labels = dynamo_labels(NamespaceField::LoraName, dialect, 3).unwrap();
        check(dialect, &labels, &runs[2..]);
    }
}

#[test]
fn the_routers_score_equals_each_replicas_own_match_with_cache_salts() {
    for dialect in Dialect::ALL {
        let labels = dynamo_labels(NamespaceField::CacheSalt, dialect, 3).unwrap();
        check(dialect, &labels, &[(5, 1), (6, 4)]);
    }
}
