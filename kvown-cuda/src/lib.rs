//! kvown CUDA backend: the KV data pool ([`CudaKvPool`]) and the paged slot allocator
//! ([`CudaPagedAllocator`]) on an NVIDIA GPU, through `cudarc` with dynamic loading, so the crate
//! builds and its CPU-side tests run on machines with no CUDA at all.
//!
//! * [`MirroredAllocator`] is the runtime's `KvAllocator` on the device: the host allocator stays
//!   authoritative and every call it accepts is replayed on the device half, so `KvCache` and
//!   the batch flow run unchanged with the free list and the request-to-token table on the GPU.
//! * [`Backend::auto`] picks CUDA when a device, a driver and NVRTC work, and the host pool
//!   otherwise, and says which and why. Detection never panics ([`CudaDevice::get`]).
//! * Kernels are CUDA C in `src/kernels/*.cu`, embedded with `include_str!` and compiled at run
//!   time by NVRTC for the device's `sm_XY`, once per process.
//!
//! The same code runs on a GPU host and on one without CUDA; only the backend it prints differs:
//!
//! ```
//! use kvown_cuda::Backend;
//! use kvown_runtime::kv::{KvData, KvDtype, KvLayout, KvSlice};
//!
//! let backend = Backend::auto(); // never panics: CUDA, or the host and the reason why
//! println!("KV pool on {backend}");
//! // 2 layers, 1 KV head of 4 elements, 8 slots in pages of 4 (+ the padding page), f32.
//! let mut pool = backend.new_kv_pool(KvLayout::new(2, 1, 4, 8, 4)?, KvDtype::F32)?;
//! let (k, v) = ([1.0, 2.0, 3.0, 4.0], [0.5; 4]);
//! pool.store_kv(1, &[5], KvSlice::F32(&k), KvSlice::F32(&v))?;
//! let (k_back, _) = pool.load_kv(1, &[5])?;
//! assert_eq!(k_back, KvData::F32(k.to_vec()));
//! # Ok::<(), kvown_runtime::kv::KvPoolError>(())
//! ```
//!
//! # Verification status
//!
//! Verified without a GPU: the crate builds, and every kernel source compiles with NVRTC 12.9 to
//! PTX for `sm_80` and `sm_90` with an empty program log (`tests/nvrtc_compile.rs`); the host
//! planning of the device allocator ([`AllocPlanner`]) and of the device pool ([`KvPlanner`]),
//! together with the `alloc.cu` and `kv.cu` kernels compiled as host C++, reproduces the CPU
//! allocator and the host pool exactly, byte for byte (`tests/differential.rs`, `emulated_*`), and
//! the mirror follows the host through the runtime's batch flow (`tests/mirror/`).
//!
//! Verified on an NVIDIA H200 (2026-12-04, `scripts/device-check.sh`): the kernels, the device
//! pool and the mirror on the GPU give the CPU's results (`gpu_*` tests, with compute-sanitizer
//! reporting no error), the engine runs on CUDA with the checker and the mirror's verification
//! every step, and `examples/kernel_timing.rs` timed each kernel (results and logs in the crate's
//! README).
#![warn(missing_docs)]

mod alloc;
mod backend;
mod detect;
mod error;
pub mod kernels;
mod kv;
mod kv_plan;
mod marks;
mod mirror;
mod plan;

pub use alloc::{CudaPagedAllocator, DeviceSlots};
pub use backend::Backend;
pub use detect::{CudaDevice, Unavailable};
pub use error::{CudaError, MirrorError};
pub use kv::{CudaKvPool, kv_bytes, kv_data_from_bytes};
pub use kv_plan::{KvPlanner, PageCopy, ROW_BLOCK_MAX, RowLaunch, RowShape};
pub use mirror::{DeviceAllocOps, MirroredAllocator};
pub use plan::{
    ALLOC_BLOCK, AllocPlan, AllocPlanner, DECODE_PARAM_WORDS, EXTEND_PARAM_WORDS, FreePlan, NO_ROW,
};
