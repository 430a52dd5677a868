//! Errors of device calls, of building and verifying a staged mirror, and why the device is
//! unavailable.

use std::any::Any;

use cudarc::driver::DriverError;
use kvown_runtime::alloc::KvSlot;
use kvown_runtime::slots::ReqRow;

/// Why a device call failed.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// A count does not fit the kernels' 32-bit indices.
    #[error("{what} = {value} exceeds the kernels' 32-bit range")]
    TooLarge {
        /// The quantity.
        what: &'static str,
        /// Its value.
        value: usize,
    },
    /// A CUDA driver call failed (allocation, copy or launch).
    #[error("CUDA driver error: {0}")]
    Driver(#[from] DriverError),
}

/// Why a [`StagedMirror`](crate::StagedMirror) cannot be built, or why
/// [`StagedMirror::verify`](crate::StagedMirror::verify) found the device apart from the
/// host.
#[derive(Debug, thiserror::Error)]
pub enum StagingError {
    /// The device table is not the host table's shape.
    #[error(
        "the device table has {device:?} (rows, positions) but the host table {host:?}; build \
         the link with the host table's size + 1 rows (row 0 is padding) and its max_context_len"
    )]
    TableMismatch {
        /// The host table's `(rows, width)`, padding row included.
        host: (usize, usize),
        /// The device table's.
        device: (usize, usize),
    },
    /// The table has more entries than a packet's 32-bit flat indices reach.
    #[error(
        "the request-to-token table has {entries} entries, more than the 2^32 that packets \
         index; use fewer rows or shorter rows"
    )]
    TableTooLarge {
        /// Rows times positions.
        entries: usize,
    },
    /// The ring's slots cannot hold one call's packet (or the ring has no slot).
    #[error(
        "the staging ring has {depth} slots of {slot_words} words; it needs at least one slot \
         of {needed} words (kvown_cuda::staging::required_slot_words; default_slot_words adds \
         room for matched prefixes)"
    )]
    RingTooSmall {
        /// Words per slot.
        slot_words: usize,
        /// Slots.
        depth: usize,
        /// Words one call's packet can take.
        needed: usize,
    },
    /// A device call failed while reading the device back.
    #[error("reading the device back failed: {0}")]
    Device(#[from] CudaError),
    /// `verify` was given a row the host table does not hold.
    #[error("row {row} is not held in the host table: there is nothing to compare it with")]
    RowNotHeld {
        /// The row.
        row: ReqRow,
    },
    /// A device request-to-token row is not the host's.
    #[error(
        "device row {row} differs from the host's at position {position}: host slot {host}, \
         device slot {device}"
    )]
    RowDiverged {
        /// The row.
        row: ReqRow,
        /// First position where they differ.
        position: usize,
        /// The host's slot there.
        host: KvSlot,
        /// The device's slot there.
        device: KvSlot,
    },
    /// The last `out_cache_loc` on the device is not the host's.
    #[error("the device out_cache_loc {device:?} is not the host's {host:?}")]
    OutDiverged {
        /// The host's slots.
        host: Vec<KvSlot>,
        /// The device's.
        device: Vec<KvSlot>,
    },
}

/// Why the CUDA backend cannot be used on this machine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    /// No CUDA driver library (`libcuda.so.1`) could be loaded.
    #[error("no CUDA driver library (libcuda.so.1) could be loaded")]
    NoDriverLibrary,
    /// The driver library loaded but `cuInit` or a device query failed.
    #[error("the CUDA driver failed to initialise: {detail}")]
    DriverInit {
        /// The driver error or panic message.
        detail: String,
    },
    /// The driver works and reports zero devices.
    #[error("the CUDA driver reports no device")]
    NoDevice,
    /// Creating (retaining) the primary context of device 0 failed.
    #[error("creating a CUDA context on device 0 failed: {detail}")]
    ContextCreation {
        /// The driver error or panic message.
        detail: String,
    },
    /// No NVRTC library (`libnvrtc.so.12`) could be loaded, so the kernels cannot be compiled.
    #[error("no NVRTC library (libnvrtc.so.12) could be loaded (run scripts/install-nvrtc.sh)")]
    NoNvrtc,
    /// NVRTC rejected a kernel source for the device's architecture.
    #[error("compiling the kernels for {arch} failed: {detail}")]
    KernelCompile {
        /// Target architecture, e.g. `sm_90`.
        arch: String,
        /// The compile error with NVRTC's log.
        detail: String,
    },
    /// The driver would not load the compiled PTX or a kernel in it.
    #[error("loading the compiled kernels failed: {detail}")]
    ModuleLoad {
        /// The driver error.
        detail: String,
    },
}

/// The text of a caught panic payload.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A caught panic is reported with its message, whatever the payload's type.
    #[test]
    fn panic_messages_of_every_payload_type() {
        let text: Box<dyn Any + Send> = Box::new("no symbol");
        assert_eq!(panic_message(text.as_ref()), "no symbol");
        let owned: Box<dyn Any + Send> = Box::new(String::from("bad handle"));
        assert_eq!(panic_message(owned.as_ref()), "bad handle");
        let other: Box<dyn Any + Send> = Box::new(7_u32);
        assert_eq!(panic_message(other.as_ref()), "non-string panic payload");
    }

    /// Messages read as one sentence: no runs of spaces left by a string continued onto the
    /// next line without a `\`.
    #[test]
    fn messages_have_no_runs_of_spaces() {
        let errors = [
            StagingError::TableMismatch {
                host: (5, 64),
                device: (4, 64),
            },
            StagingError::TableTooLarge { entries: 1 << 33 },
            StagingError::RingTooSmall {
                slot_words: 8,
                depth: 2,
                needed: 92,
            },
            StagingError::RowDiverged {
                row: 1,
                position: 4,
                host: 17,
                device: 18,
            },
        ];
        for error in errors {
            let message = error.to_string();
            assert!(!message.contains("  "), "{message:?}");
        }
        let message = StagingError::RowDiverged {
            row: 1,
            position: 4,
            host: 17,
            device: 18,
        }
        .to_string();
        assert_eq!(
            message,
            "device row 1 differs from the host's at position 4: host slot 17, device slot 18"
        );
    }
}
