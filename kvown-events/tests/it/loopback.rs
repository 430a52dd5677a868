//! The wire through a real ZMQ PUB/SUB pair on 127.0.0.1: a replica's publisher in its own
//! thread, a subscriber that joins late (getting the earlier batches from the replay socket),
//! then live batches, all applied to Dynamo's index; the replay socket answering the DEALER
//! requests vLLM's and Dynamo's clients send, framed as each dialect's engine frames it; an
//! undecodable batch handed out with its reason. Every wait is bounded: the publisher threads
//! stop by themselves after a few seconds even if the test fails.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use kvown_events::{
    BlockEvent, Context, Dialect, EventEncoder, EventPublisher, EventSubscriber, NamespaceLabels,
    PublisherConfig, PublisherThread, REPLAY_END, SubscribeError,
};
use kvown_fleet::indexer::FleetIndexer;
use kvown_runtime::alloc::{PagedAllocator, SlotCalls};
use kvown_runtime::radix::{CacheEvent, Insert, Namespace, PageHash, RadixCache, RadixConfig};

const PAGE: usize = 4;
const LIMIT: Duration = Duration::from_secs(5);

/// A publisher thread: it hands each message sent to it to `publish` (with its publisher, in
/// `dialect`), serves replays in between, and stops when the sender hangs up or after `LIMIT`.
/// Returns the message sender and the publisher's endpoints.
fn spawn_publisher<T: Send + 'static>(
    context: &Context,
    config: PublisherConfig,
    dialect: Dialect,
    mut publish: impl FnMut(&mut EventPublisher, T) + Send + 'static,
) -> (mpsc::Sender<T>, String, Option<String>) {
    let (messages, inbox) = mpsc::channel::<T>();
    let (ready, endpoints) = mpsc::channel();
    let context = context.clone();
    thread::spawn(move || {
        let encoder = EventEncoder::new(PAGE).unwrap().with_dialect(dialect);
        let mut publisher = EventPublisher::bind(&context, &config, encoder).unwrap();
        let endpoint = publisher.endpoint().to_owned();
        ready
            .send((endpoint, publisher.replay_endpoint().map(str::to_owned)))
            .unwrap();
        let started = Instant::now();
        while started.elapsed() < LIMIT {
            match inbox.recv_timeout(Duration::from_millis(2)) {
                Ok(message) => publish(&mut publisher, message),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
            publisher.serve_replay().unwrap();
        }
    });
    let (endpoint, replay) = endpoints.recv_timeout(LIMIT).unwrap();
    (messages, endpoint, replay)
}

/// A publisher thread owning a cache: it publishes one batch per key sent to it (the events of
/// inserting the key). Returns the key sender and the publisher's endpoints.
fn spawn_replica(
    context: &Context,
    config: PublisherConfig,
    dialect: Dialect,
) -> (mpsc::Sender<Vec<u32>>, String, Option<String>) {
    let mut cache = RadixCache::new(RadixConfig::new(PAGE)).unwrap();
    cache.enable_events();
    cache.take_events();
    let mut alloc = PagedAllocator::new(1024, PAGE, false).unwrap();
    spawn_publisher(context, config, dialect, move |publisher, key: Vec<u32>| {
        let mut slots = Vec::new();
        alloc.alloc(key.len(), &mut slots).unwrap();
        cache.insert(Insert::new(&key, &slots)).unwrap();
        publisher
            .publish_events(0.0, &cache.take_events())
            .unwrap()
            .expect("an insert of new pages stores them");
    })
}

fn key(first: u32, pages: usize) -> Vec<u32> {
    (first..first + (pages * PAGE) as u32).collect()
}

/// Dynamo's index of one replica speaking `dialect`.
fn dynamo_index(dialect: Dialect) -> FleetIndexer {
    FleetIndexer::new(1, PAGE as u32, NamespaceLabels::lora_names(), dialect)
}

#[test]
fn a_late_subscriber_gets_the_earlier_batches_by_replay_then_the_live_ones() {
    for dialect in Dialect::ALL {
        late_subscriber_then_live(dialect);
    }
}

fn late_subscriber_then_live(dialect: Dialect) {
    let context = Context::new();
    let config = PublisherConfig {
        topic: "kv@replica-0".to_owned(),
        ..PublisherConfig::default()
    };
    let (keys, endpoint, replay) = spawn_replica(&context, config, dialect);
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
    let mut index = dynamo_index(dialect);
    for batch in early.iter().chain(&live) {
        index.apply_batch(0, &batch.payload).unwrap();
    }
    // The subscriber's own decoding agrees: batch 0 stored the first key's two pages.
    let stored = &early[0].decoded.as_ref().unwrap().events;
    let hashes: Vec<u64> = PageHash::of_pages(Namespace::DEFAULT, &key(0, 2), PAGE)
        .map(|hash| hash.0)
        .collect();
    assert!(
        matches!(&stored[..], [BlockEvent::Stored(run)] if run.block_hashes == hashes),
        "{dialect}: {stored:?}"
    );
    assert_eq!(subscriber.undecodable(), 0);
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
    let (keys, endpoint, replay) = spawn_replica(&context, config, Dialect::Vllm);
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
    let (keys, endpoint, replay) = spawn_replica(&context, config, Dialect::Vllm);
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
    let mut cache = RadixCache::new(RadixConfig::new(PAGE)).unwrap();
    cache.enable_events();
    let mut alloc = PagedAllocator::new(1024, PAGE, false).unwrap();
    let mut seqs = Vec::new();
    for first in [0, 100, 200, 300, 400, 500] {
        let mut slots = Vec::new();
        alloc.alloc(PAGE, &mut slots).unwrap();
        cache.insert(Insert::new(&key(first, 1), &slots)).unwrap();
        seqs.extend(publisher.publish(cache.take_events()).unwrap());
    }
    assert_eq!(publisher.publish(Vec::new()).unwrap(), None);
    assert_eq!(seqs, [0, 1, 2, 3, 4, 5]);
    let batches = subscriber.catch_up(5, LIMIT).unwrap();
    let mut index = dynamo_index(Dialect::Vllm);
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
    let (keys, endpoint, replay) =
        spawn_replica(&context, PublisherConfig::default(), Dialect::Sglang);
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

/// The frames of one replay, after the delimiter, as a DEALER sending `["", start]` gets them
/// from `publisher` (served on this thread).
fn replay_frames(
    publisher: &mut EventPublisher,
    dealer: &zmq::Socket,
    start: u64,
) -> Vec<Vec<Vec<u8>>> {
    dealer
        .send_multipart([&[][..], &start.to_be_bytes()[..]], 0)
        .unwrap();
    let started = Instant::now();
    while publisher.serve_replay().unwrap() == 0 {
        assert!(
            started.elapsed() < LIMIT,
            "no replay request within {LIMIT:?}"
        );
        thread::sleep(Duration::from_millis(1));
    }
    let mut replies = Vec::new();
    loop {
        assert!(dealer.poll(zmq::POLLIN, 5_000).unwrap() > 0, "no reply");
        let mut frames = dealer.recv_multipart(0).unwrap();
        assert_eq!(frames.remove(0), b"", "the delimiter comes back first");
        let end = frames.iter().any(|frame| frame[..] == REPLAY_END);
        replies.push(frames);
        if end {
            return replies;
        }
    }
}

#[test]
fn replay_replies_are_framed_as_each_dialects_engine_frames_them() {
    let context = Context::new();
    let payloads: [&[u8]; 3] = [b"zero", b"one", b"two"];
    for dialect in Dialect::ALL {
        let config = PublisherConfig {
            topic: "kv@replica-0".to_owned(),
            ..PublisherConfig::default()
        };
        let encoder = EventEncoder::new(PAGE).unwrap().with_dialect(dialect);
        let mut publisher = EventPublisher::bind(&context, &config, encoder).unwrap();
        for payload in payloads {
            publisher.publish_payload(payload).unwrap();
        }
        let dealer = context.socket(zmq::DEALER).unwrap();
        dealer.set_linger(0).unwrap();
        dealer
            .connect(publisher.replay_endpoint().unwrap())
            .unwrap();
        let topic = dialect
            .replay_topic_frame()
            .then_some(b"kv@replica-0".to_vec());
        let framed = |frames: &[&[u8]]| -> Vec<Vec<u8>> {
            topic
                .iter()
                .cloned()
                .chain(frames.iter().map(|frame| frame.to_vec()))
                .collect()
        };
        let end = framed(&[&REPLAY_END, b""]);
        let end = match dialect.replay_topic_frame() {
            // vLLM and sglang end with an empty topic, not the stream's.
            true => [vec![Vec::new()], end[1..].to_vec()].concat(),
            false => end,
        };
        // From a sequence number, from 0, and past the end (nothing kept from there: only the
        // end marker).
        for (start, first) in [(1u64, 1usize), (0, 0), (3, 3), (u64::MAX, 3)] {
            let mut expected: Vec<Vec<Vec<u8>>> = (first..payloads.len())
                .map(|seq| framed(&[&(seq as u64).to_be_bytes(), payloads[seq]]))
                .collect();
            expected.push(end.clone());
            assert_eq!(
                replay_frames(&mut publisher, &dealer, start),
                expected,
                "{dialect} from {start}"
            );
        }
    }
}

#[test]
fn an_undecodable_batch_is_handed_out_in_its_place_with_the_reason_and_counted() {
    let context = Context::new();
    let mut good = Vec::new();
    EventEncoder::new(PAGE)
        .unwrap()
        .encode(0.0, &[CacheEvent::Cleared], &mut good)
        .unwrap();
    let (payloads, endpoint, replay) = spawn_publisher(
        &context,
        PublisherConfig::default(),
        Dialect::Vllm,
        |publisher, payload: Vec<u8>| {
            publisher.publish_payload(&payload).unwrap();
        },
    );
    let mut subscriber =
        EventSubscriber::connect(&context, &endpoint, replay.as_deref(), "").unwrap();
    // Batches 0 (good), 1 (what no dialect is), 2 (good); some before the subscription is up.
    for payload in [&good[..], b"\x93not a batch", &good[..]] {
        payloads.send(payload.to_vec()).unwrap();
    }
    let received = subscriber.catch_up(2, LIMIT).unwrap();
    assert_eq!(
        received.iter().map(|batch| batch.seq).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    let error = received[1].decoded.as_ref().unwrap_err();
    assert!(error.reason.contains("expected a sequence"), "{error}");
    assert_eq!(received[1].payload, b"\x93not a batch");
    assert!(received[0].decoded.is_ok() && received[2].decoded.is_ok());
    assert_eq!(subscriber.undecodable(), 1);
}
