//! Errors of the device allocator (every failing call leaves the allocator unchanged) and of
//! building and verifying a device mirror.

use cudarc::driver::DriverError;
use kvown_runtime::alloc::{AllocError, KvSlot, PageId};
use kvown_runtime::slots::ReqRow;

/// Why a device allocator call was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// The same rejection the CPU allocator gives (out of memory, bad shape, bad slot).
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// The batch gave a different number of request rows than requests.
    #[error("{requests} requests but {rows} request rows")]
    RowCountMismatch {
        /// Requests in the batch.
        requests: usize,
        /// Rows given.
        rows: usize,
    },
    /// A request row is past the end of the request-to-token table.
    #[error("request {request}: row {row} out of range: the table has rows 0..{rows}")]
    RowOutOfRange {
        /// Position in the batch.
        request: usize,
        /// The bad row.
        row: u32,
        /// Rows in the table.
        rows: usize,
    },
    /// Two requests of one batch name the same request row: on the device they would write it
    /// at once.
    #[error("request {request} names row {row}, which request {first} of the batch names too")]
    RowRepeated {
        /// Position in the batch of the second request.
        request: usize,
        /// The row.
        row: u32,
        /// Position in the batch of the first.
        first: usize,
    },
    /// Positions past the end of a request-to-token row.
    #[error("request {request}: positions up to {end} do not fit a row of {row_len} tokens")]
    RowOverflow {
        /// Position in the batch (0 for `write_row`).
        request: usize,
        /// One past the last position written.
        end: usize,
        /// Tokens per row (`max_context_len`).
        row_len: usize,
    },
    /// Freeing more pages than the allocator owns: some page is freed twice.
    #[error("free of {pages} pages with {free} of {num_pages} already free: a page is freed twice")]
    FreeListOverflow {
        /// Distinct pages in the call.
        pages: usize,
        /// Pages free before the call.
        free: usize,
        /// Pages the allocator manages.
        num_pages: usize,
    },
    /// A page named twice in one call that frees pages in a given order.
    #[error("page {page} is named twice")]
    DuplicatePage {
        /// The page.
        page: PageId,
    },
    /// A page that this allocator does not manage (page 0 is padding).
    #[error("page {page} is out of range: this allocator's pages are 1..={num_pages}")]
    PageOutOfRange {
        /// The page.
        page: PageId,
        /// Pages the allocator manages.
        num_pages: usize,
    },
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

/// Why a [`MirroredAllocator`](crate::MirroredAllocator) cannot be built: its device half
/// could not follow this host allocator exactly.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    /// The host allocator sends frees to a release list, merged and sorted lazily.
    #[error(
        "the host allocator uses need_sort: its release list is merged and sorted lazily on the \
         host, which the device free list does not follow; build it with need_sort = false"
    )]
    NeedSort,
    /// The host allocator is not as constructed.
    #[error(
        "the host allocator is in use ({free_pages} of {num_pages} pages free, free group open: \
         {in_free_group}); a mirror starts from a fresh allocator, every page free in the \
         initial order"
    )]
    HostInUse {
        /// Pages on its free list.
        free_pages: usize,
        /// Pages it manages.
        num_pages: usize,
        /// Whether a free group is open.
        in_free_group: bool,
    },
    /// The device half has pages out.
    #[error("the device half is in use: {free_pages} of {num_pages} pages free")]
    DeviceInUse {
        /// Pages on its free list.
        free_pages: usize,
        /// Pages it manages.
        num_pages: usize,
    },
    /// Host and device manage different pages.
    #[error(
        "the host pool has {host_pages} pages of {host_page_size} slots but the device pool \
         {device_pages} pages of {device_page_size}"
    )]
    PoolMismatch {
        /// Host pages.
        host_pages: usize,
        /// Host page size.
        host_page_size: usize,
        /// Device pages.
        device_pages: usize,
        /// Device page size.
        device_page_size: usize,
    },
    /// The device request-to-token table cannot hold the host table.
    #[error(
        "the device table has {device_rows} rows of {device_row_len} slots; the host table \
         needs {rows} rows of {row_len}"
    )]
    TableTooSmall {
        /// Rows of the host table (padding row 0 included).
        rows: usize,
        /// Slots per host row.
        row_len: usize,
        /// Rows of the device table.
        device_rows: usize,
        /// Slots per device row.
        device_row_len: usize,
    },
    /// A device call failed: creating the device half, or reading it back for
    /// [`MirroredAllocator::new`](crate::MirroredAllocator::new) or
    /// [`MirroredAllocator::verify`](crate::MirroredAllocator::verify).
    #[error("the device half failed: {0}")]
    Device(#[from] CudaError),
    /// [`MirroredAllocator::verify`](crate::MirroredAllocator::verify) (or
    /// [`MirroredAllocator::new`](crate::MirroredAllocator::new), for a device half with every
    /// page free in another order): the device free list is not the host's (`None`: the list
    /// ended there).
    #[error(
        "the device free list differs from the host's at position {position}: host page \
         {host:?}, device page {device:?}"
    )]
    FreeListDiverged {
        /// First position (from the head) where they differ.
        position: usize,
        /// The host's page there.
        host: Option<PageId>,
        /// The device's page there.
        device: Option<PageId>,
    },
    /// [`MirroredAllocator::verify`](crate::MirroredAllocator::verify): a device
    /// request-to-token row is not the host's.
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
}

/// `value` as a kernel `u32` index, or [`CudaError::TooLarge`].
pub(crate) fn to_u32(what: &'static str, value: usize) -> Result<u32, CudaError> {
    u32::try_from(value).map_err(|_| CudaError::TooLarge { what, value })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Messages read as one sentence: no runs of spaces left by a string continued onto the
    /// next line without a `\`.
    #[test]
    fn messages_have_no_runs_of_spaces() {
        let errors = [
            MirrorError::FreeListDiverged {
                position: 2,
                host: Some(3),
                device: None,
            },
            MirrorError::RowDiverged {
                row: 1,
                position: 4,
                host: 17,
                device: 18,
            },
            MirrorError::NeedSort,
            MirrorError::HostInUse {
                free_pages: 1,
                num_pages: 2,
                in_free_group: false,
            },
        ];
        for error in errors {
            let message = error.to_string();
            assert!(!message.contains("  "), "{message:?}");
        }
        let message = MirrorError::FreeListDiverged {
            position: 2,
            host: Some(3),
            device: None,
        }
        .to_string();
        assert_eq!(
            message,
            "the device free list differs from the host's at position 2: host page Some(3), \
             device page None"
        );
    }
}
