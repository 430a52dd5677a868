//! kvown runtime: the support types behind `#[kvown::guarded]` / `#[kvown::owner]`, the audit
//! register, and a paged KV-cache allocator whose per-request bookkeeping is owned at compile
//! time.
//!
//! The allocator follows sglang's KV-cache bookkeeping (target state after sglang #37085):
//! [`slots`] (request-to-token table), [`alloc`] (token and paged slot allocators), [`radix`]
//! (prefix cache), [`kv`] (K/V data pools), [`request`] (the per-request ladder in guarded
//! fields), [`batch`] (extend, decode, speculative decode, retract, release),
//! [`tree_cache`] (request-level prefix-cache steps), [`cache`] (the bundle they share), and
//! [`check`] (the invariant checker).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

// Lets the unit tests include shared test helpers written against the public paths.
#[cfg(test)]
extern crate self as kvown_runtime;

pub mod alloc;
pub mod batch;
pub mod cache;
pub mod check;
pub mod error;
pub mod kv;
pub mod ownership;
pub mod radix;
pub mod request;
pub mod slots;
pub mod tree_cache;

/// Items the macro expansions refer to. Not a public API; may change in any release.
#[doc(hidden)]
pub mod __private {
    pub use crate::ownership::audit::{FieldWrites, GuardedField, OwnerSite};
    pub use crate::ownership::{OwnerSeal, OwnerToken};
    pub use inventory;
}
