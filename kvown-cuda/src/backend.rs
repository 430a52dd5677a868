//! [`Backend`]: the CUDA backend when it works on this machine, the host backend otherwise.

use std::fmt;
use std::sync::Arc;

use kvown_runtime::kv::{KvDtype, KvLayout, KvPool, KvPoolError, new_host_pool};

use crate::detect::CudaDevice;
use crate::error::Unavailable;
use crate::kv::CudaKvPool;

/// The backend chosen for this process, with the reason for the choice.
#[derive(Debug, Clone)]
pub enum Backend {
    /// CUDA device 0 works and the kernels compiled for it.
    Cuda(Arc<CudaDevice>),
    /// The host (CPU) backend, because CUDA is unavailable for `reason`.
    Host {
        /// Why CUDA was not chosen.
        reason: Unavailable,
    },
}

impl Backend {
    /// CUDA when [`CudaDevice::get`] succeeds, the host otherwise. Never panics.
    pub fn auto() -> Self {
        match CudaDevice::get() {
            Ok(device) => Backend::Cuda(device),
            Err(reason) => Backend::Host { reason },
        }
    }

    /// True for [`Backend::Cuda`].
    pub fn is_cuda(&self) -> bool {
        matches!(self, Backend::Cuda(_))
    }

    /// A zeroed KV pool on this backend.
    pub fn new_kv_pool(
        &self,
        layout: KvLayout,
        dtype: KvDtype,
    ) -> Result<Box<dyn KvPool>, KvPoolError> {
        match self {
            Backend::Cuda(device) => Ok(Box::new(CudaKvPool::new(device.clone(), layout, dtype)?)),
            Backend::Host { .. } => new_host_pool(layout, dtype),
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Backend::Cuda(device) => {
                write!(f, "CUDA on {} ({})", device.name(), device.arch())
            }
            Backend::Host { reason } => {
                write!(f, "host (CPU), because CUDA is unavailable: {reason}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host backend says so, and why, in what the engine prints.
    #[test]
    fn the_host_backend_names_its_reason() {
        let backend = Backend::Host {
            reason: Unavailable::NoDevice,
        };
        assert!(!backend.is_cuda());
        assert_eq!(
            backend.to_string(),
            "host (CPU), because CUDA is unavailable: the CUDA driver reports no device"
        );
    }
}
