//! Shipping each step's results to the device instead of replaying its work there.
//!
//! The host allocator decides every slot. A step's GPU work needs two things from it: the
//! step's `out_cache_loc` (where its K/V is stored) and the request-to-token rows (what
//! attention reads). [`StagedMirror`], the cache's table mirror, writes both, as the batch flow
//! writes the host table, into a [`packet`] in a ring slot of host memory ([`StagingRing`]); a
//! [`StepLink`] ships the packet
//! with one copy and one scatter kernel (`src/kernels/scatter.cu`): [`CudaStepLink`] on a GPU,
//! [`HostLink`] (no device) for measuring the host's share and for tests.
//!
//! **Ring reuse.** A slot is rewritten only after the device has copied what it last held:
//! the link records an event after each packet's copy and scatter, and the ring checks that
//! event before writing the slot again. The host therefore runs at most `depth` packets ahead
//! of the device; one more and it waits for the oldest ([`StagingStats::waits`] counts these
//! waits). A step's `out_cache_loc` stays valid on the device until its slot is reused,
//! `depth` packets later.

mod cuda;
mod mirror;
pub mod packet;
mod ring;

pub use cuda::{CudaStepLink, scatter_launch};
pub use mirror::{ReadBack, ShippedOut, StagedMirror, default_slot_words, required_slot_words};
pub use packet::{PacketError, PacketView, Run};
pub use ring::{HostLink, StagingRing, StagingStats, StepLink};
