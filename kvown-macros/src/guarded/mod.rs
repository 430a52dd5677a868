//! `#[guarded]`: parse -> validate -> expand.

mod expand;
mod parse;
mod validate;

use proc_macro2::TokenStream;
use quote::quote;

use crate::diag::Diagnostics;

pub(crate) fn expand(args: TokenStream, input: TokenStream) -> TokenStream {
    let mut diagnostics = Diagnostics::new();
    let Some(model) = parse::parse(args, input.clone(), &mut diagnostics) else {
        let errors = diagnostics.into_compile_errors();
        return quote!(#errors #input);
    };
    validate::validate(&model, &mut diagnostics);
    let expansion = expand::expand(&model);
    let errors = diagnostics.into_compile_errors();
    quote!(#errors #expansion)
}
