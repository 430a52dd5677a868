//! The cache world: a `KvCache` driven through the batch flow, misused, with a second cache
//! to misuse its requests against.

use kvown_runtime::alloc::{KvAllocator, PagedAllocator};
use kvown_runtime::batch::Req;
use kvown_runtime::batch::{
    ScheduleBatch, alloc_for_decode, alloc_for_extend, alloc_for_spec_decode, commit_spec_tokens,
    prepare_for_decode, prepare_for_extend, prepare_for_spec_decode, release_kv_cache,
    retract_decode,
};
use kvown_runtime::batch::{cache_unfinished_req, init_next_round_input};
use kvown_runtime::cache::{KvCache, TreeCache};
use kvown_runtime::check::reclaim_leaks;
use kvown_runtime::radix::{RadixCache, RadixConfig, TreePos};
use kvown_runtime::slots::{ReqRow, ReqToTokenPool};

use super::{CACHE_PAGES, Op, ROWS, TreeSnapshot, WIDTH, census, tree_snapshot};

/// A cache and the requests driven through it, with a second cache to misuse them against.
pub(super) struct CacheWorld {
    cache: KvCache<PagedAllocator>,
    other: KvCache<PagedAllocator>,
    /// Requests that hold KV in `cache`.
    running: Vec<Req>,
    /// Requests released (they hold nothing).
    done: Vec<Req>,
    next_rid: u64,
}

/// What a batch-flow call must leave unchanged when it fails: both caches, and each request's
/// record (its iteration clocks aside: an abandoned prepare keeps its tick).
#[derive(Debug, PartialEq)]
struct CacheSnapshot {
    alloc: PagedAllocator,
    rows: ReqToTokenPool,
    tree: TreeSnapshot,
    other: (PagedAllocator, ReqToTokenPool),
    reqs: Vec<(u64, Option<ReqRow>, usize, usize, usize, TreePos)>,
}

fn new_cache(page_size: usize) -> KvCache<PagedAllocator> {
    let alloc = PagedAllocator::new(CACHE_PAGES * page_size, page_size, false).unwrap();
    let rows = ReqToTokenPool::new(ROWS, WIDTH).unwrap();
    KvCache::new(
        alloc,
        rows,
        TreeCache::Radix(RadixCache::new(RadixConfig::new(page_size)).unwrap()),
    )
    .unwrap()
}

impl CacheWorld {
    pub(super) fn new(page_size: usize) -> CacheWorld {
        CacheWorld {
            cache: new_cache(page_size),
            other: new_cache(page_size),
            running: Vec::new(),
            done: Vec::new(),
            next_rid: 1,
        }
    }

    fn snapshot(&self) -> CacheSnapshot {
        self.snapshot_with(&[])
    }

    /// The snapshot with `extra` (requests taken out of the world for a call) counted in.
    fn snapshot_with(&self, extra: &[Req]) -> CacheSnapshot {
        let mut reqs: Vec<_> = self
            .running
            .iter()
            .chain(&self.done)
            .chain(extra)
            .map(|req| {
                let kv = req.kv();
                (
                    req.rid(),
                    kv.req_pool_idx(),
                    kv.cache_protected_len(),
                    kv.kv_committed_len(),
                    kv.kv_allocated_len(),
                    req.last_node(),
                )
            })
            .collect();
        reqs.sort_unstable_by_key(|r| r.0);
        CacheSnapshot {
            alloc: self.cache.allocator().clone(),
            rows: self.cache.req_to_token().clone(),
            tree: tree_snapshot(self.cache.tree().radix().expect("a radix cache")),
            other: (
                self.other.allocator().clone(),
                self.other.req_to_token().clone(),
            ),
            reqs,
        }
    }

    /// After a call that succeeded: the checker passes, and so does the census from the free
    /// list, the tree's nodes and each request's own part of its row.
    fn check_ok(&self, op: &Op) {
        self.cache
            .check(&self.running)
            .unwrap_or_else(|violation| panic!("{op:?}: checker: {violation}"));
        self.other.check([]).unwrap();
        let table = self.cache.req_to_token();
        let own = self.running.iter().filter_map(|req| {
            let kv = req.kv();
            let row = table.row(kv.req_pool_idx()?).ok()?;
            Some((
                req.rid(),
                &row[kv.cache_protected_len()..kv.kv_allocated_len()],
            ))
        });
        census(self.cache.allocator(), self.cache.tree().radix(), own)
            .unwrap_or_else(|error| panic!("{op:?}: census: {error}"));
        assert!(self.done.iter().all(|req| !req.kv().holds_kv()));
    }

    /// Runs `reqs` through `step`; on success they run on, on failure they come back and
    /// the state must be as before.
    fn batch_step(
        &mut self,
        op: &Op,
        reqs: Vec<Req>,
        step: impl FnOnce(&mut KvCache<PagedAllocator>, Vec<Req>) -> Result<Vec<Req>, Vec<Req>>,
    ) -> bool {
        let before = self.snapshot_with(&reqs);
        match step(&mut self.cache, reqs) {
            Ok(reqs) => {
                self.running.extend(reqs);
                true
            }
            Err(reqs) => {
                self.running.extend(reqs);
                assert_eq!(
                    self.snapshot(),
                    before,
                    "a refused {op:?} changed the state"
                );
                false
            }
        }
    }

    /// Takes the running requests `mask` selects out of the world, in order.
    fn take(&mut self, mask: u8) -> Vec<Req> {
        let mut index = 0;
        let (taken, kept): (Vec<Req>, Vec<Req>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|_| {
                index += 1;
                mask & (1 << ((index - 1) % 8)) != 0
            });
        self.running = kept;
        taken
    }

    pub(super) fn run(&mut self, op: &Op) -> bool {
        let ok = match op {
            Op::Admit { prompt, chunk } => {
                let rid = self.next_rid;
                self.next_rid += 1;
                let Ok(mut req) = Req::try_new(rid, prompt.clone()) else {
                    assert!(prompt.is_empty());
                    return false;
                };
                let before = self.snapshot();
                init_next_round_input(&mut req, &mut self.cache, *chunk).unwrap();
                let tree_only = self.snapshot();
                assert_eq!(
                    (tree_only.alloc, tree_only.rows),
                    (before.alloc, before.rows)
                );
                let ok = self.batch_step(op, vec![req], extend);
                if !ok {
                    // Refused for lack of memory or rows: drop the prefix lock.
                    let mut req = self.running.pop().expect("the request came back");
                    if req.last_node() != TreePos::ROOT {
                        release_kv_cache(&mut req, &mut self.cache, false).unwrap();
                    }
                    self.done.push(req);
                }
                ok
            }
            Op::Continue { pick, chunk } => {
                if self.running.is_empty() {
                    return false;
                }
                let mut req = self.running.remove(pick % self.running.len());
                let before = self.snapshot_with(std::slice::from_ref(&req));
                init_next_round_input(&mut req, &mut self.cache, *chunk).unwrap();
                let after = self.snapshot_with(std::slice::from_ref(&req));
                assert_eq!(
                    after, before,
                    "a continuing request's round changed nothing held"
                );
                self.batch_step(op, vec![req], extend)
            }
            Op::Decode { mask, stale } => {
                let mut reqs = self.take(*mask);
                if let Some(pick) = stale.filter(|_| !self.done.is_empty()) {
                    let pick = pick % self.done.len();
                    reqs.push(self.done.remove(pick));
                }
                for req in &mut reqs {
                    req.push_output(9);
                }
                self.batch_step(op, reqs, |cache, reqs| {
                    let prepared = prepare_for_decode(ScheduleBatch::new(reqs), cache)
                        .map_err(|(batch, _)| batch.into_reqs())?;
                    alloc_for_decode(prepared, cache)
                        .map(ScheduleBatch::into_reqs)
                        .map_err(|failure| failure.batch.cancel().into_reqs())
                })
            }
            Op::Spec {
                mask,
                reserve,
                accepted,
            } => {
                let reqs = self.take(*mask);
                let (reserve, accepted) = (*reserve, *accepted);
                self.batch_step(op, reqs, |cache, reqs| {
                    let prepared =
                        prepare_for_spec_decode(ScheduleBatch::new(reqs), cache, reserve)
                            .map_err(|(batch, _)| batch.into_reqs())?;
                    let mut batch = alloc_for_spec_decode(prepared, cache)
                        .map_err(|failure| failure.batch.cancel().into_reqs())?;
                    let counts = vec![accepted; batch.len()];
                    let committed = batch.reqs().to_vec_ladders();
                    if commit_spec_tokens(&mut batch, &counts).is_err() {
                        assert_eq!(batch.reqs().to_vec_ladders(), committed);
                    }
                    Ok(batch.into_reqs())
                })
            }
            Op::Release { pick, insert } => {
                if self.running.is_empty() {
                    return false;
                }
                let mut req = self.running.remove(pick % self.running.len());
                let before = self.snapshot_with(std::slice::from_ref(&req));
                match release_kv_cache(&mut req, &mut self.cache, *insert) {
                    Ok(()) => {
                        self.done.push(req);
                        true
                    }
                    Err(_) => {
                        self.running.push(req);
                        assert_eq!(
                            self.snapshot(),
                            before,
                            "a refused release changed the state"
                        );
                        false
                    }
                }
            }
            Op::ReleaseAgain { pick } => {
                if self.done.is_empty() {
                    return false;
                }
                let pick = pick % self.done.len();
                let before = self.snapshot();
                assert!(release_kv_cache(&mut self.done[pick], &mut self.cache, true).is_err());
                assert_eq!(self.snapshot(), before);
                false
            }
            Op::CrossCache { pick, kind } => {
                if self.running.is_empty() {
                    return false;
                }
                let pick = pick % self.running.len();
                let before = self.snapshot();
                let req = &mut self.running[pick];
                let refused = match kind {
                    0 => release_kv_cache(req, &mut self.other, true).is_err(),
                    1 => init_next_round_input(req, &mut self.other, usize::MAX).is_err(),
                    2 => {
                        let req = self.running.remove(pick);
                        let (batch, _) =
                            prepare_for_decode(ScheduleBatch::new(vec![req]), &self.other)
                                .expect_err("a request of another cache");
                        self.running.extend(batch.into_reqs());
                        true
                    }
                    _ => {
                        // Prepared with one cache, allocated with the other.
                        let req = self.running.remove(pick);
                        let reqs =
                            match prepare_for_decode(ScheduleBatch::new(vec![req]), &self.cache) {
                                Ok(prepared) => {
                                    let failure = alloc_for_decode(prepared, &mut self.other)
                                        .expect_err("prepared for another cache");
                                    failure.batch.cancel().into_reqs()
                                }
                                Err((batch, _)) => batch.into_reqs(),
                            };
                        self.running.extend(reqs);
                        true
                    }
                };
                assert!(refused, "{op:?} was accepted");
                assert_eq!(self.snapshot(), before);
                false
            }
            Op::Evict { tokens } => {
                let before = self.snapshot();
                let ok = self.cache.evict_shortfall(*tokens).is_ok();
                if !ok {
                    assert_eq!(self.snapshot(), before);
                }
                ok
            }
            Op::CacheGroup {
                explicit_commit,
                release,
            } => {
                let mut group = self.cache.free_group().unwrap();
                assert!(group.free_group().is_err(), "nested group");
                assert!(group.check(&self.running).is_err(), "checked in a group");
                if *release && !self.running.is_empty() {
                    let mut req = self.running.remove(0);
                    let _ = release_kv_cache(&mut req, &mut group, true);
                    if req.kv().holds_kv() {
                        self.running.push(req);
                    } else {
                        self.done.push(req);
                    }
                }
                if *explicit_commit {
                    group.commit();
                }
                true
            }
            Op::CacheUnfinished { pick } => {
                if self.running.is_empty() {
                    return false;
                }
                let pick = pick % self.running.len();
                let before = self.snapshot();
                let ok = cache_unfinished_req(&mut self.running[pick], &mut self.cache).is_ok();
                if !ok {
                    assert_eq!(
                        self.snapshot(),
                        before,
                        "a refused {op:?} changed the state"
                    );
                }
                ok
            }
            Op::Retract { mask } => {
                let reqs = self.take(*mask);
                let before = self.snapshot_with(&reqs);
                let mut batch = ScheduleBatch::new(reqs);
                match retract_decode(&mut batch, &mut self.cache, None) {
                    Ok(outcome) => {
                        self.done.extend(outcome.retracted);
                        self.done.extend(outcome.aborted);
                        self.running.extend(batch.into_reqs());
                        true
                    }
                    Err(_) => {
                        self.running.extend(batch.into_reqs());
                        assert_eq!(
                            self.snapshot(),
                            before,
                            "a refused {op:?} changed the state"
                        );
                        false
                    }
                }
            }
            Op::Leak { pick } => {
                if self.running.is_empty() {
                    return false;
                }
                let leaked = self.running.remove(pick % self.running.len());
                let rid = leaked.rid();
                drop(leaked);
                let violation = self.cache.check(&self.running).expect_err("a leak unseen");
                assert!(
                    violation.to_string().contains("reclaim_leaks"),
                    "{violation}"
                );
                let reclaimed = reclaim_leaks(&mut self.cache, &mut self.running)
                    .unwrap_or_else(|error| panic!("reclaim after request {rid} leaked: {error}"));
                assert!(!reclaimed.is_empty());
                true
            }
            _ => unreachable!("not a batch-flow call: {op:?}"),
        };
        self.settle();
        if ok {
            self.check_ok(op);
        }
        ok
    }

    /// Releases every running request and evicts the prefix cache: the pool is whole again.
    pub(super) fn release_all_and_evict(mut self) {
        for mut req in std::mem::take(&mut self.running) {
            release_kv_cache(&mut req, &mut self.cache, true).unwrap();
        }
        self.cache.check([]).unwrap();
        let capacity = self.cache.allocator().capacity();
        self.cache.evict_shortfall(capacity).unwrap();
        assert_eq!(self.cache.available_size(), capacity);
    }

    /// Moves requests that hold nothing (a released one put back into a batch) to `done`.
    fn settle(&mut self) {
        let (running, idle): (Vec<Req>, Vec<Req>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|req| req.kv().holds_kv() || req.last_node() != TreePos::ROOT);
        self.running = running;
        self.done.extend(idle);
    }
}

/// The ladders of a batch's requests.
trait Ladders {
    fn to_vec_ladders(&self) -> Vec<(usize, usize)>;
}

impl Ladders for [Req] {
    fn to_vec_ladders(&self) -> Vec<(usize, usize)> {
        self.iter()
            .map(|req| (req.kv().kv_committed_len(), req.kv().kv_allocated_len()))
            .collect()
    }
}

/// The extend step of `reqs`: prepared and allocated, or handed back on refusal.
fn extend(cache: &mut KvCache<PagedAllocator>, reqs: Vec<Req>) -> Result<Vec<Req>, Vec<Req>> {
    alloc_for_extend(prepare_for_extend(ScheduleBatch::new(reqs)), cache)
        .map(ScheduleBatch::into_reqs)
        .map_err(|failure| failure.batch.cancel().into_reqs())
}
