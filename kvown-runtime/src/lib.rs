//! kvown runtime: the support types behind `#[kvown::guarded]` / `#[kvown::owner]`, the audit
//! register, and a paged KV-cache allocator whose per-request bookkeeping is owned at compile time.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod alloc;
pub mod kv;
pub mod radix;
pub mod slots;
