//! [`KvCache::check`]: every request's ladder, who holds each page (the census), and the
//! accounting identity `free + cached (evictable + locked) + request-owned == capacity`.

use crate::alloc::{
    AsPageAllocator, KvAllocator, KvSlot, PageAllocator, PageId, ReuseOrder, ceil_align,
};
use crate::batch::Req;
use crate::cache::KvCache;
use crate::radix::{NodeId, TreePos};
use crate::slots::{ReqRow, ReqToTokenPool};

use super::check_radix;
use super::ledger::PageHolders;
use super::radix::{self, PrefixPart};
use super::{Holder, Violation, check_allocator};

impl<A: AsPageAllocator, M> KvCache<A, M> {
    /// Checks every invariant for the requests that hold KV (or a prefix lock) in `reqs`,
    /// which must be all such requests of this cache, against the host allocator's state.
    /// Costs O(pool pages + held positions): for tests, debug runs and `--check` modes, not
    /// for every production step.
    ///
    /// A request left out (or dropped without [`release_kv_cache`](crate::batch::release_kv_cache))
    /// is named with what it leaked:
    ///
    /// ```
    /// use kvown_runtime::alloc::PagedAllocator;
    /// use kvown_runtime::batch::{ScheduleBatch, alloc_for_extend, prepare_for_extend};
    /// use kvown_runtime::cache::{KvCache, TreeCache};
    /// use kvown_runtime::check::Violation;
    /// use kvown_runtime::batch::Req;
    /// use kvown_runtime::slots::ReqToTokenPool;
    ///
    /// let allocator = PagedAllocator::new(64, 4, false)?;
    /// let mut cache = KvCache::new(allocator, ReqToTokenPool::new(4, 32)?, TreeCache::Disabled)?;
    /// let prepared = prepare_for_extend(ScheduleBatch::new(vec![Req::new(7, vec![1; 6])]));
    /// let batch = alloc_for_extend(prepared, &mut cache).map_err(|failure| failure.error)?;
    /// cache.check(batch.reqs())?;
    ///
    /// drop(batch); // request 7 never released: its row and its 2 pages leak
    /// let leak = cache.check([]).unwrap_err();
    /// assert!(matches!(
    ///     leak,
    ///     Violation::UnclaimedRow { assigned_to: Some(7), unclaimed_pages: 2, .. }
    /// ));
    /// println!("{leak}"); // row 4 is held ... (it was assigned to request 7); 2 pages are held by no one. ...
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check<'a>(&self, reqs: impl IntoIterator<Item = &'a Req>) -> Result<(), Violation> {
        let census = self.census(reqs)?;
        let allocator = self.allocator.page_allocator();
        let held_rows = self.req_to_token.size() - self.req_to_token.available_size();
        // Every row a request holds is held in the pool (the census checked), so any other
        // held row is held by no request.
        if held_rows != census.holding {
            let row = census.unclaimed_rows(&self.req_to_token)[0];
            return Err(Violation::UnclaimedRow {
                row,
                assigned_to: self.req_to_token.assigned_to(row),
                unclaimed_pages: census.unclaimed_pages(allocator).len(),
            });
        }
        if let Some(tree) = self.tree.radix()
            && let Err(mismatch) =
                radix::check_lock_holders(tree, census.lock_holders.iter().copied())
        {
            return Err(mismatch.into());
        }
        let unclaimed = census.unclaimed_pages(allocator);
        if let Some(&first) = unclaimed.first() {
            return Err(Violation::UnclaimedPages {
                first,
                count: unclaimed.len(),
            });
        }
        census.check_accounting(allocator, 0)
    }

    /// Every check of a single request in `reqs`, and of the allocator and the prefix cache on
    /// their own, with who holds each page: what [`KvCache::check`] and
    /// [`reclaim_leaks`] compare against the pool.
    pub(crate) fn census<'a>(
        &self,
        reqs: impl IntoIterator<Item = &'a Req>,
    ) -> Result<Census, Violation> {
        let allocator = self.allocator.page_allocator();
        if allocator.in_free_group() {
            return Err(Violation::OpenFreeGroup);
        }
        check_allocator(&self.allocator)?;
        let page_size = allocator.page_size();
        let mut holders = PageHolders::new(allocator.num_pages() + 1, page_size);
        holders.claim_free(allocator)?;
        let mut cached = 0;
        if let Some(tree) = self.tree.radix() {
            check_radix(tree)?;
            holders.claim_tree(tree)?;
            cached = tree.sizes().total();
        }

        let width = self.req_to_token.max_context_len();
        let mut claimed_rows = vec![None; self.req_to_token.size() + 1];
        let mut lock_holders = Vec::new();
        let mut holding = 0;
        let mut request_owned = 0;
        for req in reqs {
            let kv = req.kv();
            // A row or a prefix lock (only ever of this cache) goes with a record naming this
            // cache, and nothing held with no record.
            let holds = kv.holds_kv() || req.last_node() != TreePos::ROOT;
            let recorded = kv.kv_cache();
            if recorded != holds.then(|| self.id()) {
                return Err(Violation::CacheRecord {
                    rid: req.rid(),
                    holds,
                    recorded,
                });
            }
            if req.last_node() != TreePos::ROOT {
                lock_holders.push(req.last_node().node);
            }
            let Some(row) = kv.req_pool_idx() else {
                protected_is_locked(req)?;
                self.prefix_matches_lock(req, &req.prefix_indices)?;
                continue;
            };
            if !self.req_to_token.is_held(row) {
                return Err(Violation::RowNotHeld {
                    rid: req.rid(),
                    row,
                });
            }
            holding += 1;
            if let Some(first) = claimed_rows[row].replace(req.rid()) {
                return Err(Violation::RowClaimedTwice {
                    row,
                    first,
                    second: req.rid(),
                });
            }
            let (protected, committed, allocated) = (
                kv.cache_protected_len(),
                kv.kv_committed_len(),
                kv.kv_allocated_len(),
            );
            if !(protected <= committed && committed <= allocated && allocated <= width) {
                return Err(Violation::Ladder {
                    rid: req.rid(),
                    protected,
                    committed,
                    allocated,
                    width,
                });
            }
            if protected % page_size != 0 {
                return Err(Violation::UnalignedProtected {
                    rid: req.rid(),
                    protected,
                    page_size,
                });
            }
            protected_is_locked(req)?;
            let slots = self.req_to_token.row(row).expect("a held row is in range");
            // The request's own part, page by page: `protected` is page-aligned, so each run of
            // `page_size` positions fills one page from its first slot.
            for (run_index, run) in slots[protected..allocated].chunks(page_size).enumerate() {
                let page = run[0] as usize / page_size;
                let first = page * page_size;
                if let Some(offset) = (0..run.len()).find(|&i| run[i] as usize != first + i) {
                    return Err(Violation::RowLayout {
                        rid: req.rid(),
                        position: protected + run_index * page_size + offset,
                        slot: run[offset],
                        expected: first + offset,
                    });
                }
                holders.claim_run(page, run, Holder::Request(req.rid()))?;
            }
            for (position, &slot) in slots[..protected].iter().enumerate() {
                if !holders.is_tree(slot as usize / page_size) {
                    return Err(Violation::PrefixNotCached {
                        rid: req.rid(),
                        position,
                        slot,
                    });
                }
            }
            self.prefix_matches_lock(req, &slots[..protected])?;
            request_owned += ceil_align(allocated, page_size) - protected;
        }
        Ok(Census {
            holders,
            claimed_rows,
            holding,
            lock_holders,
            cached,
            request_owned,
        })
    }
}

impl<A, M> KvCache<A, M> {
    /// The tokens and `slots` of `req`'s protected prefix are those of the path its lock
    /// holds, a path of its namespace, and `slots` run no further than that path. A lock on a
    /// node no longer live is left to the lock check.
    fn prefix_matches_lock(&self, req: &Req, slots: &[KvSlot]) -> Result<(), Violation> {
        // The matched slots of a request without a row may not run past its lock: the next
        // extend would copy them into its row unlocked (another namespace's, say).
        let locked = req.last_node().len;
        if slots.len() > locked {
            return Err(Violation::PrefixMismatch {
                rid: req.rid(),
                position: locked,
                part: PrefixPart::Slot,
            });
        }
        let Some(tree) = self.tree.radix() else {
            return Ok(());
        };
        if let Some(locked) = radix::namespace_of(tree, req.last_node().node)
            && locked != req.namespace()
        {
            return Err(Violation::NamespaceMismatch {
                rid: req.rid(),
                namespace: req.namespace(),
                locked,
            });
        }
        match radix::path_difference(tree, req.last_node(), req.fill_ids(), slots) {
            Some((position, part)) => Err(Violation::PrefixMismatch {
                rid: req.rid(),
                position,
                part,
            }),
            None => Ok(()),
        }
    }
}

/// The protected prefix of `req` is exactly the one its lock keeps cached (none without one).
fn protected_is_locked(req: &Req) -> Result<(), Violation> {
    let (protected, locked) = (req.kv().cache_protected_len(), req.last_node().len);
    if protected != locked {
        return Err(Violation::ProtectedNotLocked {
            rid: req.rid(),
            protected,
            locked,
        });
    }
    Ok(())
}

/// What the requests passed to a check hold, after each of them passed its own checks.
pub(crate) struct Census {
    /// Who holds each page (by page id; `None`: no one known).
    holders: PageHolders,
    /// Which request holds each row (by row; `None`: none of those passed).
    claimed_rows: Vec<Option<u64>>,
    /// Requests holding a row.
    holding: usize,
    /// The node of each prefix lock the requests hold.
    pub(crate) lock_holders: Vec<NodeId>,
    /// Tokens the prefix cache holds.
    cached: usize,
    /// Slots the requests hold in their own ranges.
    request_owned: usize,
}

impl Census {
    /// Rows the pool holds that no request passed holds, in row order.
    pub(crate) fn unclaimed_rows(&self, pool: &ReqToTokenPool) -> Vec<ReqRow> {
        (1..self.claimed_rows.len())
            .filter(|&row| pool.is_held(row) && self.claimed_rows[row].is_none())
            .collect()
    }

    /// Pages the allocator counts as held that neither a request passed nor the prefix cache
    /// holds, in page order.
    pub(crate) fn unclaimed_pages<R: ReuseOrder>(
        &self,
        allocator: &PageAllocator<R>,
    ) -> Vec<PageId> {
        (1..self.holders.pages.len() as PageId)
            .filter(|&page| {
                self.holders.pages[page as usize].is_none() && allocator.is_page_allocated(page)
            })
            .collect()
    }

    /// The accounting identity, with `unclaimed` slots counted as held by no one:
    /// `free + cached + request-owned + unclaimed == capacity`.
    pub(crate) fn check_accounting<R: ReuseOrder>(
        &self,
        allocator: &PageAllocator<R>,
        unclaimed: usize,
    ) -> Result<(), Violation> {
        let free = allocator.available_size();
        let capacity = allocator.capacity();
        if free + self.cached + self.request_owned + unclaimed != capacity {
            return Err(Violation::Accounting {
                free,
                cached: self.cached,
                request_owned: self.request_owned,
                unclaimed,
                capacity,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{PrefixPart, Violation};
    use crate::alloc::PagedAllocator;
    use crate::batch::Req;
    use crate::batch::init_next_round_input;
    use crate::batch::{ScheduleBatch, alloc_for_extend, prepare_for_extend, release_kv_cache};
    use crate::cache::{KvCache, TreeCache};
    use crate::check::{ReclaimError, reclaim_leaks};
    use crate::radix::{Namespace, RadixCache, RadixConfig};
    use crate::slots::ReqToTokenPool;

    type Cache = KvCache<PagedAllocator>;

    /// 16 pages of 4 slots and a radix cache holding the first two pages of each of `prompts`.
    fn cache_with_paths(prompts: [[u32; 8]; 2]) -> Cache {
        let allocator = PagedAllocator::new(64, 4, false).unwrap();
        let rows = ReqToTokenPool::new(4, 32).unwrap();
        let tree = TreeCache::Radix(RadixCache::new(RadixConfig::new(4)).unwrap());
        let mut cache = KvCache::new(allocator, rows, tree).unwrap();
        for (rid, prompt) in (1..).zip(prompts) {
            let mut req = admitted(&mut cache, rid, prompt.into_iter().chain([99]).collect());
            release_kv_cache(&mut req, &mut cache, true).unwrap();
        }
        cache
    }

    /// Two paths with nothing in common: tokens `0..8` and `20..28`.
    fn cache_with_two_paths() -> Cache {
        cache_with_paths([[0, 1, 2, 3, 4, 5, 6, 7], [20, 21, 22, 23, 24, 25, 26, 27]])
    }

    /// A request for `prompt` after its prefix match: a lock on the cached prefix, no row.
    fn matched(cache: &mut Cache, rid: u64, prompt: Vec<u32>) -> Req {
        let mut req = Req::new(rid, prompt);
        init_next_round_input(&mut req, cache, usize::MAX).unwrap();
        req
    }

    /// A request for `prompt`, matched and extended.
    fn admitted(cache: &mut Cache, rid: u64, prompt: Vec<u32>) -> Req {
        let batch = prepare_for_extend(ScheduleBatch::new(vec![matched(cache, rid, prompt)]));
        let batch = alloc_for_extend(batch, cache).map_err(|f| f.error).unwrap();
        batch.into_reqs().pop().unwrap()
    }

    fn mismatch(rid: u64, position: usize, part: PrefixPart) -> Result<(), Violation> {
        Err(Violation::PrefixMismatch {
            rid,
            position,
            part,
        })
    }

    #[test]
    fn a_lock_on_another_namespaces_path_is_a_namespace_mismatch() {
        let mut cache = cache_with_two_paths();
        let mut req = admitted(&mut cache, 3, (0..8).chain([100, 101]).collect());
        assert_eq!(req.kv().cache_protected_len(), 8);
        assert_eq!(cache.check([&req]), Ok(()));
        // Same tokens, same slots: only the namespaces differ.
        req.namespace = Namespace(1);
        assert_eq!(
            cache.check([&req]),
            Err(Violation::NamespaceMismatch {
                rid: 3,
                namespace: Namespace(1),
                locked: Namespace::DEFAULT,
            })
        );
    }

    #[test]
    fn a_matched_request_whose_prefix_runs_past_its_lock_is_a_slot_mismatch() {
        let mut cache = cache_with_two_paths();
        // In another namespace than the cached paths: it matches nothing, locks nothing.
        let mut req = Req::new_in(Namespace(1), 3, (0..8).chain([100, 101]).collect());
        init_next_round_input(&mut req, &mut cache, usize::MAX).unwrap();
        assert_eq!(req.last_node(), crate::radix::TreePos::ROOT);
        assert_eq!(cache.check([&req]), Ok(()));
        // Its prefix slots now name the default namespace's path for the same tokens: the next
        // extend would copy them into its row, reading KV it neither locks nor may share.
        let tree = cache.tree.radix_mut().unwrap();
        let other = tree.match_prefix(&(0..8).collect::<Vec<u32>>());
        assert_eq!(other.len, 8);
        req.prefix_indices = vec![0; 8];
        tree.path_slots_into(other, 0, &mut req.prefix_indices)
            .unwrap();
        assert_eq!(cache.check([&req]), mismatch(3, 0, PrefixPart::Slot));
    }

    #[test]
    fn a_row_whose_prefix_names_other_cached_slots_is_a_slot_mismatch() {
        let mut cache = cache_with_two_paths();
        let req = admitted(&mut cache, 3, (0..8).chain([100, 101]).collect());
        assert_eq!(req.kv().cache_protected_len(), 8);
        assert_eq!(cache.check([&req]), Ok(()));
        // The prefix's two pages swapped: both still the tree's, in the wrong order.
        let row = req.kv().req_pool_idx().unwrap();
        cache.req_to_token.row_mut(row).unwrap()[..8].rotate_left(4);
        assert_eq!(cache.check([&req]), mismatch(3, 0, PrefixPart::Slot));
    }

    #[test]
    fn a_lock_on_another_prompts_path_is_a_token_mismatch() {
        // Two paths that share their first page and part of the second.
        let mut cache = cache_with_paths([[0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3, 4, 5, 9, 9]]);
        let mut req = admitted(&mut cache, 3, (0..8).chain([100]).collect());
        // The lock, the protected length and the row's prefix all moved to the other path,
        // consistently, but the request's tokens are `0..8`: they part at position 6.
        let tree = cache.tree.radix_mut().unwrap();
        let other = tree.match_prefix(&[0, 1, 2, 3, 4, 5, 9, 9]);
        tree.move_lock(req.last_node.node, other.node).unwrap();
        req.last_node = other;
        let row = req.kv().req_pool_idx().unwrap();
        let prefix = &mut cache.req_to_token.row_mut(row).unwrap()[..8];
        cache
            .tree
            .radix()
            .unwrap()
            .path_slots_into(other, 0, prefix)
            .unwrap();
        let violation = cache.check([&req]);
        assert_eq!(violation, mismatch(3, 6, PrefixPart::Token));
        let message = violation.unwrap_err().to_string();
        assert!(message.contains("the token at position 6"), "{message}");
    }

    #[test]
    fn matched_slots_that_differ_from_the_path_are_a_slot_mismatch() {
        let mut cache = cache_with_two_paths();
        let mut req = matched(&mut cache, 4, (20..28).chain([5]).collect());
        assert_eq!(req.prefix_indices.len(), 8);
        assert_eq!(cache.check([&req]), Ok(()));
        req.prefix_indices.swap(5, 6);
        let violation = cache.check([&req]);
        assert_eq!(violation, mismatch(4, 5, PrefixPart::Slot));
        let message = violation.unwrap_err().to_string();
        assert!(message.contains("the slot at position 5"), "{message}");
    }

    #[test]
    fn a_request_whose_row_is_not_held_is_reported_though_another_row_leaked() {
        let allocator = PagedAllocator::new(64, 4, false).unwrap();
        let rows = ReqToTokenPool::new(4, 32).unwrap();
        let mut cache = KvCache::new(allocator, rows, TreeCache::Disabled).unwrap();
        let mut req = admitted(&mut cache, 7, vec![1; 6]);
        let row = req.kv().req_pool_idx().unwrap();
        // As many rows held as requests holding one, but not the same rows.
        cache.req_to_token.alloc(1).unwrap();
        cache.req_to_token.free(row).unwrap();
        let not_held = Violation::RowNotHeld { rid: 7, row };
        assert_eq!(cache.check([&req]), Err(not_held.clone()));
        let before = cache.available_size();
        assert_eq!(
            reclaim_leaks(&mut cache, [&mut req]),
            Err(ReclaimError::Violation(not_held))
        );
        assert_eq!(cache.available_size(), before);
    }

    /// The request's own positions sit at their offsets in their pages: a row with two of a
    /// page's slots swapped, or a run starting inside a page, is named at the first position
    /// out of place (the accounting and the page census balance in both).
    #[test]
    fn a_row_out_of_its_pages_layout_is_named_at_the_first_misplaced_position() {
        let allocator = PagedAllocator::new(64, 4, false).unwrap();
        let rows = ReqToTokenPool::new(4, 32).unwrap();
        let mut cache = KvCache::new(allocator, rows, TreeCache::Disabled).unwrap();
        let req = admitted(&mut cache, 7, (0..8).collect());
        assert_eq!(cache.check([&req]), Ok(()));
        let row = req.kv().req_pool_idx().unwrap();
        let slots = cache.req_to_token.row_mut(row).unwrap();
        let (first, sixth) = (slots[0], slots[5]);
        slots.swap(5, 6);
        assert_eq!(
            cache.check([&req]),
            Err(Violation::RowLayout {
                rid: 7,
                position: 5,
                slot: sixth + 1,
                expected: sixth as usize,
            })
        );
        let slots = cache.req_to_token.row_mut(row).unwrap();
        slots.swap(5, 6);
        // The first run shifted by one slot: its page's layout starts one slot earlier.
        for slot in &mut slots[..4] {
            *slot += 1;
        }
        let violation = cache.check([&req]).unwrap_err();
        assert_eq!(
            violation,
            Violation::RowLayout {
                rid: 7,
                position: 0,
                slot: first + 1,
                expected: first as usize,
            }
        );
        assert!(
            violation.to_string().contains("position 0 is at slot"),
            "{violation}"
        );
    }
}
