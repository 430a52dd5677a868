//! Reuse orders: where freed pages re-enter the free list.

use std::fmt::Debug;

mod sealed {
    pub trait Sealed {}
}

/// Where a plain free puts its pages. Sealed: the two orders sglang uses are [`Fifo`] and [`Lifo`].
pub trait ReuseOrder: sealed::Sealed + Debug + Clone + Copy + PartialEq + Eq + Default {
    /// `true`: freed pages go to the head of the free list and are reused first (LIFO);
    /// `false`: they go to the tail and are reused last (FIFO).
    const FREED_FIRST: bool;
}

/// Freed slots are appended to the tail of the free list (sglang `TokenToKVPoolAllocator`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fifo;

/// Freed pages are prepended to the head of the free list (sglang `PagedTokenToKVPoolAllocator`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lifo;

impl sealed::Sealed for Fifo {}
impl sealed::Sealed for Lifo {}

impl ReuseOrder for Fifo {
    const FREED_FIRST: bool = false;
}

impl ReuseOrder for Lifo {
    const FREED_FIRST: bool = true;
}
