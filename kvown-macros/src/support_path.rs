//! The path through which expansions reach kvown's support items (`<path>::__private`).

use proc_macro2::TokenStream;
use quote::quote;
use syn::Path;
use syn::meta::ParseNestedMeta;

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

/// Reads the value of a `crate = path` option (the support path of a renamed dependency).
pub(crate) fn parse_support_path(meta: &ParseNestedMeta<'_>) -> syn::Result<TokenStream> {
    let path: Path = meta.value()?.parse()?;
    Ok(quote!(#path))
}
