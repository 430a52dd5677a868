//! Error accumulation: every problem the macro can see is reported in one build.

use proc_macro2::TokenStream;
use quote::ToTokens;

/// Collects `syn::Error`s; must be consumed with [`Diagnostics::into_result`] or
/// [`Diagnostics::into_compile_errors`], or it panics on drop (errors must never be lost).
pub(crate) struct Diagnostics {
    errors: Option<Vec<syn::Error>>,
}

impl Diagnostics {
    pub(crate) fn new() -> Self {
        Diagnostics {
            errors: Some(Vec::new()),
        }
    }

    /// Records an error spanned on `tokens`.
    pub(crate) fn error_at(&mut self, tokens: impl ToTokens, message: impl std::fmt::Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    /// Records an error.
    pub(crate) fn push(&mut self, error: syn::Error) {
        self.errors
            .as_mut()
            .expect("diagnostics already consumed")
            .push(error);
    }

    /// Returns all recorded errors as `compile_error!` invocations (empty when none).
    pub(crate) fn into_compile_errors(mut self) -> TokenStream {
        self.errors
            .take()
            .unwrap_or_default()
            .into_iter()
            .map(|e| e.to_compile_error())
            .collect()
    }
}

impl Drop for Diagnostics {
    fn drop(&mut self) {
        if self.errors.as_ref().is_some_and(|e| !e.is_empty()) && !std::thread::panicking() {
            panic!("kvown-macros: errors were recorded but never reported");
        }
    }
}
