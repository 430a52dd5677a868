//! Registering a request's KV with the prefix cache (sglang `cache_unfinished_req` and
//! `cache_finished_req`), built on the radix primitives. `cache_unfinished_req` owns
//! `cache_protected_len`; `cache_finished_req`, private to the crate, is the KV part of
//! [`release_kv_cache`](crate::batch::release_kv_cache), which owns the resets, and writes no
//! guarded field.

use kvown_macros::owner;

use crate::alloc::KvSlot;
use crate::alloc::{KvAllocator, SlotCalls, ceil_align, floor_align};
use crate::batch::Req;
use crate::cache::{KvCache, TableMirror, TreeCache};
use crate::error::KvError;
use crate::radix::{Insert, InsertOutcome, RadixCache, TreePos};

/// Between two chunks of a chunked prefill: insert the request's committed whole pages into
/// the prefix cache, free its duplicates, point its row at the tree's slots, move its lock to
/// the inserted end and raise `cache_protected_len` there. The unaligned tail stays the
/// request's own; the next chunk continues from its row, `row[0..committed]`. The rewritten
/// part of the row is reported to the cache's mirror ([`TableMirror::row_written`]).
///
/// All or nothing: the insert is planned and its arguments checked before anything changes,
/// and the duplicates are freed before the tree takes the rest, so a refused call (bad input,
/// or an allocator refusing the free) leaves the request, its row and the cache as they were.
///
/// Cost: O(tokens committed since the last call + tree path below the request's lock), so
/// registering each page as it fills costs O(page size) per page.
///
/// # Examples
///
/// ```
/// # use kvown_runtime::batch::*;
/// # use kvown_runtime::{alloc::PagedAllocator, cache::{KvCache, TreeCache}};
/// # use kvown_runtime::slots::ReqToTokenPool;
/// # use kvown_runtime::radix::{RadixCache, RadixConfig};
/// # let tree = TreeCache::Radix(RadixCache::new(RadixConfig::new(4))?);
/// # let allocator = PagedAllocator::new(64, 4, false)?;
/// # let mut cache = KvCache::new(allocator, ReqToTokenPool::new(4, 32)?, tree)?;
/// # let prepared = prepare_for_extend(ScheduleBatch::new(vec![Req::new(1, vec![7; 6])]));
/// # let mut batch = alloc_for_extend(prepared, &mut cache).map_err(|failure| failure.error)?;
/// let req = &mut batch.reqs_mut()[0]; // a chunk of a longer prompt, say
/// cache_unfinished_req(req, &mut cache)?;
/// assert_eq!(req.kv().cache_protected_len(), 4, "its whole page is cached and locked");
/// assert_eq!(cache.tree().protected_size(), 4);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[owner]
pub fn cache_unfinished_req<A: KvAllocator, M: TableMirror>(
    req: &mut Req,
    cache: &mut KvCache<A, M>,
) -> Result<(), KvError> {
    let row = cache.held_row(req)?;
    let committed = req.kv().kv_committed_len();
    let KvCache {
        allocator,
        req_to_token,
        tree,
        mirror,
        ..
    } = cache;
    if let TreeCache::Radix(tree) = tree {
        // A decode step commits a position before its token is known (sglang's overlap
        // schedule), so `committed` may exceed the tokens: only those with a token are keyed.
        let token_count = committed.min(req.fill_ids().len());
        let key_len = floor_align(token_count, allocator.page_size());
        let key = req.namespace().key(&req.fill_ids()[..key_len]);
        let slots = &req_to_token.row(row)?[..key_len];
        let insert = Insert::new(key, slots)
            .from(req.last_node)
            .params(req.insert_params(true));
        let new_end = match tree.insert_own_page(&insert) {
            // One page more of the request's own leaf, the commonest case: the lock stays.
            Some(appended) => TreePos {
                node: appended?.last_node,
                len: key_len,
            },
            None => {
                let outcome = insert_unfinished(tree, allocator, req, insert, slots)?;
                let new_end = TreePos {
                    node: outcome.last_node,
                    len: key_len,
                };
                let protected = req.kv().cache_protected_len();
                if outcome.prefix_len > protected {
                    // Point the row at the tree's slots where they replaced its duplicates.
                    let cached = TreePos {
                        node: new_end.node,
                        len: outcome.prefix_len,
                    };
                    let rewritten = &mut req_to_token.row_mut(row)?[protected..outcome.prefix_len];
                    tree.path_slots_into(cached, protected, rewritten)?;
                    mirror.row_written(row, protected, rewritten);
                }
                if new_end.node != req.last_node.node {
                    tree.move_lock(req.last_node.node, new_end.node)?;
                }
                new_end
            }
        };
        if !req.prompt_split_made {
            req.prompt_split_made = split_prompt(tree, req, committed, new_end);
        }
        req.last_node = new_end;
        req.kv_mut().set_cache_protected_len(owner, key_len);
    }
    Ok(())
}

/// `cache_unfinished_req`'s insert in general: checks that the request's lock may move, plans
/// `insert` (the request's committed whole pages with their `slots`, from the request's row),
/// frees its duplicates and applies the plan. The caller points the row at the tree's slots
/// where they replaced the duplicates and moves the lock. Nothing changes when it fails.
#[inline(never)]
fn insert_unfinished<A: KvAllocator>(
    tree: &mut RadixCache,
    allocator: &mut A,
    req: &Req,
    insert: Insert<'_>,
    slots: &[KvSlot],
) -> Result<InsertOutcome, KvError> {
    let protected = req.kv().cache_protected_len();
    // The lock moved at the end must be the request's own: checked before anything changes.
    tree.ensure_unlockable(req.last_node.node)?;
    let plan = tree.plan_insert(insert)?;
    let duplicated = plan.prefix_len();
    if duplicated > protected {
        // Another request cached `[protected, duplicated)` first: ours are duplicates, freed
        // before the tree changes (a refused free leaves everything as it was).
        allocator.free_segment(&slots[protected..duplicated], protected)?;
    }
    // Past `duplicated` the tree takes this request's own slots.
    Ok(plan.apply())
}

/// sglang `_insert_cache`'s prompt split, after the insert of a request's key of `up_to`
/// tokens that ended at `end`: when the prompt's whole pages are a shorter prefix of the key,
/// a node ends where they do, and records the request's priority plus one
/// ([`RadixCache::split_prompt`]), so that eviction can take the outputs and keep the prompt.
/// Returns whether it applied.
fn split_prompt(tree: &mut RadixCache, req: &Req, up_to: usize, end: TreePos) -> bool {
    let prompt_len = up_to.min(req.origin_input_ids().len());
    tree.split_prompt(end, prompt_len, req.priority().saturating_add(1))
}

/// The KV part of releasing a request that holds a row: the prefix cache takes `[0, committed)`
/// (when `is_insert`) and the request's duplicates, its unaligned tail and its over-allocation
/// `[ceil_align(committed), allocated)` are freed, or all of `[protected, allocated)` is freed;
/// then the request's lock is dropped. Every free of the release is one all-or-nothing
/// allocator call made before the tree changes, so an allocator that refuses it leaves the
/// whole cache as it was.
pub(crate) fn cache_finished_req<A: KvAllocator, M: TableMirror>(
    req: &Req,
    cache: &mut KvCache<A, M>,
    is_insert: bool,
) -> Result<(), KvError> {
    let row = req.held_row()?;
    let committed = req.kv().kv_committed_len();
    let allocated = req.kv().kv_allocated_len();
    let protected = req.kv().cache_protected_len();
    let KvCache {
        allocator,
        req_to_token,
        tree,
        ..
    } = cache;
    let row_slots = &req_to_token.row(row)?[..allocated];
    let over_start = ceil_align(committed, allocator.page_size()).min(allocated);
    let over = (&row_slots[over_start..], over_start);
    let slots = &row_slots[..committed];
    match tree {
        TreeCache::Radix(tree) => {
            let token_count = committed.min(req.fill_ids().len());
            let key_len = floor_align(token_count, allocator.page_size());
            let key = req.namespace().key(&req.fill_ids()[..key_len]);
            // Everything that can fail comes before the tree changes: the request's lock is
            // checked to be its own and the insert planned (read-only), then the one free, then
            // the insert and the unlock.
            tree.ensure_unlockable(req.last_node.node)?;
            let plan = if is_insert {
                let insert = Insert::new(key, &slots[..key_len])
                    .from(req.last_node)
                    .params(req.insert_params(false));
                Some(tree.plan_insert(insert)?)
            } else {
                None
            };
            // sglang's calls: with the insert, the duplicates (`_insert_cache`), then the
            // unkeyed tail (`free_kv_row`); without, `[protected, committed)` as one range.
            match &plan {
                Some(plan) => allocator.free_segments(&[
                    (&slots[protected..plan.prefix_len()], protected),
                    (&slots[key_len..], key_len),
                    over,
                ])?,
                None => allocator.free_segments(&[(&slots[protected..], protected), over])?,
            }
            if let Some(plan) = plan {
                let end = TreePos {
                    node: plan.apply().last_node,
                    len: key_len,
                };
                split_prompt(tree, req, committed, end);
            }
            tree.dec_lock_ref(req.last_node.node)?;
        }
        TreeCache::Disabled => {
            allocator.free_segments(&[(&slots[protected..], protected), over])?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::{KvSlot, PagedAllocator};
    use crate::batch::{
        ReqKvInfo, ScheduleBatch, alloc_for_extend, init_next_round_input, prepare_for_extend,
        release_kv_cache,
    };
    use crate::radix::{NodeId, RadixConfig};
    use crate::slots::ReqToTokenPool;

    type Cache = KvCache<PagedAllocator>;

    /// Matches (and, with `extend`, extends) a request for `prompt`.
    fn admit(cache: &mut Cache, rid: u64, prompt: Vec<u32>, extend: bool) -> Req {
        let mut req = Req::new(rid, prompt);
        init_next_round_input(&mut req, cache, usize::MAX).unwrap();
        if !extend {
            return req;
        }
        let batch = prepare_for_extend(ScheduleBatch::new(vec![req]));
        let batch = alloc_for_extend(batch, cache).map_err(|f| f.error).unwrap();
        batch.into_reqs().pop().unwrap()
    }

    /// Page size 4. `0..16` is cached; request 1 for `0..8` and a tail (extended with
    /// `extend_first`) locks the node ending at 8; request 2 for `0..16` and one more token
    /// locks its child. Then request 1's lock is taken away behind its back, so its node is
    /// locked only through the child: the corrupted state a call must refuse before it changes
    /// anything.
    fn lock_lost(extend_first: bool) -> (Cache, Req, Req, NodeId) {
        let allocator = PagedAllocator::new(256, 4, false).unwrap();
        let rows = ReqToTokenPool::new(8, 64).unwrap();
        let tree = RadixCache::new(RadixConfig::new(4)).unwrap();
        let mut cache = KvCache::new(allocator, rows, TreeCache::Radix(tree)).unwrap();
        let mut first = admit(&mut cache, 9, (0..16).chain([99]).collect(), true);
        release_kv_cache(&mut first, &mut cache, true).unwrap();
        let first = admit(&mut cache, 1, (0..8).chain(50..58).collect(), extend_first);
        let second = admit(&mut cache, 2, (0..17).collect(), false);
        let node = first.last_node.node;
        assert_eq!(first.last_node.len, 8);
        let TreeCache::Radix(tree) = &mut cache.tree else {
            unreachable!("a radix cache")
        };
        tree.dec_lock_ref(node).unwrap();
        (cache, first, second, node)
    }

    /// What a refused call must leave as it was: free slots, the tree's sizes, the request's
    /// lock, matched slots and record.
    type Snapshot = (usize, usize, usize, TreePos, Vec<KvSlot>, ReqKvInfo);

    fn snapshot(cache: &Cache, req: &Req) -> Snapshot {
        let tree = cache.tree.radix().expect("a radix cache");
        (
            cache.available_size(),
            tree.sizes().total(),
            tree.sizes().protected,
            req.last_node,
            req.prefix_indices.clone(),
            req.kv().clone(),
        )
    }

    fn lock_underflow(node: NodeId) -> Result<(), KvError> {
        Err(KvError::Radix(crate::radix::RadixError::LockUnderflow {
            node,
        }))
    }

    #[test]
    fn a_match_over_a_lock_that_is_not_the_requests_changes_nothing() {
        let (mut cache, mut first, _second, node) = lock_lost(false);
        let before = snapshot(&cache, &first);
        let result = init_next_round_input(&mut first, &mut cache, usize::MAX);
        assert_eq!(result, lock_underflow(node));
        assert_eq!(snapshot(&cache, &first), before);
    }

    #[test]
    fn a_registration_over_a_lock_that_is_not_the_requests_changes_nothing() {
        let (mut cache, mut first, _second, node) = lock_lost(true);
        let before = snapshot(&cache, &first);
        assert_eq!(
            cache_unfinished_req(&mut first, &mut cache),
            lock_underflow(node)
        );
        assert_eq!(snapshot(&cache, &first), before);
    }

    #[test]
    fn a_release_over_a_lock_that_is_not_the_requests_changes_nothing() {
        for is_insert in [true, false] {
            let (mut cache, mut first, _second, node) = lock_lost(true);
            let before = snapshot(&cache, &first);
            let result = release_kv_cache(&mut first, &mut cache, is_insert);
            assert_eq!(result, lock_underflow(node), "is_insert {is_insert}");
            assert_eq!(snapshot(&cache, &first), before, "is_insert {is_insert}");
        }
    }
}
