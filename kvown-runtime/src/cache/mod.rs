//! [`KvCache`]: the slot allocator, the request-to-token table and the prefix cache of one KV
//! pool, bundled so the batch flow can keep them consistent, with a [`TableMirror`] that
//! follows the table.

mod mirror;

pub use mirror::{DecodeDone, DecodeStep, ExtendRow, TableMirror, WrittenDecode};

use crate::alloc::{Deferring, FreeGroup, GroupStep, KvAllocator, ceil_align};
use crate::batch::Req;
use crate::error::{KvError, OutOfMemory, PageSizeMismatch};
use crate::ids::CacheId;
use crate::radix::{CacheEvent, RadixCache};
use crate::slots::{ReqRow, ReqToTokenPool};

/// The prefix cache in front of the allocator (sglang `tree_cache`).
///
/// # Examples
///
/// ```
/// use kvown_runtime::cache::TreeCache;
/// use kvown_runtime::radix::{RadixCache, RadixConfig};
///
/// let tree = TreeCache::Radix(RadixCache::new(RadixConfig::new(4))?);
/// assert_eq!((tree.evictable_size(), tree.protected_size()), (0, 0));
/// assert!(tree.radix().is_some() && TreeCache::Disabled.radix().is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "one per KV pool, never moved on a hot path: boxing the tree would only add an \
              indirection to every cache call"
)]
pub enum TreeCache {
    /// A radix tree: finished (and chunked) requests' KV is kept for reuse.
    Radix(RadixCache),
    /// No prefix reuse (sglang `ChunkCache`): KV is freed when a request finishes.
    Disabled,
}

impl TreeCache {
    /// Tokens the cache could free by eviction now.
    pub fn evictable_size(&self) -> usize {
        match self {
            TreeCache::Radix(tree) => tree.sizes().evictable,
            TreeCache::Disabled => 0,
        }
    }

    /// Cached tokens locked by running requests.
    pub fn protected_size(&self) -> usize {
        match self {
            TreeCache::Radix(tree) => tree.sizes().protected,
            TreeCache::Disabled => 0,
        }
    }

    /// The radix tree, when enabled.
    pub fn radix(&self) -> Option<&RadixCache> {
        match self {
            TreeCache::Radix(tree) => Some(tree),
            TreeCache::Disabled => None,
        }
    }

    /// The radix tree, when enabled, for changes the batch flow makes.
    pub(crate) fn radix_mut(&mut self) -> Option<&mut RadixCache> {
        match self {
            TreeCache::Radix(tree) => Some(tree),
            TreeCache::Disabled => None,
        }
    }
}

/// How much of the prefix cache the batch flow evicts before an allocation
/// ([`EvictionRules::demand`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EvictionDemand {
    /// An over-estimate: before an extend (and a speculative reservation), its new tokens plus
    /// a page per request at page sizes above 1, the new tokens alone at page size 1; before a
    /// decode, a page per request. What the free slots lack of it is evicted, as far as the
    /// cache can. Rule: sglang `mem_cache/allocation.py`.
    #[default]
    Sglang,
    /// Only what the allocation lacks: the slots of the pages it takes, less the free ones.
    /// Evicts less, and so less often, than [`EvictionDemand::Sglang`].
    Shortfall,
}

/// When the batch flow evicts from the prefix cache besides what an allocation asks for.
/// The default is sglang 0.5.23's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvictionRules {
    /// What is evicted before an allocation.
    pub demand: EvictionDemand,
    /// After each request [`retract_decode`](crate::batch::retract_decode) releases, it evicts
    /// what the free slots lack of this many tokens per request still in the batch (sglang
    /// `release_req`: `remaining_req_count * SGLANG_RETRACT_DECODE_STEPS`); 0 turns it off.
    pub retract_decode_steps: usize,
}

impl EvictionRules {
    /// sglang's `SGLANG_RETRACT_DECODE_STEPS` default.
    pub const SGLANG_RETRACT_DECODE_STEPS: usize = 20;
}

impl Default for EvictionRules {
    fn default() -> Self {
        EvictionRules {
            demand: EvictionDemand::Sglang,
            retract_decode_steps: Self::SGLANG_RETRACT_DECODE_STEPS,
        }
    }
}

/// One KV pool's bookkeeping: slot allocator `A`, request-to-token table and prefix cache,
/// and `M`, a [`TableMirror`] the batch flow tells each write to the table (none by default).
///
/// Every batch-flow function takes it by `&mut` and leaves it consistent: after each public
/// operation [`KvCache::check`](crate::check) passes for the requests that hold KV.
///
/// # Examples
///
/// ```
/// use kvown_runtime::alloc::{KvAllocator, PagedAllocator};
/// use kvown_runtime::cache::{EvictionDemand, EvictionRules, KvCache, TreeCache};
/// use kvown_runtime::radix::{CacheEvent, RadixCache, RadixConfig};
/// use kvown_runtime::slots::ReqToTokenPool;
///
/// let tree = TreeCache::Radix(RadixCache::new(RadixConfig::new(4))?);
/// let allocator = PagedAllocator::new(64, 4, false)?;
/// let mut cache = KvCache::new(allocator, ReqToTokenPool::new(8, 32)?, tree)?;
/// assert_eq!((cache.page_size(), cache.available_size()), (4, 64));
/// assert_eq!(cache.available_with_eviction(), 64, "nothing cached yet");
/// assert_eq!(cache.allocator().capacity(), 64);
/// assert_eq!(cache.req_to_token().available_size(), 8);
/// assert_eq!(cache.tree().radix().map(|tree| tree.sizes().total()), Some(0));
/// assert_eq!(cache.mirror(), &(), "no table mirror");
/// assert!(!cache.in_free_group());
/// assert_eq!(cache.evict_shortfall(16)?, 0, "16 slots free already");
/// let rules = EvictionRules { demand: EvictionDemand::Shortfall, ..cache.eviction_rules() };
/// cache.set_eviction_rules(rules);
/// assert_eq!(cache.eviction_rules().demand, EvictionDemand::Shortfall);
/// assert!(cache.enable_cache_events());
/// assert!(matches!(cache.take_cache_events()[..], [CacheEvent::Cleared]), "an empty cache");
/// let small = PagedAllocator::new(8, 4, false)?;
/// let other = KvCache::new(small, ReqToTokenPool::new(1, 8)?, TreeCache::Disabled)?;
/// assert_ne!(cache.id(), other.id(), "each cache has its own name");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct KvCache<A, M = ()> {
    pub(crate) id: CacheId,
    /// The names this cache had before each reclaim that gave something back.
    pub(crate) retired_ids: Vec<CacheId>,
    pub(crate) allocator: A,
    pub(crate) req_to_token: ReqToTokenPool,
    pub(crate) tree: TreeCache,
    pub(crate) eviction_rules: EvictionRules,
    pub(crate) mirror: M,
    /// Whether a free group is open ([`KvCache::free_group`]).
    free_group_open: bool,
}

impl<A, M> KvCache<A, M> {
    /// This cache's name in requests' records.
    pub fn id(&self) -> CacheId {
        self.id
    }
}

impl<A: KvAllocator> KvCache<A> {
    /// Bundles the three parts, all of them unused: their page sizes must agree
    /// ([`KvError::PageSizeMismatch`]), the prefix cache must be empty
    /// ([`KvError::PrefixCacheNotEmpty`]), every slot of the allocator free with no free group
    /// open ([`KvError::AllocatorInUse`]) and every row of the table free
    /// ([`KvError::RowsInUse`]): slots or rows taken before the cache existed belong to no
    /// request it knows, so its accounting could never add up.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::alloc::{KvAllocator, PagedAllocator, SlotCalls};
    /// # use kvown_runtime::cache::{KvCache, TreeCache};
    /// # use kvown_runtime::slots::ReqToTokenPool;
    /// let allocator = PagedAllocator::new(64, 4, false)?;
    /// let cache = KvCache::new(allocator, ReqToTokenPool::new(8, 32)?, TreeCache::Disabled)?;
    /// assert_eq!(cache.available_size(), 64);
    /// let mut used = PagedAllocator::new(64, 4, false)?;
    /// used.alloc(4, &mut Vec::new())?;
    /// let refused = KvCache::new(used, ReqToTokenPool::new(8, 32)?, TreeCache::Disabled);
    /// assert!(refused.is_err(), "slots taken before the cache existed");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(
        allocator: A,
        req_to_token: ReqToTokenPool,
        tree: TreeCache,
    ) -> Result<Self, KvError> {
        KvCache::with_mirror(allocator, req_to_token, tree, ())
    }
}

impl<A: KvAllocator, M: TableMirror> KvCache<A, M> {
    /// [`KvCache::new`] with `mirror` told every write the batch flow makes to the table.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::alloc::PagedAllocator;
    /// # use kvown_runtime::cache::{KvCache, TableMirror, TreeCache};
    /// # use kvown_runtime::slots::ReqToTokenPool;
    /// /// Follows nothing but says it is there.
    /// #[derive(Debug, PartialEq)]
    /// struct Quiet;
    /// impl TableMirror for Quiet {}
    ///
    /// let allocator = PagedAllocator::new(64, 4, false)?;
    /// let table = ReqToTokenPool::new(4, 32)?;
    /// let cache = KvCache::with_mirror(allocator, table, TreeCache::Disabled, Quiet)?;
    /// assert_eq!(cache.mirror(), &Quiet);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_mirror(
        mut allocator: A,
        req_to_token: ReqToTokenPool,
        tree: TreeCache,
        mirror: M,
    ) -> Result<Self, KvError> {
        if let TreeCache::Radix(radix) = &tree {
            let cache = radix.config().page_size;
            if cache != allocator.page_size() {
                return Err(KvError::PageSizeMismatch(PageSizeMismatch {
                    allocator: allocator.page_size(),
                    cache,
                }));
            }
            let cached = radix.sizes().total();
            if cached > 0 {
                return Err(KvError::PrefixCacheNotEmpty { cached });
            }
        }
        let free = allocator.available_size();
        let free_group_open = group_open(&mut allocator);
        if free != allocator.capacity() || free_group_open {
            return Err(KvError::AllocatorInUse {
                taken: allocator.capacity().saturating_sub(free),
                capacity: allocator.capacity(),
                free_group_open,
            });
        }
        if req_to_token.available_size() != req_to_token.size() {
            return Err(KvError::RowsInUse {
                held: req_to_token.size() - req_to_token.available_size(),
                rows: req_to_token.size(),
            });
        }
        Ok(KvCache {
            id: CacheId::next(),
            retired_ids: Vec::new(),
            allocator,
            req_to_token,
            tree,
            eviction_rules: EvictionRules::default(),
            mirror,
            free_group_open: false,
        })
    }

    /// When the batch flow evicts (sglang's rules unless changed here).
    pub fn eviction_rules(&self) -> EvictionRules {
        self.eviction_rules
    }

    /// Changes when the batch flow evicts, from the next call on.
    pub fn set_eviction_rules(&mut self, rules: EvictionRules) {
        self.eviction_rules = rules;
    }

    /// Fails with [`KvError::OtherCache`] when `req` is recorded for another cache (a request
    /// recorded for none, a fresh one, passes), or with [`KvError::Reclaimed`] when it is
    /// recorded under a name this cache had before a reclaim that left it out.
    pub(crate) fn ensure_own(&self, req: &Req) -> Result<(), KvError> {
        match req.kv().kv_cache() {
            Some(bound) if bound != self.id => Err(if self.retired_ids.contains(&bound) {
                KvError::Reclaimed { rid: req.rid() }
            } else {
                KvError::OtherCache {
                    rid: req.rid(),
                    bound,
                    used: self.id,
                }
            }),
            _ => Ok(()),
        }
    }

    /// The row `req` holds in this cache: [`KvCache::ensure_own`], then [`Req::held_row`].
    pub(crate) fn held_row(&self, req: &Req) -> Result<ReqRow, KvError> {
        self.ensure_own(req)?;
        req.held_row()
    }

    /// The slot allocator (read-only: slots move only through the batch flow).
    pub fn allocator(&self) -> &A {
        &self.allocator
    }

    /// The mirror the batch flow tells its table writes.
    pub fn mirror(&self) -> &M {
        &self.mirror
    }

    /// The request-to-token table.
    pub fn req_to_token(&self) -> &ReqToTokenPool {
        &self.req_to_token
    }

    /// The prefix cache.
    pub fn tree(&self) -> &TreeCache {
        &self.tree
    }

    /// Turns the prefix cache's events on, or restarts their stream
    /// ([`RadixCache::enable_events`]); `false`, changing nothing, without a radix cache.
    pub fn enable_cache_events(&mut self) -> bool {
        self.tree
            .radix_mut()
            .map(RadixCache::enable_events)
            .is_some()
    }

    /// Takes the prefix cache's queued events ([`RadixCache::take_events`]): none without a
    /// radix cache or with its events off. Drain it regularly: the queue grows until then.
    pub fn take_cache_events(&mut self) -> Vec<CacheEvent> {
        self.tree
            .radix_mut()
            .map(RadixCache::take_events)
            .unwrap_or_default()
    }

    /// Slots per page.
    pub fn page_size(&self) -> usize {
        self.allocator.page_size()
    }

    /// Slots free now.
    pub fn available_size(&self) -> usize {
        self.allocator.available_size()
    }

    /// Slots free now plus those the prefix cache could free.
    pub fn available_with_eviction(&self) -> usize {
        self.allocator.available_size() + self.tree.evictable_size()
    }

    /// Evicts unlocked prefix-cache entries until `num_tokens` slots are free, or everything
    /// evictable is gone. Returns the tokens evicted.
    ///
    /// # Errors
    /// [`KvError::FreeGroupOpen`], evicting nothing, when slots are short and the cache holds
    /// evictable entries but a free group is open (evicted pages would stay deferred);
    /// [`KvError::Radix`] with [`crate::radix::RadixError::Free`] when the allocator refuses a
    /// victim's pages (the victims freed before it stay evicted).
    pub fn evict_shortfall(&mut self, num_tokens: usize) -> Result<usize, KvError> {
        if self.free_group_open
            && self.allocator.available_size() < num_tokens
            && self.tree.evictable_size() > 0
        {
            return Err(self.free_group_refusal(num_tokens));
        }
        match &mut self.tree {
            TreeCache::Radix(tree) => {
                // sglang `evict_from_tree_cache`: only what the allocator lacks.
                let shortfall = num_tokens.saturating_sub(self.allocator.available_size());
                Ok(tree.evict(shortfall, &mut self.allocator)?)
            }
            TreeCache::Disabled => Ok(0),
        }
    }

    /// [`KvError::FreeGroupOpen`] for a call that needs `requested` slots it could only make
    /// free while the open free group defers every free.
    pub(crate) fn free_group_refusal(&self, requested: usize) -> KvError {
        KvError::FreeGroupOpen {
            requested,
            available: self.allocator.available_size(),
            evictable: self.tree.evictable_size(),
        }
    }

    /// Makes `needed` slots free for an allocation whose sglang demand is `demand` (see
    /// [`EvictionDemand`]), or fails changing nothing when even full eviction would not free
    /// `needed`. Evicts what the free slots lack of the demand ([`EvictionRules::demand`]), as
    /// far as the cache can; inside a free group, where an eviction makes no room, only when the
    /// free slots lack `needed`.
    pub(crate) fn reserve(&mut self, needed: usize, demand: usize) -> Result<(), KvError> {
        let available = self.allocator.available_size();
        let evictable = self.tree.evictable_size();
        if available.saturating_add(evictable) < needed {
            return Err(KvError::OutOfMemory(OutOfMemory {
                requested: needed,
                available,
                evictable,
            }));
        }
        let target = match self.eviction_rules.demand {
            EvictionDemand::Sglang => demand.max(needed),
            EvictionDemand::Shortfall => needed,
        };
        if available >= target {
            return Ok(());
        }
        if self.free_group_open {
            return match available >= needed {
                true => Ok(()),
                false => Err(self.free_group_refusal(needed)),
            };
        }
        self.evict_shortfall(target)?;
        Ok(())
    }

    /// sglang's eviction demand before an extend of `new_tokens` tokens for `requests`
    /// requests (the same rule reserves speculative slots): [`EvictionDemand::Sglang`].
    pub(crate) fn extend_demand(&self, new_tokens: usize, requests: usize) -> usize {
        match self.page_size() {
            1 => new_tokens,
            page_size => new_tokens.saturating_add(requests.saturating_mul(page_size)),
        }
    }

    /// Opens a free group: the frees of the batch-flow calls made through the returned guard
    /// (a release of several requests, say) stay deferred until it commits, explicitly or when
    /// dropped, and then go back as one free-list update (sglang `free_group_begin` /
    /// `free_group_end`). While the group is open, freed pages are not available, so a call
    /// that must make room by freeing (an allocation that needs an eviction,
    /// [`KvCache::evict_shortfall`], a retraction) is refused with [`KvError::FreeGroupOpen`],
    /// changing nothing, and a second group with
    /// [`AllocError::NestedFreeGroup`](crate::alloc::AllocError::NestedFreeGroup).
    ///
    /// ```
    /// use kvown_runtime::alloc::PagedAllocator;
    /// use kvown_runtime::batch::{Req, ScheduleBatch, alloc_for_extend, prepare_for_extend};
    /// use kvown_runtime::batch::release_kv_cache;
    /// use kvown_runtime::cache::{KvCache, TreeCache};
    /// use kvown_runtime::slots::ReqToTokenPool;
    ///
    /// let allocator = PagedAllocator::new(64, 4, false)?;
    /// let mut cache = KvCache::new(allocator, ReqToTokenPool::new(4, 32)?, TreeCache::Disabled)?;
    /// let reqs = vec![Req::new(1, vec![1; 6]), Req::new(2, vec![2; 6])];
    /// let batch = prepare_for_extend(ScheduleBatch::new(reqs));
    /// let mut reqs = alloc_for_extend(batch, &mut cache).map_err(|f| f.error)?.into_reqs();
    /// let mut group = cache.free_group()?;
    /// for req in &mut reqs {
    ///     release_kv_cache(req, &mut group, false)?;
    /// }
    /// assert_eq!(group.available_size(), 64 - 16, "deferred");
    /// group.commit();
    /// assert_eq!(cache.available_size(), 64);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn free_group(&mut self) -> Result<FreeGroup<'_, Self>, KvError> {
        self.allocator.free_group_step(GroupStep::OPEN)?;
        self.free_group_open = true;
        Ok(FreeGroup::opened(self))
    }

    /// Whether a free group is open ([`KvCache::free_group`]).
    pub fn in_free_group(&self) -> bool {
        self.free_group_open
    }

    /// Slots in pages that back `[start, end)` of a request whose prefix is page-aligned at
    /// `start`: the pages a request owns are whole.
    pub(crate) fn pages_span(&self, start: usize, end: usize) -> usize {
        let page_size = self.page_size();
        ceil_align(end, page_size) - ceil_align(start, page_size)
    }
}

/// The batch flow's group is the allocator's: committing one commits the other.
impl<A: KvAllocator, M: TableMirror> Deferring for KvCache<A, M> {
    fn commit_group(&mut self) {
        self.allocator.commit_group();
        self.free_group_open = false;
    }
}

/// Whether `allocator` has a free group open (one whose guard was forgotten): an open that is
/// refused as nested says so; otherwise the probe's group is committed at once, with nothing
/// deferred, which changes nothing.
fn group_open<A: KvAllocator>(allocator: &mut A) -> bool {
    match allocator.free_group_step(GroupStep::OPEN) {
        Ok(()) => {
            allocator.commit_group();
            false
        }
        Err(_) => true,
    }
}
