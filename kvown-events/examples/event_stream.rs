//! A replica's cache events published in one dialect over ZMQ on 127.0.0.1, and what was
//! published, printed: the stream `scripts/event-decoders.sh` decodes with vLLM's and sglang's
//! own event classes. A scripted run of a radix prefix cache covers every event kind: stores
//! of runs with and without a parent page in three namespaces (the default one unlabelled, one
//! named, one labelled by default), evictions, and restarts of the stream.
//!
//! `cargo run -p kvown-events --example event_stream -- --dialect sglang --namespace-field salt`
//!
//! On stdout, one JSON object per line: first `{"endpoint", "replay_endpoint"}`; then, once a
//! line arrives on stdin (the subscriber is connected), every batch is published and
//! `{"batches": [..]}` says what each held (`seq`, `timestamp`, `rank`, and each event's kind,
//! `block_hashes`, `parent_block_hash`, `token_ids`, `block_size`, `medium`, `namespace`,
//! `label`, `label_field`); replays are served until stdin closes.

use std::io::BufRead;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use kvown_events::{
    Context, Dialect, EventEncoder, EventPublisher, MEDIUM, NamespaceLabels, PublisherConfig,
};
use kvown_runtime::alloc::{KvAllocator, PagedAllocator, SlotCalls};
use kvown_runtime::radix::{CacheEvent, Insert, Namespace, RadixCache, RadixConfig};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

/// Tokens per page.
const PAGE: usize = 4;

/// Where namespaces go on the wire.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum NamespaceFieldArg {
    Lora,
    Salt,
}

#[derive(Debug, Parser)]
#[command(about = "a scripted stream of cache events, published, and what it held")]
struct Args {
    /// The wire dialect: vllm, vllm-legacy or sglang.
    #[arg(long, default_value_t = Dialect::Vllm)]
    dialect: Dialect,
    /// How namespaces travel: as an adapter or as a cache salt.
    #[arg(long, value_enum, default_value_t = NamespaceFieldArg::Lora)]
    namespace_field: NamespaceFieldArg,
    /// The topic frame of every message.
    #[arg(long, default_value = "kv@replica-0")]
    topic: String,
    /// The rank every batch carries.
    #[arg(long, default_value_t = 2)]
    rank: i32,
    /// Scheduler steps (a step that changes nothing publishes nothing).
    #[arg(long, default_value_t = 300)]
    steps: usize,
    /// The random seed.
    #[arg(long, default_value_t = 39)]
    seed: u64,
}

fn main() {
    if let Err(error) = run(&Args::parse()) {
        eprintln!("event_stream: {error}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let labels = match args.namespace_field {
        NamespaceFieldArg::Lora => NamespaceLabels::lora_names(),
        NamespaceFieldArg::Salt => NamespaceLabels::cache_salts(),
    }
    .with_name(Namespace(1), "named-one")?;
    let encoder = EventEncoder::new(PAGE)?
        .with_dialect(args.dialect)
        .with_namespaces(labels.clone())
        .with_data_parallel_rank(args.rank);
    let config = PublisherConfig {
        topic: args.topic.clone(),
        ..PublisherConfig::default()
    };
    let mut publisher = EventPublisher::bind(&Context::new(), &config, encoder)?;
    println!(
        "{}",
        json!({
            "endpoint": publisher.endpoint(),
            "replay_endpoint": publisher.replay_endpoint(),
        })
    );
    let stdin = stdin_lines();
    stdin.recv()?;
    let mut published = Vec::new();
    for (step, events) in scripted_run(args.seed, args.steps)?.into_iter().enumerate() {
        let timestamp = 1_700_000_000.0 + step as f64 / 8.0;
        let Some(seq) = publisher.publish_events(timestamp, &events)? else {
            continue;
        };
        let events: Vec<Value> = events
            .iter()
            .map(|event| described(event, &labels))
            .collect();
        published.push(json!({
            "seq": seq,
            "timestamp": timestamp,
            "rank": args.rank,
            "events": events,
        }));
        publisher.serve_replay()?;
    }
    println!("{}", json!({ "batches": published }));
    // Serve replays until the subscriber closes stdin.
    loop {
        publisher.serve_replay()?;
        match stdin.recv_timeout(Duration::from_millis(1)) {
            Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
        }
    }
}

/// Stdin's lines, read on a thread of their own; the channel closes at the end of stdin.
fn stdin_lines() -> mpsc::Receiver<String> {
    let (lines, receiver) = mpsc::channel();
    thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { return };
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    receiver
}

/// The events of each step of a seeded run of a small prefix cache (64 pages): prompts built
/// from shared stems, in three namespaces, inserted (evicting what must go to make room),
/// evictions, and now and then a restart of the stream. The first step's events open the
/// stream with `Cleared`.
fn scripted_run(
    seed: u64,
    steps: usize,
) -> Result<Vec<Vec<CacheEvent>>, Box<dyn std::error::Error>> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let stems: Vec<Vec<u32>> = (0..4)
        .map(|stem| (0..stem * PAGE).map(|_| rng.gen_range(0..50)).collect())
        .collect();
    let mut alloc = PagedAllocator::new(64 * PAGE, PAGE, false)?;
    let mut cache = RadixCache::new(RadixConfig::new(PAGE).with_events())?;
    let mut steps_events = Vec::with_capacity(steps);
    for _ in 0..steps {
        match rng.gen_range(0..100) {
            0..=69 => {
                let namespace = Namespace(rng.gen_range(0..3));
                let mut key = stems[rng.gen_range(0..stems.len())].clone();
                let tail = rng.gen_range(1..=4) * PAGE;
                key.extend((0..tail).map(|_| rng.gen_range(0..50)));
                cache.evict(key.len().saturating_sub(alloc.available_size()), &mut alloc)?;
                let mut slots = Vec::new();
                alloc.alloc(key.len(), &mut slots)?;
                let outcome = cache.insert(Insert::new(namespace.key(&key), &slots))?;
                alloc.free(&slots[..outcome.prefix_len])?;
            }
            70..=94 => {
                cache.evict(rng.gen_range(1..=6) * PAGE, &mut alloc)?;
            }
            _ => cache.enable_events(),
        }
        steps_events.push(cache.take_events());
    }
    Ok(steps_events)
}

/// What an event holds, dialect-free, with the label of a stored run's namespace.
fn described(event: &CacheEvent, labels: &NamespaceLabels) -> Value {
    match event {
        CacheEvent::Stored {
            namespace,
            parent_hash,
            pages,
            tokens,
        } => {
            let label = labels.label(*namespace);
            json!({
                "kind": "stored",
                "block_hashes": pages.iter().map(|page| page.hash.0).collect::<Vec<_>>(),
                "parent_block_hash": parent_hash.map(|hash| hash.0),
                "token_ids": tokens,
                "block_size": PAGE,
                "medium": MEDIUM,
                "namespace": namespace.0,
                "label": label.as_ref().map(|label| label.name.as_ref()),
                "label_field": label.map(|label| match label.lora_name() {
                    Some(_) => "lora",
                    None => "salt",
                }),
            })
        }
        CacheEvent::Removed { hashes } => json!({
            "kind": "removed",
            "block_hashes": hashes.iter().map(|hash| hash.0).collect::<Vec<_>>(),
            "medium": MEDIUM,
        }),
        CacheEvent::Cleared => json!({ "kind": "cleared" }),
    }
}
