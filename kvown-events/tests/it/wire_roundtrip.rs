//! The wire round trip with no socket, in every dialect: kvown's events, encoded, decoded by
//! `dynamo-kv-router`'s own decoder (`zmq_wire::decode_event_batch`) and by kvown's
//! (`EventBatch::decode`), normalised, turned into router events and applied to Dynamo's
//! `RadixTree`, then scored with its own request hashing.

use dynamo_kv_router::zmq_wire::{RawKvEvent, decode_event_batch};
use kvown_events::{BlockEvent, Dialect, EventBatch, EventEncoder, NamespaceField};
use kvown_fleet::indexer::{FleetIndexer, dynamo_labels};
use kvown_runtime::alloc::{PagedAllocator, SlotCalls};
use kvown_runtime::radix::{CacheEvent, Insert, Namespace, PageHash, RadixCache, RadixConfig};

const PAGE: usize = 4;

/// A cache of pages of 4 with events on, its opening `Cleared` taken, and its allocator.
fn cache() -> (RadixCache, PagedAllocator) {
    let mut cache = RadixCache::new(RadixConfig::new(PAGE)).unwrap();
    cache.enable_events();
    assert_eq!(cache.take_events(), [CacheEvent::Cleared]);
    (cache, PagedAllocator::new(256, PAGE, false).unwrap())
}

fn insert(cache: &mut RadixCache, alloc: &mut PagedAllocator, namespace: Namespace, key: &[u32]) {
    let mut slots = Vec::new();
    alloc.alloc(key.len(), &mut slots).unwrap();
    cache
        .insert(Insert::new(namespace.key(key), &slots))
        .unwrap();
}

fn encoded(encoder: &EventEncoder, events: &[CacheEvent]) -> Vec<u8> {
    let mut payload = Vec::new();
    encoder
        .encode(1_700_000_000.25, events, &mut payload)
        .unwrap();
    payload
}

/// What a router needs of a stored run, as Dynamo's decoder reads it: hashes, parent, tokens,
/// block size, medium, adapter, salt.
type Stored = (
    Vec<u64>,
    Option<u64>,
    Vec<u32>,
    usize,
    Option<String>,
    Option<String>,
    Option<String>,
);

fn dynamo_stored(event: RawKvEvent) -> Stored {
    match event {
        RawKvEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            medium,
            lora_name,
            cache_namespace,
            ..
        } => (
            block_hashes
                .into_iter()
                .map(|hash| hash.into_u64())
                .collect(),
            parent_block_hash.map(|hash| hash.into_u64()),
            token_ids,
            block_size,
            medium,
            lora_name,
            cache_namespace,
        ),
        other => panic!("not a store: {other:?}"),
    }
}

#[test]
fn both_decoders_read_back_every_field_of_a_stored_run_in_every_dialect() {
    let prompt: Vec<u32> = (1..=10).collect();
    let mut branch = prompt[..4].to_vec();
    branch.extend([50, 51, 52, 53]);
    let hashes: Vec<u64> = PageHash::of_pages(Namespace(2), &prompt, PAGE)
        .map(|hash| hash.0)
        .collect();
    let branch_hash = PageHash::of_pages(Namespace(2), &branch, PAGE)
        .last()
        .unwrap()
        .0;
    for dialect in Dialect::ALL {
        for field in [NamespaceField::LoraName, NamespaceField::CacheSalt] {
            let (mut cache, mut alloc) = cache();
            insert(&mut cache, &mut alloc, Namespace(2), &prompt[..8]);
            insert(&mut cache, &mut alloc, Namespace(2), &branch);
            let labels = dynamo_labels(field, dialect, 3).unwrap();
            let encoder = EventEncoder::new(PAGE)
                .unwrap()
                .with_dialect(dialect)
                .with_namespaces(labels)
                .with_data_parallel_rank(1);
            let payload = encoded(&encoder, &cache.take_events());
            let batch = decode_event_batch(&payload).unwrap();
            assert_eq!(batch.ts, 1_700_000_000.25);
            assert_eq!(batch.data_parallel_rank, Some(1));
            let stored: Vec<Stored> = batch.events.into_iter().map(dynamo_stored).collect();
            let gpu = Some("GPU".to_owned());
            let (adapter, salt) = match field {
                NamespaceField::LoraName => (Some("adapter-2".to_owned()), None),
                NamespaceField::CacheSalt => (None, Some("tenant-2".to_owned())),
            };
            // vLLM keys a salt into its key's first block only; Dynamo carries it down the
            // chain in its normaliser. sglang sends it with every run.
            let branch_salt = salt.clone().filter(|_| dialect == Dialect::Sglang);
            assert_eq!(
                stored,
                [
                    (
                        hashes[..2].to_vec(),
                        None,
                        prompt[..8].to_vec(),
                        PAGE,
                        gpu.clone(),
                        adapter.clone(),
                        salt.clone()
                    ),
                    (
                        vec![branch_hash],
                        Some(hashes[0]),
                        vec![50, 51, 52, 53],
                        PAGE,
                        gpu,
                        adapter,
                        branch_salt
                    ),
                ],
                "{dialect}, {field:?}"
            );
            let ours = EventBatch::decode(&payload).unwrap();
            assert_eq!((ours.timestamp, ours.rank), (1_700_000_000.25, Some(1)));
            for (ours, theirs) in ours.events.iter().zip(&stored) {
                let BlockEvent::Stored(ours) = ours else {
                    panic!("{dialect}: {ours:?}");
                };
                assert_eq!(ours.block_hashes, theirs.0);
                assert_eq!(ours.parent_block_hash, theirs.1);
                assert_eq!(ours.token_ids, theirs.2);
                assert_eq!(ours.block_size as usize, theirs.3);
                assert_eq!(ours.medium, theirs.4);
                assert_eq!(ours.lora_name, theirs.5);
            }
        }
    }
}

#[test]
fn removals_and_clears_reach_the_router_and_empty_it_in_every_dialect() {
    for dialect in Dialect::ALL {
        let (mut cache, mut alloc) = cache();
        let encoder = EventEncoder::new(PAGE).unwrap().with_dialect(dialect);
        let mut index = FleetIndexer::new(2, PAGE as u32, encoder.labels().clone(), dialect);
        let prompt: Vec<u32> = (1..=14).collect();
        let mut slots = Vec::new();
        alloc.alloc(12, &mut slots).unwrap();
        cache
            .insert(Insert::new(&prompt[..8], &slots[..8]))
            .unwrap();
        // A longer prompt later: its third page is a leaf of its own, evicted first.
        cache.insert(Insert::new(&prompt[..12], &slots)).unwrap();
        let events = cache.take_events();
        index.apply_batch(0, &encoded(&encoder, &events)).unwrap();
        // The same tokens on the other replica: the same block ids, one shared tree path.
        index.apply_batch(1, &encoded(&encoder, &events)).unwrap();
        let scores = |index: &FleetIndexer| {
            index.overlaps(index.block_hashes(Namespace::DEFAULT, &prompt), 2)
        };
        assert_eq!(scores(&index), [3, 3]);
        // The partial fourth page of the query is never matched; a shorter query matches less.
        let shorter = index.block_hashes(Namespace::DEFAULT, &prompt[..7]);
        assert_eq!(index.overlaps(shorter, 2), [1, 1]);
        // Evict the deepest page on replica 0 only.
        cache.evict(PAGE, &mut alloc).unwrap();
        let removed = cache.take_events();
        assert!(matches!(&removed[..], [CacheEvent::Removed { hashes }] if hashes.len() == 1));
        let batch = decode_event_batch(&encoded(&encoder, &removed)).unwrap();
        assert!(matches!(
            &batch.events[..],
            [RawKvEvent::BlockRemoved { block_hashes, medium: Some(medium), .. }]
                if block_hashes.len() == 1 && medium == "GPU"
        ));
        index.apply_batch(0, &encoded(&encoder, &removed)).unwrap();
        assert_eq!(scores(&index), [2, 3]);
        // Restarting replica 1's stream: cleared, then its pages stored again.
        let mut other = RadixCache::new(RadixConfig::new(PAGE)).unwrap();
        other.enable_events();
        let restarted = other.take_events();
        assert_eq!(restarted, [CacheEvent::Cleared]);
        let batch = decode_event_batch(&encoded(&encoder, &restarted)).unwrap();
        assert!(matches!(
            &batch.events[..],
            [RawKvEvent::AllBlocksCleared { .. }]
        ));
        index
            .apply_batch(1, &encoded(&encoder, &restarted))
            .unwrap();
        assert_eq!(scores(&index), [2, 0], "{dialect}");
    }
}

#[test]
fn a_namespace_matches_only_a_query_with_its_label_in_every_dialect() {
    for dialect in Dialect::ALL {
        for field in [NamespaceField::LoraName, NamespaceField::CacheSalt] {
            let labels = dynamo_labels(field, dialect, 9).unwrap();
            let (mut cache, mut alloc) = cache();
            let encoder = EventEncoder::new(PAGE)
                .unwrap()
                .with_dialect(dialect)
                .with_namespaces(labels.clone());
            let mut index = FleetIndexer::new(1, PAGE as u32, labels, dialect);
            let prompt: Vec<u32> = (1..=8).collect();
            insert(&mut cache, &mut alloc, Namespace(7), &prompt);
            index
                .apply_batch(0, &encoded(&encoder, &cache.take_events()))
                .unwrap();
            let score = |namespace| index.overlaps(index.block_hashes(namespace, &prompt), 1)[0];
            assert_eq!(
                (
                    score(Namespace(7)),
                    score(Namespace::DEFAULT),
                    score(Namespace(8))
                ),
                (2, 0, 0),
                "{dialect}, {field:?}"
            );
        }
    }
}

#[test]
fn a_store_below_a_page_the_router_never_saw_is_refused() {
    let (mut cache, mut alloc) = cache();
    let encoder = EventEncoder::new(PAGE).unwrap();
    let mut index = FleetIndexer::new(1, PAGE as u32, encoder.labels().clone(), Dialect::Vllm);
    insert(&mut cache, &mut alloc, Namespace::DEFAULT, &[1, 2, 3, 4]);
    cache.take_events();
    insert(
        &mut cache,
        &mut alloc,
        Namespace::DEFAULT,
        &[1, 2, 3, 4, 5, 6, 7, 8],
    );
    let error = index
        .apply_batch(0, &encoded(&encoder, &cache.take_events()))
        .unwrap_err();
    assert!(
        error.to_string().contains("Failed to find parent block"),
        "{error}"
    );
}
