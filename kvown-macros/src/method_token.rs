//! How a method owner's capability token is named, shared by `#[owners]` (which defines it) and
//! `#[guarded]` (which finds it from `Type::method` in `#[owned_by(..)]`).
//!
//! The token of `Type::method` is `Type_method`, defined in the impl block's module. For that
//! name to designate exactly one owner, `Type` is an UpperCamelCase identifier without `_` (so
//! `Type_method` splits one way only) and no free owner function starts with an upper-case
//! letter (so no function's token has the shape of a method's).
//!
//! `#[guarded]` finds the token by name only, so an imported `Type_method` (a glob import the
//! module's own `Type` shadows only in part) is taken as the token of the `Type` named there; a
//! check through the type itself is not possible for a generic type named without its
//! parameters (README, "Known limits").

use proc_macro2::Ident;
use quote::format_ident;
use syn::ext::IdentExt;

/// Whether a path segment names a type: its first letter is an ASCII upper-case one.
pub(crate) fn is_type_name(ident: &Ident) -> bool {
    ident
        .unraw()
        .to_string()
        .starts_with(|c: char| c.is_ascii_uppercase())
}

/// Whether `ident` may be the self type of an `#[owners]` impl: a type name without `_`.
pub(crate) fn is_owner_type_name(ident: &Ident) -> bool {
    is_type_name(ident) && !ident.unraw().to_string().contains('_')
}

/// The capability token of `type_name::method`: `Type_method`, spanned on the method.
pub(crate) fn token_name(type_name: &Ident, method: &Ident) -> Ident {
    format_ident!("{}_{}", type_name, method, span = method.span())
}
