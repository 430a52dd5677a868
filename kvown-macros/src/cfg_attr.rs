//! rustc expands `#[cfg_attr(predicate, attrs..)]` after kvown's attribute macros have run, so
//! a kvown attribute inside one is never seen by them: they refuse it instead of ignoring it.

use syn::punctuated::Punctuated;
use syn::{Attribute, Meta, Token};

/// Whether `attr` is a `#[cfg_attr(..)]` whose attributes (past the predicate, which may name a
/// cfg `name` of its own) include one named `name`: `name`, `kvown::name` or `name(..)`.
pub(crate) fn hides_attribute(attr: &Attribute, name: &str) -> bool {
    if !attr.path().is_ident("cfg_attr") {
        return false;
    }
    let Ok(items) = attr.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated) else {
        return false;
    };
    items
        .iter()
        .skip(1)
        .any(|meta| meta.path().segments.last().is_some_and(|s| s.ident == name))
}

#[cfg(test)]
mod tests {
    use syn::parse_quote;

    use super::*;

    #[test]
    fn only_the_attributes_past_the_predicate_count() {
        let hidden: [Attribute; 4] = [
            parse_quote!(#[cfg_attr(test, owner)]),
            parse_quote!(#[cfg_attr(all(unix, test), doc = "x", kvown::owner)]),
            parse_quote!(#[cfg_attr(test, owner(token = cap))]),
            parse_quote!(#[cfg_attr(feature = "a", owned_by(alloc, Batch::go))]),
        ];
        for attr in &hidden[..3] {
            assert!(hides_attribute(attr, "owner"), "{attr:?}");
        }
        assert!(hides_attribute(&hidden[3], "owned_by"));
        let plain: [Attribute; 4] = [
            parse_quote!(#[cfg_attr(owner, inline)]),
            parse_quote!(#[cfg_attr(test, derive(owner))]),
            parse_quote!(#[owner]),
            parse_quote!(#[cfg(owner)]),
        ];
        for attr in &plain {
            assert!(!hides_attribute(attr, "owner"), "{attr:?}");
        }
    }
}
