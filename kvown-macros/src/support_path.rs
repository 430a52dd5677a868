//! The path through which expansions reach kvown's support items (`<path>::__private`).

use proc_macro2::TokenStream;
use quote::quote;
use syn::Path;
use syn::meta::ParseNestedMeta;

/// The default support path, `::kvown`: the facade, or what a crate that cannot depend on it
/// (kvown's own allocator) names `kvown` (`extern crate kvown_ownership as kvown;`).
///
/// A crate that renames its `kvown` dependency passes `crate = path` (serde-style).
pub(crate) fn default_support_path() -> TokenStream {
    quote!(::kvown)
}

/// Reads the value of a `crate = path` option (the support path of a renamed dependency).
pub(crate) fn parse_support_path(meta: &ParseNestedMeta<'_>) -> syn::Result<TokenStream> {
    let path: Path = meta.value()?.parse()?;
    Ok(quote!(#path))
}
