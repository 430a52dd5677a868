//! **Start here.** A small shop written as a user's crate, depending only on `kvown` without its
//! allocator (`default-features = false`: the macros and their support crate, no
//! `kvown-runtime`): the macros' expansions reach what they need through `::kvown::__private`.
//!
//! * [`ledger`]: an [`ledger::Account`] whose `balance` only `deposit` and `withdraw` write,
//!   both through a helper bound by the owner trait [`ledger::AccountBalanceOwner`];
//! * [`orders`]: an [`orders::Order`] whose `state` only the methods `Order::ship` and
//!   `Order::cancel` write (method owners, `#[kvown::owners]`);
//! * [`storage`]: a generic [`storage::Bin<T>`] whose items only `Bin::put` and `Bin::take`
//!   write;
//! * `journal`, a private module: the same macros on private items (`cargo doc
//!   --document-private-items` shows them as the module's own).
//!
//! When a change does not compile, `docs/macro-messages.md` in the kvown repository quotes each
//! message a first-hour mistake gets, and its fix.
#![forbid(unsafe_code)]

pub mod ledger;
pub mod orders;
pub mod storage;

mod journal;

pub use journal::recorded;
