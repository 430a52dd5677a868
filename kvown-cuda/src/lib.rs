//! kvown CUDA backend: the KV data pool ([`CudaKvPool`]) on an NVIDIA GPU, and each step's
//! allocation results shipped to it ([`StagedMirror`]), through `cudarc` with dynamic
//! loading, so the crate builds and its CPU-side tests run on machines with no CUDA at all.
//!
//! * [`StagedMirror`] is the device's copy of a `KvCache`'s request-to-token table, the
//!   cache's `TableMirror`: the host allocator makes every decision, and each batch-flow step
//!   ships its `out_cache_loc` and its table writes to the device as one packet through a
//!   pinned staging ring: one copy and one scatter kernel ([`staging`]). The device keeps no
//!   free list and replays nothing.
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
//! Without a GPU: the crate builds, every kernel source compiles with NVRTC 12.9 to PTX for
//! `sm_80` and `sm_90` (`tests/it/nvrtc_compile.rs`); the `scatter.cu` and `kv.cu` kernels compiled
//! as host C++ reproduce the host table and the host pool exactly under the runtime's batch
//! flow and random pools (`tests/it/staging.rs`, `tests/it/kv_pool.rs`). On a GPU,
//! `scripts/device-check.sh` runs the same tests on the device, the engine on CUDA and the
//! timings; the crate's README records its last results.
#![warn(missing_docs)]

mod backend;
mod detect;
mod error;
pub mod kernels;
mod kv;
mod kv_plan;
pub mod staging;

pub use backend::Backend;
pub use detect::CudaDevice;
pub use error::{CudaError, StagingError, Unavailable};
pub use kv::{CudaKvPool, kv_bytes, kv_data_from_bytes};
pub use kv_plan::{KvPlanner, PageCopy, ROW_BLOCK_MAX, RowLaunch, RowShape};
pub use staging::{CudaStepLink, HostLink, StagedMirror};
