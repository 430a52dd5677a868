//! The path through which expansions reach kvown's support items (`<path>::__private`).

use proc_macro2::TokenStream;
use quote::quote;

/// The crate whose own code uses the macros with `crate::__private` support.
const RUNTIME_CRATE: &str = "kvown_runtime";

/// The default support path: `crate` inside kvown-runtime itself, `::kvown` everywhere else.
///
/// A crate that renames its `kvown` dependency passes `crate = path` (serde-style).
pub(crate) fn default_support_path() -> TokenStream {
    if std::env::var("CARGO_CRATE_NAME").as_deref() == Ok(RUNTIME_CRATE) {
        quote!(crate)
    } else {
        quote!(::kvown)
    }
}
