//! The wire dialects: which engine's KV-event format a stream speaks. A dialect is a table (the
//! events' form, each event's fields in order with where their value comes from, and the replay
//! framing); the one encoder and the one decoder read it.
//!
//! The facts come from the engines' own event classes (`vllm/distributed/kv_events.py`,
//! `sglang/srt/disaggregation/kv_events.py`: msgspec structs with `tag=True`, `array_like` or
//! not, `omit_defaults`) and from their publishers' `_service_replay`.

use std::fmt;
use std::str::FromStr;

use crate::error::UnknownDialect;

/// A KV-event wire format, chosen by the consumer the stream is for. Every dialect sends the
/// batch `[timestamp, [events...], rank]` with the rank filled, and `BlockStored`,
/// `BlockRemoved` and `AllBlocksCleared` events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Dialect {
    /// vLLM's current form (the default): events are tagged maps (`{"type": "BlockStored",
    /// ..}`), namespaces travel as `lora_id` / `lora_name` and, for salts, in `extra_keys`;
    /// replay replies carry the topic frame. Its events decode in vLLM 0.24 to 0.34; its replay
    /// replies are vLLM 0.26 to 0.34's (0.24 and 0.25 reply without the topic frame).
    #[default]
    Vllm,
    /// vLLM's positional form (`["BlockStored", ..]`), replay replies without the topic frame:
    /// vLLM 0.11 to 0.23, and sglang 0.5.15 to 0.5.19. Namespaces travel as `lora_id` (vLLM
    /// 0.11 on), `lora_name` (0.14 on) and salts in `extra_keys` (0.17 on); sglang reads
    /// `lora_id` only.
    VllmLegacy,
    /// sglang's current form: tagged maps with `cache_salt` and `lora_name` at the top level of
    /// `BlockStored` (`lora_id` nil, as sglang sends it), the rank being sglang's
    /// `attn_dp_rank`; replay replies carry the topic frame. Its events decode in sglang 0.5.20
    /// to 0.5.23 (`lora_name` is a field from 0.5.22); its replay replies are 0.5.22 and
    /// 0.5.23's.
    Sglang,
}

impl Dialect {
    /// Every dialect.
    pub const ALL: [Dialect; 3] = [Dialect::Vllm, Dialect::VllmLegacy, Dialect::Sglang];

    /// Its name: `vllm`, `vllm-legacy` or `sglang`.
    pub fn name(self) -> &'static str {
        self.table().name
    }

    /// Whether a replay reply carries the topic frame before the sequence number
    /// (`[topic, seq, payload]`, the end `["", -1, ""]`) or not (`[seq, payload]`, the end
    /// `[-1, ""]`).
    pub fn replay_topic_frame(self) -> bool {
        self.table().replay_topic_frame
    }

    pub(crate) fn table(self) -> &'static DialectTable {
        match self {
            Dialect::Vllm => &VLLM,
            Dialect::VllmLegacy => &VLLM_LEGACY,
            Dialect::Sglang => &SGLANG,
        }
    }
}

impl fmt::Display for Dialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Dialect {
    type Err = UnknownDialect;

    /// Parses a dialect's [`Dialect::name`].
    fn from_str(name: &str) -> Result<Dialect, UnknownDialect> {
        Dialect::ALL
            .into_iter()
            .find(|dialect| dialect.name() == name)
            .ok_or_else(|| UnknownDialect {
                name: name.to_owned(),
            })
    }
}

/// How a dialect lays out an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventForm {
    /// A map from field name to value, the tag under `"type"` first (msgspec `tag=True`).
    Tagged,
    /// An array, the tag first, then the fields in order (msgspec `tag=True, array_like=True`).
    Positional,
}

/// Where a field's value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The hashes of the pages the event names.
    BlockHashes,
    /// The hash of the page before a stored run; nil when the run starts its key.
    ParentBlockHash,
    /// A stored run's tokens.
    TokenIds,
    /// The page size.
    BlockSize,
    /// The namespace's number when it is labelled as an adapter (vLLM's `lora_id`, the
    /// adapter's id); nil otherwise.
    AdapterId,
    /// Always nil: a field the engine declares without a default but kvown has no value for.
    Nil,
    /// [`crate::MEDIUM`].
    Medium,
    /// The namespace's label when it is an adapter's name.
    LoraName,
    /// The namespace's label when it is a cache salt.
    CacheSalt,
    /// vLLM's per-block `extra_keys`: the adapter's name on every page, a salt on the first
    /// page of its key only; nil when no page has any.
    ExtraKeys,
}

/// One field of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Field {
    /// Its name on the wire (a map key; the position's name in an array).
    pub name: &'static str,
    /// Its value.
    pub source: Source,
    /// Left out when nil (the engine's field has a default and `omit_defaults` drops it; in an
    /// array only trailing ones can go).
    pub optional: bool,
}

/// A dialect's description.
#[derive(Debug)]
pub(crate) struct DialectTable {
    /// Its name.
    pub name: &'static str,
    /// Maps or arrays.
    pub form: EventForm,
    /// `BlockStored`'s fields, in the engine's order.
    pub stored: &'static [Field],
    /// `BlockRemoved`'s fields, in the engine's order.
    pub removed: &'static [Field],
    /// Whether replay replies carry the topic frame.
    pub replay_topic_frame: bool,
}

const fn required(name: &'static str, source: Source) -> Field {
    Field {
        name,
        source,
        optional: false,
    }
}

const fn optional(name: &'static str, source: Source) -> Field {
    Field {
        name,
        source,
        optional: true,
    }
}

/// vLLM's `BlockStored`: the fields up to `lora_name` have no default (always sent), the rest
/// do (vLLM's `extra_keys`; kvown sends none of the later ones).
const VLLM_STORED: &[Field] = &[
    required("block_hashes", Source::BlockHashes),
    required("parent_block_hash", Source::ParentBlockHash),
    required("token_ids", Source::TokenIds),
    required("block_size", Source::BlockSize),
    required("lora_id", Source::AdapterId),
    required("medium", Source::Medium),
    required("lora_name", Source::LoraName),
    optional("extra_keys", Source::ExtraKeys),
];

/// `BlockRemoved`, the same in every dialect.
const REMOVED: &[Field] = &[
    required("block_hashes", Source::BlockHashes),
    required("medium", Source::Medium),
];

static VLLM: DialectTable = DialectTable {
    name: "vllm",
    form: EventForm::Tagged,
    stored: VLLM_STORED,
    removed: REMOVED,
    replay_topic_frame: true,
};

static VLLM_LEGACY: DialectTable = DialectTable {
    name: "vllm-legacy",
    form: EventForm::Positional,
    stored: VLLM_STORED,
    removed: REMOVED,
    replay_topic_frame: false,
};

/// sglang's `BlockStored` (0.5.22 on): `lora_id` without a default but always nil, then
/// defaults: `medium`, `cache_salt`, `session_id` (never sent), `lora_name`.
static SGLANG: DialectTable = DialectTable {
    name: "sglang",
    form: EventForm::Tagged,
    stored: &[
        required("block_hashes", Source::BlockHashes),
        required("parent_block_hash", Source::ParentBlockHash),
        required("token_ids", Source::TokenIds),
        required("block_size", Source::BlockSize),
        required("lora_id", Source::Nil),
        optional("medium", Source::Medium),
        optional("cache_salt", Source::CacheSalt),
        optional("lora_name", Source::LoraName),
    ],
    removed: REMOVED,
    replay_topic_frame: true,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dialect_parses_from_its_name_and_nothing_else() {
        for dialect in Dialect::ALL {
            assert_eq!(dialect.name().parse::<Dialect>().unwrap(), dialect);
            assert_eq!(dialect.to_string(), dialect.name());
        }
        let error = "vllm_legacy".parse::<Dialect>().unwrap_err();
        assert_eq!(error.name, "vllm_legacy");
        assert!(error.to_string().contains("vllm-legacy"), "{error}");
        assert_eq!(Dialect::default(), Dialect::Vllm);
    }
}
