//! GPU detection that never panics, and the process-wide CUDA device with its compiled kernels.
//!
//! cudarc panics (rather than returning `Err`) when `libcuda` is missing, so detection first asks
//! `driver::sys::is_culib_present()`, then runs every driver call inside `catch_unwind` as a
//! second net (a symbol missing from an old driver also panics). NVRTC is checked separately:
//! a host can have a driver and no NVRTC.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaContext, CudaStream, DriverError, sys as driver_sys};

use crate::error::{Unavailable, panic_message};
use crate::kernels::{Kernels, arch_for, nvrtc_available};

/// The CUDA device 0 of this process: context, stream, and the kernels compiled for its
/// architecture. Obtained through [`CudaDevice::get`], which detects and compiles once.
#[derive(Debug)]
pub struct CudaDevice {
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    name: String,
    compute_capability: (i32, i32),
    arch: String,
    pub(crate) kernels: Kernels,
}

static DEVICE: OnceLock<Result<Arc<CudaDevice>, Unavailable>> = OnceLock::new();

/// Runs a driver call, turning both its `Err` and a panic into a message.
fn guarded<T>(call: impl FnOnce() -> Result<T, DriverError>) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(call)) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(error.to_string()),
        Err(panic) => Err(format!("panicked: {}", panic_message(panic.as_ref()))),
    }
}

impl CudaDevice {
    /// The process-wide device, detecting it and compiling the kernels on first use. Every later
    /// call returns the same result. Never panics.
    pub fn get() -> Result<Arc<CudaDevice>, Unavailable> {
        DEVICE.get_or_init(|| Self::detect().map(Arc::new)).clone()
    }

    fn detect() -> Result<Self, Unavailable> {
        // SAFETY: is_culib_present only tries libloading::Library::new on candidate names.
        if !unsafe { driver_sys::is_culib_present() } {
            return Err(Unavailable::NoDriverLibrary);
        }
        let count = guarded(CudaContext::device_count)
            .map_err(|detail| Unavailable::DriverInit { detail })?;
        if count <= 0 {
            return Err(Unavailable::NoDevice);
        }
        let context = guarded(|| CudaContext::new(0))
            .map_err(|detail| Unavailable::ContextCreation { detail })?;
        let name =
            guarded(|| context.name()).map_err(|detail| Unavailable::DriverInit { detail })?;
        let compute_capability = guarded(|| context.compute_capability())
            .map_err(|detail| Unavailable::DriverInit { detail })?;
        if !nvrtc_available() {
            return Err(Unavailable::NoNvrtc);
        }
        let arch = arch_for(compute_capability);
        // Module and function loading are driver calls too: a panic there is caught as well.
        let kernels = catch_unwind(AssertUnwindSafe(|| Kernels::load(&context, &arch)))
            .unwrap_or_else(|panic| {
                Err(Unavailable::ModuleLoad {
                    detail: format!("panicked: {}", panic_message(panic.as_ref())),
                })
            })?;
        let stream = context.default_stream();
        Ok(Self {
            context,
            stream,
            name,
            compute_capability,
            arch,
            kernels,
        })
    }

    /// The device's name as the driver reports it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Compute capability `(major, minor)`.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// The architecture the kernels were compiled for, e.g. `sm_90`.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// The stream every kernel of this crate is launched on (the context's default stream).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The CUDA context (primary context of device 0).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.context
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A driver call that panics is reported with its message.
    #[test]
    fn a_panicking_driver_call_is_reported_with_its_message() {
        assert_eq!(
            guarded(|| -> Result<(), DriverError> { panic!("driver gone") }),
            Err("panicked: driver gone".to_owned())
        );
    }
}
