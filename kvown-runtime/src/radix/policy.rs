//! Eviction policies: the order in which an eviction takes the unlocked leaves (sglang's
//! eviction strategies, `mem_cache/evict_policy.py`), and what an insert records for
//! them.

use std::fmt;
use std::str::FromStr;

/// Which evictable leaf an eviction takes first (sglang `--radix-eviction-policy`). Only
/// unlocked leaves are ever evicted; ties go to the older node handle.
///
/// The figures a policy reads are kept per node: the logical time of the last match or insert
/// that reached it, the time its first page was cached, the hits (inserts of finished requests)
/// through it and the highest priority of an insert through it.
///
/// ```
/// use kvown_runtime::radix::EvictionPolicy;
///
/// let policy: EvictionPolicy = "lfu".parse().unwrap();
/// assert_eq!(policy, EvictionPolicy::Lfu);
/// assert_eq!(policy.to_string(), "lfu");
/// assert_eq!(EvictionPolicy::default(), EvictionPolicy::Lru);
/// assert!("lifo".parse::<EvictionPolicy>().is_err());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum EvictionPolicy {
    /// Least recently used first (the default, as in sglang).
    #[default]
    Lru,
    /// Fewest hits first, then least recently used.
    Lfu,
    /// Oldest first: the leaf whose first page was cached earliest.
    Fifo,
    /// Most recently used first.
    Mru,
    /// Newest first: the leaf whose first page was cached last.
    Filo,
    /// Lowest insert priority first ([`crate::batch::Req::with_priority`]), then least
    /// recently used.
    Priority,
    /// Segmented LRU: leaves with fewer than [`SLRU_PROTECTED_HITS`] hits (the probationary
    /// segment) before the others, least recently used first within each.
    Slru,
}

/// Hits from which a node is in SLRU's protected segment (sglang's `protected_threshold`).
pub const SLRU_PROTECTED_HITS: u32 = 2;

impl EvictionPolicy {
    /// Every policy, in the spec's order.
    pub const ALL: [EvictionPolicy; 7] = [
        EvictionPolicy::Lru,
        EvictionPolicy::Lfu,
        EvictionPolicy::Fifo,
        EvictionPolicy::Mru,
        EvictionPolicy::Filo,
        EvictionPolicy::Priority,
        EvictionPolicy::Slru,
    ];

    /// The policy's name, as sglang spells it and as [`FromStr`] reads it.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::radix::EvictionPolicy;
    /// assert_eq!(EvictionPolicy::Lfu.name(), "lfu");
    /// assert_eq!("lfu".parse::<EvictionPolicy>().ok(), Some(EvictionPolicy::Lfu));
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            EvictionPolicy::Lru => "lru",
            EvictionPolicy::Lfu => "lfu",
            EvictionPolicy::Fifo => "fifo",
            EvictionPolicy::Mru => "mru",
            EvictionPolicy::Filo => "filo",
            EvictionPolicy::Priority => "priority",
            EvictionPolicy::Slru => "slru",
        }
    }

    /// Whether the policy reads the hits and priorities that inserts record (the others need
    /// not record them).
    #[inline]
    pub(super) fn reads_insert_figures(self) -> bool {
        matches!(
            self,
            EvictionPolicy::Lfu | EvictionPolicy::Priority | EvictionPolicy::Slru
        )
    }
}

impl fmt::Display for EvictionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name [`EvictionPolicy`]'s [`FromStr`] does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown eviction policy {name:?}: expected one of lru, lfu, fifo, mru, filo, priority, slru"
)]
pub struct UnknownEvictionPolicy {
    /// The name given.
    pub name: String,
}

impl FromStr for EvictionPolicy {
    type Err = UnknownEvictionPolicy;

    /// Reads a policy by its [`EvictionPolicy::name`], in any letter case.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        EvictionPolicy::ALL
            .into_iter()
            .find(|policy| policy.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| UnknownEvictionPolicy {
                name: name.to_owned(),
            })
    }
}

/// How an insert counts for eviction (sglang `InsertParams`' `priority` and `chunked`). The
/// default, priority 0 and not chunked, is what an [`Insert`](super::Insert) records unless
/// given others ([`Insert::params`](super::Insert::params)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InsertParams {
    /// Raised into the nodes of the key's path (each keeps the highest it has seen);
    /// [`EvictionPolicy::Priority`] evicts lower priorities first.
    pub priority: i32,
    /// A running request registering what it has computed so far (a chunk of a chunked
    /// prefill, or a page filled by decoding): not a hit for [`EvictionPolicy::Lfu`] and
    /// [`EvictionPolicy::Slru`]. The insert of a finished request is a hit.
    pub chunked: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_back_in_any_case_and_unknown_ones_are_refused_by_name() {
        for policy in EvictionPolicy::ALL {
            assert_eq!(policy.name().parse(), Ok(policy));
            assert_eq!(policy.name().to_uppercase().parse(), Ok(policy));
        }
        let error = "random".parse::<EvictionPolicy>().unwrap_err();
        assert_eq!(error.name, "random");
        assert!(error.to_string().contains("\"random\""), "{error}");
    }
}
