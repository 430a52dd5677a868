//! Error accumulation: every problem the macro can see is reported in one build.

use proc_macro2::TokenStream;
use quote::ToTokens;

/// Collects `syn::Error`s; once one is recorded it must be consumed with
/// [`Diagnostics::into_compile_errors`], or the drop panics (errors must never be lost).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_errors_come_out_as_compile_errors() {
        let mut diagnostics = Diagnostics::new();
        diagnostics.error_at(quote::quote!(field), "first");
        diagnostics.error_at(quote::quote!(other), "second");
        let errors = diagnostics.into_compile_errors().to_string();
        assert!(
            errors.contains("first") && errors.contains("second"),
            "{errors}"
        );
    }

    #[test]
    fn a_collection_without_errors_drops_quietly() {
        drop(Diagnostics::new());
        assert!(Diagnostics::new().into_compile_errors().is_empty());
    }

    #[test]
    #[should_panic(expected = "errors were recorded but never reported")]
    fn dropping_recorded_errors_panics() {
        let mut diagnostics = Diagnostics::new();
        diagnostics.error_at(quote::quote!(field), "lost");
        drop(diagnostics);
    }
}
