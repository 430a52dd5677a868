//! The root crate's integration tests, one binary (the trybuild suite is `tests/ui.rs`):
//! * `audit`: the audit register of guarded structs defined here;
//! * `macro_messages`, `readme`: the documents' quotes equal their sources;
//! * `module_layout`: no import cycle in any crate of the workspace, at any depth;
//! * `test_layout`: at most two integration-test binaries per crate, no test including an example;
//! * `ui_internal_paths`: no compiler message of the trybuild suite names kvown's machinery.

// Public, as it was at the root of a test binary of its own: its owners that no test calls are
// there for the audit register, and dead-code analysis would flag them in a private module.
pub mod audit;
mod macro_messages;
mod module_layout;
mod readme;
mod test_layout;
mod ui_internal_paths;
