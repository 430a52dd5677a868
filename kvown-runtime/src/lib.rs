//! kvown runtime: the support types behind `#[kvown::guarded]` / `#[kvown::owner]`, the audit
//! register, and a paged KV-cache allocator whose per-request bookkeeping is owned at compile time.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod alloc;
pub mod kv;
pub mod ownership;
pub mod radix;
pub mod slots;

/// Items the macro expansions refer to. Not a public API; may change in any release.
#[doc(hidden)]
pub mod __private {
    pub use crate::ownership::audit::{FieldWrites, GuardedField, OwnerSite};
    pub use crate::ownership::{OwnerSeal, OwnerToken};
    pub use inventory;
}
