//! The typed model of a `#[guarded]` struct and its `#[owned_by(..)]` fields.

use proc_macro2::TokenStream;
use quote::{ToTokens, format_ident};
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Attribute, Fields, Ident, ItemStruct, Meta, Path, Token, Type, Visibility, parse_quote};

use crate::cfg_attr::{cfg_conditions, hides_attribute};
use crate::diag::Diagnostics;
use crate::support_path::{default_support_path, parse_support_path};

/// A parsed `#[guarded]` struct.
pub(crate) struct GuardedStruct {
    /// Where expansions find kvown's support items (`crate = path`).
    pub(crate) support: TokenStream,
    /// Name of the generated init struct (`init = Name`, default `<Struct>Init`).
    pub(crate) init_name: Ident,
    /// Whether `into_init(self)` is generated (`into_init`): it moves every field out, which a
    /// struct with a `Drop` impl forbids, so it is asked for.
    pub(crate) into_init: bool,
    /// The struct as written, minus the `#[owned_by]` attributes.
    pub(crate) item: ItemStruct,
    /// Its fields, in order.
    pub(crate) fields: Vec<FieldModel>,
    /// The struct's lint suppressions ([`lint_suppressions`]), repeated on the hidden module.
    pub(crate) lint_allows: Vec<Attribute>,
}

/// One named field.
pub(crate) struct FieldModel {
    pub(crate) ident: Ident,
    pub(crate) ty: Type,
    pub(crate) vis: Visibility,
    /// `#[cfg]` attributes, and the `#[cfg_attr]`s that carry a `cfg`, reduced to it
    /// ([`cfg_conditions`]), repeated on everything generated for the field. (Other `#[cfg_attr]`s
    /// are not: they usually carry attributes, like `serde(..)`, that mean nothing on generated
    /// items.)
    pub(crate) cfg_attrs: Vec<Attribute>,
    /// Doc comments, repeated on the getter.
    pub(crate) doc_attrs: Vec<Attribute>,
    /// Lint suppressions ([`lint_suppressions`]), repeated on everything generated for the
    /// field.
    pub(crate) lint_allows: Vec<Attribute>,
    /// `#[deprecated]`, repeated on the field's accessors: reading or writing a deprecated field
    /// through them warns as a plain field access would.
    pub(crate) deprecated_attrs: Vec<Attribute>,
    /// Present when the field carries `#[owned_by(..)]`.
    pub(crate) ownership: Option<Ownership>,
}

/// The content of one `#[owned_by(..)]`.
pub(crate) struct Ownership {
    /// The attribute itself, for spans.
    pub(crate) attr: Attribute,
    /// Owner paths, as written (resolved like `use` paths from the struct's module).
    pub(crate) owners: Vec<Path>,
    /// `read = copy | ref`, when given.
    pub(crate) read: Option<ReadMode>,
    /// Further `#[owned_by]` attributes on the same field (an error).
    pub(crate) repeated: Vec<Attribute>,
    /// Some argument did not parse (already reported): an empty owner list is not news then.
    pub(crate) malformed: bool,
}

/// How the getter returns the field.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadMode {
    /// `fn field(&self) -> T` (the type must be `Copy`).
    ByValue,
    /// `fn field(&self) -> &T`.
    ByRef,
}

/// One argument of `#[owned_by(..)]`.
enum OwnedByArg {
    Owner(Path),
    Read(ReadMode),
}

impl Parse for OwnedByArg {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        if input.peek(Ident) && input.peek2(Token![=]) {
            let key: Ident = input.parse()?;
            input.parse::<Token![=]>()?;
            if key != "read" {
                return Err(syn::Error::new(
                    key.span(),
                    format!(
                        "unknown `owned_by` option `{key}`; expected owner paths and optionally `read = copy` or `read = ref`"
                    ),
                ));
            }
            // `ref` is a keyword: parse any identifier-like token.
            let mode = Ident::parse_any(input)?;
            return match mode.to_string().as_str() {
                "copy" => Ok(OwnedByArg::Read(ReadMode::ByValue)),
                "ref" => Ok(OwnedByArg::Read(ReadMode::ByRef)),
                _ => Err(syn::Error::new(
                    mode.span(),
                    "expected `read = copy` (getter returns the value) or `read = ref` (getter returns a reference)",
                )),
            };
        }
        Ok(OwnedByArg::Owner(Path::parse_mod_style(input)?))
    }
}

/// Parses the comma-separated arguments of `#[owned_by(..)]`, recording a bad argument in
/// `errors` and going on with the next one, so every bad argument is reported and the good ones
/// are kept.
fn parse_owned_by_args(
    input: ParseStream,
    errors: &mut Vec<syn::Error>,
) -> syn::Result<Vec<OwnedByArg>> {
    let mut args = Vec::new();
    while !input.is_empty() {
        match input.parse::<OwnedByArg>() {
            Ok(arg) => args.push(arg),
            Err(error) => {
                errors.push(error);
                while !input.is_empty() && !input.peek(Token![,]) {
                    input.parse::<proc_macro2::TokenTree>()?;
                }
            }
        }
        if !input.is_empty() {
            input.parse::<Token![,]>()?;
        }
    }
    Ok(args)
}

/// Parses the attribute arguments and the struct. When the item is not a struct with named
/// fields the error is recorded and `Err` carries the item to emit instead (unchanged, minus
/// any `#[owned_by]`, so the one error is all the user sees).
pub(crate) fn parse(
    args: TokenStream,
    input: TokenStream,
    diagnostics: &mut Diagnostics,
) -> Result<GuardedStruct, TokenStream> {
    let mut item: ItemStruct = match syn::parse2(input.clone()) {
        Ok(item) => item,
        Err(_) => {
            diagnostics.push(syn::Error::new(
                proc_macro2::Span::call_site(),
                "#[kvown::guarded] applies to a struct with named fields",
            ));
            return Err(input);
        }
    };
    if !matches!(item.fields, Fields::Named(_)) {
        diagnostics.error_at(
            &item.fields,
            "#[kvown::guarded] needs named fields: `#[owned_by]` names a field",
        );
        for field in item.fields.iter_mut() {
            field.attrs.retain(|attr| !attr.path().is_ident("owned_by"));
        }
        return Err(item.into_token_stream());
    }

    let mut support = default_support_path();
    let mut init_name = format_ident!("{}Init", item.ident, span = item.ident.span());
    let mut into_init = false;
    let options = syn::meta::parser(|meta| {
        if meta.path.is_ident("crate") {
            support = parse_support_path(&meta)?;
            Ok(())
        } else if meta.path.is_ident("init") {
            init_name = meta.value()?.parse()?;
            Ok(())
        } else if meta.path.is_ident("into_init") {
            into_init = true;
            Ok(())
        } else {
            Err(meta.error(
                "unknown `guarded` option; expected `crate = path`, `init = Name` or `into_init`",
            ))
        }
    });
    if let Err(error) = syn::parse::Parser::parse2(options, args) {
        diagnostics.push(error);
    }

    let mut fields = Vec::new();
    for field in item.fields.iter_mut() {
        let ident = field.ident.clone().expect("named field");
        let mut ownership: Option<Ownership> = None;
        let mut kept = Vec::with_capacity(field.attrs.len());
        for attr in std::mem::take(&mut field.attrs) {
            if hides_attribute(&attr, "owned_by") {
                // rustc expands `cfg_attr` after this macro has run: the field would look
                // unowned here and then meet an unknown `#[owned_by]`.
                diagnostics.error_at(
                    &attr,
                    format!(
                        "`#[owned_by]` inside `#[cfg_attr]` is not seen by #[kvown::guarded], which \
                         runs before `cfg_attr` is expanded; put `#[owned_by(..)]` on `{ident}` \
                         itself (a `#[cfg]` on the field is honoured)"
                    ),
                );
                continue;
            }
            if !attr.path().is_ident("owned_by") {
                kept.push(attr);
                continue;
            }
            if let Some(first) = ownership.as_mut() {
                first.repeated.push(attr);
                continue;
            }
            let mut owners = Vec::new();
            let mut read = None;
            let mut errors = Vec::new();
            if !matches!(attr.meta, syn::Meta::Path(_)) {
                let parsed = attr
                    .parse_args_with(|input: ParseStream| parse_owned_by_args(input, &mut errors));
                match parsed {
                    Ok(args) => {
                        for arg in args {
                            match arg {
                                OwnedByArg::Owner(path) => owners.push(path),
                                OwnedByArg::Read(mode) => read = Some(mode),
                            }
                        }
                    }
                    Err(error) => errors.push(error),
                }
            }
            let malformed = !errors.is_empty();
            errors.into_iter().for_each(|e| diagnostics.push(e));
            ownership = Some(Ownership {
                attr,
                owners,
                read,
                repeated: Vec::new(),
                malformed,
            });
        }
        field.attrs = kept;
        let cfg_attrs = cfg_conditions(&field.attrs);
        let doc_attrs = field
            .attrs
            .iter()
            .filter(|a| a.path().is_ident("doc"))
            .cloned()
            .collect();
        fields.push(FieldModel {
            ident,
            ty: field.ty.clone(),
            vis: field.vis.clone(),
            cfg_attrs,
            doc_attrs,
            lint_allows: lint_suppressions(&field.attrs),
            deprecated_attrs: field
                .attrs
                .iter()
                .filter(|a| a.path().is_ident("deprecated"))
                .cloned()
                .collect(),
            ownership,
        });
    }

    Ok(GuardedStruct {
        support,
        init_name,
        into_init,
        lint_allows: lint_suppressions(&item.attrs),
        item,
        fields,
    })
}

/// The `#[allow(..)]` and `#[expect(..)]` among `attrs`, all as `#[allow(..)]`, also inside a
/// `#[cfg_attr(predicate, ..)]` (kept under its predicate): what the user silenced on the
/// struct or a field stays silent in the copies of its types that the expansion makes (any
/// lint a type can trigger; `deprecated` and `unused_braces` the expansion allows there
/// anyway). An `expect` is fulfilled by the item it is written on; on the copies it only
/// allows, or it would be unfulfilled there.
fn lint_suppressions(attrs: &[Attribute]) -> Vec<Attribute> {
    attrs
        .iter()
        .filter_map(|attr| {
            if attr.path().is_ident("cfg_attr") {
                let items = attr
                    .parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)
                    .ok()?;
                let mut items = items.into_iter();
                let predicate = items.next()?;
                let allows: Vec<Meta> = items.filter_map(as_allow).collect();
                (!allows.is_empty()).then(|| parse_quote!(#[cfg_attr(#predicate, #(#allows),*)]))
            } else {
                let allow = as_allow(attr.meta.clone())?;
                Some(parse_quote!(#[#allow]))
            }
        })
        .collect()
}

/// `allow(..)` as it is, `expect(..)` as `allow(..)` with the same lints and reason; `None` for
/// anything else.
fn as_allow(meta: Meta) -> Option<Meta> {
    let Meta::List(mut list) = meta else {
        return None;
    };
    if !(list.path.is_ident("allow") || list.path.is_ident("expect")) {
        return None;
    }
    list.path = parse_quote!(allow);
    Some(Meta::List(list))
}

#[cfg(test)]
mod tests {
    use quote::ToTokens;
    use syn::parse_quote;

    use super::lint_suppressions;

    /// `allow` and `expect` are kept, the `expect` turned into an `allow` with its lints and
    /// reason; other attributes, stronger lint levels included, are not repeated.
    #[test]
    fn lint_suppressions_are_the_allows_and_the_expects_as_allows() {
        let attrs: Vec<syn::Attribute> = vec![
            parse_quote!(#[allow(dead_code)]),
            parse_quote!(#[doc = "a field"]),
            parse_quote!(#[expect(deprecated, reason = "old type")]),
            parse_quote!(#[deny(unused_braces)]),
            parse_quote!(#[derive(Debug)]),
            parse_quote!(#[cfg_attr(test, derive(Clone), expect(unused))]),
            parse_quote!(#[cfg_attr(feature = "x", derive(Clone))]),
        ];
        let kept: Vec<String> = lint_suppressions(&attrs)
            .iter()
            .map(|attr| attr.to_token_stream().to_string())
            .collect();
        assert_eq!(
            kept,
            [
                "# [allow (dead_code)]",
                "# [allow (deprecated , reason = \"old type\")]",
                "# [cfg_attr (test , allow (unused))]"
            ]
        );
    }
}
