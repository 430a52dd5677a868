//! Options of `#[owner(..)]` / `#[owners(..)]` and small readers of the annotated items.

use proc_macro2::{Span, TokenStream};
use syn::{Attribute, Ident, Type};

use crate::diag::Diagnostics;
use crate::method_token::is_owner_type_name;
use crate::support_path::{default_support_path, parse_support_path};

/// Options of one owner.
pub(crate) struct OwnerOptions {
    /// Where expansions find kvown's support items.
    pub(crate) support: TokenStream,
    /// Name of the capability binding inside the body (`owner` unless `token = name`).
    pub(crate) binding: Ident,
}

fn default_binding() -> Ident {
    Ident::new("owner", Span::call_site())
}

/// Parses `#[owner(token = name, crate = path)]` on a free function.
pub(crate) fn owner_options(args: TokenStream, diagnostics: &mut Diagnostics) -> OwnerOptions {
    let mut options = OwnerOptions {
        support: default_support_path(),
        binding: default_binding(),
    };
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("token") {
            options.binding = meta.value()?.parse()?;
            Ok(())
        } else if meta.path.is_ident("crate") {
            options.support = parse_support_path(&meta)?;
            Ok(())
        } else {
            Err(meta.error("unknown `owner` option; expected `token = name` or `crate = path`"))
        }
    });
    if let Err(error) = syn::parse::Parser::parse2(parser, args) {
        diagnostics.push(error);
    }
    options
}

/// Parses `#[owners(crate = path)]` and returns the support path.
pub(crate) fn owners_options(args: TokenStream, diagnostics: &mut Diagnostics) -> TokenStream {
    let mut support = default_support_path();
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("crate") {
            support = parse_support_path(&meta)?;
            Ok(())
        } else {
            Err(meta.error("unknown `owners` option; expected `crate = path`"))
        }
    });
    if let Err(error) = syn::parse::Parser::parse2(parser, args) {
        diagnostics.push(error);
    }
    support
}

/// Parses the `#[owner(token = name)]` of a method inside `#[owners]`.
pub(crate) fn method_options(
    attr: &Attribute,
    support: &TokenStream,
    diagnostics: &mut Diagnostics,
) -> OwnerOptions {
    let mut options = OwnerOptions {
        support: support.clone(),
        binding: default_binding(),
    };
    if matches!(attr.meta, syn::Meta::Path(_)) {
        return options;
    }
    let result = attr.parse_nested_meta(|meta| {
        if meta.path.is_ident("token") {
            options.binding = meta.value()?.parse()?;
            Ok(())
        } else {
            Err(meta.error(
                "unknown `owner` option on a method; expected `token = name` \
                 (`crate = path` goes on #[owners])",
            ))
        }
    });
    if let Err(error) = result {
        diagnostics.push(error);
    }
    options
}

/// Removes and returns the method's `#[owner]` / `#[kvown::owner]` attribute, if any.
pub(crate) fn take_owner_attr(attrs: &mut Vec<Attribute>) -> Option<Attribute> {
    let index = attrs.iter().position(|attr| {
        attr.path()
            .segments
            .last()
            .is_some_and(|segment| segment.ident == "owner")
    })?;
    Some(attrs.remove(index))
}

/// The name of the impl's self type (`Batch` for `impl<T> Batch<T>`), or the error to report:
/// the method tokens are named after it and defined in the impl's module, so the type must be a
/// single UpperCamelCase identifier naming a type in scope there (see [`crate::method_token`]).
pub(crate) fn self_type_name(ty: &Type) -> syn::Result<Ident> {
    let Type::Path(path) = ty else {
        return Err(syn::Error::new_spanned(
            ty,
            "#[kvown::owners] needs a named type (`impl Type` or `impl<T> Type<T>`)",
        ));
    };
    let single =
        path.qself.is_none() && path.path.leading_colon.is_none() && path.path.segments.len() == 1;
    if !single {
        return Err(syn::Error::new_spanned(
            ty,
            "#[kvown::owners] needs the impl's type named by one identifier (`impl Batch`, \
             `impl<T> Batch<T>`): `#[owned_by(path::Batch::method)]` finds the owner through the \
             module where that name means this type; import the type (`use path::Batch;`) or \
             put the impl block in its module",
        ));
    }
    let ident = &path.path.segments[0].ident;
    if !is_owner_type_name(ident) {
        return Err(syn::Error::new_spanned(
            ident,
            format!(
                "#[kvown::owners] needs an UpperCamelCase type name without `_` (found `{ident}`): \
                 kvown finds a method owner `Type::method` by the type's and the method's names \
                 joined with `_`, which must split one way only"
            ),
        ));
    }
    Ok(ident.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_self_types_are_one_upper_camel_case_identifier() {
        let named = |ty: Type| self_type_name(&ty).map(|ident| ident.to_string());
        assert_eq!(named(syn::parse_quote!(Batch)).unwrap(), "Batch");
        assert_eq!(named(syn::parse_quote!(Batch<T>)).unwrap(), "Batch");
        assert_eq!(named(syn::parse_quote!(r#Req)).unwrap(), "r#Req");
        for refused in [
            syn::parse_quote!(other::Batch),
            syn::parse_quote!(::Batch),
            syn::parse_quote!(<T as Tr>::Batch),
            syn::parse_quote!(Batch_Req),
            syn::parse_quote!(batch),
            syn::parse_quote!(&Batch),
        ] {
            let text = quote::ToTokens::to_token_stream(&refused).to_string();
            assert!(named(refused).is_err(), "{text}");
        }
    }
}
