//! The wire through a real ZMQ PUB/SUB pair on 127.0.0.1: a replica's publisher in its own
//! thread, a subscriber that joins late (getting the earlier batches from the replay socket),
//! then live batches, all applied to Dynamo's index. Every wait is bounded: the publisher
//! thread stops by itself after a few seconds even if the test fails.

#[path = "../examples/fleet/indexer.rs"]
mod indexer;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use indexer::FleetIndexer;
use kvown_events::{
    Context, EventEncoder, EventPublisher, EventSubscriber, NamespaceLabels, PublisherConfig,
    PublisherThread, SubscribeError,
};
use kvown_runtime::alloc::{KvAllocator, PagedAllocator};
use kvown_runtime::radix::{Namespace, RadixCache};

const PAGE: usize = 4;
const LIMIT: Duration = Duration::from_secs(5);

/// A publisher thread owning a cache: it publishes one batch per key sent to it (the events of
/// inserting the key), serves replays in between, and stops when told or after `LIMIT`.
/// Returns the key sender and the publisher's endpoints.
fn spawn_replica(
    context: &Context,
    config: PublisherConfig,
) -> (mpsc::Sender<Vec<u32>>, String, Option<String>) {
    let (keys, inbox) = mpsc::channel::<Vec<u32>>();
    let (ready, endpoints) = mpsc::channel();
    let context = context.clone();
    thread::spawn(move || {
        let mut publisher = EventPublisher::bind(&context, &config).unwrap();
        let endpoint = publisher.endpoint().to_owned();
        ready
            .send((endpoint, publisher.replay_endpoint().map(str::to_owned)))
            .unwrap();
        let encoder = EventEncoder::new(PAGE).unwrap();
        let mut cache = RadixCache::new(PAGE);
        cache.enable_events();
        cache.take_events();
        let mut alloc = PagedAllocator::new(1024, PAGE, false).unwrap();
        let started = Instant::now();
        while started.elapsed() < LIMIT {
            match inbox.recv_timeout(Duration::from_millis(2)) {
                Ok(key) => {
                    let mut slots = Vec::new();
                    alloc.alloc(key.len(), &mut slots).unwrap();
                    cache.insert(&key, &slots).unwrap();
                    publisher
                        .publish_events(&encoder, 0.0, &cache.take_events())
                        .unwrap()
                        .expect("an insert of new pages stores them");
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
            publisher.serve_replay().unwrap();
        }
    });
    let (endpoint, replay) = endpoints.recv_timeout(LIMIT).unwrap();
    (keys, endpoint, replay)
}

fn key(first: u32, pages: usize) -> Vec<u32> {
    (first..first + (pages * PAGE) as u32).collect()
}

#[test]
fn a_late_subscriber_gets_the_earlier_batches_by_replay_then_the_live_ones() {
    let context = Context::new();
    let config = PublisherConfig {
        topic: "kv@replica-0".to_owned(),
        ..PublisherConfig::default()
    };
    let (keys, endpoint, replay) = spawn_replica(&context, config);
    // Two batches before anyone listens.
    keys.send(key(0, 2)).unwrap();
    keys.send(key(100, 1)).unwrap();
    thread::sleep(Duration::from_millis(50));
    let mut subscriber =
        EventSubscriber::connect(&context, &endpoint, replay.as_deref(), "kv@").unwrap();
    let early = subscriber.catch_up(1, LIMIT).unwrap();
    assert_eq!(
        early.iter().map(|batch| batch.seq).collect::<Vec<_>>(),
        [0, 1]
    );
    // Then live: the subscription is up once a batch arrives live, so send until one does.
    let mut live = Vec::new();
    let mut next_key = 1_000;
    let started = Instant::now();
    while live.is_empty() {
        assert!(started.elapsed() < LIMIT, "no live batch within {LIMIT:?}");
        keys.send(key(next_key, 1)).unwrap();
        next_key += 100;
        live.extend(subscriber.recv(Duration::from_millis(20)).unwrap());
    }
    let last = next_key - 100;
    let sent = 2 + (next_key - 1_000) / 100;
    live.extend(subscriber.catch_up(u64::from(sent) - 1, LIMIT).unwrap());
    let seqs: Vec<u64> = early.iter().chain(&live).map(|batch| batch.seq).collect();
    assert_eq!(
        seqs,
        (0..u64::from(sent)).collect::<Vec<_>>(),
        "in order, no gap"
    );
    let mut index = FleetIndexer::new(1, PAGE as u32, NamespaceLabels::lora_names());
    for batch in early.iter().chain(&live) {
        index.apply_batch(0, &batch.payload).unwrap();
    }
    let score =
        |tokens: &[u32]| index.overlaps(index.block_hashes(Namespace::DEFAULT, tokens), 1)[0];
    assert_eq!(score(&key(0, 3)), 2);
    assert_eq!(score(&key(100, 1)), 1);
    assert_eq!(score(&key(last, 1)), 1);
    assert_eq!(score(&key(7, 1)), 0);
}

#[test]
fn batches_gone_from_the_replay_buffer_are_reported_lost() {
    let context = Context::new();
    let config = PublisherConfig {
        replay_buffer_batches: 1,
        ..PublisherConfig::default()
    };
    let (keys, endpoint, replay) = spawn_replica(&context, config);
    for first in [0, 100, 200] {
        keys.send(key(first, 1)).unwrap();
    }
    thread::sleep(Duration::from_millis(50));
    let mut subscriber =
        EventSubscriber::connect(&context, &endpoint, replay.as_deref(), "").unwrap();
    let error = subscriber.catch_up(2, LIMIT).unwrap_err();
    assert!(
        matches!(
            error,
            SubscribeError::Lost {
                expected: 0,
                oldest_replayed: 2
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("restart its stream"), "{error}");
}

#[test]
fn without_a_replay_socket_a_late_subscriber_times_out_naming_the_batch() {
    let context = Context::new();
    let config = PublisherConfig {
        replay_endpoint: None,
        ..PublisherConfig::default()
    };
    let (keys, endpoint, replay) = spawn_replica(&context, config);
    assert_eq!(replay, None);
    keys.send(key(0, 1)).unwrap();
    thread::sleep(Duration::from_millis(50));
    let mut subscriber = EventSubscriber::connect(&context, &endpoint, None, "").unwrap();
    let error = subscriber
        .catch_up(0, Duration::from_millis(200))
        .unwrap_err();
    assert!(
        matches!(
            error,
            SubscribeError::Timeout {
                target: 0,
                expected: 0,
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn the_publisher_thread_numbers_batches_as_they_are_handed_over_and_sends_them_all() {
    let context = Context::new();
    let encoder = EventEncoder::new(PAGE).unwrap();
    let mut publisher =
        PublisherThread::spawn(&context, &PublisherConfig::default(), encoder, 4).unwrap();
    let mut subscriber = EventSubscriber::connect(
        &context,
        publisher.endpoint(),
        publisher.replay_endpoint(),
        "",
    )
    .unwrap();
    let mut cache = RadixCache::new(PAGE);
    cache.enable_events();
    let mut alloc = PagedAllocator::new(1024, PAGE, false).unwrap();
    let mut seqs = Vec::new();
    for first in [0, 100, 200, 300, 400, 500] {
        let mut slots = Vec::new();
        alloc.alloc(PAGE, &mut slots).unwrap();
        cache.insert(&key(first, 1), &slots).unwrap();
        seqs.extend(publisher.publish(cache.take_events()).unwrap());
    }
    assert_eq!(publisher.publish(Vec::new()).unwrap(), None);
    assert_eq!(seqs, [0, 1, 2, 3, 4, 5]);
    let batches = subscriber.catch_up(5, LIMIT).unwrap();
    let mut index = FleetIndexer::new(1, PAGE as u32, NamespaceLabels::lora_names());
    for batch in &batches {
        index.apply_batch(0, &batch.payload).unwrap();
    }
    let score =
        |tokens: &[u32]| index.overlaps(index.block_hashes(Namespace::DEFAULT, tokens), 1)[0];
    assert_eq!(
        [0, 300, 500, 600].map(|first| score(&key(first, 1))),
        [1, 1, 1, 0]
    );
    assert_eq!(publisher.finish().unwrap(), 6);
}

#[test]
fn a_live_batch_past_a_gap_brings_the_missed_ones_from_the_replay_first() {
    let context = Context::new();
    let (keys, endpoint, replay) = spawn_replica(&context, PublisherConfig::default());
    keys.send(key(0, 1)).unwrap();
    keys.send(key(100, 1)).unwrap();
    thread::sleep(Duration::from_millis(50));
    let mut subscriber =
        EventSubscriber::connect(&context, &endpoint, replay.as_deref(), "").unwrap();
    // Batches 0 and 1 went out before the subscription: the first live one is past a gap.
    let mut received = Vec::new();
    let mut next_key = 1_000;
    let started = Instant::now();
    while received.len() < 3 {
        assert!(
            started.elapsed() < LIMIT,
            "got {received:?} within {LIMIT:?}"
        );
        if received.is_empty() {
            keys.send(key(next_key, 1)).unwrap();
            next_key += 100;
        }
        if let Some(batch) = subscriber.recv(Duration::from_millis(20)).unwrap() {
            received.push(batch.seq);
        }
    }
    assert_eq!(received, [0, 1, 2]);
    assert_eq!(subscriber.next_seq(), 3);
}
