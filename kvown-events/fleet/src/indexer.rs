//! The router's index: NVIDIA Dynamo's KV indexer (`dynamo-kv-router`'s `RadixTree`) fed with
//! each replica's event batches exactly as Dynamo's ZMQ listener feeds it (decode the batch,
//! normalise each event with the replica's own `ZmqEventNormalizer`, turn it into a router
//! event, apply it), and queried as Dynamo's router queries it (hash the request's tokens
//! with `compute_block_hash_for_seq`, `find_matches`).
//!
//! Dynamo reads every kvown dialect. A salt it takes from sglang's top-level `cache_salt` as
//! it is, but from vLLM's `extra_keys` only in the form its own vLLM worker gives vLLM: after
//! [`DYNAMO_CACHE_SALT_PREFIX`], which it strips ([`dynamo_labels`] names namespaces so).

use dynamo_kv_router::RadixTree;
use dynamo_kv_router::protocols::{
    BlockHashOptions, KvCacheEventError, LocalBlockHash, WorkerWithDpRank,
    compute_block_hash_for_seq,
};
use dynamo_kv_router::zmq_wire::{
    DYNAMO_CACHE_SALT_PREFIX, ZmqEventFilterReason, ZmqEventNormalizer, decode_event_batch,
};
use kvown_events::{Dialect, EncodeError, NamespaceField, NamespaceLabels};
use kvown_runtime::radix::Namespace;

/// Why a batch could not be indexed.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// The payload is not an event batch Dynamo reads.
    #[error("replica {replica}: Dynamo cannot decode the batch: {reason}")]
    Decode {
        /// The replica.
        replica: usize,
        /// Dynamo's decoder's message.
        reason: String,
    },
    /// The normaliser filtered an event out (unknown medium, ambiguous namespace, ...).
    #[error("replica {replica}: event {event_id} filtered out: {reason:?}")]
    Filtered {
        /// The replica.
        replica: usize,
        /// The event's number in the replica's stream.
        event_id: u64,
        /// Dynamo's reason.
        reason: ZmqEventFilterReason,
    },
    /// The conversion dropped an event.
    #[error("replica {replica}: event {event_id} dropped by the conversion")]
    Dropped {
        /// The replica.
        replica: usize,
        /// The event's number in the replica's stream.
        event_id: u64,
    },
    /// The tree refused an event (an unknown parent, a self-reference).
    #[error("replica {replica}: event {event_id} refused by the index: {source}")]
    Refused {
        /// The replica.
        replica: usize,
        /// The event's number in the replica's stream.
        event_id: u64,
        /// The tree's error.
        source: KvCacheEventError,
    },
}

/// The labels of namespaces `1..namespaces` for a fleet whose replicas speak `dialect`, as
/// `field`: `adapter-<n>`, or the salt `tenant-<n>` (after [`DYNAMO_CACHE_SALT_PREFIX`] in a
/// vLLM dialect, where Dynamo reads a salt only so). The default namespace stays unlabelled.
pub fn dynamo_labels(
    field: NamespaceField,
    dialect: Dialect,
    namespaces: u32,
) -> Result<NamespaceLabels, EncodeError> {
    let (mut labels, name): (NamespaceLabels, fn(u32) -> String) = match (field, dialect) {
        (NamespaceField::LoraName, _) => {
            (NamespaceLabels::lora_names(), |n| format!("adapter-{n}"))
        }
        (NamespaceField::CacheSalt, Dialect::Sglang) => {
            (NamespaceLabels::cache_salts(), |n| format!("tenant-{n}"))
        }
        (NamespaceField::CacheSalt, _) => (NamespaceLabels::cache_salts(), |n| {
            format!("{DYNAMO_CACHE_SALT_PREFIX}tenant-{n}")
        }),
    };
    for namespace in 1..namespaces {
        labels = labels.with_name(Namespace(namespace), name(namespace))?;
    }
    Ok(labels)
}

/// Dynamo's index of a fleet of replicas, worker `i` being replica `i`.
pub struct FleetIndexer {
    tree: RadixTree,
    normalizers: Vec<ZmqEventNormalizer>,
    next_event_ids: Vec<u64>,
    block_size: u32,
    labels: NamespaceLabels,
    dialect: Dialect,
}

impl FleetIndexer {
    /// An empty index of `replicas` replicas with blocks of `block_size` tokens, speaking
    /// `dialect`, whose namespaces are labelled by `labels` (the replicas' encoders' labels).
    pub fn new(
        replicas: usize,
        block_size: u32,
        labels: NamespaceLabels,
        dialect: Dialect,
    ) -> FleetIndexer {
        FleetIndexer {
            tree: RadixTree::new(),
            normalizers: (0..replicas)
                .map(|_| ZmqEventNormalizer::new(block_size))
                .collect(),
            next_event_ids: vec![0; replicas],
            block_size,
            labels,
            dialect,
        }
    }

    /// Applies one of `replica`'s batches; returns the events it held.
    pub fn apply_batch(&mut self, replica: usize, payload: &[u8]) -> Result<usize, IndexError> {
        let batch = decode_event_batch(payload).map_err(|error| IndexError::Decode {
            replica,
            reason: error.to_string(),
        })?;
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
        let salt = label.as_ref().and_then(|label| label.cache_salt());
        let options = BlockHashOptions {
            block_mm_infos: None,
            lora_name: label.as_ref().and_then(|label| label.lora_name()),
            cache_namespace: match self.dialect {
                Dialect::Sglang => salt,
                Dialect::Vllm | Dialect::VllmLegacy => {
                    salt.and_then(|salt| salt.strip_prefix(DYNAMO_CACHE_SALT_PREFIX))
                }
            },
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
