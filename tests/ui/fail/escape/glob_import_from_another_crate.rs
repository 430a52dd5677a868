//! A glob import of a library's module brings its functions, not its owners' capability tokens:
//! those never leave the crate (owners live in the struct's crate). Here `alloc_for_decode` is
//! only the function.

use kvown::batch::*;

fn main() {
    let _: Option<alloc_for_decode> = None;
    let _ = alloc_for_decode::<kvown::alloc::PagedAllocator, ()>;
}
