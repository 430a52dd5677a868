//! The runtime support of [kvown](https://docs.rs/kvown)'s macros: what `#[kvown::guarded]`,
//! `#[kvown::owner]` and `#[kvown::owners]` expand to refers to, and the audit register.
//!
//! **Depend on `kvown`, not on this crate**: the facade re-exports it beside the macros, and
//! `kvown = { version = "0.1", default-features = false }` is the macros with this crate alone,
//! without the allocator. It holds
//! * [`audit`]: the ownership table of every guarded field linked into a program (the facade's
//!   `kvown::audit_table!()` is the calling crate's);
//! * the seal of the owners' capability tokens (`__private`, not a public API).
//!
//! The allocator crate, `kvown-runtime`, depends on this one for its own guarded fields, never
//! the reverse.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod audit;
mod seal;

/// Items the macro expansions refer to. Not a public API; may change in any release.
#[doc(hidden)]
pub mod __private {
    pub use crate::audit::{FieldWrites, GuardedField, GuardedStruct, OwnerSite};
    pub use crate::seal::{OwnerSeal, OwnerToken};
    pub use inventory;
    pub use kvown_macros::{
        __guarded_documented as guarded_documented, __owner_documented as owner_documented,
    };
}
