//! Property tests: random interleavings of alloc / alloc_page_ids / alloc_extend / alloc_decode
//! / free / free_segment(s) / free_page_ids (several pages, or one at a time) / free groups over
//! page sizes 1, 3, 4, 16, 32 and 64 (the last three are also the sizes whose one-page runs are
//! compiled at a fixed length), with and without need_sort,
//! checked after every step against a model of who holds which pages and against a
//! position-wise reference of the extend and decode rules.

use crate::common;

use std::collections::BTreeSet;

use kvown_runtime::alloc::{
    AllocError, DecodeShape, ExtendShape, FreeOrder, KvAllocator, KvSlot, PageAllocator, PageId,
    ReuseOrder, SlotCalls,
};
use kvown_runtime::alloc::{PagedAllocator, TokenAllocator};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Alloc(usize),
    AllocPages(usize),
    Extend(Vec<(usize, usize)>),
    Decode(Vec<usize>),
    FreeRow(usize),
    FreeRaw(usize),
    FreeRawPages(usize),
    FreeRawPageByPage(usize),
    Truncate(usize, usize),
    FreeSplit(usize, usize),
    Begin,
    End,
}

fn op(page_size: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        (0usize..4).prop_map(Op::Alloc),
        (0usize..4).prop_map(Op::AllocPages),
        prop::collection::vec((0usize..10, 0..3 * page_size + 2), 1..5).prop_map(Op::Extend),
        prop::collection::vec(0usize..10, 1..6).prop_map(Op::Decode),
        (0usize..10).prop_map(Op::FreeRow),
        (0usize..10).prop_map(Op::FreeRaw),
        (0usize..10).prop_map(Op::FreeRawPages),
        (0usize..10).prop_map(Op::FreeRawPageByPage),
        (0usize..10, 0usize..64).prop_map(|(r, c)| Op::Truncate(r, c)),
        (0usize..10, 0usize..64).prop_map(|(r, c)| Op::FreeSplit(r, c)),
        Just(Op::Begin),
        Just(Op::End),
    ]
}

/// Who holds what: request rows (position → slot) and raw `alloc` results.
struct Model {
    page_size: usize,
    rows: Vec<Vec<KvSlot>>,
    raw: Vec<Vec<KvSlot>>,
    in_group: bool,
    deferred: usize,
}

impl Model {
    fn pages(&self, slots: &[KvSlot]) -> BTreeSet<PageId> {
        slots
            .iter()
            .map(|&s| s / self.page_size as KvSlot)
            .collect()
    }

    fn held_pages(&self) -> BTreeSet<PageId> {
        self.rows
            .iter()
            .chain(&self.raw)
            .flat_map(|s| self.pages(s))
            .collect()
    }

    fn freed(&mut self, pages: usize) {
        if self.in_group {
            self.deferred += pages;
        }
    }
}

/// Every slot of `pages`, page by page.
fn page_slots(pages: &[PageId], page_size: usize) -> Vec<KvSlot> {
    pages
        .iter()
        .flat_map(|&page| {
            let first = page * page_size as KvSlot;
            first..first + page_size as KvSlot
        })
        .collect()
}

/// The head of the free list the next allocation of `needed` pages reads: merged with the
/// release list when `estimate` (sglang's merge trigger for the call) exceeds the free list and
/// the merged list can serve the call.
fn next_free<R: ReuseOrder>(
    allocator: &PageAllocator<R>,
    needed: usize,
    estimate: usize,
) -> Vec<PageId> {
    let free: Vec<PageId> = allocator.free_pages().collect();
    let released = allocator.released_pages().count();
    if released == 0 || estimate <= free.len() || needed > free.len() + released {
        return free;
    }
    let mut merged: Vec<PageId> = free.into_iter().chain(allocator.released_pages()).collect();
    merged.sort_unstable();
    merged
}

/// sglang's three-part extend rule (`alloc_extend_naive`, `mem_cache/allocator/paged.py`)
/// restated per position: part 1 continues after `last_loc`, later positions use
/// the request's share of `free` (page `(pos − ceil_align(pre)) / ps` of it).
fn reference_extend(page_size: usize, reqs: &[ExtendShape], free: &[PageId]) -> Vec<KvSlot> {
    let mut out = Vec::new();
    let mut page_start = 0;
    for r in reqs {
        let pre_ceil = r.prefix_len.div_ceil(page_size) * page_size;
        let share = &free[page_start..];
        page_start += r.seq_len.div_ceil(page_size) - r.prefix_len.div_ceil(page_size);
        for pos in r.prefix_len..r.seq_len {
            out.push(if pos < pre_ceil {
                r.last_loc.unwrap() + 1 + (pos - r.prefix_len) as KvSlot
            } else {
                share[(pos - pre_ceil) / page_size] * page_size as KvSlot
                    + (pos % page_size) as KvSlot
            });
        }
    }
    out
}

/// What an out-of-memory answer leaves of `before`: its release list merged (sglang merges
/// before it finds the call does not fit, and keeps the merge), nothing else changed.
fn refused<R: ReuseOrder>(before: &PageAllocator<R>) -> PageAllocator<R> {
    let mut merged = before.clone();
    merged.merge_released();
    merged
}

fn run<R: ReuseOrder>(mut allocator: PageAllocator<R>, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let page_size = allocator.page_size();
    let num_pages = allocator.num_pages();
    let mut model = Model {
        page_size,
        rows: Vec::new(),
        raw: Vec::new(),
        in_group: false,
        deferred: 0,
    };
    run_ops(&mut allocator, &mut model, &mut ops.into_iter())?;
    for slots in model.rows.iter().chain(&model.raw) {
        allocator.free(slots).unwrap();
    }
    prop_assert_eq!(allocator.available_size(), allocator.capacity());
    let mut all: Vec<PageId> = allocator
        .free_pages()
        .chain(allocator.released_pages())
        .collect();
    all.sort_unstable();
    prop_assert_eq!(all, (1..=num_pages as PageId).collect::<Vec<_>>());
    allocator
        .check()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    Ok(())
}

/// Runs `ops` until an `End` closes the group this call runs in (or they run out), checking the
/// allocator against the model after each.
fn run_ops<R: ReuseOrder>(
    allocator: &mut PageAllocator<R>,
    model: &mut Model,
    ops: &mut impl Iterator<Item = Op>,
) -> Result<(), TestCaseError> {
    let page_size = allocator.page_size();
    let num_pages = allocator.num_pages();
    while let Some(op) = ops.next() {
        let before = allocator.clone();
        let available_pages = allocator.available_size() / page_size;
        match op {
            Op::Alloc(pages) => {
                let mut out = Vec::new();
                let free = next_free(allocator, pages, pages);
                match allocator.alloc(pages * page_size, &mut out) {
                    Ok(()) => {
                        prop_assert_eq!(&out, &page_slots(&free[..pages], page_size));
                        model.raw.push(out);
                    }
                    Err(e) => {
                        prop_assert!(pages > available_pages, "{e}");
                        prop_assert_eq!(&*allocator, &refused(&before));
                    }
                }
            }
            Op::AllocPages(pages) => {
                let mut out = vec![0];
                let free = next_free(allocator, pages, pages);
                match allocator.alloc_page_ids(pages, &mut out) {
                    Ok(()) => {
                        prop_assert_eq!(&out[1..], &free[..pages]);
                        model.raw.push(page_slots(&out[1..], page_size));
                    }
                    Err(e) => {
                        prop_assert!(
                            matches!(e, AllocError::OutOfMemory(_)) && pages > available_pages,
                            "{e}"
                        );
                        prop_assert_eq!(&out, &vec![0]);
                        prop_assert_eq!(&*allocator, &refused(&before));
                    }
                }
            }
            Op::Extend(entries) => {
                let mut chosen = BTreeSet::new();
                let mut targets = Vec::new();
                let mut reqs = Vec::new();
                for (pick, len) in entries {
                    let target = if pick < model.rows.len() && chosen.insert(pick) {
                        Some(pick)
                    } else {
                        None
                    };
                    let row: &[KvSlot] = target.map_or(&[], |t| &model.rows[t]);
                    reqs.push(ExtendShape {
                        prefix_len: row.len(),
                        seq_len: row.len() + len,
                        last_loc: row.last().copied(),
                    });
                    targets.push(target);
                }
                let needed: usize = reqs
                    .iter()
                    .map(|r| r.seq_len.div_ceil(page_size) - r.prefix_len.div_ceil(page_size))
                    .sum();
                // sglang's paged `alloc_extend` merges when `extend_num_tokens // ps + bs + 1`
                // exceeds the free list; the token allocator's `alloc(n)` when `n` does.
                let tokens: usize = reqs.iter().map(|r| r.seq_len - r.prefix_len).sum();
                let estimate = match R::FREED_FIRST {
                    true => tokens / page_size + reqs.len() + 1,
                    false => needed,
                };
                let free = next_free(allocator, needed, estimate);
                let mut out = vec![0];
                match allocator.alloc_extend(&reqs, &mut out) {
                    Ok(()) => {
                        prop_assert!(needed <= available_pages);
                        let expected = reference_extend(page_size, &reqs, &free);
                        prop_assert_eq!(&out[1..], &expected[..]);
                        let unique: BTreeSet<_> = out[1..].iter().collect();
                        prop_assert_eq!(unique.len(), out.len() - 1);
                        prop_assert_eq!(
                            allocator.available_size(),
                            (available_pages - needed) * page_size
                        );
                        let mut offset = 1;
                        for (r, target) in reqs.iter().zip(targets) {
                            let new = &out[offset..offset + r.seq_len - r.prefix_len];
                            offset += new.len();
                            match target {
                                Some(t) => model.rows[t].extend_from_slice(new),
                                None => model.rows.push(new.to_vec()),
                            }
                        }
                    }
                    Err(e) => {
                        prop_assert!(
                            matches!(e, AllocError::OutOfMemory(_)) && needed > available_pages,
                            "{e}"
                        );
                        prop_assert_eq!(&out, &vec![0]);
                        prop_assert_eq!(&*allocator, &refused(&before));
                    }
                }
            }
            Op::Decode(picks) => {
                let targets: Vec<usize> = picks
                    .into_iter()
                    .filter(|&p| p < model.rows.len() && !model.rows[p].is_empty())
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect();
                let reqs: Vec<DecodeShape> = targets
                    .iter()
                    .map(|&t| DecodeShape {
                        seq_len: model.rows[t].len() + 1,
                        last_loc: *model.rows[t].last().unwrap(),
                    })
                    .collect();
                let needed = reqs
                    .iter()
                    .filter(|r| (r.seq_len - 1) % page_size == 0)
                    .count();
                // sglang's `alloc_decode` merges when the batch exceeds the free list.
                let free = next_free(allocator, needed, reqs.len());
                let mut out = Vec::new();
                match allocator.alloc_decode(&reqs, &mut out) {
                    Ok(()) => {
                        let mut next = free.iter();
                        for ((r, &slot), &t) in reqs.iter().zip(&out).zip(&targets) {
                            let expected = if (r.seq_len - 1) % page_size == 0 {
                                next.next().unwrap() * page_size as KvSlot
                            } else {
                                r.last_loc + 1
                            };
                            prop_assert_eq!(slot, expected);
                            model.rows[t].push(slot);
                        }
                    }
                    Err(e) => {
                        prop_assert!(needed > available_pages, "{e}");
                        prop_assert_eq!(&*allocator, &refused(&before));
                    }
                }
            }
            Op::FreeRow(pick) if pick < model.rows.len() => {
                let row = model.rows.swap_remove(pick);
                allocator.free(&row).unwrap();
                model.freed(model.pages(&row).len());
            }
            Op::FreeRaw(pick) if pick < model.raw.len() => {
                let raw = model.raw.swap_remove(pick);
                allocator.free(&raw).unwrap();
                model.freed(model.pages(&raw).len());
            }
            Op::FreeRawPages(pick) if pick < model.raw.len() => {
                let raw = model.raw.swap_remove(pick);
                let pages: Vec<PageId> = raw
                    .chunks(page_size)
                    .map(|page| page[0] / page_size as KvSlot)
                    .collect();
                allocator.free_page_ids(&pages, FreeOrder::Given).unwrap();
                model.freed(pages.len());
            }
            Op::FreeRawPageByPage(pick) if pick < model.raw.len() => {
                // Last page first, as W1 frees: each call names one page.
                let raw = model.raw.swap_remove(pick);
                for page in raw.chunks(page_size).rev() {
                    let page = page[0] / page_size as KvSlot;
                    allocator.free_page_ids(&[page], FreeOrder::Given).unwrap();
                    let again = allocator.free_page_ids(&[page], FreeOrder::Given);
                    prop_assert!(
                        matches!(again, Err(AllocError::DoubleFree { .. })),
                        "{again:?}"
                    );
                }
                model.freed(raw.len() / page_size);
            }
            Op::Truncate(pick, cut) if pick < model.rows.len() => {
                let row = &mut model.rows[pick];
                let cut = cut % (row.len() + 1) / page_size * page_size;
                let tail = row.split_off(cut);
                allocator.free_segment(&tail, cut).unwrap();
                let pages = model.pages(&tail).len();
                model.freed(pages);
            }
            Op::FreeSplit(pick, cut) if pick < model.rows.len() => {
                let row = model.rows.swap_remove(pick);
                let cut = cut % (row.len() + 1);
                allocator
                    .free_segments(&[(&row[..cut], 0), (&row[cut..], cut)])
                    .unwrap();
                if let Some(first) = row.first() {
                    let again = allocator.free(&[*first]);
                    prop_assert!(
                        matches!(again, Err(AllocError::DoubleFree { .. })),
                        "{again:?}"
                    );
                }
                model.freed(model.pages(&row).len());
            }
            Op::Begin if model.in_group => {
                prop_assert_eq!(
                    allocator.free_group().map(drop),
                    Err(AllocError::NestedFreeGroup {
                        deferred_pages: model.deferred
                    })
                );
            }
            // The ops up to the next `End` (or the last op) run inside the group.
            Op::Begin => {
                let mut group = allocator.free_group().unwrap();
                model.in_group = true;
                run_ops(&mut group, model, ops)?;
                group.commit();
                model.in_group = false;
                model.deferred = 0;
            }
            Op::End if model.in_group => return Ok(()),
            // An end without a group cannot be written.
            Op::End => {}
            Op::FreeRow(_)
            | Op::FreeRaw(_)
            | Op::FreeRawPages(_)
            | Op::FreeRawPageByPage(_)
            | Op::Truncate(..)
            | Op::FreeSplit(..) => {}
        }
        allocator
            .check()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let held = model.held_pages();
        prop_assert!(held.iter().all(|&p| allocator.is_page_allocated(p)));
        prop_assert_eq!(allocator.deferred_count(), model.deferred);
        prop_assert_eq!(
            allocator.available_size() / page_size + held.len() + model.deferred,
            num_pages
        );
    }
    Ok(())
}

fn scenario(page_size: usize) -> impl Strategy<Value = (usize, bool, Vec<Op>)> {
    (
        4usize..40,
        any::<bool>(),
        prop::collection::vec(op(page_size), 1..60),
    )
}

proptest! {
    #![proptest_config(common::proptest_config())]

    #[test]
    fn token_allocator_interleavings((pages, need_sort, ops) in scenario(1)) {
        run(TokenAllocator::new(pages, need_sort).unwrap(), ops)?;
    }

    #[test]
    fn paged_allocator_interleavings_page_size_1((pages, need_sort, ops) in scenario(1)) {
        run(PagedAllocator::new(pages, 1, need_sort).unwrap(), ops)?;
    }

    /// A page size that is not a power of two: the allocator's division-based arithmetic.
    #[test]
    fn paged_allocator_interleavings_page_size_3((pages, need_sort, ops) in scenario(3)) {
        run(PagedAllocator::new(pages * 3, 3, need_sort).unwrap(), ops)?;
    }

    #[test]
    fn paged_allocator_interleavings_page_size_4((pages, need_sort, ops) in scenario(4)) {
        run(PagedAllocator::new(pages * 4, 4, need_sort).unwrap(), ops)?;
    }

    #[test]
    fn paged_allocator_interleavings_page_size_16((pages, need_sort, ops) in scenario(16)) {
        run(PagedAllocator::new(pages * 16, 16, need_sort).unwrap(), ops)?;
    }

    #[test]
    fn paged_allocator_interleavings_page_size_32((pages, need_sort, ops) in scenario(32)) {
        run(PagedAllocator::new(pages * 32, 32, need_sort).unwrap(), ops)?;
    }

    #[test]
    fn paged_allocator_interleavings_page_size_64((pages, need_sort, ops) in scenario(64)) {
        run(PagedAllocator::new(pages * 64, 64, need_sort).unwrap(), ops)?;
    }
}
