//! The encoder: kvown's [`CacheEvent`]s as one vLLM-format msgpack event batch.
//!
//! The batch is the positional array `[timestamp, [events...], data_parallel_rank]`, and each
//! event the positional array a `msgspec` `array_like` struct makes (vLLM's encoding):
//!
//! * `["BlockStored", block_hashes, parent_block_hash | nil, token_ids, block_size,
//!   lora_id (nil), medium, lora_name | {"cache_salt": salt} | nil, extra_keys (nil)]`;
//! * `["BlockRemoved", block_hashes, medium]`;
//! * `["AllBlocksCleared"]`.
//!
//! A stored run's `block_hashes` are its pages' [`PageHash`]es and its `parent_block_hash` the
//! hash of the page before the run, so every replica names the same token chain alike.

use kvown_runtime::radix::{CacheEvent, PageHash, StoredPage};
use serde::ser::{SerializeMap, SerializeSeq, SerializeTuple};
use serde::{Serialize, Serializer};

use crate::error::EncodeError;
use crate::namespace::{NamespaceField, NamespaceLabel, NamespaceLabels};

/// The `medium` of every event: kvown's pages are in accelerator (or host) memory of the
/// replica itself, the router's primary tier.
pub const MEDIUM: &str = "GPU";

/// Encodes a replica's cache events as event batches. Holds the block size (the cache's page
/// size), the namespaces' labels and the replica's data-parallel rank.
#[derive(Debug, Clone)]
pub struct EventEncoder {
    block_size: u32,
    labels: NamespaceLabels,
    data_parallel_rank: Option<i32>,
}

impl EventEncoder {
    /// An encoder for a cache of pages of `page_size` tokens, namespaces labelled as
    /// `lora_name`s ([`NamespaceLabels::lora_names`]), no data-parallel rank. Fails when
    /// `page_size` is 0 or does not fit a `u32`.
    pub fn new(page_size: usize) -> Result<EventEncoder, EncodeError> {
        let block_size = u32::try_from(page_size)
            .ok()
            .filter(|&size| size > 0)
            .ok_or(EncodeError::BlockSize { page_size })?;
        Ok(EventEncoder {
            block_size,
            labels: NamespaceLabels::lora_names(),
            data_parallel_rank: None,
        })
    }

    /// The same encoder with the namespaces labelled by `labels`.
    pub fn with_namespaces(mut self, labels: NamespaceLabels) -> EventEncoder {
        self.labels = labels;
        self
    }

    /// The same encoder stamping batches with data-parallel rank `rank`.
    pub fn with_data_parallel_rank(mut self, rank: i32) -> EventEncoder {
        self.data_parallel_rank = Some(rank);
        self
    }

    /// The wire's `block_size`: the cache's page size.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The namespaces' labels, for the router's query of a request.
    pub fn labels(&self) -> &NamespaceLabels {
        &self.labels
    }

    /// Writes `events` as one batch stamped `timestamp` (seconds since the Unix epoch) into
    /// `out`, replacing what it held. Fails, writing nothing, when a stored run is not whole
    /// pages of the block size.
    pub fn encode(
        &self,
        timestamp: f64,
        events: &[CacheEvent],
        out: &mut Vec<u8>,
    ) -> Result<(), EncodeError> {
        for event in events {
            if let CacheEvent::Stored { pages, tokens, .. } = event {
                let per_page = self.block_size as usize;
                let whole = pages
                    .iter()
                    .all(|page| page.tokens.len() == per_page && page.tokens.end <= tokens.len());
                if !whole || tokens.len() != pages.len() * per_page {
                    return Err(EncodeError::PageSizeMismatch {
                        pages: pages.len(),
                        tokens: tokens.len(),
                        block_size: self.block_size,
                    });
                }
            }
        }
        out.clear();
        let batch = WireBatch {
            timestamp,
            events,
            encoder: self,
        };
        batch.serialize(&mut rmp_serde::Serializer::new(&mut *out))?;
        Ok(())
    }
}

/// `[timestamp, [events...], data_parallel_rank]`.
struct WireBatch<'a> {
    timestamp: f64,
    events: &'a [CacheEvent],
    encoder: &'a EventEncoder,
}

impl Serialize for WireBatch<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut batch = serializer.serialize_tuple(3)?;
        batch.serialize_element(&self.timestamp)?;
        batch.serialize_element(&WireEvents(self))?;
        batch.serialize_element(&self.encoder.data_parallel_rank)?;
        batch.end()
    }
}

/// The batch's events.
struct WireEvents<'a>(&'a WireBatch<'a>);

impl Serialize for WireEvents<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut events = serializer.serialize_seq(Some(self.0.events.len()))?;
        for event in self.0.events {
            events.serialize_element(&WireEvent {
                event,
                encoder: self.0.encoder,
            })?;
        }
        events.end()
    }
}

/// One event, positional.
struct WireEvent<'a> {
    event: &'a CacheEvent,
    encoder: &'a EventEncoder,
}

impl Serialize for WireEvent<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.event {
            CacheEvent::Stored {
                namespace,
                parent_hash,
                pages,
                tokens,
            } => {
                let label = self.encoder.labels.label(*namespace);
                let mut event = serializer.serialize_tuple(9)?;
                event.serialize_element("BlockStored")?;
                event.serialize_element(&StoredHashes(pages))?;
                event.serialize_element(&parent_hash.map(|hash| hash.0))?;
                event.serialize_element(tokens.as_slice())?;
                event.serialize_element(&self.encoder.block_size)?;
                event.serialize_element(&None::<u64>)?;
                event.serialize_element(MEDIUM)?;
                event.serialize_element(&WireLabel(label.as_ref()))?;
                event.serialize_element(&None::<()>)?;
                event.end()
            }
            CacheEvent::Removed { hashes } => {
                let mut event = serializer.serialize_tuple(3)?;
                event.serialize_element("BlockRemoved")?;
                event.serialize_element(&RemovedHashes(hashes))?;
                event.serialize_element(MEDIUM)?;
                event.end()
            }
            CacheEvent::Cleared => {
                let mut event = serializer.serialize_tuple(1)?;
                event.serialize_element("AllBlocksCleared")?;
                event.end()
            }
        }
    }
}

/// A stored run's page hashes as `u64`s.
struct StoredHashes<'a>(&'a [StoredPage]);

impl Serialize for StoredHashes<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|page| page.hash.0))
    }
}

/// Removed page hashes as `u64`s.
struct RemovedHashes<'a>(&'a [PageHash]);

impl Serialize for RemovedHashes<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|hash| hash.0))
    }
}

/// The namespace slot: a `lora_name` string, sglang's `{"cache_salt": salt}`, or nil.
struct WireLabel<'a>(Option<&'a NamespaceLabel<'a>>);

impl Serialize for WireLabel<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            None => serializer.serialize_none(),
            Some(label) => match label.field {
                NamespaceField::LoraName => serializer.serialize_str(&label.name),
                NamespaceField::CacheSalt => {
                    let mut map = serializer.serialize_map(Some(1))?;
                    map.serialize_entry("cache_salt", &*label.name)?;
                    map.end()
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use kvown_runtime::radix::Namespace;

    use super::*;

    /// `BlockStored` as a positional tuple, the namespace slot as a `lora_name`.
    type Stored = (
        String,
        Vec<u64>,
        Option<u64>,
        Vec<u32>,
        u32,
        Option<u64>,
        String,
        Option<String>,
        Option<()>,
    );

    fn stored_run(namespace: Namespace, tokens: Vec<u32>, page_size: usize) -> CacheEvent {
        let hashes: Vec<PageHash> = PageHash::of_pages(namespace, &tokens, page_size).collect();
        let pages = hashes
            .iter()
            .enumerate()
            .map(|(index, &hash)| StoredPage {
                hash,
                page: index as u32 + 1,
                tokens: index * page_size..(index + 1) * page_size,
            })
            .collect();
        CacheEvent::Stored {
            namespace,
            parent_hash: None,
            pages,
            tokens,
        }
    }

    #[test]
    fn a_stored_run_is_the_positional_tuple_vllm_sends() {
        let encoder = EventEncoder::new(2).unwrap().with_data_parallel_rank(3);
        let event = stored_run(Namespace(4), vec![1, 2, 3, 4], 2);
        let mut out = Vec::new();
        encoder.encode(12.5, &[event], &mut out).unwrap();
        let (timestamp, events, rank): (f64, Vec<Stored>, Option<i32>) =
            rmp_serde::from_slice(&out).unwrap();
        assert_eq!((timestamp, rank), (12.5, Some(3)));
        let hashes: Vec<u64> = PageHash::of_pages(Namespace(4), &[1, 2, 3, 4], 2)
            .map(|hash| hash.0)
            .collect();
        assert_eq!(
            events,
            [(
                "BlockStored".to_owned(),
                hashes,
                None,
                vec![1, 2, 3, 4],
                2,
                None,
                "GPU".to_owned(),
                Some("kvown-namespace-4".to_owned()),
                None
            )]
        );
    }

    #[test]
    fn removals_and_clears_are_short_tuples() {
        let encoder = EventEncoder::new(4).unwrap();
        let mut out = Vec::new();
        let removed = CacheEvent::Removed {
            hashes: vec![PageHash(u64::MAX), PageHash(7)],
        };
        encoder.encode(0.0, &[removed], &mut out).unwrap();
        type Removed = (String, Vec<u64>, String);
        let (_, events, rank): (f64, Vec<Removed>, Option<i32>) =
            rmp_serde::from_slice(&out).unwrap();
        assert_eq!(rank, None);
        let expected = (
            "BlockRemoved".to_owned(),
            vec![u64::MAX, 7],
            "GPU".to_owned(),
        );
        assert_eq!(events, [expected]);
        encoder
            .encode(0.0, &[CacheEvent::Cleared], &mut out)
            .unwrap();
        let (_, events, _): (f64, Vec<(String,)>, Option<i32>) =
            rmp_serde::from_slice(&out).unwrap();
        assert_eq!(events, [("AllBlocksCleared".to_owned(),)]);
    }

    #[test]
    fn a_salt_goes_in_the_namespace_slot_as_a_map() {
        let labels = NamespaceLabels::cache_salts()
            .with_name(Namespace(1), "tenant-a")
            .unwrap();
        let encoder = EventEncoder::new(2).unwrap().with_namespaces(labels);
        let mut out = Vec::new();
        let event = stored_run(Namespace(1), vec![5, 6], 2);
        encoder.encode(0.0, &[event], &mut out).unwrap();
        type Salted = (
            String,
            Vec<u64>,
            Option<u64>,
            Vec<u32>,
            u32,
            Option<u64>,
            String,
            std::collections::BTreeMap<String, String>,
            Option<()>,
        );
        let (_, events, _): (f64, Vec<Salted>, Option<i32>) = rmp_serde::from_slice(&out).unwrap();
        assert_eq!(events[0].7["cache_salt"], "tenant-a");
    }

    #[test]
    fn an_encoder_of_another_page_size_refuses_the_run_and_writes_nothing() {
        let encoder = EventEncoder::new(4).unwrap();
        let mut out = vec![9];
        let event = stored_run(Namespace::DEFAULT, vec![1, 2, 3, 4], 2);
        let error = encoder.encode(0.0, &[event], &mut out).unwrap_err();
        assert!(
            matches!(
                error,
                EncodeError::PageSizeMismatch {
                    pages: 2,
                    tokens: 4,
                    block_size: 4
                }
            ),
            "{error}"
        );
        assert_eq!(out, [9]);
        assert!(matches!(
            EventEncoder::new(0),
            Err(EncodeError::BlockSize { page_size: 0 })
        ));
    }
}
