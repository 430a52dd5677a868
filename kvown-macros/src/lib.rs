//! Procedural macros of [kvown](https://docs.rs/kvown): compile-time single-owner field writes.
//!
//! * [`macro@guarded`] seals a struct and gives each `#[owned_by(..)]` field a free getter and
//!   setters that demand an owner's capability;
//! * [`macro@owner`] turns a free function into an owner: its body gets the capability `owner`;
//! * [`macro@owners`] does the same for the `#[owner]` methods of an inherent `impl` block.
//!
//! Use them through the `kvown` facade crate; its documentation describes the contract.
//! Each macro parses its input into a typed model, validates it (reporting every problem in one
//! build, as `syn::Error`s spanned on the offending tokens), then expands.

mod cfg_attr;
mod diag;
mod guarded;
mod method_token;
mod owner;
mod seal;
mod support_path;

#[cfg(test)]
mod budget;

use proc_macro::TokenStream;

/// Seals a struct so that only the functions named in `#[owned_by(..)]` can write those fields.
///
/// See the `kvown` crate documentation for the full contract.
#[proc_macro_attribute]
pub fn guarded(args: TokenStream, input: TokenStream) -> TokenStream {
    guarded::expand(args.into(), input.into()).into()
}

/// Marks a free function as an owner and binds its capability as `owner` inside its body.
///
/// `#[owner(token = name)]` renames the binding.
#[proc_macro_attribute]
pub fn owner(args: TokenStream, input: TokenStream) -> TokenStream {
    owner::expand_fn(args.into(), input.into()).into()
}

/// Turns the `#[owner]` methods of an inherent `impl` block into owners (`Type::method`).
#[proc_macro_attribute]
pub fn owners(args: TokenStream, input: TokenStream) -> TokenStream {
    owner::expand_impl(args.into(), input.into()).into()
}

/// The documented form of a `#[guarded]` struct, which `#[guarded]` emits behind `cfg(doc)`:
/// only rustdoc expands it. Not a public API.
#[doc(hidden)]
#[proc_macro]
pub fn __guarded_documented(input: TokenStream) -> TokenStream {
    guarded::expand_documented(input.into()).into()
}

/// The documented form of an `#[owner]` function, which `#[owner]` emits behind `cfg(doc)`: only
/// rustdoc expands it. Not a public API.
#[doc(hidden)]
#[proc_macro]
pub fn __owner_documented(input: TokenStream) -> TokenStream {
    owner::expand_fn_documented(input.into()).into()
}
