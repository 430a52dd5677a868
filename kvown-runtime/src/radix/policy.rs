//! Eviction policies: the order in which an eviction takes the unlocked leaves (sglang's
//! eviction strategies, `mem_cache/evict_policy.py`), and the per-node figures they read.

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

    /// The sort key of a candidate with access time `last_access` and `stats`: candidates are
    /// evicted in increasing order.
    #[inline]
    pub(super) fn rank(self, last_access: u64, stats: &NodeStats) -> Rank {
        match self {
            EvictionPolicy::Lru => (0, last_access),
            EvictionPolicy::Lfu => (u64::from(stats.hits), last_access),
            EvictionPolicy::Fifo => (0, stats.created),
            EvictionPolicy::Mru => (0, !last_access),
            EvictionPolicy::Filo => (0, !stats.created),
            // Flipping the sign bit maps i32's order onto u32's.
            EvictionPolicy::Priority => (u64::from(stats.priority as u32 ^ 1 << 31), last_access),
            EvictionPolicy::Slru => (u64::from(stats.hits >= SLRU_PROTECTED_HITS), last_access),
        }
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

/// Sort key of an eviction candidate (see [`EvictionPolicy::rank`]).
pub(super) type Rank = (u64, u64);

/// What the policies read of a node besides its access time (kept beside the node table, so
/// that the nodes stay 72 bytes).
///
/// An insert records them at the node where it ends, and a removed leaf passes its own on to
/// its parent ([`NodeStats::absorb`]), so that a leaf, the only node ever evicted, carries the
/// hits and the priority of every insert through it (`docs/design.md`: eviction figures per
/// node, not per path).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct NodeStats {
    /// Logical time at which the node was made: an insert's new leaf, or the upper part of a
    /// split, which is a new node (sglang `_split_node`).
    pub(super) created: u64,
    /// Inserts of finished requests that ended at the node, plus those of its removed children
    /// (kept only under a policy that reads it: [`EvictionPolicy::reads_insert_figures`]).
    pub(super) hits: u32,
    /// Highest priority of an insert that ended at the node or at a removed child (kept as
    /// `hits` is).
    pub(super) priority: i32,
}

impl NodeStats {
    /// Figures of a node first cached at `created`, before the insert that made it is
    /// recorded: no hits, and the lowest priority, so that the node takes the insert's, however
    /// low.
    pub(super) fn new(created: u64) -> NodeStats {
        NodeStats {
            created,
            hits: 0,
            priority: i32::MIN,
        }
    }

    /// The upper part cut at `now` from a node with these figures (sglang `_split_node`): a
    /// new node, created `now`, at the node's priority, and with no hits of its own (the node
    /// keeps them and passes them on when it is removed; `docs/design.md` compares).
    pub(super) fn split_upper(&self, now: u64) -> NodeStats {
        NodeStats {
            created: now,
            hits: 0,
            priority: self.priority,
        }
    }

    /// Records an insert of `params` that ended at the node.
    #[inline]
    pub(super) fn record(&mut self, params: InsertParams) {
        self.hits = self.hits.saturating_add(u32::from(!params.chunked));
        self.priority = self.priority.max(params.priority);
    }

    /// Takes on the figures of a removed child.
    pub(super) fn absorb(&mut self, child: &NodeStats) {
        self.hits = self.hits.saturating_add(child.hits);
        self.priority = self.priority.max(child.priority);
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

    #[test]
    fn ranks_order_candidates_as_each_policy_says() {
        let at = |created, hits, priority| NodeStats {
            created,
            hits,
            priority,
        };
        // (access time, stats): `old` was created and used first, `new` later; `new` has more
        // hits, `old` a higher priority.
        let old = (10, at(1, 1, 5));
        let new = (20, at(2, 3, -5));
        let first = |policy: EvictionPolicy| {
            if policy.rank(old.0, &old.1) < policy.rank(new.0, &new.1) {
                "old"
            } else {
                "new"
            }
        };
        let expected = [
            (EvictionPolicy::Lru, "old"),
            (EvictionPolicy::Lfu, "old"),
            (EvictionPolicy::Fifo, "old"),
            (EvictionPolicy::Mru, "new"),
            (EvictionPolicy::Filo, "new"),
            (EvictionPolicy::Priority, "new"),
            (EvictionPolicy::Slru, "old"),
        ];
        for (policy, goes_first) in expected {
            assert_eq!(first(policy), goes_first, "{policy}");
        }
        // SLRU: a newer node below the threshold still goes first; above it, hits no longer
        // count (where LFU keeps counting them).
        let probation = (30, at(3, SLRU_PROTECTED_HITS - 1, 0));
        let protected = (6, at(0, SLRU_PROTECTED_HITS, 0));
        let (slru, lfu) = (EvictionPolicy::Slru, EvictionPolicy::Lfu);
        assert!(slru.rank(probation.0, &probation.1) < slru.rank(protected.0, &protected.1));
        let hot = (5, at(0, SLRU_PROTECTED_HITS + 5, 0));
        assert!(slru.rank(hot.0, &hot.1) < slru.rank(protected.0, &protected.1));
        assert!(lfu.rank(protected.0, &protected.1) < lfu.rank(hot.0, &hot.1));
        // Priorities compare as signed numbers.
        let low = at(0, 0, i32::MIN);
        let high = at(0, 0, i32::MAX);
        let priority = EvictionPolicy::Priority;
        assert!(priority.rank(9, &low) < priority.rank(1, &at(0, 0, -1)));
        assert!(priority.rank(9, &at(0, 0, 0)) < priority.rank(1, &high));
    }

    #[test]
    fn inserts_count_hits_unless_chunked_and_keep_the_highest_priority() {
        let mut stats = NodeStats::new(7);
        stats.record(InsertParams {
            priority: 3,
            chunked: true,
        });
        assert_eq!((stats.created, stats.hits, stats.priority), (7, 0, 3));
        stats.record(InsertParams {
            priority: -1,
            chunked: false,
        });
        assert_eq!((stats.hits, stats.priority), (1, 3));
        let upper = stats.split_upper(9);
        assert_eq!((upper.created, upper.hits, upper.priority), (9, 0, 3));
        let mut parent = NodeStats::new(1);
        parent.record(InsertParams::default());
        parent.absorb(&stats);
        let mut other_child = NodeStats::new(2);
        other_child.record(InsertParams {
            priority: 9,
            chunked: false,
        });
        parent.absorb(&other_child);
        assert_eq!((parent.created, parent.hits, parent.priority), (1, 3, 9));
        let mut saturated = NodeStats {
            hits: u32::MAX,
            ..NodeStats::default()
        };
        saturated.record(InsertParams::default());
        saturated.absorb(&parent);
        assert_eq!(saturated.hits, u32::MAX);
    }
}
