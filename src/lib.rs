//! kvown: compile-time single-owner field writes, and a paged KV-cache allocator built on them.
#![forbid(unsafe_code)]

pub use kvown_macros::{guarded, owner, owners};
pub use kvown_runtime::ownership::audit;
pub use kvown_runtime::{alloc, batch, cache, check, error, kv, radix, request, slots, tree_cache};

#[doc(hidden)]
pub use kvown_runtime::__private;
