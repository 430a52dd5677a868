//! kvown: compile-time single-owner field writes, and a paged KV-cache allocator built on them.
#![forbid(unsafe_code)]

// Lets the macros' default support path (`::kvown::__private`) resolve inside this crate too.
extern crate self as kvown;

pub mod bench;

pub use kvown_macros::{guarded, owner, owners};
pub use kvown_runtime::ownership::audit;
pub use kvown_runtime::{alloc, kv, radix, slots};

#[doc(hidden)]
pub use kvown_runtime::__private;
