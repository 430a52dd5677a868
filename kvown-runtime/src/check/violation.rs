//! What the checkers report: [`Violation`], a broken invariant of a cache as a whole, and
//! [`Holder`], who holds a page.

use crate::alloc::{InvariantViolation, KvSlot, PageId};
use crate::ids::CacheId;
use crate::radix::{Namespace, NodeId, RadixError};
use crate::shared_error::PageOutOfRange;
use crate::slots::ReqRow;

use super::radix::{LockMismatch, PrefixPart};

/// Who holds a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// The allocator's free (or release) list.
    Free,
    /// The prefix cache, in this node.
    Tree(NodeId),
    /// A request's own range `[cache_protected_len, ceil_align(kv_allocated_len))`, by its
    /// id (or, for a [`PageLedger`](super::PageLedger), whatever id its caller gives the holder).
    Request(u64),
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holder::Free => f.write_str("the allocator's free list"),
            Holder::Tree(node) => write!(f, "prefix-cache node {node}"),
            Holder::Request(rid) => write!(f, "request {rid}"),
        }
    }
}

/// A broken invariant: a bug in kvown, a misuse of its internals, or (the leaks
/// [`Violation::UnclaimedRow`] and [`Violation::LockCount`]) a request dropped while it held KV
/// or a prefix lock, or left out of the requests passed to the check;
/// [`reclaim_leaks`](super::reclaim_leaks) gives such leaks back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// The allocator's own check failed.
    #[error("allocator: {0}")]
    Allocator(#[from] InvariantViolation),
    /// The prefix cache's own check failed.
    #[error("prefix cache: {0}")]
    Radix(#[from] RadixError),
    /// The check ran inside a free group, where frees are deferred and counts are in flux.
    #[error("checked inside an open free group; end the group first")]
    OpenFreeGroup,
    /// A request's record of the cache it holds KV in is wrong: it holds a row or a prefix
    /// lock but does not name this cache, or names a cache while it holds nothing.
    #[error(
        "request {rid}: holds a row or a prefix lock: {holds}, but its record names cache {recorded:?}"
    )]
    CacheRecord {
        /// The request.
        rid: u64,
        /// Whether it holds a row or a prefix lock.
        holds: bool,
        /// The cache its record names.
        recorded: Option<CacheId>,
    },
    /// `0 <= protected <= committed <= allocated <= width` does not hold.
    #[error(
        "request {rid}: ladder broken: protected {protected}, committed {committed}, allocated \
         {allocated}, row width {width}"
    )]
    Ladder {
        /// The request.
        rid: u64,
        /// `cache_protected_len`.
        protected: usize,
        /// `kv_committed_len`.
        committed: usize,
        /// `kv_allocated_len`.
        allocated: usize,
        /// Row width.
        width: usize,
    },
    /// `cache_protected_len` differs from the length of the prefix the request's lock keeps in
    /// the prefix cache (0 without a lock): the protected range would not be cached, or a
    /// locked prefix not counted as protected.
    #[error(
        "request {rid}: protected length {protected} differs from the {locked} tokens its prefix \
         lock covers"
    )]
    ProtectedNotLocked {
        /// The request.
        rid: u64,
        /// `cache_protected_len`.
        protected: usize,
        /// Length of the locked prefix (0 without a lock).
        locked: usize,
    },
    /// `cache_protected_len` is not page-aligned.
    #[error(
        "request {rid}: protected length {protected} is not a multiple of page size {page_size}"
    )]
    UnalignedProtected {
        /// The request.
        rid: u64,
        /// `cache_protected_len`.
        protected: usize,
        /// Page size.
        page_size: usize,
    },
    /// A row is held in the request pool but no request passed to the check holds it: the
    /// request it was assigned to was dropped (or lost) without `release_kv_cache`, leaking the
    /// row and its pages.
    #[error(
        "row {row} is held in the request pool but no request passed to the check holds it \
         ({}); {unclaimed_pages} pages are held by no one. A request dropped without \
         release_kv_cache leaks its row and its pages; reclaim_leaks gives them back",
        match .assigned_to { Some(rid) => format!("it was assigned to request {rid}"), None => "assigned outside the batch flow".to_owned() }
    )]
    UnclaimedRow {
        /// The row.
        row: usize,
        /// The request the batch flow assigned it to.
        assigned_to: Option<u64>,
        /// Pages the allocator counts as held that neither a request passed to the check nor
        /// the prefix cache holds.
        unclaimed_pages: usize,
    },
    /// Pages the allocator counts as held that neither the prefix cache nor a request passed to
    /// the check holds, while every held row is accounted for: a free the allocator reported
    /// done but lost ([`reclaim_leaks`](super::reclaim_leaks) gives them back), or a
    /// row naming one page at two page positions (the request's count of owned slots then
    /// includes them, so a reclaim refuses until that request is released).
    #[error(
        "{count} pages are allocated but held by no one (the first: page {first}): a free the \
         allocator reported done but lost (reclaim_leaks gives them back), or a row naming one \
         page at two page positions (release that request, then reclaim_leaks)"
    )]
    UnclaimedPages {
        /// The lowest such page.
        first: PageId,
        /// How many there are.
        count: usize,
    },
    /// A prefix-cache node holds more (or fewer) locks than the requests passed to the check
    /// hold on it and below it: a request dropped between its match and its release leaks its
    /// lock, and the locked prefix can never be evicted.
    #[error(
        "prefix-cache node {node:?} holds {locks} locks but the requests passed to the check \
         hold {held} on it and below it; a request dropped between its match and \
         release_kv_cache leaks its lock, and the prefix stays unevictable until \
         reclaim_leaks releases it"
    )]
    LockCount {
        /// The deepest node whose count is off.
        node: NodeId,
        /// Its lock count.
        locks: usize,
        /// The locks the requests hold on it and below it.
        held: usize,
    },
    /// A request names a row that the request pool does not hold (freed, or out of range).
    #[error("request {rid} holds row {row}, which the request pool does not hold")]
    RowNotHeld {
        /// The request.
        rid: u64,
        /// The row its record names.
        row: ReqRow,
    },
    /// Two records passed to the check name the same row: two requests share it, or one
    /// request was passed twice.
    #[error(
        "row {row} is held by request {first} and again by request {second}; a row belongs to \
         one request (was a request passed to the check twice?)"
    )]
    RowClaimedTwice {
        /// The row.
        row: ReqRow,
        /// The request that claimed it first.
        first: u64,
        /// The request that claimed it again.
        second: u64,
    },
    /// A position of a request's own part of its row is not at its place in a page: each of
    /// its pages holds one run of `page_size` positions, the first at the page's first slot
    /// (the layout the extend and decode rules write).
    #[error(
        "request {rid}: position {position} is at slot {slot}, where its page's layout puts it at \
         slot {expected}"
    )]
    RowLayout {
        /// The request.
        rid: u64,
        /// The position in its row.
        position: usize,
        /// The slot the row names there.
        slot: KvSlot,
        /// The slot the layout puts there: the page of the run's first slot, at the position's
        /// offset.
        expected: usize,
    },
    /// A page is held by two holders at once, or by one request for two runs of positions.
    #[error(
        "page {page} is held twice: by {first} and by {second}; one of them took it without \
         the allocator handing it out (a foreign last_loc, a free behind its holder's back): \
         find which, and release the other's claim"
    )]
    PageHeldTwice {
        /// The page.
        page: usize,
        /// One holder.
        first: Holder,
        /// The other.
        second: Holder,
    },
    /// One slot is held by two requests: both would write their KV to it (a raw free of
    /// another request's slots, whose page is then handed out again).
    #[error(
        "slot {slot} (page {page}) is held by {first} and by {second}; both would write their \
         KV to it. A slot belongs to one request: free only a request's own slots"
    )]
    SlotHeldTwice {
        /// The slot.
        slot: KvSlot,
        /// Its page.
        page: usize,
        /// The holder that claimed it first.
        first: Holder,
        /// The other.
        second: Holder,
    },
    /// A page a holder claims is not held as allocated by the allocator: the free list has it
    /// (or nobody allocated it since the last clear), so the allocator will hand it out again
    /// or refuse to free it.
    #[error(
        "page {page}, held by {holder}, is {state:?} in the allocator, not allocated: it was \
         never handed out (or was freed) and will be handed out again; give a holder only pages \
         the allocator allocated"
    )]
    PageNotAllocated {
        /// The page.
        page: usize,
        /// Who claims it.
        holder: Holder,
        /// Its state in the allocator.
        state: crate::alloc::PageState,
    },
    /// A page id past the pool's pages, in the prefix cache or a request's row (an allocator
    /// that handed out a slot it does not have).
    #[error("{range}, but {holder} holds it")]
    PageOutOfRange {
        /// The page, and the pages in the pool (padding page included).
        range: PageOutOfRange,
        /// Who holds it.
        holder: Holder,
    },
    /// A request's locked prefix points at a page the prefix cache does not hold.
    #[error(
        "request {rid}: prefix position {position} uses slot {slot}, which the prefix cache does not hold"
    )]
    PrefixNotCached {
        /// The request.
        rid: u64,
        /// Position in its row.
        position: usize,
        /// The slot there.
        slot: KvSlot,
    },
    /// A request holds a lock on a path of another namespace than its own: it would read KV
    /// computed for other requests (another LoRA adapter's, another tenant's).
    #[error(
        "request {rid} in {namespace} holds a lock on a prefix-cache path in {locked}; requests \
         share prefixes only within their namespace"
    )]
    NamespaceMismatch {
        /// The request.
        rid: u64,
        /// Its namespace.
        namespace: Namespace,
        /// The namespace of the path it locks.
        locked: Namespace,
    },
    /// A request's protected prefix is not the prefix its lock keeps cached: at `position`
    /// its token or its slot differs from the prefix cache's path, so it would attend to the
    /// KV of another prefix.
    #[error(
        "request {rid}: the {part} at position {position} of its protected prefix differs from \
         the prefix cache's path it locks (it would read another prefix's KV)"
    )]
    PrefixMismatch {
        /// The request.
        rid: u64,
        /// The first position that differs.
        position: usize,
        /// What differs there (the token where both do).
        part: PrefixPart,
    },
    /// The accounting identity failed.
    #[error(
        "accounting: {free} free + {cached} cached + {request_owned} request-owned + \
         {unclaimed} held by no one = {} slots, but the pool has {capacity}",
        .free + .cached + .request_owned + .unclaimed
    )]
    Accounting {
        /// Slots free in the allocator.
        free: usize,
        /// Slots the prefix cache holds (evictable and locked).
        cached: usize,
        /// Slots requests hold in their own ranges.
        request_owned: usize,
        /// Slots of pages the allocator holds but neither the prefix cache nor a request does:
        /// counted by [`reclaim_leaks`](super::reclaim_leaks) as the leak it would
        /// give back; 0 in [`KvCache::check`](crate::cache::KvCache::check), which reports such pages first.
        unclaimed: usize,
        /// Slots the allocator can hand out.
        capacity: usize,
    },
}

impl From<LockMismatch> for Violation {
    fn from(mismatch: LockMismatch) -> Self {
        Violation::LockCount {
            node: mismatch.node,
            locks: mismatch.locks,
            held: mismatch.held,
        }
    }
}
