//! Token allocator (page size 1): slot range, FIFO reuse, need_sort, typed errors.

use kvown_runtime::alloc::{
    AllocError, DecodeShape, ExtendShape, KvAllocator, KvSlot, PageState, PagedAllocator,
    SlotCalls, TokenAllocator,
};
use kvown_runtime::error::OutOfMemory;

fn alloc(allocator: &mut TokenAllocator, n: usize) -> Vec<KvSlot> {
    let mut out = Vec::new();
    allocator.alloc(n, &mut out).expect("alloc");
    out
}

fn free_list(allocator: &TokenAllocator) -> Vec<KvSlot> {
    allocator.free_pages().collect()
}

#[test]
fn fresh_pool_hands_out_slots_one_to_size_in_order() {
    let mut allocator = TokenAllocator::new(8, false).unwrap();
    assert_eq!(allocator.page_size(), 1);
    assert_eq!(allocator.capacity(), 8);
    assert_eq!(allocator.available_size(), 8);
    assert_eq!(alloc(&mut allocator, 3), [1, 2, 3]);
    assert_eq!(alloc(&mut allocator, 5), [4, 5, 6, 7, 8]);
    assert_eq!(allocator.available_size(), 0);
    assert!(!allocator.is_page_free(0));
    assert_eq!(allocator.page_state(0), Some(PageState::Reserved));
    allocator.check().unwrap();
}

#[test]
fn out_of_memory_reports_requested_and_available_and_changes_nothing() {
    let mut allocator = TokenAllocator::new(4, false).unwrap();
    alloc(&mut allocator, 3);
    let before = allocator.clone();
    let mut out = vec![42];
    let error = allocator.alloc(2, &mut out).unwrap_err();
    assert_eq!(
        error,
        AllocError::OutOfMemory(OutOfMemory {
            requested: 2,
            available: 1,
            evictable: 0
        })
    );
    assert!(error.to_string().contains("requested 2 slots, 1 free"));
    assert_eq!(out, [42]);
    assert_eq!(allocator, before);
}

#[test]
fn plain_free_appends_to_the_tail_in_the_order_given() {
    let mut allocator = TokenAllocator::new(6, false).unwrap();
    assert_eq!(alloc(&mut allocator, 4), [1, 2, 3, 4]);
    allocator.free(&[3, 1]).unwrap();
    assert_eq!(free_list(&allocator), [5, 6, 3, 1]);
    assert_eq!(alloc(&mut allocator, 3), [5, 6, 3]);
    assert_eq!(allocator.available_size(), 1);
    allocator.check().unwrap();
}

#[test]
fn a_slot_named_twice_in_one_free_is_freed_once() {
    let mut allocator = TokenAllocator::new(3, false).unwrap();
    alloc(&mut allocator, 2);
    allocator.free(&[2, 2, 1]).unwrap();
    assert_eq!(free_list(&allocator), [3, 2, 1]);
    allocator.check().unwrap();
}

#[test]
fn invalid_frees_are_typed_and_roll_back() {
    let mut allocator = TokenAllocator::new(4, false).unwrap();
    alloc(&mut allocator, 2);
    allocator.free(&[1]).unwrap();
    let before = allocator.clone();
    assert_eq!(
        allocator.free(&[1]),
        Err(AllocError::DoubleFree {
            slot: 1,
            page: 1,
            state: PageState::Free
        })
    );
    assert_eq!(
        allocator.free(&[3]),
        Err(AllocError::NotAllocated { slot: 3, page: 3 })
    );
    assert_eq!(
        allocator.free(&[0]),
        Err(AllocError::ReservedSlot {
            slot: 0,
            page_size: 1
        })
    );
    assert_eq!(
        allocator.free(&[2, 5]),
        Err(AllocError::SlotOutOfRange {
            slot: 5,
            slot_end: 5
        })
    );
    assert_eq!(allocator, before);
    assert!(allocator.is_page_allocated(2));
    allocator.check().unwrap();
}

#[test]
fn need_sort_releases_frees_and_merges_sorted_only_when_short() {
    let mut allocator = TokenAllocator::new(6, true).unwrap();
    assert_eq!(alloc(&mut allocator, 4), [1, 2, 3, 4]);
    allocator.free(&[4, 2]).unwrap();
    assert_eq!(free_list(&allocator), [5, 6]);
    let mut released: Vec<_> = allocator.released_pages().collect();
    released.sort_unstable();
    assert_eq!(released, [2, 4]);
    assert_eq!(allocator.available_size(), 4);
    assert_eq!(alloc(&mut allocator, 1), [5]);
    assert_eq!(
        allocator.released_pages().count(),
        2,
        "no merge while the free list suffices"
    );
    assert_eq!(alloc(&mut allocator, 2), [2, 4]);
    assert_eq!(free_list(&allocator), [6]);
    assert_eq!(allocator.released_pages().count(), 0);
    allocator.check().unwrap();
}

#[test]
fn need_sort_out_of_memory_keeps_the_merge_and_hands_out_nothing() {
    let mut allocator = TokenAllocator::new(4, true).unwrap();
    alloc(&mut allocator, 3);
    allocator.free(&[2]).unwrap();
    let mut merged = allocator.clone();
    merged.merge_released();
    let mut out = Vec::new();
    assert_eq!(
        allocator.alloc(3, &mut out),
        Err(AllocError::OutOfMemory(OutOfMemory {
            requested: 3,
            available: 2,
            evictable: 0
        }))
    );
    // sglang's `alloc` merged before it found 2 slots short of 3, and keeps the merge.
    assert!(out.is_empty());
    assert_eq!(allocator, merged);
    assert_eq!(free_list(&allocator), [2, 4]);
}

#[test]
fn decode_takes_a_fresh_slot_for_every_token() {
    let mut allocator = TokenAllocator::new(10, false).unwrap();
    let mut row = Vec::new();
    allocator
        .alloc_extend(
            &[ExtendShape {
                prefix_len: 0,
                seq_len: 3,
                last_loc: None,
            }],
            &mut row,
        )
        .unwrap();
    assert_eq!(row, [1, 2, 3]);
    let other = alloc(&mut allocator, 1);
    assert_eq!(other, [4]);
    let mut out = Vec::new();
    allocator
        .alloc_decode(
            &[DecodeShape {
                seq_len: 4,
                last_loc: 3,
            }],
            &mut out,
        )
        .unwrap();
    assert_eq!(out, [5], "last_loc + 1 = 4 belongs to another owner");
    assert_eq!(allocator.available_size(), 5);
    allocator.check().unwrap();
}

#[test]
fn clear_makes_everything_free_again() {
    let mut allocator = TokenAllocator::new(5, false).unwrap();
    alloc(&mut allocator, 4);
    allocator.free(&[2]).unwrap();
    let mut group = allocator.free_group().unwrap();
    group.free(&[1]).unwrap();
    group.clear(); // closes the group, whose guard then commits nothing
    drop(group);
    assert_eq!(allocator, TokenAllocator::new(5, false).unwrap());
    assert_eq!(allocator.available_size(), 5);
}

#[test]
fn bookkeeping_stays_within_sixteen_bytes_per_slot() {
    let allocator = TokenAllocator::new(1 << 16, false).unwrap();
    let per_page = allocator.bookkeeping_bytes() as f64 / allocator.num_pages() as f64;
    assert!(per_page <= 16.0, "{per_page} bytes per page");
    assert!(
        per_page >= 9.0,
        "{per_page}: state byte + fill mark + free ring + deferred list"
    );
}

#[test]
fn a_pool_beyond_the_u32_slot_range_is_rejected() {
    assert_eq!(
        TokenAllocator::new(u32::MAX as usize, false),
        Err(AllocError::TooManySlots {
            num_pages: u32::MAX as usize,
            page_size: 1,
            slot_end: 1 << 32
        })
    );
    // So is one whose page count plus the padding page overflows (it panicked counting it).
    for allocator in [
        TokenAllocator::new(usize::MAX, false).map(drop),
        PagedAllocator::new(usize::MAX, 1, false).map(drop),
    ] {
        assert_eq!(
            allocator,
            Err(AllocError::TooManySlots {
                num_pages: usize::MAX,
                page_size: 1,
                slot_end: u64::MAX
            })
        );
    }
}
