//! `#[guarded]`: parse -> validate -> expand.

mod expand;
mod parse;
mod validate;

use proc_macro2::{Delimiter, TokenStream, TokenTree};
use quote::quote;

use crate::diag::Diagnostics;

pub(crate) fn expand(args: TokenStream, input: TokenStream) -> TokenStream {
    let mut diagnostics = Diagnostics::new();
    let model = match parse::parse(args.clone(), input.clone(), &mut diagnostics) {
        Ok(model) => model,
        Err(fallback) => {
            let errors = diagnostics.into_compile_errors();
            return quote!(#errors #fallback);
        }
    };
    let refused = validate::validate(&model, &mut diagnostics);
    let expansion = expand::expand(&model, &refused, &args, &input);
    let errors = diagnostics.into_compile_errors();
    quote!(#errors #expansion)
}

/// `guarded_documented! { (args) struct .. }`: the documented form of a `#[guarded]` struct,
/// which `#[guarded]` leaves to rustdoc (behind `cfg(doc)`), so that a build pays nothing for it.
/// Its errors were reported by `#[guarded]`; a struct that did not parse is emitted as written.
pub(crate) fn expand_documented(input: TokenStream) -> TokenStream {
    let mut tokens = input.into_iter();
    let args = match tokens.next() {
        Some(TokenTree::Group(group)) if group.delimiter() == Delimiter::Parenthesis => {
            group.stream()
        }
        _ => return TokenStream::new(),
    };
    let mut diagnostics = Diagnostics::new();
    let parsed = parse::parse(args, tokens.collect(), &mut diagnostics);
    let documented = match parsed {
        Ok(model) => {
            let refused = validate::validate(&model, &mut diagnostics);
            expand::expand_documented(&model, &refused)
        }
        Err(fallback) => fallback,
    };
    // Reported by `#[guarded]` already, in the same build.
    drop(diagnostics.into_compile_errors());
    documented
}

#[cfg(test)]
mod snapshot;
