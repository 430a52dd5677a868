//! `#[guarded]`: parse -> validate -> expand.

mod expand;
mod parse;
mod validate;

use proc_macro2::TokenStream;
use quote::quote;

use crate::diag::Diagnostics;

pub(crate) fn expand(args: TokenStream, input: TokenStream) -> TokenStream {
    let mut diagnostics = Diagnostics::new();
    let model = match parse::parse(args, input, &mut diagnostics) {
        Ok(model) => model,
        Err(fallback) => {
            let errors = diagnostics.into_compile_errors();
            return quote!(#errors #fallback);
        }
    };
    let refused = validate::validate(&model, &mut diagnostics);
    let expansion = expand::expand(&model, &refused);
    let errors = diagnostics.into_compile_errors();
    quote!(#errors #expansion)
}

#[cfg(test)]
mod snapshot;
