//! K/V transfer between a prefill node and a decode node in separate processes (or machines),
//! through NVIDIA's NIXL, the transfer library under Dynamo and vLLM's `NixlConnector`.
//!
//! NIXL's C API (`libnixl_capi.so`, from the `nixl-cu12` wheel: `scripts/install-nixl.sh`) is
//! loaded at run time, so nothing of NIXL is needed to build; where it is missing every
//! entry point answers [`Unavailable`] with the reason. With it, two processes on one machine
//! move host memory through UCX with no GPU.
//!
//! The pieces, in the order a pair of nodes uses them:
//!
//! * [`Agent`]: a NIXL agent with its UCX backend.
//! * [`RegisteredPool`]: a host K/V pool registered with the agent, used as any `KvPool`.
//! * [`PeerMetadata`]: NIXL's metadata blob of a node, its incarnation and where its rows are;
//!   sent over the [`channel`] and loaded by the peer's [`Agent::load_peer`] (a restarted peer
//!   is re-loaded, a stale copy refused).
//! * [`prealloc_or_wait`]: the decode node's rule for a request whose K/V is waiting:
//!   preallocate, wait or reject.
//! * [`NixlTransfer`]: the decode node's [`KvTransfer`](kvown_runtime::kv::KvTransfer), a NIXL
//!   READ per request, one descriptor per run of contiguous slots per layer and tensor, with a
//!   deadline after which it is cancelled.
//! * [`Holds`]: the prefill node keeps each computed request until the READ's notice arrives,
//!   its deadline passes or the decode node is lost, then releases it.
//! * [`NixlLoopback`]: both nodes in one process, two agents, each side's pool (any `KvPool`,
//!   a model's candle tensors say) staged through a registered host pool: the NIXL twin of
//!   kvown's `LocalTransfer`.
//!
//! ```no_run
//! use kvown_nixl::{Agent, NixlTransfer, PeerMetadata, RegisteredPool};
//! use kvown_runtime::kv::{KvDtype, KvLayout};
//!
//! # fn main() -> Result<(), kvown_nixl::NixlError> {
//! let layout = KvLayout::new(2, 2, 64, 4096, 16).unwrap();
//! // The decode node: its agent and pool.
//! let agent = Agent::new("decode")?;
//! let pool = RegisteredPool::new(&agent, layout, KvDtype::F16)?;
//! // The prefill node's metadata, as received over the control channel.
//! # let bytes: Vec<u8> = Vec::new();
//! let peer = agent.load_peer(&PeerMetadata::from_bytes(&bytes)?)?;
//! let mut link = NixlTransfer::new(&agent, pool, peer)?;
//! // Read the prefill node's slots 32..48 into this node's 64..80; notify it with tag 7.
//! let src: Vec<u32> = (32..48).collect();
//! let dst: Vec<u32> = (64..80).collect();
//! let id = link.submit_tagged(&src, &dst, Some(7))?;
//! link.wait(id)?;
//! # Ok(())
//! # }
//! ```

mod agent;
pub mod channel;
mod descs;
mod error;
mod ffi;
mod library;
mod loopback;
mod metadata;
mod notices;
mod prealloc;
mod registered;
mod request;
mod runs;
mod transfer;

pub use agent::{Agent, AgentOptions, Notification};
pub use error::{NixlError, NixlStatus, Unavailable};
pub use library::{NIXL_VERSION, available};
pub use loopback::{LoopbackCounters, LoopbackStats, NixlLoopback};
pub use metadata::{LoadedPeer, PeerMetadata, PoolDescriptor};
pub use notices::{Holds, Released, notice, parse_notice};
pub use prealloc::{Prealloc, prealloc_or_wait};
pub use registered::RegisteredPool;
pub use runs::{SlotRun, slot_runs};
pub use transfer::{DEFAULT_TIMEOUT, NixlTransfer, TransferStats};
