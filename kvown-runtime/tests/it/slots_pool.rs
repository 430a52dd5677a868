//! ReqToTokenPool: row 0 reserved, tail allocation in batch order, all-or-nothing, LIFO free,
//! generations, typed errors, bounded writes.

use kvown_runtime::slots::{ReqToTokenPool, SlotError};

#[test]
fn fresh_pool_is_zeroed_and_hands_out_rows_from_the_tail() {
    let mut pool = ReqToTokenPool::new(8, 16).unwrap();
    assert_eq!(pool.available_size(), 8);
    assert!((0..=8).all(|r| pool.row(r).unwrap() == [0; 16]));
    assert_eq!(pool.alloc(2).unwrap(), [7, 8]);
    assert_eq!(pool.alloc(3).unwrap(), [4, 5, 6]);
    assert_eq!(pool.free_rows(), [1, 2, 3]);
    assert_eq!(pool.alloc(0).unwrap(), Vec::<usize>::new());
}

#[test]
fn row_zero_is_never_handed_out() {
    let mut pool = ReqToTokenPool::new(3, 4).unwrap();
    let mut rows = pool.alloc(3).unwrap();
    assert!(!rows.contains(&0));
    for row in rows.drain(..) {
        pool.free(row).unwrap();
    }
    assert!(!pool.alloc(3).unwrap().contains(&0));
    assert_eq!(pool.free(0), Err(SlotError::ReservedRow));
    assert!(!pool.is_held(0));
}

#[test]
fn alloc_is_all_or_nothing_with_an_actionable_error() {
    let mut pool = ReqToTokenPool::new(4, 4).unwrap();
    pool.alloc(3).unwrap();
    let before = pool.clone();
    let error = pool.alloc(2).unwrap_err();
    assert_eq!(
        error,
        SlotError::OutOfRows {
            requested: 2,
            available: 1
        }
    );
    assert!(
        error
            .to_string()
            .contains("lower the maximum number of running requests")
    );
    assert_eq!(pool, before);
}

#[test]
fn free_appends_so_the_last_freed_row_is_reused_first() {
    let mut pool = ReqToTokenPool::new(5, 4).unwrap();
    assert_eq!(pool.alloc(5).unwrap(), [1, 2, 3, 4, 5]);
    pool.free(2).unwrap();
    pool.free(4).unwrap();
    assert_eq!(pool.free_rows(), [2, 4]);
    assert_eq!(pool.alloc(1).unwrap(), [4]);
    assert_eq!(pool.alloc(1).unwrap(), [2]);
}

#[test]
fn free_errors_are_typed_and_change_nothing() {
    let mut pool = ReqToTokenPool::new(3, 4).unwrap();
    pool.alloc(1).unwrap();
    let before = pool.clone();
    assert_eq!(pool.free(2), Err(SlotError::DoubleFree { row: 2 }));
    assert_eq!(
        pool.free(4),
        Err(SlotError::RowOutOfRange { row: 4, size: 3 })
    );
    assert_eq!(pool, before);
    pool.free(3).unwrap();
    assert_eq!(pool.free(3), Err(SlotError::DoubleFree { row: 3 }));
}

#[test]
fn generation_is_bumped_on_every_assignment() {
    let mut pool = ReqToTokenPool::new(2, 4).unwrap();
    assert_eq!(pool.req_generation(2), Ok(0));
    let [row] = pool.alloc(1).unwrap()[..] else {
        panic!("one row")
    };
    assert_eq!(pool.req_generation(row), Ok(1));
    pool.free(row).unwrap();
    assert_eq!(pool.req_generation(row), Ok(1));
    assert_eq!(pool.alloc(1).unwrap(), [row]);
    assert_eq!(pool.req_generation(row), Ok(2));
    assert_eq!(pool.req_generation(1), Ok(0));
    assert_eq!(
        pool.req_generation(3),
        Err(SlotError::RowOutOfRange { row: 3, size: 2 })
    );
}

#[test]
fn writes_land_in_the_row_and_are_bounded_by_its_width() {
    let mut pool = ReqToTokenPool::new(2, 6).unwrap();
    let row = pool.alloc(1).unwrap()[0];
    pool.write(row, 2, &[40, 41, 42]).unwrap();
    assert_eq!(pool.row(row).unwrap(), [0, 0, 40, 41, 42, 0]);
    pool.row_mut(row).unwrap()[5] = 9;
    let before = pool.clone();
    let error = pool.write(row, 4, &[1, 2, 3]).unwrap_err();
    assert_eq!(
        error,
        SlotError::PositionOutOfRange {
            row,
            start: 4,
            end: 7,
            row_width: 6
        }
    );
    assert!(error.to_string().contains("max_context_len = 6"));
    assert_eq!(
        pool.write(1, 0, &[1]),
        Err(SlotError::RowNotHeld { row: 1 })
    );
    assert_eq!(pool.write(0, 0, &[1]), Err(SlotError::ReservedRow));
    assert_eq!(
        pool.row(3),
        Err(SlotError::RowOutOfRange { row: 3, size: 2 })
    );
    assert_eq!(pool, before);
    assert_eq!(pool.row(row).unwrap(), [0, 0, 40, 41, 42, 9]);
}

#[test]
fn free_keeps_contents_and_clear_restores_rows_and_generations() {
    let mut pool = ReqToTokenPool::new(3, 2).unwrap();
    let row = pool.alloc(1).unwrap()[0];
    pool.write(row, 0, &[5, 6]).unwrap();
    pool.free(row).unwrap();
    assert_eq!(pool.row(row).unwrap(), [5, 6]);
    pool.alloc(2).unwrap();
    pool.clear();
    assert_eq!(pool.free_rows(), [1, 2, 3]);
    assert!((1..=3).all(|r| !pool.is_held(r) && pool.req_generation(r) == Ok(0)));
}

#[test]
fn an_unrepresentable_table_is_rejected() {
    assert_eq!(
        ReqToTokenPool::new(usize::MAX, 2),
        Err(SlotError::TableTooLarge {
            rows: usize::MAX,
            max_context_len: 2
        })
    );
    // Entries that a usize counts but whose bytes (4 each) the address space does not hold,
    // and rows whose bookkeeping does not fit (these panicked in the allocation).
    for (size, max_context_len) in [(1 << 62, 1), (0, 1 << 62), (1 << 60, 0)] {
        assert_eq!(
            ReqToTokenPool::new(size, max_context_len),
            Err(SlotError::TableTooLarge {
                rows: size + 1,
                max_context_len
            }),
            "{size} x {max_context_len}"
        );
    }
    // A table the address space holds but no x86-64 or AArch64 host can map (2^56 bytes):
    // the allocator's refusal is the same error (it aborted the process).
    assert_eq!(
        ReqToTokenPool::new(0, 1 << 54),
        Err(SlotError::TableTooLarge {
            rows: 1,
            max_context_len: 1 << 54
        })
    );
}

#[test]
fn rows_taken_directly_name_no_request() {
    // Only the batch flow's extend records whose row it is; out-of-range rows name none either.
    let mut pool = ReqToTokenPool::new(2, 4).unwrap();
    let rows = pool.alloc(2).unwrap();
    assert!(rows.iter().all(|&row| pool.assigned_to(row).is_none()));
    assert_eq!(pool.assigned_to(0), None);
    assert_eq!(pool.assigned_to(3), None);
}
