//! kvown-runtime's integration tests, one binary, a module per topic (fixtures in `common/`):
//! * the allocators: `alloc_token`, `alloc_paged`, `alloc_extend`, `alloc_shared_page`,
//!   `alloc_decode_table`, `alloc_props`, `need_sort_replay` (against a model of sglang's two
//!   allocators), `wrapped_allocator` (wrappers, and allocators that refuse);
//! * the request-to-token table and the K/V pools: `slots_pool`, `kv_pool`, `disaggregation`;
//! * the prefix cache: `radix_cache`, `radix_namespaces`, `radix_policies`, `radix_events`,
//!   `radix_budget`, `radix_proptest`, `eviction_replay` (against a model of sglang's
//!   `RadixCache`);
//! * the batch flow: `batch_flow`, `batch_extend_edges`, `batch_decode_edges`,
//!   `batch_spec_edges`, `batch_release_edges`, `other_cache`, `batch_proptest`, `batch_replay`
//!   (against a model of sglang's batch rules);
//! * misuse: `misuse` (each case that once corrupted state or aborted), `misuse_fuzz`;
//! * the crate itself: `ownership_table` (its reviewed owner sites; its modules' import
//!   order is checked with every crate's by the workspace's `tests/it/module_layout.rs`).
//!
//! A property test's failures are saved beside its module, as `<module>.proptest-regressions`
//! ([`common::proptest_config`]), and replayed first on every run.

mod common;

mod alloc_decode_table;
mod alloc_extend;
mod alloc_paged;
mod alloc_props;
mod alloc_shared_page;
mod alloc_token;
mod batch_decode_edges;
mod batch_extend_edges;
mod batch_flow;
mod batch_proptest;
mod batch_release_edges;
mod batch_replay;
mod batch_spec_edges;
mod disaggregation;
mod eviction_replay;
mod kv_pool;
mod misuse;
mod misuse_fuzz;
mod need_sort_replay;
mod other_cache;
mod ownership_table;
mod radix_budget;
mod radix_cache;
mod radix_events;
mod radix_namespaces;
mod radix_policies;
mod radix_proptest;
mod slots_pool;
mod wrapped_allocator;
