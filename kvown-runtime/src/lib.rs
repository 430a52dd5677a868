//! kvown runtime: a paged KV-cache allocator whose per-request bookkeeping is owned at compile
//! time (with `#[kvown::guarded]` fields, whose support lives in `kvown-ownership`).
//!
//! The allocator follows sglang's KV-cache bookkeeping (target state after sglang #37085). The
//! modules read as floors, each importing only those below it (the owner links of
//! `#[owned_by]` aside, see the workspace's
//! `tests/it/module_layout.rs`):
//! * [`check`]: the invariant checker, and giving back what dropped requests leaked;
//! * [`batch`]: a request's whole life: the request and its ladder in guarded fields, and the
//!   functions that own it (admit, extend, decode, speculative decode, register with the prefix
//!   cache, retract, release, decode-side preallocation);
//! * [`cache`]: the allocator, table and prefix cache a batch flow keeps consistent;
//! * [`error`];
//! * [`radix`] (prefix cache) and [`kv`] (K/V data pools);
//! * [`alloc`] (token and paged slot allocators);
//! * [`slots`] (request-to-token table), [`ownership`] (the audit register of guarded fields),
//!   and the refusals every layer shares ([`error::PageOutOfRange`], [`error::OutOfMemory`],
//!   [`error::PageSizeMismatch`], defined once beneath the errors that wrap them);
//! * [`ids`].
//!
//! # A request's life
//!
//! Admit a request (match its prompt against the prefix cache), extend it, decode a few
//! tokens, release it into the prefix cache, and let a second request reuse its pages. A
//! batch-flow call that fails leaves the requests, their rows and the prefix cache as they were,
//! whether it was refused for bad input, for lack of memory, or by an allocator that refused a
//! free (the one exception, [`batch::retract_decode`], releases request by request and says
//! what it hands back; an eviction that made room stays made when the call then fails for
//! another reason). [`cache::KvCache::check`]
//! verifies the accounting identity and every request's ladder at any point, and names the
//! request behind a leak: a `Req` does not own the cache, so one dropped before
//! [`batch::release_kv_cache`] keeps its row, pages and prefix lock until
//! [`check::reclaim_leaks`] gives back what the requests still alive do not hold.
//!
//! ```
//! use kvown_runtime::alloc::{KvAllocator, PagedAllocator};
//! use kvown_runtime::batch::{
//!     ScheduleBatch, alloc_for_decode, alloc_for_extend, prepare_for_decode, prepare_for_extend,
//!     release_kv_cache,
//! };
//! use kvown_runtime::cache::{KvCache, TreeCache};
//! use kvown_runtime::radix::{RadixCache, RadixConfig};
//! use kvown_runtime::batch::Req;
//! use kvown_runtime::slots::ReqToTokenPool;
//! use kvown_runtime::batch::init_next_round_input;
//!
//! // 64 pages of 4 slots, 8 request rows of up to 128 tokens, a radix prefix cache.
//! let allocator = PagedAllocator::new(256, 4, false)?;
//! let rows = ReqToTokenPool::new(8, 128)?;
//! let mut cache = KvCache::new(allocator, rows, TreeCache::Radix(RadixCache::new(RadixConfig::new(4))?))?;
//!
//! // Admit and extend a 10-token prompt: nothing cached yet, so all 10 tokens get slots.
//! let mut req = Req::new(1, (0..10).collect());
//! init_next_round_input(&mut req, &mut cache, usize::MAX)?;
//! let prepared = prepare_for_extend(ScheduleBatch::new(vec![req]));
//! let mut batch = alloc_for_extend(prepared, &mut cache).map_err(|failure| failure.error)?;
//! assert_eq!(batch.out_cache_loc().len(), 10);
//!
//! // Decode three tokens. Between prepare and alloc the batch hides its requests, so no code
//! // can read a length that is about to change.
//! for token in 100..103 {
//!     batch.reqs_mut()[0].push_output(token);
//!     let prepared = prepare_for_decode(batch, &cache).map_err(|(_, error)| error)?;
//!     batch = alloc_for_decode(prepared, &mut cache).map_err(|failure| failure.error)?;
//! }
//! let kv = batch.reqs()[0].kv();
//! assert_eq!((kv.kv_committed_len(), kv.kv_allocated_len()), (13, 13));
//! cache.check(batch.reqs())?;
//!
//! // Finish: the 12 page-aligned tokens stay cached (evictable), the 13th token's page is freed.
//! let mut finished = batch.into_reqs();
//! release_kv_cache(&mut finished[0], &mut cache, true)?;
//! assert_eq!(cache.tree().evictable_size(), 12);
//! assert_eq!(cache.available_size(), 256 - 12);
//!
//! // A prompt sharing the first 8 tokens reuses (and locks) two cached pages.
//! let mut again = Req::new(2, (0..8).chain([7, 7]).collect());
//! init_next_round_input(&mut again, &mut cache, usize::MAX)?;
//! assert_eq!(again.kv().cache_protected_len(), 8);
//! let prepared = prepare_for_extend(ScheduleBatch::new(vec![again]));
//! let batch = alloc_for_extend(prepared, &mut cache).map_err(|failure| failure.error)?;
//! assert_eq!(batch.out_cache_loc().len(), 2, "only the new tokens get slots");
//!
//! // Release without caching, then evict what is cached: the pool is whole again.
//! let mut finished = batch.into_reqs();
//! release_kv_cache(&mut finished[0], &mut cache, false)?;
//! cache.check(&finished)?;
//! cache.evict_shortfall(cache.allocator().capacity())?;
//! assert_eq!(cache.available_size(), cache.allocator().capacity());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

// Lets the unit tests include shared test helpers written against the public paths.
#[cfg(test)]
extern crate self as kvown_runtime;

// The macros' expansions name their support crate `::kvown` (the facade, which this crate cannot
// depend on); here that is the support crate itself.
extern crate kvown_ownership as kvown;

pub mod alloc;
pub mod batch;
pub mod cache;
pub mod check;
pub mod error;
pub mod ids;
pub mod kv;
pub mod radix;
mod shared_error;
pub mod slots;

/// The audit register of guarded fields, from `kvown-ownership`: it lists this crate's ownership
/// table among those of every linked crate.
pub mod ownership {
    pub use kvown_ownership::audit;
}
