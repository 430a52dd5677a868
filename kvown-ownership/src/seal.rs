/// The private field of every owner capability token.
///
/// It is deliberately neither `Clone` nor `Copy`, so a user cannot add `impl Copy` to a token
/// (E0204), and the token field that holds it is private to the owner's sealed module, so a
/// token cannot be built outside its owner's body (E0451), whoever can name `OwnerSeal`.
#[derive(Debug)]
pub struct OwnerSeal(());

impl OwnerSeal {
    /// Makes a seal. Harmless on its own: a token also needs its private field named.
    #[doc(hidden)]
    #[inline(always)]
    pub const fn new() -> Self {
        OwnerSeal(())
    }
}

/// Marks the capability token types that `#[kvown::owner]` / `#[kvown::owners]` generate, and
/// carries the owner's audit site.
///
/// A `#[guarded]` struct registers the site of each owner listed in `#[owned_by(..)]` through this
/// trait, so a listed owner must be a real owner: a plain `struct alloc_for_decode;` of the listed
/// name does not compile as one. Implementing it by hand goes through `__private` and is outside
/// the contract.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a kvown owner",
    label = "not the capability token of a `#[kvown::owner]`",
    note = "mark the function `#[kvown::owner]`, or the method `#[owner]` inside `#[kvown::owners] impl ..`"
)]
pub trait OwnerToken {
    /// The owner this token belongs to, as the audit register shows it.
    const SITE: &'static crate::audit::OwnerSite;
}
