//! kvown-cuda's integration tests, one binary:
//! * `kv_pool`: `CudaKvPool` against the host pool (random shapes and dtypes reaching every
//!   kernel word width; stores with padding slot 0, gathers, slot and page copies, refused calls;
//!   every byte compared after every step), on seeded random batches;
//! * `staging`: the staged mirror's device table and `out_cache_loc` against the host's under the
//!   runtime's batch flow;
//! * `nvrtc_compile`: every kernel source compiles with NVRTC, without warnings.
//!
//! (No import cycle between its modules: the workspace's `tests/it/module_layout.rs` checks
//! every crate.)
//!
//! The GPU tests run only where a CUDA device works; elsewhere each prints `skipped: <reason>`
//! and passes. The same scenarios also run against the kernels compiled as host C++
//! (`emulator`), so the kernels' index arithmetic and the host side are checked on every machine
//! with a C++ compiler.

mod emulator;
mod kv_pool;
mod nvrtc_compile;
mod staging;

use std::sync::Arc;

use kvown_cuda::CudaDevice;

fn device() -> Option<Arc<CudaDevice>> {
    or_skip(CudaDevice::get())
}

/// The value, or `None` after a skip notice with the reason.
fn or_skip<T>(result: Result<T, impl std::fmt::Display>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(reason) => {
            skip_notice(&format!("skipped: {reason}"));
            None
        }
    }
}

/// The real device.
struct OnGpu(Arc<CudaDevice>);

/// The kernels compiled as host C++.
struct OnHost;

/// xorshift64*: deterministic, dependency-free randomness.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

/// Prints a skip notice to the real stderr: the test harness captures `println!`/`eprintln!`
/// of passing tests, but a skipped GPU check must be visible in every run's output.
fn skip_notice(message: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{message}");
}
