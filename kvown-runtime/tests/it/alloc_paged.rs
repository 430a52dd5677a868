//! Paged allocator: page 0, LIFO reuse, free / free_segment(s) / free_page_ids page sets, groups,
//! need_sort,
//! typed errors and transactional failure.

use std::collections::BTreeSet;

use kvown_runtime::alloc::{
    AllocError, ExtendShape, FreeOrder, KvAllocator, KvSlot, PageId, PageState, PagedAllocator,
    SlotCalls,
};
use kvown_runtime::error::{OutOfMemory, PageOutOfRange};

fn paged(num_pages: usize, page_size: usize) -> PagedAllocator {
    PagedAllocator::new(num_pages * page_size, page_size, false).unwrap()
}

fn alloc(allocator: &mut PagedAllocator, n: usize) -> Vec<KvSlot> {
    let mut out = Vec::new();
    allocator.alloc(n, &mut out).expect("alloc");
    out
}

fn free_list(allocator: &PagedAllocator) -> Vec<PageId> {
    allocator.free_pages().collect()
}

fn slots_of(page: PageId, page_size: usize) -> Vec<KvSlot> {
    let first = page * page_size as KvSlot;
    (first..first + page_size as KvSlot).collect()
}

#[test]
fn page_zero_is_never_handed_out_and_slots_stay_in_range() {
    let mut allocator = PagedAllocator::new(22, 4, false).unwrap();
    assert_eq!(allocator.num_pages(), 5);
    assert_eq!(allocator.capacity(), 20);
    assert_eq!(allocator.available_size(), 20);
    let slots = alloc(&mut allocator, 20);
    assert_eq!(slots, (4..24).collect::<Vec<_>>());
    assert!(slots.iter().all(|&s| (4..24).contains(&s)));
    assert!(matches!(
        allocator.alloc(4, &mut Vec::new()),
        Err(AllocError::OutOfMemory(OutOfMemory {
            requested: 4,
            available: 0,
            evictable: 0
        }))
    ));
}

#[test]
fn alloc_takes_whole_pages_from_the_head() {
    let mut allocator = paged(6, 4);
    assert_eq!(alloc(&mut allocator, 8), [4, 5, 6, 7, 8, 9, 10, 11]);
    assert_eq!(free_list(&allocator), [3, 4, 5, 6]);
}

#[test]
fn unaligned_alloc_is_rejected_and_leaves_out_untouched() {
    let mut allocator = paged(6, 4);
    let before = allocator.clone();
    let mut out = vec![99];
    assert_eq!(
        allocator.alloc(5, &mut out),
        Err(AllocError::UnalignedAlloc {
            num_tokens: 5,
            page_size: 4
        })
    );
    assert_eq!(out, [99]);
    assert_eq!(allocator, before);
}

#[test]
fn plain_free_prepends_sorted_unique_pages() {
    let mut allocator = paged(6, 4);
    alloc(&mut allocator, 24);
    allocator.free(&[21, 9, 20, 22]).unwrap();
    assert_eq!(free_list(&allocator), [2, 5]);
    assert_eq!(allocator.available_size(), 8);
    allocator.free(&[12]).unwrap();
    assert_eq!(
        free_list(&allocator),
        [3, 2, 5],
        "freed pages are reused first"
    );
    assert_eq!(alloc(&mut allocator, 4), slots_of(3, 4));
    allocator.check().unwrap();
}

#[test]
fn free_segment_frees_the_same_pages_as_unique_slot_div_page_size() {
    for page_size in [1usize, 2, 4, 16] {
        for start_pos in 0..2 * page_size {
            let lengths = [
                1,
                page_size.saturating_sub(1).max(1),
                page_size,
                page_size + 1,
                3 * page_size + 2,
            ];
            for len in lengths {
                let pages_needed = (start_pos + len).div_ceil(page_size);
                let mut allocator = paged(pages_needed + 3, page_size);
                // Scatter the row's pages: take them after freeing some pages out of order.
                let all = alloc(&mut allocator, (pages_needed + 3) * page_size);
                allocator.free(&[all[page_size * 2], all[0]]).unwrap();
                let row_pages: Vec<PageId> = {
                    let mut out = Vec::new();
                    allocator.alloc(2 * page_size, &mut out).unwrap();
                    let mut pages: Vec<PageId> = out
                        .iter()
                        .step_by(page_size)
                        .map(|&s| s / page_size as u32)
                        .collect();
                    pages.extend((3..pages_needed + 3).map(|p| p as PageId + 1));
                    pages.truncate(pages_needed);
                    pages
                };
                let row: Vec<KvSlot> = (0..start_pos + len)
                    .map(|pos| {
                        row_pages[pos / page_size] * page_size as u32 + (pos % page_size) as u32
                    })
                    .collect();
                let segment = &row[start_pos..];
                let expected: BTreeSet<PageId> =
                    segment.iter().map(|&s| s / page_size as u32).collect();

                let mut by_segment = allocator.clone();
                let mut by_free = allocator.clone();
                by_segment.free_segment(segment, start_pos).unwrap();
                by_free.free(segment).unwrap();
                let freed = |a: &PagedAllocator| -> BTreeSet<PageId> { a.free_pages().collect() };
                assert_eq!(
                    freed(&by_segment),
                    expected,
                    "ps {page_size} start {start_pos} len {len}"
                );
                assert_eq!(freed(&by_free), expected);
                by_segment.check().unwrap();
            }
        }
    }
}

#[test]
fn free_segment_prepends_pages_in_row_order() {
    let mut allocator = paged(6, 4);
    alloc(&mut allocator, 24);
    let row: Vec<KvSlot> = [5u32, 2, 4].iter().flat_map(|&p| slots_of(p, 4)).collect();
    allocator.free_segment(&row[2..], 2).unwrap();
    assert_eq!(free_list(&allocator), [5, 2, 4]);
}

#[test]
fn free_page_ids_prepends_pages_in_the_order_given_like_free_segment() {
    let mut by_pages = paged(6, 4);
    alloc(&mut by_pages, 24);
    let mut by_segment = by_pages.clone();
    by_pages
        .free_page_ids(&[5, 2, 4, 2], FreeOrder::Given)
        .unwrap();
    let row: Vec<KvSlot> = [5u32, 2, 4].iter().flat_map(|&p| slots_of(p, 4)).collect();
    by_segment.free_segment(&row, 0).unwrap();
    assert_eq!(free_list(&by_pages), [5, 2, 4]);
    assert_eq!(by_pages, by_segment);
    by_pages.check().unwrap();
}

#[test]
fn free_page_ids_rejects_bad_pages_with_typed_errors_and_changes_nothing() {
    let mut allocator = paged(4, 4);
    alloc(&mut allocator, 8);
    allocator.free_page_ids(&[1], FreeOrder::Given).unwrap();
    let before = allocator.clone();
    for (pages, error) in [
        (
            &[2, 0][..],
            AllocError::PageOutOfRange(PageOutOfRange { page: 0, pages: 5 }),
        ),
        (
            &[2, 5][..],
            AllocError::PageOutOfRange(PageOutOfRange { page: 5, pages: 5 }),
        ),
        (
            &[2, 1][..],
            AllocError::DoubleFree {
                slot: 4,
                page: 1,
                state: PageState::Free,
            },
        ),
        (&[2, 3][..], AllocError::NotAllocated { slot: 12, page: 3 }),
    ] {
        assert_eq!(
            allocator.free_page_ids(pages, FreeOrder::Given),
            Err(error),
            "{pages:?}"
        );
        assert_eq!(allocator, before, "{pages:?} changed the allocator");
    }
    assert!(allocator.is_page_allocated(2));
    // Free, never allocated, padding, and beyond the pool: not allocated.
    for page in [1, 3, 0, 99] {
        assert!(!allocator.is_page_allocated(page), "page {page}");
    }
}

#[test]
fn free_page_ids_inside_a_group_is_deferred() {
    let mut allocator = paged(4, 4);
    alloc(&mut allocator, 16);
    let mut group = allocator.free_group().unwrap();
    group.free_page_ids(&[3, 1], FreeOrder::Given).unwrap();
    assert_eq!(group.deferred_pages(), [3, 1]);
    assert_eq!(group.available_size(), 0);
    group.commit();
    // In the order given, as outside a group (only `free`'s pages are sorted).
    assert_eq!(free_list(&allocator), [3, 1]);
}

/// A group's end releases as sglang's does: one `free` of the tokens deferred by `free` calls
/// (their pages sorted, at the head), then the page representatives of the `free_segment(s)`
/// calls in call order, in front of those.
#[test]
fn a_group_end_puts_segment_pages_in_call_order_before_the_sorted_free_pages() {
    let mut allocator = paged(8, 4);
    let row = alloc(&mut allocator, 32);
    let page = |p: PageId| row[(p as usize - 1) * 4..p as usize * 4].to_vec();
    let mut group = allocator.free_group().unwrap();
    group.free(&[page(7), page(2)].concat()).unwrap();
    group.free_segment(&[page(5), page(3)].concat(), 0).unwrap();
    group.free(&page(4)).unwrap();
    group
        .free_segments(&[(&page(8), 0), (&page(1), 0)])
        .unwrap();
    assert_eq!(group.deferred_pages(), [5, 3, 8, 1, 7, 2, 4]);
    group.commit();
    assert_eq!(free_list(&allocator), [5, 3, 8, 1, 2, 4, 7]);
    allocator.check().unwrap();
}

#[test]
fn free_segment_rejects_slots_outside_their_page_and_rolls_back() {
    let mut allocator = paged(6, 4);
    alloc(&mut allocator, 24);
    let before = allocator.clone();
    let segment = [8, 9, 10, 11, 12, 13, 20, 15];
    assert_eq!(
        allocator.free_segment(&segment, 0),
        Err(AllocError::SegmentNotPaged {
            offset: 6,
            slot: 20,
            expected_page: 3
        })
    );
    assert_eq!(allocator, before);
}

#[test]
fn free_segments_meeting_inside_a_page_free_it_once() {
    let mut allocator = paged(6, 4);
    alloc(&mut allocator, 24);
    let row: Vec<KvSlot> = [4u32, 1, 6].iter().flat_map(|&p| slots_of(p, 4)).collect();
    allocator
        .free_segments(&[(&row[0..6], 0), (&row[6..12], 6)])
        .unwrap();
    // As sglang's two frees: [4, 1] at the head, then [6] (page 1 went with the first).
    assert_eq!(free_list(&allocator), [6, 4, 1]);
    assert_eq!(allocator.available_size(), 12);
    allocator.check().unwrap();
}

#[test]
fn invalid_frees_are_typed_and_change_nothing() {
    let mut allocator = paged(4, 4);
    alloc(&mut allocator, 8);
    allocator.free(&[4]).unwrap();
    let before = allocator.clone();
    assert_eq!(
        allocator.free(&[8, 7]),
        Err(AllocError::DoubleFree {
            slot: 7,
            page: 1,
            state: PageState::Free
        })
    );
    assert_eq!(
        allocator.free(&[8, 12]),
        Err(AllocError::NotAllocated { slot: 12, page: 3 })
    );
    assert_eq!(
        allocator.free(&[3]),
        Err(AllocError::ReservedSlot {
            slot: 3,
            page_size: 4
        })
    );
    assert_eq!(
        allocator.free(&[20]),
        Err(AllocError::SlotOutOfRange {
            slot: 20,
            slot_end: 20
        })
    );
    assert_eq!(allocator, before);
    assert!(allocator.is_page_allocated(2));
}

#[test]
fn group_defers_every_free_until_end_and_applies_them_at_once() {
    let mut allocator = paged(6, 4);
    alloc(&mut allocator, 24);
    let mut group = allocator.free_group().unwrap();
    let mut source: Vec<KvSlot> = slots_of(5, 4);
    group.free(&source).unwrap();
    source.fill(8);
    group.free_segment(&slots_of(2, 4), 0).unwrap();
    assert_eq!(group.available_size(), 0);
    assert_eq!(group.deferred_count(), 2);
    assert!(!group.is_page_free(5));
    assert_eq!(group.page_state(5), Some(PageState::Deferred));
    assert!(matches!(
        group.alloc(4, &mut Vec::new()),
        Err(AllocError::OutOfMemory(_))
    ));
    assert_eq!(
        group.free(&[22]),
        Err(AllocError::DoubleFree {
            slot: 22,
            page: 5,
            state: PageState::Deferred
        })
    );
    group.check().unwrap();
    group.commit();
    assert_eq!(free_list(&allocator), [2, 5]);
    assert_eq!(allocator.available_size(), 8);
    assert_eq!(allocator.deferred_count(), 0);
    allocator.check().unwrap();
}

#[test]
fn nested_begin_is_an_error_that_keeps_the_open_group() {
    let mut allocator = paged(4, 4);
    alloc(&mut allocator, 8);
    let mut group = allocator.free_group().unwrap();
    group.free(&[4]).unwrap();
    assert_eq!(
        group.free_group().map(drop),
        Err(AllocError::NestedFreeGroup { deferred_pages: 1 })
    );
    assert!(group.in_free_group());
    assert_eq!(group.deferred_pages(), [1]);
    group.commit();
    assert_eq!(free_list(&allocator), [1, 3, 4]);
}

#[test]
// An end without a begin, or a second end, cannot be written: the guard commits once.
fn a_group_with_nothing_deferred_commits_to_no_change() {
    let mut allocator = paged(4, 4);
    alloc(&mut allocator, 8);
    let before = allocator.clone();
    let mut group = allocator.free_group().unwrap();
    group.free(&[]).unwrap();
    group.commit();
    assert_eq!(allocator, before);
    drop(allocator.free_group().unwrap());
    assert_eq!(allocator, before);
}

#[test]
fn failed_free_inside_a_group_keeps_earlier_deferrals() {
    let mut allocator = paged(4, 4);
    alloc(&mut allocator, 12);
    let mut group = allocator.free_group().unwrap();
    group.free(&[4]).unwrap();
    let before = group.clone();
    assert!(group.free(&[8, 16]).is_err());
    assert_eq!(*group, before);
    assert_eq!(group.deferred_pages(), [1]);
    assert!(group.is_page_allocated(2));
}

#[test]
fn need_sort_paged_frees_wait_in_release_and_merge_sorted_when_short() {
    let mut allocator = PagedAllocator::new(24, 4, true).unwrap();
    assert!(allocator.need_sort());
    assert!(!PagedAllocator::new(24, 4, false).unwrap().need_sort());
    alloc(&mut allocator, 16);
    allocator.free(&[12]).unwrap();
    allocator.free_segment(&slots_of(1, 4), 0).unwrap();
    assert_eq!(free_list(&allocator), [5, 6]);
    assert_eq!(allocator.available_size(), 16);
    assert_eq!(allocator.page_state(3), Some(PageState::Released));
    assert_eq!(alloc(&mut allocator, 8), [20, 21, 22, 23, 24, 25, 26, 27]);
    assert_eq!(alloc(&mut allocator, 4), slots_of(1, 4));
    assert_eq!(free_list(&allocator), [3]);
    allocator.check().unwrap();
}

// Slot runs are computed with their exclusive end, so the end of the last page must fit in a
// u32 too (a pool whose last page ended at 2^32 was accepted, and allocating that page handed
// out no slots in release builds).
#[test]
fn a_pool_ends_where_a_u32_can_still_mark_the_end_of_its_last_page() {
    // 65,534 pages of 65,536 slots after the padding page: the last page ends at 2^32 - 2^16.
    let page_size = 1 << 16;
    let num_pages = (1 << 16) - 2;
    let mut allocator = PagedAllocator::new(num_pages * page_size, page_size, false).unwrap();
    let mut pages = Vec::new();
    allocator.alloc_page_ids(num_pages, &mut pages).unwrap();
    let last = *pages.iter().max().unwrap();
    let first = last * page_size as KvSlot;
    assert_eq!(u64::from(first) + page_size as u64, (1 << 32) - (1 << 16));
    // The top page through every path that computes a run's end.
    allocator.free_page_ids(&[last], FreeOrder::Given).unwrap();
    let mut out = Vec::new();
    allocator.alloc(page_size, &mut out).unwrap();
    assert_eq!(
        out,
        (first..first + page_size as KvSlot).collect::<Vec<_>>()
    );
    let mut rest = Vec::new();
    let shape = ExtendShape {
        prefix_len: 1,
        seq_len: page_size,
        last_loc: Some(first),
    };
    allocator.free_page_ids(&[last], FreeOrder::Given).unwrap();
    let first_token = ExtendShape {
        prefix_len: 0,
        seq_len: 1,
        last_loc: None,
    };
    let mut started = Vec::new();
    allocator
        .alloc_extend(&[first_token], &mut started)
        .unwrap();
    assert_eq!(started, [first]);
    allocator.alloc_extend(&[shape], &mut rest).unwrap();
    assert_eq!(rest, out[1..], "fills the partial page up to its end");
    allocator.check().unwrap();
    // Pages up to 2^32 - 1 would put the end of the last one at 2^32.
    assert_eq!(
        PagedAllocator::new((num_pages + 1) * page_size, page_size, false),
        Err(AllocError::TooManySlots {
            num_pages: num_pages + 1,
            page_size,
            slot_end: 1 << 32
        })
    );
}

#[test]
fn bookkeeping_stays_within_sixteen_bytes_per_page() {
    let allocator = PagedAllocator::new(1 << 20, 16, false).unwrap();
    let per_page = allocator.bookkeeping_bytes() as f64 / allocator.num_pages() as f64;
    assert!(per_page <= 16.0, "{per_page} bytes per page");
    assert!(
        per_page >= 9.0,
        "{per_page}: state byte + free list + release list"
    );
}

#[test]
fn zero_page_size_is_rejected() {
    assert_eq!(
        PagedAllocator::new(16, 0, false),
        Err(AllocError::ZeroPageSize)
    );
}

/// Segments of whole pages of 16, 32 and 64 slots are checked a page at a time at a length known
/// at compile time: a slot outside its page is still named, at its offset, and the free refused
/// with nothing changed.
#[test]
fn a_misplaced_slot_in_a_whole_page_of_a_common_size_is_named() {
    for page_size in [16, 32, 64] {
        let mut allocator = paged(4, page_size);
        let row = alloc(&mut allocator, 3 * page_size);
        let before = allocator.clone();
        // A slot other than its page's first moved to the next page: the first names the page.
        for position in [1, page_size + 5, 3 * page_size - 1] {
            let mut segment = row.clone();
            segment[position] = row[(position + page_size) % row.len()];
            let error = allocator.free_segment(&segment, 0).unwrap_err();
            let expected_page = row[position - position % page_size] as usize / page_size;
            assert_eq!(
                error,
                AllocError::SegmentNotPaged {
                    offset: position,
                    slot: segment[position],
                    expected_page,
                },
                "page size {page_size}, position {position}"
            );
            assert_eq!(allocator, before);
        }
        allocator.free_segment(&row, 0).unwrap();
        allocator.check().unwrap();
    }
}
