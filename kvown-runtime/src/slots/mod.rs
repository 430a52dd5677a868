//! Request slots: the request-to-token table ([`ReqToTokenPool`], sglang `ReqToTokenPool`).
//!
//! Each running request holds one row; entry `[row, position]` is the KV slot of that position.
//! Row 0 is padding (CUDA-graph padded batches read and write it) and is never handed out.
//!
//! ```
//! use kvown_runtime::slots::ReqToTokenPool;
//!
//! // 8 rows of 16 positions each, all free.
//! let mut pool = ReqToTokenPool::new(8, 16)?;
//! let rows = pool.alloc(2)?; // from the tail of the free-row list
//! assert_eq!(rows, [7, 8]);
//! pool.write(rows[0], 0, &[4, 5, 6])?; // positions 0..3 of row 7 hold slots 4, 5, 6
//! assert_eq!(pool.row(rows[0])?[..3], [4, 5, 6]);
//! pool.free(rows[0])?;
//! assert_eq!(pool.available_size(), 7);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
mod pool;

pub use crate::ids::ReqRow;
pub use error::SlotError;
pub use pool::ReqToTokenPool;
