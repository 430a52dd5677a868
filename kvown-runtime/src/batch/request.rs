//! A request and its KV record [`ReqKvInfo`], whose bookkeeping fields are owned at compile
//! time by the batch-flow functions that really allocate, commit and release KV memory.

use kvown_macros::guarded;

use crate::error::KvError;
use crate::ids::CacheId;
use crate::ids::KvSlot;
use crate::radix::{InsertParams, Namespace, TreePos};
use crate::slots::ReqRow;

/// The KV ladder of one request: `0 <= cache_protected_len <= kv_committed_len <=
/// kv_allocated_len <= row width` while it holds a row (sglang `ReqKvInfo`, target state).
///
/// Each field can be written only by the functions listed on it; reads are free.
///
/// # Examples
///
/// ```
/// use kvown_runtime::batch::{Req, ScheduleBatch, alloc_for_extend, prepare_for_extend};
/// # use kvown_runtime::{alloc::PagedAllocator, cache::{KvCache, TreeCache}};
/// # use kvown_runtime::slots::ReqToTokenPool;
/// # let allocator = PagedAllocator::new(64, 4, false)?;
/// # let mut cache = KvCache::new(allocator, ReqToTokenPool::new(4, 32)?, TreeCache::Disabled)?;
///
/// let req = Req::new(1, vec![7; 6]);
/// assert!(!req.kv().holds_kv());
/// let batch = alloc_for_extend(prepare_for_extend(ScheduleBatch::new(vec![req])), &mut cache)
///     .map_err(|failure| failure.error)?;
/// let kv = batch.reqs()[0].kv();
/// assert!(kv.holds_kv() && !kv.holds_reservation());
/// assert_eq!((kv.cache_protected_len(), kv.kv_committed_len(), kv.kv_allocated_len()), (0, 6, 6));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[guarded]
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReqKvInfo {
    /// The request's row in the request-to-token table; `None` while it holds no KV.
    #[owned_by(
        crate::batch::alloc_for_extend,
        crate::batch::prealloc_for_transfer,
        crate::batch::release_kv_cache,
        read = copy
    )]
    req_pool_idx: Option<ReqRow>,
    /// Prefix `[0, cache_protected_len)` is owned by the prefix cache and locked by this
    /// request; always page-aligned.
    #[owned_by(
        crate::batch::init_next_round_input,
        crate::batch::cache_unfinished_req,
        crate::batch::reset_for_retract,
        crate::batch::release_kv_cache
    )]
    cache_protected_len: usize,
    /// Tokens whose KV is committed (written or scheduled).
    #[owned_by(
        crate::batch::alloc_for_extend,
        crate::batch::alloc_for_decode,
        crate::batch::commit_spec_tokens,
        crate::batch::prealloc_for_transfer,
        crate::batch::commit_transfer,
        crate::batch::release_kv_cache
    )]
    kv_committed_len: usize,
    /// Tokens of the row backed by allocated slots.
    #[owned_by(
        crate::batch::alloc_for_extend,
        crate::batch::alloc_for_decode,
        crate::batch::alloc_for_spec_decode,
        crate::batch::prealloc_for_transfer,
        crate::batch::release_kv_cache
    )]
    kv_allocated_len: usize,
    /// Extend iterations this request took part in.
    #[owned_by(crate::batch::prepare_for_extend, crate::batch::reset_for_retract)]
    extend_batch_idx: u64,
    /// Decode iterations this request took part in.
    #[owned_by(
        crate::batch::prepare_for_decode,
        crate::batch::prepare_for_spec_decode,
        crate::batch::reset_for_retract
    )]
    decode_batch_idx: u64,
    /// The cache whose prefix lock, row and slots this request holds, from the match that
    /// locked a prefix (or the extend that gave it a row) to its release; `None` while it holds
    /// none of them. A reclaim renames the cache and rebinds the requests it was given.
    #[owned_by(
        crate::batch::init_next_round_input,
        crate::batch::alloc_for_extend,
        crate::batch::prealloc_for_transfer,
        crate::batch::release_kv_cache,
        crate::check::reclaim_leaks,
        read = copy
    )]
    kv_cache: Option<CacheId>,
}

impl ReqKvInfo {
    /// Whether the request holds a row (and therefore KV).
    #[inline]
    pub fn holds_kv(&self) -> bool {
        self.req_pool_idx().is_some()
    }

    /// Whether the request holds slots allocated beyond its committed length: a speculative
    /// reservation (`kv_allocated_len > kv_committed_len`), which an extend refuses.
    pub fn holds_reservation(&self) -> bool {
        self.kv_allocated_len() > self.kv_committed_len()
    }
}

/// One request as the scheduler sees it: its tokens, its KV record and its prefix-cache lock.
///
/// Not `Clone`: a request that holds KV owns its request-to-token row and its lock in the
/// prefix cache, and a copy would decode into the same row and release both twice.
///
/// # Examples
///
/// ```
/// use kvown_runtime::batch::{Req, ScheduleBatch, alloc_for_extend, prepare_for_extend};
/// use kvown_runtime::radix::{Namespace, TreePos};
/// # use kvown_runtime::{alloc::PagedAllocator, cache::{KvCache, TreeCache}};
/// # use kvown_runtime::slots::ReqToTokenPool;
/// # let allocator = PagedAllocator::new(64, 4, false)?;
/// # let mut cache = KvCache::new(allocator, ReqToTokenPool::new(4, 32)?, TreeCache::Disabled)?;
///
/// let req = Req::new(7, vec![1, 2, 3]);
/// assert_eq!((req.rid(), req.namespace()), (7, Namespace::DEFAULT));
/// assert_eq!(req.priority(), 0, "unless set with `with_priority`");
/// assert!(req.held_row().is_err() && !req.kv().holds_kv(), "no KV before an extend");
/// assert_eq!((req.prefix_len(), req.extend_end(), req.last_node()), (0, 3, TreePos::ROOT));
/// let mut batch = alloc_for_extend(prepare_for_extend(ScheduleBatch::new(vec![req])), &mut cache)
///     .map_err(|failure| failure.error)?;
/// let req = &mut batch.reqs_mut()[0];
/// assert!(req.held_row().is_ok() && req.kv().holds_kv() && !req.kv().holds_reservation());
/// assert_eq!(req.kv().kv_committed_len(), 3);
/// req.push_output(9); // sampled: the next decode backs it
/// assert_eq!((req.origin_input_ids(), req.output_ids()), (&[1, 2, 3][..], &[9][..]));
/// assert_eq!(req.fill_ids(), [1, 2, 3, 9]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Req {
    rid: u64,
    /// Prompt followed by the outputs so far.
    tokens: Vec<u32>,
    origin_len: usize,
    kv: ReqKvInfo,
    /// Slots of the matched prefix of a request that holds no KV yet (written into its new row
    /// by `alloc_for_extend`, then cleared). A request holding KV continues from its row.
    pub(crate) prefix_indices: Vec<KvSlot>,
    /// The prefix-cache position this request has locked (the root when none).
    pub(crate) last_node: TreePos,
    /// The token count the next extend backs (`prefix_len + extend_len`): all tokens until
    /// `init_next_round_input` caps it for a chunk.
    pub(crate) extend_end: usize,
    /// The key space of its cached prefixes (set at creation).
    pub(crate) namespace: Namespace,
    /// Recorded with its inserts into the prefix cache ([`Req::with_priority`]).
    priority: i32,
    /// Times this request was retracted.
    pub retraction_count: u32,
    /// Whether the request was retracted and waits to be re-admitted.
    pub is_retracted: bool,
    /// Whether a registration of the KV it holds now made a node end at its prompt (sglang's
    /// prompt split): its lock keeps that node, so later registrations need not look again.
    pub(crate) prompt_split_made: bool,
}

impl Req {
    /// A new request with prompt `input_ids` (at least one token), for prompts known to be
    /// non-empty; [`Req::try_new`] checks one that comes from outside. Its prefixes are cached in
    /// [`Namespace::DEFAULT`].
    ///
    /// # Panics
    /// If `input_ids` is empty: every request needs one token to compute.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::batch::Req;
    /// let req = Req::new(1, vec![5, 6, 7]);
    /// assert_eq!(req.fill_ids(), [5, 6, 7]);
    /// ```
    pub fn new(rid: u64, input_ids: Vec<u32>) -> Req {
        Req::new_in(Namespace::DEFAULT, rid, input_ids)
    }

    /// [`Req::new`] for a request whose prefixes are matched and cached in `namespace` only
    /// (its LoRA adapter's, say): it shares KV with no request of another namespace.
    ///
    /// # Panics
    /// If `input_ids` is empty.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::{batch::Req, radix::Namespace};
    /// let req = Req::new_in(Namespace(3), 1, vec![5, 6, 7]);
    /// assert_eq!(req.namespace(), Namespace(3));
    /// ```
    pub fn new_in(namespace: Namespace, rid: u64, input_ids: Vec<u32>) -> Req {
        Req::try_new_in(namespace, rid, input_ids).unwrap_or_else(|error| panic!("{error}"))
    }

    /// A new request with prompt `input_ids`, or [`KvError::EmptyPrompt`] when it is empty; in
    /// [`Namespace::DEFAULT`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::batch::Req;
    /// assert!(Req::try_new(1, vec![5]).is_ok());
    /// assert!(Req::try_new(1, vec![]).is_err(), "an empty prompt");
    /// ```
    pub fn try_new(rid: u64, input_ids: Vec<u32>) -> Result<Req, KvError> {
        Req::try_new_in(Namespace::DEFAULT, rid, input_ids)
    }

    /// [`Req::try_new`] in `namespace` (see [`Req::new_in`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::{batch::Req, radix::Namespace};
    /// assert_eq!(Req::try_new_in(Namespace(2), 1, vec![5])?.namespace(), Namespace(2));
    /// assert!(Req::try_new_in(Namespace(2), 1, vec![]).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_new_in(namespace: Namespace, rid: u64, input_ids: Vec<u32>) -> Result<Req, KvError> {
        if input_ids.is_empty() {
            return Err(KvError::EmptyPrompt { rid });
        }
        Ok(Req {
            rid,
            origin_len: input_ids.len(),
            extend_end: input_ids.len(),
            tokens: input_ids,
            kv: ReqKvInfo::default(),
            prefix_indices: Vec::new(),
            last_node: TreePos::ROOT,
            namespace,
            priority: 0,
            retraction_count: 0,
            is_retracted: false,
            prompt_split_made: false,
        })
    }

    /// The request id.
    #[inline]
    pub fn rid(&self) -> u64 {
        self.rid
    }

    /// The namespace its prefixes are matched and cached in.
    #[inline]
    pub fn namespace(&self) -> Namespace {
        self.namespace
    }

    /// The request with `priority` (0 unless set; sglang's request priority), recorded with
    /// the prefixes it caches: under [`crate::radix::EvictionPolicy::Priority`] the prefix
    /// cache evicts what only lower priorities cached first.
    ///
    /// ```
    /// use kvown_runtime::batch::Req;
    ///
    /// let req = Req::new(7, vec![1, 2, 3]).with_priority(5);
    /// assert_eq!(req.priority(), 5);
    /// assert_eq!(Req::new(8, vec![1]).priority(), 0);
    /// ```
    #[must_use]
    pub fn with_priority(mut self, priority: i32) -> Req {
        self.priority = priority;
        self
    }

    /// The priority its prefix-cache inserts record ([`Req::with_priority`]).
    #[inline]
    pub fn priority(&self) -> i32 {
        self.priority
    }

    /// What an insert of this request's prefix records for eviction: its priority, and a hit
    /// unless it is still running (`chunked`).
    pub(crate) fn insert_params(&self, chunked: bool) -> InsertParams {
        InsertParams {
            priority: self.priority,
            chunked,
        }
    }

    /// The request's row, or [`KvError::NotHeld`] when it holds no KV.
    #[inline]
    pub fn held_row(&self) -> Result<ReqRow, KvError> {
        self.kv
            .req_pool_idx()
            .ok_or(KvError::NotHeld { rid: self.rid })
    }

    /// The KV record (read-only; its writes belong to the batch flow).
    #[inline]
    pub fn kv(&self) -> &ReqKvInfo {
        &self.kv
    }

    #[inline]
    pub(crate) fn kv_mut(&mut self) -> &mut ReqKvInfo {
        &mut self.kv
    }

    /// Prompt tokens.
    #[inline]
    pub fn origin_input_ids(&self) -> &[u32] {
        &self.tokens[..self.origin_len]
    }

    /// Output tokens so far.
    #[inline]
    pub fn output_ids(&self) -> &[u32] {
        &self.tokens[self.origin_len..]
    }

    /// Prompt followed by outputs: the tokens whose KV the request needs (sglang `fill_ids`).
    #[inline]
    pub fn fill_ids(&self) -> &[u32] {
        &self.tokens
    }

    /// Appends one sampled output token.
    #[inline]
    pub fn push_output(&mut self, token: u32) {
        self.tokens.push(token);
    }

    /// Length of the prefix the next extend continues from: the committed length of a request
    /// that holds KV, the matched prefix of one that does not.
    #[inline]
    pub fn prefix_len(&self) -> usize {
        match self.kv.holds_kv() {
            true => self.kv.kv_committed_len(),
            false => self.prefix_indices.len(),
        }
    }

    /// Tokens backed after the next extend (set by `init_next_round_input`).
    #[inline]
    pub fn extend_end(&self) -> usize {
        self.extend_end
    }

    /// The prefix-cache position this request holds locked.
    #[inline]
    pub fn last_node(&self) -> TreePos {
        self.last_node
    }
}

#[cfg(test)]
mod tests {
    //! The checker against ladders the batch flow never writes: a request's record rewritten
    //! whole, as a bug in an owner would leave it. Here because only this module sees the
    //! fields of [`ReqKvInfoInit`].

    use super::{Req, ReqKvInfo, ReqKvInfoInit};
    use crate::alloc::PagedAllocator;
    use crate::batch::init_next_round_input;
    use crate::batch::{ScheduleBatch, alloc_for_extend, prepare_for_extend};
    use crate::cache::{KvCache, TreeCache};
    use crate::check::Violation;
    use crate::slots::ReqToTokenPool;

    const WIDTH: usize = 32;

    /// A cache of page size 4 and one request holding 20 tokens in it (protected 0).
    fn extended() -> (KvCache<PagedAllocator>, Req) {
        let allocator = PagedAllocator::new(64, 4, false).unwrap();
        let table = ReqToTokenPool::new(2, WIDTH).unwrap();
        let mut cache = KvCache::new(allocator, table, TreeCache::Disabled).unwrap();
        let mut req = Req::new(7, (0..20).collect());
        init_next_round_input(&mut req, &mut cache, usize::MAX).unwrap();
        let batch = prepare_for_extend(ScheduleBatch::new(vec![req]));
        let batch = alloc_for_extend(batch, &mut cache)
            .map_err(|failure| failure.error)
            .unwrap();
        let req = batch.into_reqs().pop().unwrap();
        cache.check([&req]).unwrap();
        (cache, req)
    }

    /// `req`'s record with the ladder `(protected, committed, allocated)`, the rest kept.
    fn rewrite_ladder(req: &mut Req, (protected, committed, allocated): (usize, usize, usize)) {
        let kv = req.kv();
        let record = ReqKvInfo::from(ReqKvInfoInit {
            req_pool_idx: kv.req_pool_idx(),
            cache_protected_len: protected,
            kv_committed_len: committed,
            kv_allocated_len: allocated,
            extend_batch_idx: kv.extend_batch_idx(),
            decode_batch_idx: kv.decode_batch_idx(),
            kv_cache: kv.kv_cache(),
        });
        *req.kv_mut() = record;
    }

    #[test]
    fn a_protected_prefix_without_its_lock_is_reported() {
        // A whole page protected, but the request holds no prefix lock (Disabled tree).
        let (cache, mut req) = extended();
        rewrite_ladder(&mut req, (4, 20, 20));
        assert_eq!(
            cache.check([&req]),
            Err(Violation::ProtectedNotLocked {
                rid: 7,
                protected: 4,
                locked: 0,
            })
        );
    }

    #[test]
    fn each_broken_rung_of_the_ladder_is_reported_alone() {
        // One rung broken each time, the other two holding.
        let broken = [
            (8, 4, 20),  // protected > committed
            (0, 24, 20), // committed > allocated
            (0, 20, 36), // allocated > row width
        ];
        for ladder in broken {
            let (cache, mut req) = extended();
            rewrite_ladder(&mut req, ladder);
            let (protected, committed, allocated) = ladder;
            assert_eq!(
                cache.check([&req]),
                Err(Violation::Ladder {
                    rid: 7,
                    protected,
                    committed,
                    allocated,
                    width: WIDTH,
                }),
                "ladder {ladder:?}"
            );
        }
    }
}
