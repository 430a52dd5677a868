//! Interior-mutable owned fields would be writable through a shared read: each one is rejected,
//! all in one build.

use std::cell::{Cell, OnceCell, RefCell, UnsafeCell};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, RwLock};

/// Shaped like the `atomic` crate's `Atomic<T>`: a value behind a shared-write cell.
pub struct Atomic<T>(Cell<T>);

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc)]
    cell: Cell<usize>,
    #[owned_by(alloc)]
    ref_cell: RefCell<Vec<u32>>,
    #[owned_by(alloc)]
    atomic: std::sync::atomic::AtomicU64,
    #[owned_by(alloc)]
    shared_atomic: Arc<AtomicUsize>,
    #[owned_by(alloc)]
    mutex: Mutex<usize>,
    #[owned_by(alloc)]
    rw_lock: RwLock<usize>,
    #[owned_by(alloc)]
    once: OnceCell<usize>,
    #[owned_by(alloc)]
    raw: UnsafeCell<usize>,
    #[owned_by(alloc)]
    once_flag: std::sync::Once,
    #[owned_by(alloc)]
    generic_atomic: Atomic<u64>,
}

#[kvown::owner]
pub fn alloc() {}

fn main() {}
