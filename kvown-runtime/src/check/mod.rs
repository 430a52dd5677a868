//! The invariant checkers, each reached from here:
//! * [`check_allocator`] (`alloc`): the allocator's own lists and page states;
//! * [`check_radix`] (`radix`): the prefix cache's tree, sizes, eviction order and registrations;
//! * [`KvCache::check`](crate::cache::KvCache::check) (`cache`): every request's ladder, who
//!   holds each page, and the accounting identity
//!   `free + cached (evictable + locked) + request-owned == capacity`;
//! * [`PageLedger`] (`ledger`): who holds each page, for a caller's own holders;
//! * [`reclaim_leaks`] (`reclaim`): giving back what dropped requests leaked;
//! * what they report (`violation`): [`Violation`], [`Holder`], and the allocator's
//!   [`InvariantViolation`].

mod alloc;
mod cache;
mod ledger;
mod radix;
mod reclaim;
mod violation;

pub use crate::alloc::InvariantViolation;
pub use alloc::check_allocator;
pub use ledger::PageLedger;
pub use radix::{PrefixPart, check_radix};
pub use reclaim::{ReclaimError, Reclaimed, reclaim_leaks};
pub use violation::{Holder, Violation};

#[cfg(test)]
pub(crate) use radix::small_tree;
