//! Request slots: the request-to-token table ([`ReqToTokenPool`], sglang `ReqToTokenPool`).
//!
//! Each running request holds one row; entry `[row, position]` is the KV slot of that position.
//! Row 0 is padding (CUDA-graph padded batches read and write it) and is never handed out.

mod error;
mod pool;

pub use crate::ids::ReqRow;
pub use error::SlotError;
pub use pool::ReqToTokenPool;
