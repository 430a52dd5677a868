//! The encoder: kvown's [`CacheEvent`]s as one msgpack event batch in a [`Dialect`].
//!
//! The batch is the array `[timestamp, [events...], rank]` in every dialect. Each event is
//! written from its dialect's table: a map (`"type"` first, then the fields, the optional ones
//! only when set) or an array (the tag, then the fields up to the last one set). A stored
//! run's `block_hashes` are its pages' [`PageHash`]es and its `parent_block_hash` the hash of
//! the page before the run, so every replica names the same token chain alike.

use kvown_runtime::radix::{CacheEvent, PageHash, StoredPage};
use serde::ser::{SerializeMap, SerializeSeq, SerializeTuple};
use serde::{Serialize, Serializer};

use crate::dialect::{Dialect, EventForm, Field, Source};
use crate::error::EncodeError;
use crate::namespace::{NamespaceLabel, NamespaceLabels};

/// The `medium` of every event: kvown's pages are in accelerator (or host) memory of the
/// replica itself, the router's primary tier.
pub const MEDIUM: &str = "GPU";

/// Encodes a replica's cache events as event batches of one [`Dialect`]. Holds the block size
/// (the cache's page size), the namespaces' labels and the replica's rank.
#[derive(Debug, Clone)]
pub struct EventEncoder {
    block_size: u32,
    labels: NamespaceLabels,
    dialect: Dialect,
    rank: i32,
}

impl EventEncoder {
    /// An encoder for a cache of pages of `page_size` tokens, in the default [`Dialect`]
    /// (`vllm`), namespaces labelled as `lora_name`s ([`NamespaceLabels::lora_names`]), rank 0.
    /// Fails when `page_size` is 0 or does not fit a `u32`.
    pub fn new(page_size: usize) -> Result<EventEncoder, EncodeError> {
        let block_size = u32::try_from(page_size)
            .ok()
            .filter(|&size| size > 0)
            .ok_or(EncodeError::BlockSize { page_size })?;
        Ok(EventEncoder {
            block_size,
            labels: NamespaceLabels::lora_names(),
            dialect: Dialect::default(),
            rank: 0,
        })
    }

    /// The same encoder writing `dialect`.
    pub fn with_dialect(mut self, dialect: Dialect) -> EventEncoder {
        self.dialect = dialect;
        self
    }

    /// The same encoder with the namespaces labelled by `labels`.
    pub fn with_namespaces(mut self, labels: NamespaceLabels) -> EventEncoder {
        self.labels = labels;
        self
    }

    /// The same encoder stamping batches with rank `rank` (vLLM's `data_parallel_rank`,
    /// sglang's `attn_dp_rank`).
    pub fn with_data_parallel_rank(mut self, rank: i32) -> EventEncoder {
        self.rank = rank;
        self
    }

    /// The dialect it writes.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The wire's `block_size`: the cache's page size.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The namespaces' labels, for the router's query of a request.
    pub fn labels(&self) -> &NamespaceLabels {
        &self.labels
    }

    /// The rank every batch carries.
    pub fn data_parallel_rank(&self) -> i32 {
        self.rank
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

/// `[timestamp, [events...], rank]`.
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
        batch.serialize_element(&self.encoder.rank)?;
        batch.end()
    }
}

/// The batch's events.
struct WireEvents<'a>(&'a WireBatch<'a>);

impl Serialize for WireEvents<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut events = serializer.serialize_seq(Some(self.0.events.len()))?;
        for event in self.0.events {
            let label = match event {
                CacheEvent::Stored { namespace, .. } => self.0.encoder.labels.label(*namespace),
                CacheEvent::Removed { .. } | CacheEvent::Cleared => None,
            };
            events.serialize_element(&WireEvent {
                event,
                label,
                encoder: self.0.encoder,
            })?;
        }
        events.end()
    }
}

/// One event, laid out by the encoder's dialect.
struct WireEvent<'a> {
    event: &'a CacheEvent,
    /// A stored run's namespace label.
    label: Option<NamespaceLabel<'a>>,
    encoder: &'a EventEncoder,
}

impl WireEvent<'_> {
    /// The value of a field of this event.
    fn value(&self, source: Source) -> Value<'_> {
        let label = self.label.as_ref();
        match (source, self.event) {
            (Source::BlockHashes, CacheEvent::Stored { pages, .. }) => Value::StoredHashes(pages),
            (Source::BlockHashes, CacheEvent::Removed { hashes }) => Value::RemovedHashes(hashes),
            (Source::ParentBlockHash, CacheEvent::Stored { parent_hash, .. }) => {
                parent_hash.map_or(Value::Nil, |hash| Value::Unsigned(hash.0))
            }
            (Source::TokenIds, CacheEvent::Stored { tokens, .. }) => Value::Tokens(tokens),
            (Source::BlockSize, _) => Value::Unsigned(u64::from(self.encoder.block_size)),
            (Source::AdapterId, CacheEvent::Stored { namespace, .. }) => label
                .and_then(NamespaceLabel::lora_name)
                .map_or(Value::Nil, |_| Value::Unsigned(u64::from(namespace.0))),
            (Source::Medium, _) => Value::Text(MEDIUM),
            (Source::LoraName, _) => Value::text(label.and_then(NamespaceLabel::lora_name)),
            (Source::CacheSalt, _) => Value::text(label.and_then(NamespaceLabel::cache_salt)),
            (
                Source::ExtraKeys,
                CacheEvent::Stored {
                    pages, parent_hash, ..
                },
            ) => {
                let lora_name = label.and_then(NamespaceLabel::lora_name);
                // vLLM keys a salt into the first block of a request only.
                let first_page_salt = label
                    .and_then(NamespaceLabel::cache_salt)
                    .filter(|_| parent_hash.is_none());
                if lora_name.is_none() && first_page_salt.is_none() {
                    Value::Nil
                } else {
                    Value::ExtraKeys {
                        pages: pages.len(),
                        lora_name,
                        first_page_salt,
                    }
                }
            }
            _ => Value::Nil,
        }
    }

    /// Whether `field` goes on the wire: required, or set.
    fn sends(&self, field: &Field) -> bool {
        !field.optional || !matches!(self.value(field.source), Value::Nil)
    }
}

impl Serialize for WireEvent<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let table = self.encoder.dialect.table();
        let (tag, fields): (&str, &[Field]) = match self.event {
            CacheEvent::Stored { .. } => ("BlockStored", table.stored),
            CacheEvent::Removed { .. } => ("BlockRemoved", table.removed),
            CacheEvent::Cleared => ("AllBlocksCleared", &[]),
        };
        match table.form {
            EventForm::Tagged => {
                let sent = fields.iter().filter(|field| self.sends(field)).count();
                let mut event = serializer.serialize_map(Some(1 + sent))?;
                event.serialize_entry("type", tag)?;
                for field in fields.iter().filter(|field| self.sends(field)) {
                    event.serialize_entry(field.name, &self.value(field.source))?;
                }
                event.end()
            }
            EventForm::Positional => {
                let sent = fields
                    .iter()
                    .rposition(|field| self.sends(field))
                    .map_or(0, |last| last + 1);
                let mut event = serializer.serialize_tuple(1 + sent)?;
                event.serialize_element(tag)?;
                for field in &fields[..sent] {
                    event.serialize_element(&self.value(field.source))?;
                }
                event.end()
            }
        }
    }
}

/// A field's value on the wire.
enum Value<'a> {
    Nil,
    Unsigned(u64),
    Text(&'a str),
    StoredHashes(&'a [StoredPage]),
    RemovedHashes(&'a [PageHash]),
    Tokens(&'a [u32]),
    /// vLLM's per-block extra keys: `[lora_name]` on every page, the salt added on the first.
    ExtraKeys {
        pages: usize,
        lora_name: Option<&'a str>,
        first_page_salt: Option<&'a str>,
    },
}

impl<'a> Value<'a> {
    fn text(text: Option<&'a str>) -> Value<'a> {
        text.map_or(Value::Nil, Value::Text)
    }
}

impl Serialize for Value<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match *self {
            Value::Nil => serializer.serialize_none(),
            Value::Unsigned(value) => serializer.serialize_u64(value),
            Value::Text(text) => serializer.serialize_str(text),
            Value::StoredHashes(pages) => serializer.collect_seq(pages.iter().map(|p| p.hash.0)),
            Value::RemovedHashes(hashes) => serializer.collect_seq(hashes.iter().map(|h| h.0)),
            Value::Tokens(tokens) => tokens.serialize(serializer),
            Value::ExtraKeys {
                pages,
                lora_name,
                first_page_salt,
            } => serializer.collect_seq((0..pages).map(|page| {
                let salt = first_page_salt.filter(|_| page == 0);
                let keys: Vec<&str> = lora_name.into_iter().chain(salt).collect();
                (!keys.is_empty()).then_some(keys)
            })),
        }
    }
}

#[cfg(test)]
mod tests {
    use kvown_runtime::radix::Namespace;
    use serde::de::{Deserializer, MapAccess, Visitor};
    use serde_json::{Value as Json, json};

    use super::*;

    fn stored_run(
        namespace: Namespace,
        parent_hash: Option<PageHash>,
        tokens: Vec<u32>,
        page_size: usize,
    ) -> CacheEvent {
        let seed = parent_hash.unwrap_or(PageHash::seed(namespace));
        let pages = tokens
            .chunks(page_size)
            .scan(seed, |hash, page| {
                *hash = hash.chain(page);
                Some(*hash)
            })
            .enumerate()
            .map(|(index, hash)| StoredPage {
                hash,
                page: index as u32 + 1,
                tokens: index * page_size..(index + 1) * page_size,
            })
            .collect();
        CacheEvent::Stored {
            namespace,
            parent_hash,
            pages,
            tokens,
        }
    }

    fn hashes(event: &CacheEvent) -> Vec<u64> {
        match event {
            CacheEvent::Stored { pages, .. } => pages.iter().map(|page| page.hash.0).collect(),
            _ => unreachable!(),
        }
    }

    /// A map's entries in wire order.
    struct Entries(Vec<(String, Json)>);

    impl<'de> serde::Deserialize<'de> for Entries {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Entries, D::Error> {
            struct EntriesVisitor;
            impl<'de> Visitor<'de> for EntriesVisitor {
                type Value = Entries;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a map")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                    let mut entries = Vec::new();
                    while let Some(entry) = map.next_entry()? {
                        entries.push(entry);
                    }
                    Ok(Entries(entries))
                }
            }
            deserializer.deserialize_map(EntriesVisitor)
        }
    }

    /// The batch `events` encode to in `dialect` with `labels`: timestamp, rank, and each event
    /// as its map entries (in wire order) or array.
    fn encoded(
        dialect: Dialect,
        labels: NamespaceLabels,
        events: &[CacheEvent],
    ) -> (f64, Vec<Json>, i32) {
        let encoder = EventEncoder::new(2)
            .unwrap()
            .with_dialect(dialect)
            .with_namespaces(labels)
            .with_data_parallel_rank(3);
        let mut out = Vec::new();
        encoder.encode(12.5, events, &mut out).unwrap();
        if dialect.table().form == EventForm::Positional {
            return rmp_serde::from_slice(&out).unwrap();
        }
        let (timestamp, events, rank): (f64, Vec<Entries>, i32) =
            rmp_serde::from_slice(&out).unwrap();
        let events = events
            .into_iter()
            .map(|entries| Json::Array(entries.0.into_iter().map(|e| json!(e)).collect()))
            .collect();
        (timestamp, events, rank)
    }

    #[test]
    fn vllm_sends_tagged_maps_with_every_field_it_declares_without_a_default() {
        let labels = NamespaceLabels::lora_names()
            .with_name(Namespace(4), "adapter")
            .unwrap();
        let run = stored_run(Namespace(4), None, vec![1, 2, 3, 4], 2);
        let unlabelled = stored_run(Namespace::DEFAULT, None, vec![5, 6], 2);
        let removed = CacheEvent::Removed {
            hashes: vec![PageHash(u64::MAX)],
        };
        let events = [
            run.clone(),
            unlabelled.clone(),
            removed,
            CacheEvent::Cleared,
        ];
        let (timestamp, events, rank) = encoded(Dialect::Vllm, labels, &events);
        assert_eq!((timestamp, rank), (12.5, 3));
        let stored = |event: &CacheEvent, lora_id: Json, lora_name: Json, extra: Option<Json>| {
            let mut entries = vec![
                json!(["type", "BlockStored"]),
                json!(["block_hashes", hashes(event)]),
                json!(["parent_block_hash", null]),
                json!([
                    "token_ids",
                    match event {
                        CacheEvent::Stored { tokens, .. } => tokens.clone(),
                        _ => unreachable!(),
                    }
                ]),
                json!(["block_size", 2]),
                json!(["lora_id", lora_id]),
                json!(["medium", "GPU"]),
                json!(["lora_name", lora_name]),
            ];
            entries.extend(extra.map(|keys| json!(["extra_keys", keys])));
            Json::Array(entries)
        };
        let extra = json!([["adapter"], ["adapter"]]);
        assert_eq!(
            events,
            [
                stored(&run, json!(4), json!("adapter"), Some(extra)),
                stored(&unlabelled, json!(null), json!(null), None),
                json!([
                    ["type", "BlockRemoved"],
                    ["block_hashes", [u64::MAX]],
                    ["medium", "GPU"]
                ]),
                json!([["type", "AllBlocksCleared"]]),
            ]
        );
    }

    #[test]
    fn vllm_legacy_sends_the_same_fields_positionally_dropping_only_trailing_nils() {
        let labels = NamespaceLabels::lora_names()
            .with_name(Namespace(4), "adapter")
            .unwrap();
        let run = stored_run(Namespace(4), None, vec![1, 2], 2);
        let plain = stored_run(Namespace::DEFAULT, None, vec![5, 6], 2);
        let events = [run.clone(), plain.clone(), CacheEvent::Cleared];
        let (_, events, rank) = encoded(Dialect::VllmLegacy, labels, &events);
        assert_eq!(rank, 3);
        assert_eq!(
            events,
            [
                json!([
                    "BlockStored",
                    hashes(&run),
                    null,
                    [1, 2],
                    2,
                    4,
                    "GPU",
                    "adapter",
                    [["adapter"]]
                ]),
                json!([
                    "BlockStored",
                    hashes(&plain),
                    null,
                    [5, 6],
                    2,
                    null,
                    "GPU",
                    null
                ]),
                json!(["AllBlocksCleared"]),
            ]
        );
    }

    #[test]
    fn a_vllm_salt_is_an_extra_key_of_the_first_page_of_its_key_only() {
        let labels = NamespaceLabels::cache_salts()
            .with_name(Namespace(1), "tenant")
            .unwrap();
        let first = stored_run(Namespace(1), None, vec![5, 6, 7, 8], 2);
        let parent = PageHash(hashes(&first)[1]);
        let below = stored_run(Namespace(1), Some(parent), vec![9, 10], 2);
        for dialect in [Dialect::Vllm, Dialect::VllmLegacy] {
            let (_, events, _) = encoded(dialect, labels.clone(), &[first.clone(), below.clone()]);
            let fields: Vec<&[Json]> = events
                .iter()
                .map(|event| &event.as_array().unwrap()[..])
                .collect();
            match dialect {
                Dialect::Vllm => {
                    assert_eq!(fields[0][5], json!(["lora_id", null]));
                    assert_eq!(fields[0][7], json!(["lora_name", null]));
                    assert_eq!(fields[0][8], json!(["extra_keys", [["tenant"], null]]));
                    assert_eq!(fields[1].len(), 8, "no extra keys below the first page");
                }
                _ => {
                    assert_eq!(fields[0][5..8], [json!(null), json!("GPU"), json!(null)]);
                    assert_eq!(fields[0][8], json!([["tenant"], null]));
                    assert_eq!(fields[1].len(), 8, "no extra keys below the first page");
                }
            }
        }
    }

    #[test]
    fn sglang_sends_the_salt_and_the_adapter_at_the_top_level_and_no_lora_id() {
        for (labels, salt, lora_name) in [
            (
                NamespaceLabels::cache_salts(),
                Some("kvown-namespace-2"),
                None,
            ),
            (
                NamespaceLabels::lora_names(),
                None,
                Some("kvown-namespace-2"),
            ),
        ] {
            let parent = PageHash(7);
            let run = stored_run(Namespace(2), Some(parent), vec![1, 2], 2);
            let (_, events, rank) = encoded(Dialect::Sglang, labels, std::slice::from_ref(&run));
            assert_eq!(rank, 3);
            let mut expected = vec![
                json!(["type", "BlockStored"]),
                json!(["block_hashes", hashes(&run)]),
                json!(["parent_block_hash", 7]),
                json!(["token_ids", [1, 2]]),
                json!(["block_size", 2]),
                json!(["lora_id", null]),
                json!(["medium", "GPU"]),
            ];
            expected.extend(salt.map(|salt| json!(["cache_salt", salt])));
            expected.extend(lora_name.map(|name| json!(["lora_name", name])));
            assert_eq!(events, [Json::Array(expected)]);
        }
    }

    #[test]
    fn an_encoder_of_another_page_size_refuses_the_run_and_writes_nothing() {
        let encoder = EventEncoder::new(4).unwrap();
        let mut out = vec![9];
        let event = stored_run(Namespace::DEFAULT, None, vec![1, 2, 3, 4], 2);
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
