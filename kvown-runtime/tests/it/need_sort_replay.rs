//! `need_sort` mode (prefill/decode disaggregation) replayed against a model of sglang's two
//! allocators: random extend / decode / free / whole-page traces over page sizes 1 (the token
//! allocator), 4, 16 and 64, with pools small enough to force merges. After every call the
//! slots (or the out-of-memory answer), the available size, the free list and the release list
//! must equal the model's.
//!
//! The model restates sglang's rules (`python/sglang/srt/mem_cache/allocator/`):
//! * `paged.py`, `PagedTokenToKVPoolAllocator`:
//!   * `alloc`: merge when `num_pages > len(free_pages)`;
//!   * `alloc_extend`: merge when `extend_num_tokens // page_size + bs + 1 > len(free_pages)`,
//!     then the three parts per request of `alloc_extend_naive` (the rest of the partial page
//!     after `last_loc`, whole new pages, a partial tail page), then `None` when
//!     `num_new_pages > len(free_pages)`;
//!   * `alloc_decode`: merge when `bs > len(free_pages)`;
//!   * `free`: the pages' ids (unique, sorted) are staged until a merge (`_release_page_ids`);
//!   * `merge_and_sort_free`: `free_pages = sort(free_pages ∪ staged)`.
//! * `token.py`, `TokenToKVPoolAllocator.alloc`: merge when `need_size > len(free_pages)`; the
//!   batch flow allocates an extend's tokens and a decode's with it (one call each).
//!
//! An out-of-memory answer: sglang merges before it finds the call does not fit, and keeps the
//! merge; so does kvown. A refused call changes no ownership: the same pages are held before
//! and after, and nothing is handed out.

use crate::common;
use kvown_runtime::alloc::{
    AllocError, DecodeShape, ExtendShape, FreeOrder, KvAllocator, KvSlot, PageAllocator, PageId,
    PagedAllocator, ReuseOrder, SlotCalls, TokenAllocator,
};
use kvown_runtime::error::OutOfMemory;
use proptest::prelude::*;

/// sglang's allocator in `need_sort` mode, as the module docs restate it.
#[derive(Debug)]
struct Sglang {
    page_size: usize,
    /// The paged allocator (`false`: the token allocator, page size 1).
    paged: bool,
    free: Vec<PageId>,
    staged: Vec<PageId>,
}

impl Sglang {
    fn new(pages: usize, page_size: usize, paged: bool) -> Self {
        Sglang {
            page_size,
            paged,
            free: (1..=pages as PageId).collect(),
            staged: Vec::new(),
        }
    }

    fn merge_and_sort_free(&mut self) {
        self.free.append(&mut self.staged);
        self.free.sort_unstable();
    }

    fn available(&self) -> usize {
        (self.free.len() + self.staged.len()) * self.page_size
    }

    /// Takes the first `n` free pages.
    fn take(&mut self, n: usize) -> Vec<PageId> {
        self.free.drain(..n).collect()
    }

    /// `alloc_extend` (paged) or `alloc(extend_num_tokens)` (token).
    fn extend(&mut self, reqs: &[ExtendShape]) -> Option<Vec<KvSlot>> {
        let ps = self.page_size;
        let tokens: usize = reqs.iter().map(|r| r.seq_len - r.prefix_len).sum();
        let estimate = match self.paged {
            true => tokens / ps + reqs.len() + 1,
            false => tokens,
        };
        if estimate > self.free.len() {
            self.merge_and_sort_free();
        }
        let new_pages: usize = reqs
            .iter()
            .map(|r| r.seq_len.div_ceil(ps) - r.prefix_len.div_ceil(ps))
            .sum();
        if new_pages > self.free.len() {
            return None;
        }
        let pages = self.take(new_pages);
        let mut pages = pages.iter();
        let mut out = Vec::new();
        for r in reqs {
            // Part 1: the rest of the partial page after `last_loc`.
            let first_new = r.seq_len.min(r.prefix_len.div_ceil(ps) * ps);
            for i in 0..first_new - r.prefix_len {
                out.push(r.last_loc.unwrap() + 1 + i as KvSlot);
            }
            // Parts 2 and 3: new pages, the last one possibly partial.
            let mut position = first_new;
            while position < r.seq_len {
                let page = *pages.next().unwrap() as usize;
                let end = r.seq_len.min(position + ps);
                out.extend((position..end).map(|p| (page * ps + p % ps) as KvSlot));
                position = end;
            }
        }
        Some(out)
    }

    /// `alloc_decode` (paged) or `alloc(bs)` (token).
    fn decode(&mut self, reqs: &[DecodeShape]) -> Option<Vec<KvSlot>> {
        if reqs.len() > self.free.len() {
            self.merge_and_sort_free();
        }
        let ps = self.page_size;
        let opens = |r: &DecodeShape| (r.seq_len - 1).is_multiple_of(ps);
        let new_pages = reqs.iter().filter(|r| opens(r)).count();
        if new_pages > self.free.len() {
            return None;
        }
        let pages = self.take(new_pages);
        let mut pages = pages.iter();
        let out = reqs
            .iter()
            .map(|r| match opens(r) {
                true => *pages.next().unwrap() * ps as KvSlot,
                false => r.last_loc + 1,
            })
            .collect();
        Some(out)
    }

    /// `alloc(pages * page_size)`.
    fn alloc_pages(&mut self, pages: usize) -> Option<Vec<PageId>> {
        if pages > self.free.len() {
            self.merge_and_sort_free();
        }
        (pages <= self.free.len()).then(|| self.take(pages))
    }

    fn free(&mut self, slots: &[KvSlot]) {
        let mut pages: Vec<PageId> = slots
            .iter()
            .map(|&s| s / self.page_size as KvSlot)
            .collect();
        pages.sort_unstable();
        pages.dedup();
        self.staged.extend(pages);
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// Requests: a row to continue (`None`, or past the rows: a new request) and new tokens.
    Extend(Vec<(usize, usize)>),
    Decode(Vec<usize>),
    /// Frees a row.
    Free(usize),
    AllocPages(usize),
    /// Frees whole pages taken by `AllocPages`.
    FreePages(usize),
}

fn op(page_size: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => prop::collection::vec((0usize..8, 1..2 * page_size + 2), 1..4).prop_map(Op::Extend),
        3 => prop::collection::vec(0usize..8, 1..5).prop_map(Op::Decode),
        2 => (0usize..8).prop_map(Op::Free),
        1 => (1usize..4).prop_map(Op::AllocPages),
        1 => (0usize..4).prop_map(Op::FreePages),
    ]
}

/// Free list head first, and the release list sorted: equal on both sides after every call.
fn lists<R: ReuseOrder>(allocator: &PageAllocator<R>) -> (Vec<PageId>, Vec<PageId>) {
    let mut released: Vec<PageId> = allocator.released_pages().collect();
    released.sort_unstable();
    (allocator.free_pages().collect(), released)
}

fn model_lists(model: &Sglang) -> (Vec<PageId>, Vec<PageId>) {
    let mut staged = model.staged.clone();
    staged.sort_unstable();
    (model.free.clone(), staged)
}

/// The pages handed out (held), ascending.
fn held<R: ReuseOrder>(allocator: &PageAllocator<R>) -> Vec<PageId> {
    (1..=allocator.num_pages() as PageId)
        .filter(|&page| allocator.is_page_allocated(page))
        .collect()
}

/// Replays `ops` on both, comparing after every call; returns how many out-of-memory answers
/// came after a merge of a release list that was not empty.
fn replay<R: ReuseOrder>(
    mut kvown: PageAllocator<R>,
    mut model: Sglang,
    ops: Vec<Op>,
) -> Result<usize, TestCaseError> {
    let ps = model.page_size;
    let mut rows: Vec<Vec<KvSlot>> = Vec::new();
    let mut raw: Vec<Vec<PageId>> = Vec::new();
    let mut merged_refusals = 0;
    for op in ops {
        let before = kvown.clone();
        let (kvown_result, model_result, outcome): (Result<Vec<KvSlot>, AllocError>, _, _) =
            match &op {
                Op::Extend(picks) => {
                    let mut reqs = Vec::new();
                    let mut targets = Vec::new();
                    for &(pick, len) in picks {
                        let target =
                            (pick < rows.len() && !targets.contains(&Some(pick))).then_some(pick);
                        let row: &[KvSlot] = target.map_or(&[], |t| &rows[t]);
                        reqs.push(ExtendShape {
                            prefix_len: row.len(),
                            seq_len: row.len() + len,
                            last_loc: row.last().copied(),
                        });
                        targets.push(target);
                    }
                    let mut out = Vec::new();
                    let result = kvown.alloc_extend(&reqs, &mut out).map(|()| out);
                    let expected = model.extend(&reqs);
                    if let (Ok(out), Some(_)) = (&result, &expected) {
                        let mut offset = 0;
                        for (r, target) in reqs.iter().zip(targets) {
                            let new = &out[offset..offset + r.seq_len - r.prefix_len];
                            offset += new.len();
                            match target {
                                Some(t) => rows[t].extend_from_slice(new),
                                None => rows.push(new.to_vec()),
                            }
                        }
                    }
                    (result, expected, "extend")
                }
                Op::Decode(picks) => {
                    let mut targets: Vec<usize> =
                        picks.iter().copied().filter(|&p| p < rows.len()).collect();
                    targets.sort_unstable();
                    targets.dedup();
                    let reqs: Vec<DecodeShape> = targets
                        .iter()
                        .map(|&t| DecodeShape {
                            seq_len: rows[t].len() + 1,
                            last_loc: *rows[t].last().unwrap(),
                        })
                        .collect();
                    if reqs.is_empty() {
                        continue;
                    }
                    let mut out = Vec::new();
                    let result = kvown.alloc_decode(&reqs, &mut out).map(|()| out);
                    let expected = model.decode(&reqs);
                    if let Ok(out) = &result {
                        for (&t, &slot) in targets.iter().zip(out) {
                            rows[t].push(slot);
                        }
                    }
                    (result, expected, "decode")
                }
                Op::Free(pick) => {
                    if *pick >= rows.len() {
                        continue;
                    }
                    let row = rows.swap_remove(*pick);
                    kvown.free(&row).unwrap();
                    model.free(&row);
                    (Ok(Vec::new()), Some(Vec::new()), "free")
                }
                Op::AllocPages(n) => {
                    let mut pages = Vec::new();
                    let result = kvown.alloc_page_ids(*n, &mut pages).map(|()| pages.clone());
                    let expected = model.alloc_pages(*n);
                    if result.is_ok() {
                        raw.push(pages);
                    }
                    (result, expected, "alloc_page_ids")
                }
                Op::FreePages(pick) => {
                    if *pick >= raw.len() {
                        continue;
                    }
                    let pages = raw.swap_remove(*pick);
                    kvown.free_page_ids(&pages, FreeOrder::Given).unwrap();
                    let slots: Vec<KvSlot> = pages.iter().map(|&p| p * ps as KvSlot).collect();
                    model.free(&slots);
                    (Ok(Vec::new()), Some(Vec::new()), "free_page_ids")
                }
            };
        match (kvown_result, model_result) {
            (Ok(slots), Some(expected)) => prop_assert_eq!(slots, expected, "{:?}", op),
            (Err(AllocError::OutOfMemory(_)), None) => {
                prop_assert_eq!(
                    held(&kvown),
                    held(&before),
                    "a refusal changes no ownership"
                );
                prop_assert_eq!(kvown.available_size(), before.available_size());
                merged_refusals += usize::from(before.released_pages().next().is_some());
            }
            (kvown, model) => {
                return Err(TestCaseError::fail(format!(
                    "{outcome} {op:?}: kvown {kvown:?}, sglang {model:?}"
                )));
            }
        }
        prop_assert_eq!(lists(&kvown), model_lists(&model), "after {:?}", op);
        prop_assert_eq!(kvown.available_size(), model.available());
        kvown
            .check()
            .map_err(|v| TestCaseError::fail(v.to_string()))?;
    }
    Ok(merged_refusals)
}

proptest! {
    #![proptest_config(common::beside_source(ProptestConfig::with_cases(256)))]

    #[test]
    fn paged_need_sort_hands_out_sglangs_pages(
        (page_size, pages, ops) in prop_oneof![Just(4usize), Just(16), Just(64)]
            .prop_flat_map(|ps| (Just(ps), 3usize..12, prop::collection::vec(op(ps), 1..40)))
    ) {
        let kvown = PagedAllocator::new(pages * page_size, page_size, true).unwrap();
        replay(kvown, Sglang::new(pages, page_size, true), ops)?;
    }

    #[test]
    fn token_need_sort_hands_out_sglangs_slots(
        (slots, ops) in (8usize..40, prop::collection::vec(op(1), 1..40))
    ) {
        let kvown = TokenAllocator::new(slots, true).unwrap();
        replay(kvown, Sglang::new(slots, 1, false), ops)?;
    }
}

/// The example: page 4, a pool of 3 pages. An extend takes page 1, is freed (staged),
/// and the same extend again: sglang's estimate (4 // 4 + 1 + 1 = 3 > 2 free pages) merges, so
/// it hands out page 1 again, and so does kvown.
#[test]
fn an_extend_merges_on_sglangs_estimate() {
    let mut allocator = PagedAllocator::new(12, 4, true).unwrap();
    let fresh = [ExtendShape {
        prefix_len: 0,
        seq_len: 4,
        last_loc: None,
    }];
    let mut out = Vec::new();
    allocator.alloc_extend(&fresh, &mut out).unwrap();
    assert_eq!(out, [4, 5, 6, 7]);
    allocator.free(&out).unwrap();
    out.clear();
    allocator.alloc_extend(&fresh, &mut out).unwrap();
    assert_eq!(out, [4, 5, 6, 7]);
}

/// An out-of-memory answer after a merge: page 4, a pool of 3 pages, pages 1 and 2 taken and
/// page 1 freed (staged). Three pages are asked: sglang merges (`num_pages > len(free_pages)`),
/// finds two, answers `None` and keeps the merge, so the next page it hands out is page 1, and
/// so does kvown.
#[test]
fn an_out_of_memory_answer_keeps_the_merge_as_sglang_does() {
    let pages = |allocator: &mut PagedAllocator, n: usize| {
        let mut out = Vec::new();
        allocator.alloc_page_ids(n, &mut out).map(|()| out)
    };
    let mut kvown = PagedAllocator::new(12, 4, true).unwrap();
    let mut sglang = Sglang::new(3, 4, true);
    assert_eq!(pages(&mut kvown, 2).unwrap(), [1, 2]);
    assert_eq!(sglang.alloc_pages(2).unwrap(), [1, 2]);
    kvown.free_page_ids(&[1], FreeOrder::Given).unwrap();
    sglang.free(&[4]);
    let before = held(&kvown);
    assert_eq!(
        pages(&mut kvown, 3),
        Err(AllocError::OutOfMemory(OutOfMemory {
            requested: 12,
            available: 8,
            evictable: 0
        }))
    );
    assert_eq!(sglang.alloc_pages(3), None);
    assert_eq!(held(&kvown), before, "a refused call changes no ownership");
    assert_eq!(lists(&kvown), model_lists(&sglang), "merged, as sglang");
    assert_eq!(sglang.alloc_pages(1).unwrap(), [1]);
    assert_eq!(pages(&mut kvown, 1).unwrap(), [1]);
}

/// The replays above reach the case that matters: an out-of-memory answer after a merge of a
/// release list that was not empty (counted over 256 deterministic traces per allocator).
#[test]
fn the_replays_reach_refusals_after_a_merge() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let (mut paged, mut token) = (0, 0);
    for _ in 0..256 {
        let trace = (3usize..12, prop::collection::vec(op(16), 1..40));
        let (pages, ops) = trace.new_tree(&mut runner).unwrap().current();
        let kvown = PagedAllocator::new(pages * 16, 16, true).unwrap();
        paged += replay(kvown, Sglang::new(pages, 16, true), ops).unwrap();
        let trace = (8usize..40, prop::collection::vec(op(1), 1..40));
        let (slots, ops) = trace.new_tree(&mut runner).unwrap().current();
        let kvown = TokenAllocator::new(slots, true).unwrap();
        token += replay(kvown, Sglang::new(slots, 1, false), ops).unwrap();
    }
    assert!(paged > 0 && token > 0, "paged {paged}, token {token}");
}
