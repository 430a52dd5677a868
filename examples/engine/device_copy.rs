//! The engine's checks on a device: with the allocator staged on CUDA, every check also copies
//! the held rows of the device table back and compares them with the host's.

use kvown::alloc::{PageAllocator, ReuseOrder};
use kvown::slots::{ReqRow, ReqToTokenPool};
use kvown_cuda::StagedAllocator;
use kvown_cuda::staging::ReadBack;

/// An allocator whose state may have a device copy to compare with the host.
pub trait DeviceCopy {
    /// Compares the device copy, if there is one, with the host: `row[..len]` of each
    /// `(row, len)` in `rows`.
    fn verify_device(
        &self,
        table: &ReqToTokenPool,
        rows: impl Iterator<Item = (ReqRow, usize)>,
    ) -> Result<(), String>;
}

/// The host allocator alone: nothing to compare.
impl<R: ReuseOrder> DeviceCopy for PageAllocator<R> {
    fn verify_device(
        &self,
        _table: &ReqToTokenPool,
        _rows: impl Iterator<Item = (ReqRow, usize)>,
    ) -> Result<(), String> {
        Ok(())
    }
}

impl<R: ReuseOrder, L: ReadBack> DeviceCopy for StagedAllocator<R, L> {
    fn verify_device(
        &self,
        table: &ReqToTokenPool,
        rows: impl Iterator<Item = (ReqRow, usize)>,
    ) -> Result<(), String> {
        self.verify(table, rows, None)
            .map_err(|divergence| format!("device table: {divergence}"))
    }
}
