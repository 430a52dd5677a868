//! The decoder: an event batch of any [`Dialect`](crate::Dialect) back into its events, as a
//! router reads it.
//!
//! A tagged event is read by field name (unknown names skipped, order free); a positional one
//! by the positional dialect's field order (elements past the last known one skipped), as
//! msgspec reads its structs. A required field that is missing, or a value of the wrong type,
//! makes the batch undecodable, with a [`DecodeError`] that says which.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::dialect::{Dialect, Field};
use crate::error::DecodeError;

/// A decoded event batch.
#[derive(Debug, Clone, PartialEq)]
pub struct EventBatch {
    /// Seconds since the Unix epoch when it was published.
    pub timestamp: f64,
    /// Its events, in order.
    pub events: Vec<BlockEvent>,
    /// The rank (vLLM's `data_parallel_rank`, sglang's `attn_dp_rank`); `None` when absent or
    /// nil.
    pub rank: Option<i64>,
}

impl EventBatch {
    /// Decodes a batch of any dialect.
    pub fn decode(payload: &[u8]) -> Result<EventBatch, DecodeError> {
        Ok(rmp_serde::from_slice(payload)?)
    }
}

/// One decoded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockEvent {
    /// `BlockStored`: a run of blocks entered the cache.
    Stored(StoredBlocks),
    /// `BlockRemoved`: blocks left it.
    Removed(RemovedBlocks),
    /// `AllBlocksCleared`: forget everything of this publisher's cache.
    Cleared,
}

/// A `BlockStored` event: each field as the wire had it, `None` when absent or nil.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBlocks {
    /// The blocks' ids, each the parent of the next (signed ids read as their bits).
    pub block_hashes: Vec<u64>,
    /// The id of the block before the first; `None` when the run starts its key.
    pub parent_block_hash: Option<u64>,
    /// The blocks' tokens.
    pub token_ids: Vec<u32>,
    /// Tokens per block.
    pub block_size: u32,
    /// vLLM's adapter id.
    pub lora_id: Option<i64>,
    /// The storage tier (`"GPU"`).
    pub medium: Option<String>,
    /// The adapter's name.
    pub lora_name: Option<String>,
    /// sglang's top-level cache salt.
    pub cache_salt: Option<String>,
    /// vLLM's per-block extra keys.
    pub extra_keys: Option<Vec<Option<Vec<ExtraKey>>>>,
}

/// A `BlockRemoved` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovedBlocks {
    /// The removed blocks' ids.
    pub block_hashes: Vec<u64>,
    /// The storage tier.
    pub medium: Option<String>,
}

/// One of vLLM's per-block extra keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExtraKey {
    /// A string: an adapter's name or a cache salt.
    Text(String),
    /// Anything else (a multimodal `(identifier, offset)` pair, a prompt-embedding digest):
    /// kvown sends none.
    Other,
}

impl<'de> Deserialize<'de> for EventBatch {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<EventBatch, D::Error> {
        deserializer.deserialize_seq(BatchVisitor)
    }
}

/// `[timestamp, [events...], rank]`, the rank optional (vLLM leaves a nil one out).
struct BatchVisitor;

impl<'de> Visitor<'de> for BatchVisitor {
    type Value = EventBatch;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an event batch [timestamp, [events...], rank]")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<EventBatch, A::Error> {
        let timestamp = seq
            .next_element()?
            .ok_or_else(|| de::Error::invalid_length(0, &self))?;
        let events = seq
            .next_element()?
            .ok_or_else(|| de::Error::invalid_length(1, &self))?;
        let rank = seq.next_element::<Option<i64>>()?.flatten();
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(EventBatch {
            timestamp,
            events,
            rank,
        })
    }
}

impl<'de> Deserialize<'de> for BlockEvent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<BlockEvent, D::Error> {
        deserializer.deserialize_any(EventVisitor)
    }
}

/// A tagged map or a positional array.
struct EventVisitor;

impl<'de> Visitor<'de> for EventVisitor {
    type Value = BlockEvent;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a KV event: a map with a \"type\", or an array starting with its tag")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<BlockEvent, A::Error> {
        let mut tag: Option<String> = None;
        let mut fields = Fields::default();
        while let Some(name) = map.next_key::<String>()? {
            if name == "type" {
                tag = Some(map.next_value()?);
            } else {
                fields.read(&name, &mut FromMap(&mut map))?;
            }
        }
        let tag = tag.ok_or_else(|| de::Error::missing_field("type"))?;
        fields.into_event(&tag)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<BlockEvent, A::Error> {
        let tag: String = seq
            .next_element()?
            .ok_or_else(|| de::Error::invalid_length(0, &self))?;
        // The one positional dialect gives the order.
        let table = Dialect::VllmLegacy.table();
        let order: &[Field] = match tag.as_str() {
            "BlockStored" => table.stored,
            "BlockRemoved" => table.removed,
            _ => &[],
        };
        let mut fields = Fields::default();
        for field in order {
            if !fields.read(field.name, &mut FromSeq(&mut seq))? {
                break;
            }
        }
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        fields.into_event(&tag)
    }
}

/// Where an event's field values come from: a map's values or an array's elements.
trait FieldReader<'de> {
    type Error: de::Error;

    /// The next value; `None` past an array's end.
    fn next<T: Deserialize<'de>>(&mut self) -> Result<Option<T>, Self::Error>;
}

struct FromMap<'a, A>(&'a mut A);

impl<'de, A: MapAccess<'de>> FieldReader<'de> for FromMap<'_, A> {
    type Error = A::Error;

    fn next<T: Deserialize<'de>>(&mut self) -> Result<Option<T>, A::Error> {
        self.0.next_value().map(Some)
    }
}

struct FromSeq<'a, A>(&'a mut A);

impl<'de, A: SeqAccess<'de>> FieldReader<'de> for FromSeq<'_, A> {
    type Error = A::Error;

    fn next<T: Deserialize<'de>>(&mut self) -> Result<Option<T>, A::Error> {
        self.0.next_element()
    }
}

/// The fields read so far, by their wire names.
#[derive(Default)]
struct Fields {
    block_hashes: Option<Vec<BlockId>>,
    parent_block_hash: Option<BlockId>,
    token_ids: Option<Vec<u32>>,
    block_size: Option<u32>,
    lora_id: Option<i64>,
    medium: Option<String>,
    lora_name: Option<String>,
    cache_salt: Option<String>,
    extra_keys: Option<Vec<Option<Vec<WireExtraKey>>>>,
}

impl Fields {
    /// Reads field `name`'s value (skips it when the name is unknown); false when the reader
    /// had none left.
    fn read<'de, R: FieldReader<'de>>(
        &mut self,
        name: &str,
        reader: &mut R,
    ) -> Result<bool, R::Error> {
        /// Stores a value read (nil: `None`); false when there was none.
        fn store<T>(slot: &mut Option<T>, read: Option<Option<T>>) -> bool {
            read.map(|value| *slot = value).is_some()
        }
        Ok(match name {
            "block_hashes" => store(&mut self.block_hashes, reader.next()?.map(Some)),
            "parent_block_hash" => store(&mut self.parent_block_hash, reader.next()?),
            "token_ids" => store(&mut self.token_ids, reader.next()?.map(Some)),
            "block_size" => store(&mut self.block_size, reader.next()?.map(Some)),
            "lora_id" => store(&mut self.lora_id, reader.next()?),
            "medium" => store(&mut self.medium, reader.next()?),
            "lora_name" => store(&mut self.lora_name, reader.next()?),
            "cache_salt" => store(&mut self.cache_salt, reader.next()?),
            "extra_keys" => store(&mut self.extra_keys, reader.next()?),
            _ => reader.next::<IgnoredAny>()?.is_some(),
        })
    }

    /// The event tagged `tag`, from the fields read.
    fn into_event<E: de::Error>(self, tag: &str) -> Result<BlockEvent, E> {
        let ids = |ids: Vec<BlockId>| ids.into_iter().map(|id| id.0).collect();
        match tag {
            "BlockStored" => Ok(BlockEvent::Stored(StoredBlocks {
                block_hashes: ids(required(self.block_hashes, "block_hashes")?),
                parent_block_hash: self.parent_block_hash.map(|id| id.0),
                token_ids: required(self.token_ids, "token_ids")?,
                block_size: required(self.block_size, "block_size")?,
                lora_id: self.lora_id,
                medium: self.medium,
                lora_name: self.lora_name,
                cache_salt: self.cache_salt,
                extra_keys: self.extra_keys.map(|blocks| {
                    blocks
                        .into_iter()
                        .map(|keys| keys.map(|keys| keys.into_iter().map(ExtraKey::from).collect()))
                        .collect()
                }),
            })),
            "BlockRemoved" => Ok(BlockEvent::Removed(RemovedBlocks {
                block_hashes: ids(required(self.block_hashes, "block_hashes")?),
                medium: self.medium,
            })),
            "AllBlocksCleared" => Ok(BlockEvent::Cleared),
            other => Err(de::Error::unknown_variant(
                other,
                &["BlockStored", "BlockRemoved", "AllBlocksCleared"],
            )),
        }
    }
}

/// A field the event cannot go without.
fn required<T, E: de::Error>(value: Option<T>, name: &'static str) -> Result<T, E> {
    value.ok_or_else(|| de::Error::missing_field(name))
}

/// A block id: unsigned (kvown, vLLM) or signed (sglang's int64 ids), kept as its bits.
struct BlockId(u64);

impl<'de> Deserialize<'de> for BlockId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<BlockId, D::Error> {
        struct BlockIdVisitor;
        impl Visitor<'_> for BlockIdVisitor {
            type Value = BlockId;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a 64-bit block id")
            }
            fn visit_u64<E: de::Error>(self, id: u64) -> Result<BlockId, E> {
                Ok(BlockId(id))
            }
            fn visit_i64<E: de::Error>(self, id: i64) -> Result<BlockId, E> {
                Ok(BlockId(id.cast_unsigned()))
            }
        }
        deserializer.deserialize_any(BlockIdVisitor)
    }
}

/// An extra key as read: a string, or anything else.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum WireExtraKey {
    Text(String),
    Other(IgnoredAny),
}

impl From<WireExtraKey> for ExtraKey {
    fn from(key: WireExtraKey) -> ExtraKey {
        match key {
            WireExtraKey::Text(text) => ExtraKey::Text(text),
            WireExtraKey::Other(_) => ExtraKey::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde::Serialize;

    use super::*;

    fn packed(value: &impl Serialize) -> Vec<u8> {
        rmp_serde::to_vec(value).unwrap()
    }

    #[test]
    fn a_tagged_event_is_read_by_name_in_any_order_skipping_unknown_fields() {
        let event = serde_json::json!({
            "medium": "GPU",
            "token_ids": [1, 2],
            "session_id": "s",
            "type": "BlockStored",
            "block_size": 2,
            "block_hashes": [-1],
            "cache_salt": "tenant",
            "extra_keys": [["adapter", ["mm", 3]]],
        });
        let batch = EventBatch::decode(&packed(&(1.5, [event]))).unwrap();
        assert_eq!(batch.rank, None, "vLLM leaves a nil rank out");
        assert_eq!(
            batch.events,
            [BlockEvent::Stored(StoredBlocks {
                block_hashes: vec![u64::MAX],
                parent_block_hash: None,
                token_ids: vec![1, 2],
                block_size: 2,
                lora_id: None,
                medium: Some("GPU".to_owned()),
                lora_name: None,
                cache_salt: Some("tenant".to_owned()),
                extra_keys: Some(vec![Some(vec![
                    ExtraKey::Text("adapter".to_owned()),
                    ExtraKey::Other
                ])]),
            })]
        );
    }

    #[test]
    fn a_positional_event_may_end_early_or_run_past_the_known_fields() {
        let short = ("BlockStored", [7u64], None::<u64>, [1u32, 2], 2, 4, "GPU");
        let long = ("BlockRemoved", [7u64], "GPU", 0, "full", 12);
        let batch =
            EventBatch::decode(&packed(&(0.0, (short, long, ("AllBlocksCleared",)), 2))).unwrap();
        assert_eq!(batch.rank, Some(2));
        let BlockEvent::Stored(stored) = &batch.events[0] else {
            panic!("{batch:?}");
        };
        assert_eq!(
            (stored.lora_id, stored.lora_name.as_deref()),
            (Some(4), None)
        );
        assert_eq!(
            batch.events[1..],
            [
                BlockEvent::Removed(RemovedBlocks {
                    block_hashes: vec![7],
                    medium: Some("GPU".to_owned())
                }),
                BlockEvent::Cleared
            ]
        );
    }

    #[test]
    fn what_no_dialect_sends_is_refused_with_the_reason() {
        let cases: [(Vec<u8>, &str); 5] = [
            (vec![0xc1], "marker Reserved"),
            (packed(&(0.0,)), "invalid length 1"),
            (
                packed(&(0.0, [("BlockMoved", [1u64])])),
                "unknown variant `BlockMoved`",
            ),
            (
                packed(&(
                    0.0,
                    [serde_json::json!({"type": "BlockStored", "block_hashes": []})],
                )),
                "missing field `token_ids`",
            ),
            (
                packed(&(0.0, [("BlockRemoved", "not a list")])),
                "invalid type",
            ),
        ];
        for (payload, reason) in cases {
            let error = EventBatch::decode(&payload).unwrap_err();
            assert!(error.reason.contains(reason), "{error} lacks {reason:?}");
            assert!(error.to_string().starts_with("undecodable KV-event batch"));
        }
    }
}
