//! rustc expands `#[cfg_attr(predicate, attrs..)]` after kvown's attribute macros have run, so
//! a kvown attribute inside one is never seen by them: they refuse it instead of ignoring it. A
//! `cfg` inside one compiles the field or method out after the macro has run, so it is repeated
//! on what the macro generates from it, as a plain `#[cfg]` is.

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

/// The attributes among `attrs` that can compile the item out, to repeat on what is generated
/// from it: each `#[cfg(..)]`, and each `#[cfg_attr(predicate, ..)]` that carries a `cfg(..)`
/// (also in a nested `cfg_attr`), reduced to its `cfg`s: `#[cfg_attr(unix, doc = "x", cfg(test))]`
/// gives `#[cfg_attr(unix, cfg(test))]`.
pub(crate) fn cfg_conditions(attrs: &[Attribute]) -> Vec<Attribute> {
    attrs
        .iter()
        .filter_map(|attr| {
            if attr.path().is_ident("cfg") {
                return Some(attr.clone());
            }
            let meta = conditions_of(&attr.meta)?;
            Some(syn::parse_quote!(#[#meta]))
        })
        .collect()
}

/// `cfg(..)` itself, or a `cfg_attr(predicate, ..)` reduced to the `cfg`s it carries; `None`
/// when it carries none.
fn conditions_of(meta: &Meta) -> Option<Meta> {
    if meta.path().is_ident("cfg") {
        return Some(meta.clone());
    }
    if !meta.path().is_ident("cfg_attr") {
        return None;
    }
    let items = meta
        .require_list()
        .ok()?
        .parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)
        .ok()?;
    let mut items = items.into_iter();
    let predicate = items.next()?;
    let kept: Vec<Meta> = items.filter_map(|item| conditions_of(&item)).collect();
    (!kept.is_empty()).then(|| syn::parse_quote!(cfg_attr(#predicate, #(#kept),*)))
}

#[cfg(test)]
mod tests {
    use quote::ToTokens;
    use syn::parse_quote;

    use super::*;

    #[test]
    fn cfg_conditions_keep_cfgs_and_the_cfgs_inside_cfg_attrs() {
        let attrs: [Attribute; 6] = [
            parse_quote!(#[cfg(test)]),
            parse_quote!(#[cfg_attr(unix, doc = "x", cfg(test))]),
            parse_quote!(#[cfg_attr(unix, cfg_attr(test, cfg(any()), inline))]),
            parse_quote!(#[cfg_attr(unix, doc = "no cfg")]),
            parse_quote!(#[doc = "plain"]),
            parse_quote!(#[cfg_attr(cfg, allow(dead_code))]),
        ];
        let kept: Vec<String> = cfg_conditions(&attrs)
            .iter()
            .map(|a| a.to_token_stream().to_string().replace(' ', ""))
            .collect();
        assert_eq!(
            kept,
            [
                "#[cfg(test)]",
                "#[cfg_attr(unix,cfg(test))]",
                "#[cfg_attr(unix,cfg_attr(test,cfg(any())))]",
            ]
        );
    }

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
