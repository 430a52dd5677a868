//! kvown replicas behind NVIDIA Dynamo's KV-aware router: the parts of `kvown-events`' fleet
//! example (`cargo run --release -p kvown-events --example fleet`), a library so that
//! `kvown-events`' tests drive the same code.
//!
//! * [`replica`]: one kvown engine replica, a paged KV cache with a radix prefix cache and its
//!   events on, driven through the runtime's batch flow.
//! * [`indexer`]: Dynamo's KV indexer fed with the replicas' event batches as Dynamo's ZMQ
//!   listener feeds it, and queried as Dynamo's router queries it.
//! * [`workload`]: multi-turn conversations over shared system prompts.
//! * [`fleet`]: one run of replicas publishing on ZMQ and a router routing the workload under
//!   a policy (KV-aware or round robin).

pub mod fleet;
pub mod indexer;
pub mod replica;
pub mod workload;
