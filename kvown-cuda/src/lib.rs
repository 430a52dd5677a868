//! kvown CUDA backend: the KV data pool ([`CudaKvPool`]) and the paged slot allocator
//! ([`CudaPagedAllocator`]) on an NVIDIA GPU, through `cudarc` with dynamic loading, so the crate
//! builds and its CPU-side tests run on machines with no CUDA at all.
//!
//! * [`Backend::auto`] picks CUDA when a device, a driver and NVRTC work, and the host pool
//!   otherwise, and says which and why. Detection never panics ([`CudaDevice::get`]).
//! * Kernels are CUDA C in `src/kernels/*.cu`, embedded with `include_str!` and compiled at run
//!   time by NVRTC for the device's `sm_XY`, once per process.
//!
//! # Verification status
//!
//! **Nothing in this crate has run on a GPU yet.** Verified without a GPU: the crate builds, and
//! every kernel source compiles with NVRTC 12.9 to PTX for `sm_80` and `sm_90` with an empty
//! program log (`tests/nvrtc_compile.rs`); the host planning of the device allocator
//! ([`AllocPlanner`]) and of the device pool ([`KvPlanner`]), together with the `alloc.cu` and
//! `kv.cu` kernels compiled as host C++, reproduces the CPU allocator and the host pool exactly,
//! byte for byte (`tests/differential.rs`, `emulated_*`). Written but not yet run: the kernels
//! on a GPU, the device pool (`tests/differential.rs` compares both with the CPU allocator and
//! host pool), and `examples/kernel_timing.rs`. `scripts/device-check.sh` runs them on a GPU
//! host.
#![warn(missing_docs)]

mod alloc;
mod backend;
mod detect;
mod error;
pub mod kernels;
mod kv;
mod kv_plan;
mod plan;

pub use alloc::{CudaPagedAllocator, DeviceSlots};
pub use backend::Backend;
pub use detect::{CudaDevice, Unavailable};
pub use error::CudaError;
pub use kv::{CudaKvPool, kv_bytes, kv_data_from_bytes};
pub use kv_plan::{KvPlanner, PageCopy, ROW_BLOCK_MAX, RowLaunch, RowShape};
pub use plan::{
    ALLOC_BLOCK, AllocPlan, AllocPlanner, DECODE_PARAM_WORDS, EXTEND_PARAM_WORDS, FreePlan,
};
