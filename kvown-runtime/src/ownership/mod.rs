//! Support types behind `#[kvown::guarded]`, `#[kvown::owner]` and `#[kvown::owners]`, and the
//! audit register that lists every guarded field and owner site of a program.

pub mod audit;
mod seal;

pub use seal::{OwnerSeal, OwnerToken};
