//! The router's index: NVIDIA Dynamo's KV indexer (`dynamo-kv-router`'s `RadixTree`) fed with
//! each replica's event batches exactly as Dynamo's ZMQ listener feeds it (decode the batch,
//! normalise each event with the replica's own `ZmqEventNormalizer`, turn it into a router
//! event, apply it), and queried as Dynamo's router queries it (hash the request's tokens
//! with `compute_block_hash_for_seq`, `find_matches`).

use dynamo_kv_router::RadixTree;
use dynamo_kv_router::protocols::{
    BlockHashOptions, KvCacheEventError, LocalBlockHash, WorkerWithDpRank,
    compute_block_hash_for_seq,
};
use dynamo_kv_router::zmq_wire::{ZmqEventFilterReason, ZmqEventNormalizer, decode_event_batch};
use kvown_events::NamespaceLabels;
use kvown_runtime::radix::Namespace;

/// Why a batch could not be indexed.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// The payload is not an event batch.
    #[error("replica {replica}: the batch does not decode: {source}")]
    Decode {
        replica: usize,
        source: rmp_serde::decode::Error,
    },
    /// The normaliser filtered an event out (unknown medium, ambiguous namespace, ...).
    #[error("replica {replica}: event {event_id} filtered out: {reason:?}")]
    Filtered {
        replica: usize,
        event_id: u64,
        reason: ZmqEventFilterReason,
    },
    /// The conversion dropped an event.
    #[error("replica {replica}: event {event_id} dropped by the conversion")]
    Dropped { replica: usize, event_id: u64 },
    /// The tree refused an event (an unknown parent, a self-reference).
    #[error("replica {replica}: event {event_id} refused by the index: {source}")]
    Refused {
        replica: usize,
        event_id: u64,
        source: KvCacheEventError,
    },
}

/// Dynamo's index of a fleet of replicas, worker `i` being replica `i`.
pub struct FleetIndexer {
    tree: RadixTree,
    normalizers: Vec<ZmqEventNormalizer>,
    next_event_ids: Vec<u64>,
    block_size: u32,
    labels: NamespaceLabels,
}

impl FleetIndexer {
    /// An empty index of `replicas` replicas with blocks of `block_size` tokens, whose
    /// namespaces are labelled by `labels` (the replicas' encoders' labels).
    pub fn new(replicas: usize, block_size: u32, labels: NamespaceLabels) -> FleetIndexer {
        FleetIndexer {
            tree: RadixTree::new(),
            normalizers: (0..replicas)
                .map(|_| ZmqEventNormalizer::new(block_size))
                .collect(),
            next_event_ids: vec![0; replicas],
            block_size,
            labels,
        }
    }

    /// Applies one of `replica`'s batches; returns the events it held.
    pub fn apply_batch(&mut self, replica: usize, payload: &[u8]) -> Result<usize, IndexError> {
        let batch =
            decode_event_batch(payload).map_err(|source| IndexError::Decode { replica, source })?;
        let dp_rank = batch.data_parallel_rank.unwrap_or(0) as u32;
        let worker = WorkerWithDpRank::new(replica as u64, dp_rank);
        let count = batch.events.len();
        for raw in batch.events {
            let event_id = self.next_event_ids[replica];
            self.next_event_ids[replica] += 1;
            let normalizer = &mut self.normalizers[replica];
            let raw = normalizer
                .preprocess_with_reason(raw, worker)
                .map_err(|reason| IndexError::Filtered {
                    replica,
                    event_id,
                    reason,
                })?;
            let event = normalizer
                .normalize_preprocessed(raw, event_id, worker)
                .and_then(|placement| placement.into_router_event())
                .ok_or(IndexError::Dropped { replica, event_id })?;
            self.tree
                .apply_event(event)
                .map_err(|source| IndexError::Refused {
                    replica,
                    event_id,
                    source,
                })?;
        }
        Ok(count)
    }

    /// The router's block hashes of `tokens` in `namespace` (whole blocks only).
    pub fn block_hashes(&self, namespace: Namespace, tokens: &[u32]) -> Vec<LocalBlockHash> {
        let label = self.labels.label(namespace);
        let options = BlockHashOptions {
            block_mm_infos: None,
            lora_name: label.as_ref().and_then(|label| label.lora_name()),
            cache_namespace: label.as_ref().and_then(|label| label.cache_salt()),
            is_eagle: None,
        };
        compute_block_hash_for_seq(tokens, self.block_size, options)
    }

    /// Each replica's overlap with `hashes`: the leading blocks it holds.
    pub fn overlaps(&self, hashes: Vec<LocalBlockHash>, replicas: usize) -> Vec<u32> {
        let scores = self.tree.find_matches(hashes, false).scores;
        (0..replicas)
            .map(|replica| {
                let worker = WorkerWithDpRank::new(replica as u64, 0);
                scores.get(&worker).copied().unwrap_or(0)
            })
            .collect()
    }
}
