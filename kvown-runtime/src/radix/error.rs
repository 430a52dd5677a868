//! Errors of the radix prefix cache.

use super::Namespace;
use super::node::NodeId;
use crate::alloc::AllocError;
use crate::shared_error::PageSizeMismatch;

/// Why a radix-cache call was refused. A refused call leaves the tree unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RadixError {
    /// An inserted key must cover whole pages.
    #[error(
        "key of {len} tokens is not a multiple of the page size {page_size}; \
         insert floor_align(len, page_size) tokens and keep the tail in the request"
    )]
    UnalignedKey {
        /// Tokens in the key.
        len: usize,
        /// The cache's page size.
        page_size: usize,
    },
    /// A key longer than the tree can address.
    #[error("key of {len} tokens exceeds the radix tree's limit of {max} tokens")]
    KeyTooLong {
        /// Tokens in the key.
        len: usize,
        /// Longest supported key.
        max: usize,
    },
    /// Keys and slots are parallel: one slot per key token.
    #[error("{slots} slots for a key of {key} tokens; pass exactly one slot per key token")]
    LengthMismatch {
        /// Tokens in the key.
        key: usize,
        /// Slots passed.
        slots: usize,
    },
    /// A copy of a path's slots must start on the path.
    #[error(
        "copy starts at position {start}, past the end {end} of the path it reads; \
         start at or before the position's length"
    )]
    StartPastEnd {
        /// The first position asked for.
        start: usize,
        /// The path's length (the position's `len`).
        end: usize,
    },
    /// With page size > 1 the tree stores whole pages, so each page must start aligned.
    #[error(
        "slot {slot} at key position {position} starts a page but is not a multiple of the \
         page size {page_size}; pass the request's row, whose pages are whole"
    )]
    MisalignedPage {
        /// Key position of the page's first token.
        position: usize,
        /// The slot found there.
        slot: u32,
        /// The cache's page size.
        page_size: usize,
    },
    /// With page size > 1 a page's slots must be consecutive.
    #[error(
        "slot {found} at key position {position} breaks its page: expected slot {expected}; \
         pass the request's row, whose pages are whole"
    )]
    BrokenPage {
        /// Key position of the offending slot.
        position: usize,
        /// The slot found there.
        found: u32,
        /// The slot the page requires there.
        expected: u32,
    },
    /// An insert may hand the tree only pages it does not hold yet.
    #[error(
        "page {page} at key position {position} is already cached; insert only pages that are \
         the caller's own (allocated and not yet handed to the tree)"
    )]
    PageCached {
        /// Key position of the page's first token.
        position: usize,
        /// The page id.
        page: u32,
    },
    /// An insert may name each page it hands the tree once.
    #[error(
        "page {page} is named twice in one insert, at key positions {first} and {second}; \
         each page holds the KV of one key page"
    )]
    PageRepeated {
        /// Key position of the page's first use.
        first: usize,
        /// Key position of its second use.
        second: usize,
        /// The page id.
        page: u32,
    },
    /// The handle names no node in the tree: never created, or already evicted.
    #[error("node {node} is not in the radix tree (evicted, or not from this cache)")]
    UnknownNode {
        /// The handle passed.
        node: NodeId,
    },
    /// An insert checked against an allocator ([`Insert::allocated_in`](super::Insert::allocated_in))
    /// was given a page the allocator does not hold as allocated.
    #[error(
        "the page at key position {position} (page {page}) is {} in the allocator, not \
         allocated: insert only pages the allocator handed out and nobody freed",
        match .state { Some(state) => format!("{state:?}"), None => "beyond the last page".to_owned() }
    )]
    PageNotAllocated {
        /// Key position of the page's first token.
        position: usize,
        /// The page.
        page: crate::ids::PageId,
        /// Its state in the allocator (`None` past its last page).
        state: Option<crate::alloc::PageState>,
    },
    /// A node already counts as many locks as its counter holds; another would wrap it and
    /// turn locked tokens evictable.
    #[error(
        "node {node} already counts {locks} locks, the most a node can hold: release \
         (dec_lock_ref) locks that are no longer needed before taking another"
    )]
    LockLimit {
        /// The deepest node of the path at the limit (its ancestors count at least as many).
        node: NodeId,
        /// Its lock count.
        locks: u32,
    },
    /// More unlocks of a node than locks taken on it.
    #[error(
        "dec_lock_ref on node {node}, on which no lock was taken (its descendants' locks are \
         theirs to release); pair every dec_lock_ref with an earlier inc_lock_ref on the same \
         node"
    )]
    LockUnderflow {
        /// The node passed.
        node: NodeId,
    },
    /// An insert continued from a node of another namespace than its own.
    #[error(
        "insert in {namespace} from node {node}, which is in {node_namespace}: continue a \
         namespace's prefix with a key of that namespace (namespace.key(..))"
    )]
    NamespaceMismatch {
        /// The node the insert continued from.
        node: NodeId,
        /// That node's namespace.
        node_namespace: Namespace,
        /// The insert's namespace.
        namespace: Namespace,
    },
    /// An insert hint must be locked, so that nobody evicts or extends it meanwhile.
    #[error("insert hint node {node} is not locked; inc_lock_ref it before inserting from it")]
    HintNotLocked {
        /// The hint node.
        node: NodeId,
    },
    /// An insert hint's length must lie on the hint node's path and within the key.
    #[error(
        "hint length {len} does not fit: node {node} ends at {node_end}, the key has \
         {key_len} tokens (page size {page_size})"
    )]
    HintOutOfRange {
        /// The hint node.
        node: NodeId,
        /// The hinted prefix length.
        len: usize,
        /// Where the hint node's key ends.
        node_end: usize,
        /// Tokens in the key.
        key_len: usize,
        /// The cache's page size.
        page_size: usize,
    },
    /// A page holds at least one slot.
    #[error("radix cache page size 0; pass the allocator's page size (at least 1)")]
    ZeroPageSize,
    /// A page size no allocator has: page 1 would end past the `u32` slot range.
    #[error(
        "radix cache page size {page_size} exceeds {max}, the largest an allocator can have \
         (page 1 must end within the u32 slot range); pass the allocator's page size"
    )]
    PageSizeTooLarge {
        /// The page size passed.
        page_size: usize,
        /// The largest page size.
        max: usize,
    },
    /// The allocator must use the cache's page size.
    #[error(transparent)]
    PageSizeMismatch(PageSizeMismatch),
    /// The allocator refused to free the pages of a node an eviction chose. Eviction frees node
    /// by node (sglang `RadixCache.evict`): the nodes freed before the refused one are evicted (`evicted`
    /// tokens, often none), the others stay cached.
    #[error(
        "eviction refused: the allocator did not free the pages of a node among the {tokens} \
         tokens chosen; {evicted} tokens were evicted before it, the rest stay cached: \
         {source}. A page the tree holds but the allocator does not was inserted without being \
         allocated (an insert with allocated_in refuses such a page; PageLedger names its node)"
    )]
    Free {
        /// Tokens the eviction chose.
        tokens: usize,
        /// Tokens evicted before the refusal.
        evicted: usize,
        /// The allocator's reason.
        source: AllocError,
    },
    /// [`check_radix`](crate::check::check_radix) found bookkeeping that disagrees with the tree.
    #[error("radix invariant broken at node {node}: {what}: expected {expected}, found {found}")]
    Inconsistent {
        /// The node where the disagreement was found.
        node: NodeId,
        /// Which invariant.
        what: &'static str,
        /// The value the tree implies.
        expected: usize,
        /// The value stored.
        found: usize,
    },
}

impl RadixError {
    /// `Ok` when `expected == found`, else [`RadixError::Inconsistent`] at `node` naming the
    /// invariant `what`: the comparison of the radix checkers.
    pub(crate) fn expect_eq(
        node: NodeId,
        what: &'static str,
        expected: usize,
        found: usize,
    ) -> Result<(), RadixError> {
        if expected == found {
            Ok(())
        } else {
            Err(RadixError::Inconsistent {
                node,
                what,
                expected,
                found,
            })
        }
    }
}
