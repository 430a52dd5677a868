//! The engine's checks on a device: with the table mirrored on CUDA, every check also copies the
//! held rows of the device table back and compares them with the host's.

use kvown::slots::{ReqRow, ReqToTokenPool};
use kvown_cuda::StagedMirror;
use kvown_cuda::staging::ReadBack;

/// A cache's table mirror, which may be a device copy to compare with the host.
pub trait DeviceCopy {
    /// Compares the device copy, if there is one, with the host: `row[..len]` of each
    /// `(row, len)` in `rows`.
    fn verify_device(
        &self,
        table: &ReqToTokenPool,
        rows: impl Iterator<Item = (ReqRow, usize)>,
    ) -> Result<(), String>;
}

/// No mirror: nothing to compare.
impl DeviceCopy for () {
    fn verify_device(
        &self,
        _table: &ReqToTokenPool,
        _rows: impl Iterator<Item = (ReqRow, usize)>,
    ) -> Result<(), String> {
        Ok(())
    }
}

impl<L: ReadBack> DeviceCopy for StagedMirror<L> {
    fn verify_device(
        &self,
        table: &ReqToTokenPool,
        rows: impl Iterator<Item = (ReqRow, usize)>,
    ) -> Result<(), String> {
        self.verify(table, rows, None)
            .map_err(|divergence| format!("device table: {divergence}"))
    }
}
