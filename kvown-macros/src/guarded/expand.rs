//! Code generation for `#[guarded]`.
//!
//! The struct moves into a hidden child module where its owned fields are private, so no code
//! outside that module (the struct's own module included) can touch them except through the
//! generated accessors. Everything else keeps the reach it had when written. What needs no
//! access to the owned fields (the init struct and the split-borrow view) is defined in the
//! struct's own module.
//!
//! Three parts: the sealed form, which the compiler builds (`cfg(not(doc))`); the items shared by
//! both forms; and a call of `guarded_documented!`, which rustdoc alone expands (`cfg(doc)`) into
//! the struct as written, in place, so that it is documented as its module's own item.

use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::visit_mut::VisitMut;
use syn::{
    Attribute, Fields, GenericParam, Generics, Ident, Lifetime, LifetimeParam, Path, Token,
    TraitBoundModifier, Type, TypeParamBound, Visibility, WherePredicate, parse_quote,
};

use super::parse::{FieldModel, GuardedStruct, Ownership, ReadMode};
use crate::method_token::{is_type_name, token_name};
use crate::seal::{DeeperPaths, path_from_child, widen_one_level};

/// Std derives mirrored onto the generated init struct.
const MIRRORED_DERIVES: &[&str] = &["Debug", "Clone", "Default"];

/// A field of the struct: its model and its type as the generated code names it.
struct SealedField<'a> {
    model: &'a FieldModel,
    ty: Type,
}

/// Where the struct is emitted.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Placement {
    /// In the hidden child module, re-exported: what the compiler builds.
    Sealed,
    /// In the struct's own module, as written: what rustdoc documents (`cfg(doc)`). rustdoc
    /// inlines a re-export only on a public path, so a private struct sealed in a hidden module
    /// would have no page even with `--document-private-items`. Nothing is compiled from this
    /// placement (rustdoc does not build code), so it has no seal to enforce and registers
    /// nothing; its owner traits are still sealed and implemented for the listed owners.
    InPlace,
}

/// What `#[guarded]` emits for the compiler: the sealed struct with its accessors and
/// registration, the init and view structs beside it, and the deferred documented form.
/// `args` and `input` are the attribute's arguments and the struct as written, handed on to
/// `guarded_documented!`; the owned fields in `refused` (whose generated names were refused) get
/// no accessors and no owner trait.
pub(crate) fn expand(
    model: &GuardedStruct,
    refused: &[&Ident],
    args: &TokenStream,
    input: &TokenStream,
) -> TokenStream {
    let sealed = expand_at(model, refused, Placement::Sealed);
    let shared = shared_items(model, refused);
    let support = &model.support;
    quote! {
        #sealed
        #shared
        #[cfg(doc)]
        #support::__private::guarded_documented! { (#args) #input }
    }
}

/// The documented form, what `guarded_documented!` expands to under rustdoc: the struct in
/// place with its accessors and owner traits (the init and view structs are shared).
pub(crate) fn expand_documented(model: &GuardedStruct, refused: &[&Ident]) -> TokenStream {
    expand_at(model, refused, Placement::InPlace)
}

/// The struct's type parameters declared `?Sized`, and the field types that mention one: the
/// bounds (`FieldType: Sized`) that what moves those fields by value needs.
struct MaybeUnsized<'a> {
    params: Vec<&'a Ident>,
}

impl MaybeUnsized<'_> {
    /// Whether `ty` names one of the `?Sized` parameters (so it may be unsized).
    fn mentioned_in(&self, ty: &Type) -> bool {
        struct Finder<'p> {
            params: &'p [&'p Ident],
            found: bool,
        }
        impl<'ast> Visit<'ast> for Finder<'_> {
            fn visit_path(&mut self, path: &'ast Path) {
                if let Some(first) = path.segments.first()
                    && self.params.iter().any(|p| **p == first.ident)
                {
                    self.found = true;
                }
                syn::visit::visit_path(self, path);
            }
        }
        let mut finder = Finder {
            params: &self.params,
            found: false,
        };
        finder.visit_type(ty);
        finder.found
    }

    /// `FieldType: Sized` for each of `fields` that names a `?Sized` parameter.
    fn bounds<'f>(&self, fields: impl Iterator<Item = &'f Type>) -> Vec<WherePredicate> {
        fields
            .filter(|ty| self.mentioned_in(ty))
            .map(|ty| parse_quote!(#ty: ::core::marker::Sized))
            .collect()
    }
}

fn expand_at(model: &GuardedStruct, refused: &[&Ident], placement: Placement) -> TokenStream {
    let private = {
        let support = &model.support;
        quote!(#support::__private)
    };
    let in_place = placement == Placement::InPlace;
    let name = &model.item.ident;
    let outer_vis = &model.item.vis;
    let inner_vis = if in_place {
        outer_vis.clone()
    } else {
        widen_one_level(outer_vis)
    };
    let module = sealed_module_name(name);
    let init = &model.init_name;
    let view = format_ident!("{}FieldsMut", name);

    let mut sealed = model.item.clone();
    sealed.vis = inner_vis.clone();
    if !in_place {
        DeeperPaths::default().visit_generics_mut(&mut sealed.generics);
    }
    let Fields::Named(named) = &mut sealed.fields else {
        unreachable!("parse accepts only named fields")
    };
    let self_type: Type = {
        let (_, ty_generics, _) = sealed.generics.split_for_impl();
        parse_quote!(#name #ty_generics)
    };
    let mut fields = Vec::new();
    for (field, field_model) in named.named.iter_mut().zip(&model.fields) {
        if !in_place {
            DeeperPaths::default().visit_type_mut(&mut field.ty);
        }
        field.vis = if field_model.ownership.is_some() {
            Visibility::Inherited
        } else if in_place {
            field_model.vis.clone()
        } else {
            widen_one_level(&field_model.vis)
        };
        let mut ty = field.ty.clone();
        SelfToStruct(&self_type).visit_type_mut(&mut ty);
        fields.push(SealedField {
            model: field_model,
            ty,
        });
    }

    let generics = &sealed.generics;
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    // A `?Sized` parameter may make a field (the tail) unsized: what moves fields by value asks
    // for those that name one to be `Sized` (usable once they are), and no more.
    let maybe_unsized = MaybeUnsized {
        params: maybe_sized_params(generics),
    };
    let mut sized_generics = generics.clone();
    let tail_bounds = maybe_unsized.bounds(fields.iter().map(|f| &f.ty));
    if !tail_bounds.is_empty() {
        sized_generics
            .make_where_clause()
            .predicates
            .extend(tail_bounds);
    }
    let (_, _, sized_where) = sized_generics.split_for_impl();
    let borrow = borrow_lifetime(&model.item);
    let view_generics = with_view_lifetime(generics, &borrow);
    let (_, view_ty_generics, _) = view_generics.split_for_impl();

    let mut seals = Vec::new();
    let mut owner_traits = Vec::new();
    let mut trait_exports = Vec::new();
    let mut accessors = Vec::new();
    let mut registered = Vec::new();
    for field in &fields {
        let Some(ownership) = &field.model.ownership else {
            continue;
        };
        if refused.contains(&&field.model.ident) {
            continue;
        }
        let trait_name = owner_trait_name(name, &field.model.ident);
        trait_exports.push((&field.model.cfg_attrs, trait_name.clone()));
        seals.push(seal_trait(name, field.model, &trait_name));
        owner_traits.push(owner_trait(
            name,
            field.model,
            ownership,
            &trait_name,
            &inner_vis,
            placement,
        ));
        let context = AccessorContext {
            inner_vis: &inner_vis,
            maybe_unsized: &maybe_unsized,
            borrow: &borrow,
            placement,
        };
        accessors.push(field_accessors(&context, field, ownership, &trait_name));
        registered.push(registered_field(&private, field.model, ownership));
    }

    let idents: Vec<&Ident> = fields.iter().map(|f| &f.model.ident).collect();
    let cfgs: Vec<&Vec<Attribute>> = fields.iter().map(|f| &f.model.cfg_attrs).collect();
    let view_refs = fields.iter().map(|f| {
        let ident = &f.model.ident;
        if f.model.ownership.is_some() {
            quote!(&self.#ident)
        } else {
            quote!(&mut self.#ident)
        }
    });
    // `into_init(self)` moves every field out, which a struct with a `Drop` impl forbids
    // (E0509), and a macro cannot see impls: it is generated only on request.
    let into_init = model.into_init.then(|| {
        let vis = if in_place {
            Visibility::Inherited
        } else {
            parse_quote!(pub(super))
        };
        let doc = in_place.then(|| {
            quote!(
                /// Takes the value apart into its init struct, whose fields are visible where a
                /// struct literal of this type would be (`#[kvown::guarded(into_init)]`).
            )
        });
        quote! {
            #doc
            #[inline]
            #[allow(dead_code)]
            #vis fn into_init(self) -> #init #ty_generics #sized_where {
                #init { #( #(#cfgs)* #idents: self.#idents, )* }
            }
        }
    });
    let fields_mut_doc = in_place.then(|| {
        quote!(
            /// Borrows every field at once: shared references to owned fields, mutable
            /// references to the others (the split borrow that sealing otherwise prevents).
        )
    });
    // `deprecated` here and on every item generated from the struct: a `#[deprecated]` struct or
    // field warns where it is used, not in what the expansion derives from it. A field named
    // `len` gets a `len()` getter: that is not a collection API. A field type's braces were
    // linted on the struct already (`unused_braces`). The sealed form documents nothing: rustdoc
    // reads the documented form.
    let missing_docs = (!in_place).then(|| quote!(missing_docs,));
    let methods = quote! {
        #[allow(deprecated)]
        impl #impl_generics ::core::convert::From<#init #ty_generics> for #name #ty_generics
        #sized_where
        {
            #[inline]
            fn from(init: #init #ty_generics) -> Self {
                #name { #( #(#cfgs)* #idents: init.#idents, )* }
            }
        }

        #[allow(
            clippy::len_without_is_empty, unused_braces, unused_variables, deprecated,
            #missing_docs
        )]
        impl #impl_generics #name #ty_generics #where_clause {
            #(#accessors)*

            #fields_mut_doc
            #[inline]
            #[allow(dead_code)]
            #inner_vis fn fields_mut<#borrow>(&#borrow mut self) -> #view #view_ty_generics {
                #view { #( #(#cfgs)* #idents: #view_refs, )* }
            }

            #into_init
        }

        #(#owner_traits)*
    };
    if in_place {
        return quote! {
            #[doc(hidden)]
            #[allow(non_snake_case)]
            mod #module {
                pub mod owned_by {
                    #(#seals)*
                }
            }

            #sealed

            #methods
        };
    }
    let struct_allows = &model.lint_allows;
    let registration = registration(&private, name, &registered);
    // The owner traits of fields without `#[cfg]` are re-exported with the struct, the others
    // one by one under their field's `cfg`.
    let (plain_traits, gated_traits): (Vec<_>, Vec<_>) =
        trait_exports.iter().partition(|(cfg, _)| cfg.is_empty());
    let plain_traits = plain_traits.iter().map(|(_, name)| name);
    let gated_traits = gated_traits.iter().map(|(cfg, trait_name)| {
        quote! {
            #[cfg(not(doc))]
            #(#cfg)*
            #[allow(unused_imports)]
            #outer_vis use self::#module::#trait_name;
        }
    });
    quote! {
        #[cfg(not(doc))]
        #[doc(hidden)]
        #[allow(non_snake_case, unused_imports)]
        #(#struct_allows)*
        mod #module {
            // With everything of the struct's module, functions named like the expansion's
            // parameters (`owner` and `value` in the accessors, `init` in `From`): they shadow
            // what `super::*` brings in under those names, where a `const value` would turn the
            // parameter into a constant pattern; a function never does. Imported rather than
            // defined here, so that rustc does not list them as inaccessible candidates when a
            // user's `owner`, `value` or `init` is not found.
            use super::*;
            use ::core::convert::{identity as owner, identity as value, identity as init};

            // The seal traits, one per owned field, named after its owner trait: private to this
            // module, so only the owner trait impls below can implement them. rustc names them
            // where it explains a sealed trait (`sealed_Req::owned_by::ReqLenOwnerSeal`).
            mod owned_by {
                #(#seals)*
            }

            #sealed

            #methods

            #registration
        }

        #[cfg(not(doc))]
        #[allow(unused_imports, deprecated)]
        #outer_vis use self::#module::{#name #(, #plain_traits)*};
        #(#gated_traits)*
    }
}

/// The items both forms share, defined in the struct's own module: the init struct and the
/// split-borrow view. They name the struct's field types as written.
fn shared_items(model: &GuardedStruct, refused: &[&Ident]) -> TokenStream {
    let name = &model.item.ident;
    let self_type: Type = {
        let (_, ty_generics, _) = model.item.generics.split_for_impl();
        parse_quote!(#name #ty_generics)
    };
    // The init and view structs declare the struct's generics again; in their bounds and
    // where-clause `Self` would name them, not the struct.
    let mut generics = model.item.generics.clone();
    SelfToStruct(&self_type).visit_generics_mut(&mut generics);
    let fields: Vec<SealedField<'_>> = model
        .fields
        .iter()
        .map(|field| {
            let mut ty = field.ty.clone();
            SelfToStruct(&self_type).visit_type_mut(&mut ty);
            SealedField { model: field, ty }
        })
        .collect();
    // An owned field `from` gets an inherent `from(&self)` getter, which `Name::from(..)` then
    // names instead of `From::from`.
    let from_is_a_getter = fields.iter().any(|f| {
        f.model.ownership.is_some() && !refused.contains(&&f.model.ident) && f.model.ident == "from"
    });
    let borrow = borrow_lifetime(&model.item);
    let init = init_struct(model, &generics, &fields, from_is_a_getter);
    let view = view_struct(
        model,
        &with_view_lifetime(&generics, &borrow),
        &fields,
        &borrow,
    );
    quote!(#init #view)
}

/// Replaces `Self` in a copied field type or generics by the struct's type (`Node<T>`): the init
/// and view structs reuse the field types and generics, and there `Self` would name them
/// instead. A path that starts with `Self` (`[u8; Self::N]` in an array length) becomes
/// `<Node<T>>::N`.
struct SelfToStruct<'a>(&'a Type);

impl SelfToStruct<'_> {
    /// `Self::rest` as `<Struct>::rest`, or `None` when `path` does not start with `Self::`.
    fn qualified(&self, qself: &Option<syn::QSelf>, path: &Path) -> Option<TokenStream> {
        let first = path.segments.first()?;
        if qself.is_some()
            || path.leading_colon.is_some()
            || path.segments.len() < 2
            || first.ident != "Self"
            || !first.arguments.is_none()
        {
            return None;
        }
        let ty = self.0;
        let rest = path.segments.iter().skip(1);
        Some(quote!(<#ty> #(:: #rest)*))
    }
}

impl VisitMut for SelfToStruct<'_> {
    fn visit_type_mut(&mut self, ty: &mut Type) {
        if let Type::Path(path) = ty {
            if path.qself.is_none() && path.path.is_ident("Self") {
                *ty = self.0.clone();
                return;
            }
            if let Some(tokens) = self.qualified(&path.qself, &path.path)
                && let Ok(qualified) = syn::parse2(tokens)
            {
                *ty = qualified;
                return;
            }
        }
        syn::visit_mut::visit_type_mut(self, ty);
    }

    fn visit_expr_path_mut(&mut self, expr: &mut syn::ExprPath) {
        if let Some(tokens) = self.qualified(&expr.qself, &expr.path)
            && let Ok(qualified) = syn::parse2::<syn::ExprPath>(tokens)
        {
            expr.qself = qualified.qself;
            expr.path = qualified.path;
            return;
        }
        syn::visit_mut::visit_expr_path_mut(self, expr);
    }
}

/// `ReqKvInfo` + `kv_committed_len` -> `ReqKvInfoKvCommittedLenOwner`.
pub(crate) fn owner_trait_name(struct_name: &Ident, field: &Ident) -> Ident {
    let camel: String = field
        .to_string()
        .trim_start_matches("r#")
        .split('_')
        .filter(|part| !part.is_empty())
        .map(|part| {
            let mut chars = part.chars();
            let first = chars.next().map(|c| c.to_ascii_uppercase());
            first.into_iter().chain(chars).collect::<String>()
        })
        .collect();
    format_ident!("{}{}Owner", struct_name, camel)
}

/// `Req` -> `sealed_Req`, the module the struct is sealed in.
fn sealed_module_name(struct_name: &Ident) -> Ident {
    format_ident!("sealed_{}", struct_name)
}

/// `ReqLenOwner` -> `ReqLenOwnerSeal`, its seal.
fn seal_name(trait_name: &Ident) -> Ident {
    format_ident!("{}Seal", trait_name)
}

/// The supertrait that only the hidden module can implement.
fn seal_trait(struct_name: &Ident, field: &FieldModel, trait_name: &Ident) -> TokenStream {
    let ident = &field.ident;
    let seal = seal_name(trait_name);
    let cfg = &field.cfg_attrs;
    let message = format!(
        "`{trait_name}` is sealed: `{{Self}}` cannot become an owner of `{struct_name}::{ident}` by implementing it"
    );
    let note = format!(
        "list the owner in `#[owned_by(..)]` on `{struct_name}::{ident}`; the macro implements the trait for it"
    );
    quote!(
        #(#cfg)*
        #[diagnostic::on_unimplemented(message = #message, note = #note)]
        pub trait #seal {}
    )
}

/// The per-field owner trait, its diagnostic, and its impls for exactly the listed owners.
fn owner_trait(
    struct_name: &Ident,
    field: &FieldModel,
    ownership: &Ownership,
    trait_name: &Ident,
    inner_vis: &Visibility,
    placement: Placement,
) -> TokenStream {
    let seals_path = match placement {
        Placement::Sealed => quote!(owned_by),
        Placement::InPlace => {
            let module = sealed_module_name(struct_name);
            quote!(#module::owned_by)
        }
    };
    let ident = &field.ident;
    let cfg = &field.cfg_attrs;
    let owners: Vec<String> = ownership.owners.iter().map(path_text).collect();
    let listed = owners.join(", ");
    let message =
        format!("`{{Self}}` is not an owner of `{struct_name}::{ident}`; owners: {listed}");
    let label = format!("not an owner of `{struct_name}::{ident}`");
    let how_to_own = format!(
        "only the owners listed in `#[owned_by(..)]` on `{struct_name}::{ident}` may write it: to \
         make a function one, mark it `#[kvown::owner]` (a method: `#[owner]` in a \
         `#[kvown::owners]` impl block) and add it to that list"
    );
    let how_to_help = format!(
        "a helper writing on an owner's behalf takes `owner: &impl {trait_name}`; \
         reads are free: `.{ident}()`"
    );
    let doc = format!(
        "Implemented exactly by the capability tokens of the owners of `{struct_name}::{ident}` \
         ({listed}). Bound a helper's capability parameter by it to let the helper write the \
         field on an owner's behalf."
    );
    // Each impl is spanned on its entry in `#[owned_by(..)]`, so an entry that is not an owner
    // is reported there. A duplicate entry (already an error) is implemented once.
    let seal = seal_name(trait_name);
    let impls = distinct_owners(ownership).map(|owner| {
        let token = match placement {
            Placement::Sealed => path_from_child(&token_path(owner)),
            Placement::InPlace => token_path(owner),
        };
        quote_spanned!(owner.span()=>
            #(#cfg)* #[diagnostic::do_not_recommend] impl #seals_path::#seal for #token {}
            #(#cfg)* impl #trait_name for #token {}
        )
    });
    // Documented in the documented form, which rustdoc reads.
    let doc = match placement {
        Placement::Sealed => quote!(#[allow(missing_docs)]),
        Placement::InPlace => quote!(#[doc = #doc]),
    };
    quote! {
        #(#cfg)*
        #doc
        #[diagnostic::on_unimplemented(
            message = #message,
            label = #label,
            note = #how_to_own,
            note = #how_to_help
        )]
        #inner_vis trait #trait_name: #seals_path::#seal {}
        #(#impls)*
    }
}

/// The owners listed in `#[owned_by(..)]`, each once (a duplicate entry is already an error).
fn distinct_owners(ownership: &Ownership) -> impl Iterator<Item = &Path> {
    let mut seen = Vec::new();
    ownership.owners.iter().filter(move |owner| {
        let text = path_text(owner);
        let new = !seen.contains(&text);
        seen.push(text);
        new
    })
}

/// The capability token type of an owner path, as seen from the struct's module:
/// `f` -> `f`, `a::Batch::retract` -> `a::Batch_retract` (from the hidden module, through
/// [`path_from_child`]: `super::f`).
fn token_path(owner: &Path) -> Path {
    let segments: Vec<&Ident> = owner.segments.iter().map(|s| &s.ident).collect();
    let mut path = owner.clone();
    let n = segments.len();
    if n >= 2 && is_type_name(segments[n - 2]) {
        let token = token_name(segments[n - 2], segments[n - 1]);
        let mut kept: syn::punctuated::Punctuated<syn::PathSegment, syn::Token![::]> =
            owner.segments.iter().take(n - 2).cloned().collect();
        kept.push(token.into());
        path.segments = kept;
    }
    path
}

/// An owner path as the audit register and the messages show it: `a::Batch::move` for
/// `a::Batch::r#move`, matching the owner site's own name.
fn path_text(path: &Path) -> String {
    quote!(#path).to_string().replace(' ', "").replace("r#", "")
}

/// What every owned field's accessors share.
struct AccessorContext<'a> {
    /// The accessors' visibility.
    inner_vis: &'a Visibility,
    /// The struct's `?Sized` type parameters.
    maybe_unsized: &'a MaybeUnsized<'a>,
    /// The lifetime of the borrows `_mut` hands out.
    borrow: &'a Lifetime,
    placement: Placement,
}

/// Getter, setter and `_mut` accessor of one owned field (methods of the struct's impl block).
fn field_accessors(
    context: &AccessorContext<'_>,
    field: &SealedField<'_>,
    ownership: &Ownership,
    trait_name: &Ident,
) -> TokenStream {
    let AccessorContext {
        inner_vis,
        maybe_unsized,
        borrow,
        placement,
    } = context;
    // The capability parameter is named `owner` where it is compiled, so that rustc's "provide
    // the argument" suggestion for a setter called without it reads `/* owner */`; the sealed
    // module imports a function under that name, so that a `const owner` of the user's module
    // cannot turn the parameter into a constant pattern. The documented form, in the user's
    // module, names it `_`: a `static owner` there would make `owner` an error even for rustdoc.
    let (capability, documented) = match placement {
        Placement::Sealed => (quote!(owner), false),
        Placement::InPlace => (quote!(_), true),
    };
    let model = field.model;
    let ty = &field.ty;
    let ident = &model.ident;
    let cfg = &model.cfg_attrs;
    let allows = &model.lint_allows;
    let docs = &model.doc_attrs;
    let deprecated = &model.deprecated_attrs;
    let setter = format_ident!("set_{}", ident);
    let mut_accessor = format_ident!("{}_mut", ident);
    let by_value = match ownership.read {
        Some(mode) => mode == ReadMode::ByValue,
        None => is_copy_by_syntax(ty),
    };
    let getter = if by_value {
        quote!(#inner_vis const fn #ident(&self) -> #ty { self.#ident })
    } else {
        quote!(#inner_vis const fn #ident(&self) -> &#ty { &self.#ident })
    };
    // A `Copy` value has no destructor, so its setter can be `const` (a `const fn` owner can
    // call it); other types are assigned through `_mut`, which is always `const`.
    let setter_constness = by_value.then(|| quote!(const));
    // The setter takes the value by value: with a `?Sized` parameter around, the field's type
    // may be the unsized tail.
    let setter_where = maybe_unsized
        .mentioned_in(ty)
        .then(|| quote!(where #ty: ::core::marker::Sized));
    // The generated sentences are for rustdoc, which reads the documented form; the field's own
    // docs also go on the compiled getter, where an editor shows them.
    let [read_doc, set_doc, mut_doc] = if documented {
        [
            format!("Reads `{ident}` (free: no capability needed)."),
            format!("Writes `{ident}`. Only its owners' capabilities satisfy `{trait_name}`."),
            format!(
                "Mutably borrows `{ident}`, for as long as the owner's capability is borrowed."
            ),
        ]
        .map(|doc| quote!(#[doc = #doc]))
    } else {
        [quote!(), quote!(), quote!()]
    };
    let doc_break = documented.then(|| quote!(#[doc = ""]));
    quote! {
        #(#cfg)* #(#allows)*
        #read_doc
        #doc_break
        #(#docs)*
        #[inline(always)]
        #(#deprecated)*
        #getter

        #(#cfg)* #(#allows)*
        #set_doc
        #[inline]
        #(#deprecated)*
        #inner_vis #setter_constness fn #setter(&mut self, #capability: &impl #trait_name, value: #ty) #setter_where {
            self.#ident = value;
        }

        #(#cfg)* #(#allows)*
        #mut_doc
        #[inline]
        #(#deprecated)*
        #inner_vis const fn #mut_accessor<#borrow>(
            &#borrow mut self,
            #capability: &#borrow impl #trait_name,
        ) -> &#borrow mut #ty {
            &mut self.#ident
        }
    }
}

/// Whether a type is `Copy` judging by its syntax alone: primitives, shared references, raw
/// pointers, and tuples, arrays and `Option`s of those. Anything else is read by reference
/// unless the field says `read = copy`.
fn is_copy_by_syntax(ty: &Type) -> bool {
    const PRIMITIVES: &[&str] = &[
        "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32", "i64", "i128", "isize",
        "f32", "f64", "bool", "char",
    ];
    match ty {
        Type::Reference(reference) => reference.mutability.is_none(),
        Type::Ptr(_) => true,
        Type::Paren(inner) => is_copy_by_syntax(&inner.elem),
        Type::Group(inner) => is_copy_by_syntax(&inner.elem),
        Type::Tuple(tuple) => tuple.elems.iter().all(is_copy_by_syntax),
        Type::Array(array) => is_copy_by_syntax(&array.elem),
        Type::Path(path) if path.qself.is_none() && path.path.segments.len() == 1 => {
            let segment = &path.path.segments[0];
            let name = segment.ident.to_string();
            match &segment.arguments {
                syn::PathArguments::None => PRIMITIVES.contains(&name.as_str()),
                syn::PathArguments::AngleBracketed(args) if name == "Option" => {
                    args.args.len() == 1
                        && matches!(&args.args[0], syn::GenericArgument::Type(t) if is_copy_by_syntax(t))
                }
                _ => false,
            }
        }
        _ => false,
    }
}

/// One owned field's entry in its struct's registration: name, line and its owners' sites.
fn registered_field(
    private: &TokenStream,
    field: &FieldModel,
    ownership: &Ownership,
) -> TokenStream {
    let cfg = &field.cfg_attrs;
    // Unrawed, as the owner's write count records it (`set_type` writes `type`).
    let name = field.ident.unraw().to_string();
    // Each owner's site, spanned on its entry like the owner trait's impl for it, so an entry
    // that is no type is reported once, there; a type that is no owner is reported here only.
    let sites = distinct_owners(ownership).map(|owner| {
        let token = path_from_child(&token_path(owner));
        quote_spanned!(owner.span()=> <#token as #private::OwnerToken>::SITE)
    });
    let line = quote_spanned!(field.ident.span()=> ::core::line!());
    quote! {
        #(#cfg)*
        #private::GuardedField::new(#name, #line, &[#(#sites),*])
    }
}

/// Registers the struct and its owned fields in the audit register: one static per struct.
fn registration(private: &TokenStream, struct_name: &Ident, fields: &[TokenStream]) -> TokenStream {
    let name = struct_name.unraw().to_string();
    quote! {
        #private::inventory::submit! {
            #private::GuardedStruct::new(
                #name,
                ::core::module_path!(),
                ::core::file!(),
                &[#(#fields),*],
            )
        }
    }
}

/// The init struct: the same fields, with the visibility they were written with, so that it is
/// nameable exactly where a struct literal was legal; for construction
/// (`Name::from(NameInit { .. })`) and `..Default::default()` updates.
fn init_struct(
    model: &GuardedStruct,
    generics: &Generics,
    fields: &[SealedField<'_>],
    from_is_a_getter: bool,
) -> TokenStream {
    let name = &model.item.ident;
    let init = &model.init_name;
    let vis = &model.item.vis;
    let derives = mirrored_derives(&model.item.attrs);
    let derive = (!derives.is_empty()).then(|| quote!(#[derive(#(#derives),*)]));
    let where_clause = &generics.where_clause;
    let construction = if from_is_a_getter {
        format!("`{init} {{ .. }}.into()` (`{name}::from` is the getter of the owned field `from`)")
    } else {
        format!("`{name}::from({init} {{ .. }})`")
    };
    let doc = format!(
        "The fields of [`{name}`], for building one: {construction}. \
         Generated by `#[kvown::guarded]`: a struct literal of `{name}` itself does not compile."
    );
    let rows = fields.iter().map(|field| {
        let ident = &field.model.ident;
        let ty = &field.ty;
        let cfg = &field.model.cfg_attrs;
        let allows = &field.model.lint_allows;
        let docs = &field.model.doc_attrs;
        let vis = &field.model.vis;
        quote!(#(#cfg)* #(#allows)* #(#docs)* #vis #ident: #ty,)
    });
    let struct_allows = &model.lint_allows;
    quote! {
        #[doc = #doc]
        #derive
        // `unused_braces`: a field type's braces were linted on the struct itself already; with
        // `Self` replaced, rustc would lint this copy again. What the user silenced on the struct
        // stays silent in this copy of its field types.
        #[allow(dead_code, unused_braces, deprecated)]
        #(#struct_allows)*
        #vis struct #init #generics #where_clause { #(#rows)* }
    }
}

/// The split-borrow view returned by `fields_mut`: owned fields as visible as the struct, the
/// others as they were written.
fn view_struct(
    model: &GuardedStruct,
    view_generics: &Generics,
    fields: &[SealedField<'_>],
    borrow: &Lifetime,
) -> TokenStream {
    let view = format_ident!("{}FieldsMut", model.item.ident);
    let vis = &model.item.vis;
    let where_clause = &view_generics.where_clause;
    let rows = fields.iter().map(|field| {
        let ident = &field.model.ident;
        let ty = &field.ty;
        let cfg = &field.model.cfg_attrs;
        let allows = &field.model.lint_allows;
        let docs = &field.model.doc_attrs;
        if field.model.ownership.is_some() {
            quote!(#(#cfg)* #(#allows)* #(#docs)* #vis #ident: &#borrow #ty,)
        } else {
            let field_vis = &field.model.vis;
            quote!(#(#cfg)* #(#allows)* #(#docs)* #field_vis #ident: &#borrow mut #ty,)
        }
    });
    let struct_allows = &model.lint_allows;
    quote! {
        /// Every field borrowed at once: owned fields shared, the others mutable.
        #[allow(dead_code, unused_braces, deprecated)]
        #(#struct_allows)*
        #vis struct #view #view_generics #where_clause { #(#rows)* }
    }
}

/// The type parameters declared `?Sized` (in their bounds or in the where-clause).
fn maybe_sized_params(generics: &Generics) -> Vec<&Ident> {
    let relaxed = |bounds: &Punctuated<TypeParamBound, Token![+]>| {
        bounds.iter().any(|bound| {
            matches!(bound, TypeParamBound::Trait(t) if matches!(t.modifier, TraitBoundModifier::Maybe(_)))
        })
    };
    let relaxed_in_where = |ident: &Ident| {
        let predicates = generics
            .where_clause
            .iter()
            .flat_map(|clause| &clause.predicates);
        predicates.into_iter().any(|predicate| {
            matches!(predicate, WherePredicate::Type(t)
                if matches!(&t.bounded_ty, Type::Path(p) if p.qself.is_none() && p.path.is_ident(ident))
                    && relaxed(&t.bounds))
        })
    };
    generics
        .type_params()
        .filter(|param| relaxed(&param.bounds) || relaxed_in_where(&param.ident))
        .map(|param| &param.ident)
        .collect()
}

/// The struct's generics with the view lifetime `borrow` first.
fn with_view_lifetime(generics: &Generics, borrow: &Lifetime) -> Generics {
    let mut generics = generics.clone();
    generics.params.insert(
        0,
        GenericParam::Lifetime(LifetimeParam::new(borrow.clone())),
    );
    generics
}

/// The lifetime of the borrows the view and the `_mut` accessors hand out: `'kvown`, with `_`s
/// added until no lifetime named in the struct (a parameter, or a higher-ranked one in a field
/// type) has that name, which it would clash with (E0403) or shadow (E0496).
fn borrow_lifetime(item: &syn::ItemStruct) -> Lifetime {
    struct Names(Vec<String>);
    impl<'ast> syn::visit::Visit<'ast> for Names {
        fn visit_lifetime(&mut self, lifetime: &'ast Lifetime) {
            self.0.push(lifetime.ident.to_string());
        }
    }
    let mut names = Names(Vec::new());
    syn::visit::Visit::visit_item_struct(&mut names, item);
    let mut name = "kvown".to_string();
    while names.0.contains(&name) {
        name.push('_');
    }
    Lifetime::new(&format!("'{name}"), proc_macro2::Span::call_site())
}

/// The std derives of the struct that the init struct mirrors.
fn mirrored_derives(attrs: &[Attribute]) -> Vec<Ident> {
    let mut found = Vec::new();
    for attr in attrs.iter().filter(|a| a.path().is_ident("derive")) {
        let _ = attr.parse_nested_meta(|meta| {
            if let Some(last) = meta.path.segments.last()
                && MIRRORED_DERIVES.contains(&last.ident.to_string().as_str())
            {
                found.push(last.ident.clone());
            }
            Ok(())
        });
    }
    found
}

#[cfg(test)]
mod tests {
    use quote::ToTokens;
    use syn::parse_quote;

    use super::*;

    #[test]
    fn copy_is_judged_by_syntax_alone() {
        let copy: [Type; 9] = [
            parse_quote!(usize),
            parse_quote!(&str),
            parse_quote!(*const u8),
            parse_quote!((u32)),
            parse_quote!((u32, bool)),
            parse_quote!([u8; 4]),
            parse_quote!(Option<u32>),
            parse_quote!(Option<(char, &[u8])>),
            Type::Group(syn::TypeGroup {
                group_token: Default::default(),
                elem: Box::new(parse_quote!(u64)),
            }),
        ];
        for ty in &copy {
            assert!(is_copy_by_syntax(ty), "{}", ty.to_token_stream());
        }
        let by_reference: [Type; 8] = [
            parse_quote!(String),
            parse_quote!(&mut u32),
            parse_quote!((u32, String)),
            parse_quote!([String; 2]),
            parse_quote!(Option<String>),
            parse_quote!(Vec<u32>),
            // A path that only starts with a primitive's name, and a qualified one.
            parse_quote!(u32::Assoc),
            parse_quote!(<u32 as Tr>::Assoc),
        ];
        for ty in &by_reference {
            assert!(!is_copy_by_syntax(ty), "{}", ty.to_token_stream());
        }
    }

    #[test]
    fn self_in_field_types_becomes_the_struct_type() {
        let node: Type = parse_quote!(Node<T>);
        for (written, copied) in [
            (quote::quote!(Self), "Node<T>"),
            (quote::quote!(Vec<Self>), "Vec<Node<T>>"),
            (quote::quote!(Option<Box<Self>>), "Option<Box<Node<T>>>"),
            (quote::quote!([Self; 2]), "[Node<T>;2]"),
            (quote::quote!(<Self as Tr>::Out), "<Node<T>asTr>::Out"),
            (quote::quote!([u8; Self::N]), "[u8;<Node<T>>::N]"),
            (
                quote::quote!([u8; { Self::N + 1 }]),
                "[u8;{<Node<T>>::N+1}]",
            ),
            (quote::quote!(Self::Assoc), "<Node<T>>::Assoc"),
            (quote::quote!(Vec<u32>), "Vec<u32>"),
        ] {
            let mut ty: Type = syn::parse2(written.clone()).unwrap();
            SelfToStruct(&node).visit_type_mut(&mut ty);
            assert_eq!(ty.to_token_stream().to_string().replace(' ', ""), copied);
        }
    }

    #[test]
    fn the_init_struct_documents_a_construction_that_compiles() {
        let init_doc = |input: TokenStream| {
            let expanded = crate::guarded::expand(TokenStream::new(), input).to_string();
            let start = expanded
                .find("The fields of")
                .expect("the init struct's doc");
            let end = start
                + expanded[start..]
                    .find(". Generated")
                    .expect("end of the sentence");
            expanded[start..end].to_string()
        };
        let plain = init_doc(quote::quote!(
            struct Span {
                #[owned_by(f)]
                to: usize,
            }
        ));
        assert_eq!(
            plain,
            "The fields of [`Span`], for building one: `Span::from(SpanInit { .. })`"
        );
        // `Span::from` names the getter of an owned `from`; an unowned `from` has no getter.
        let owned = init_doc(quote::quote!(
            struct Span {
                #[owned_by(f)]
                from: usize,
            }
        ));
        assert_eq!(
            owned,
            "The fields of [`Span`], for building one: `SpanInit { .. }.into()` \
             (`Span::from` is the getter of the owned field `from`)"
        );
        let unowned = init_doc(quote::quote!(
            struct Span {
                #[owned_by(f)]
                to: usize,
                from: usize,
            }
        ));
        assert_eq!(unowned, plain);
    }

    /// The top-level items of `tokens`, as `cfg(..) kind name` (`-` for an item without a
    /// `cfg`).
    fn items(tokens: TokenStream) -> Vec<String> {
        let expanded: syn::File = syn::parse2(tokens).unwrap();
        expanded
            .items
            .iter()
            .filter_map(|item| {
                let (attrs, kind, name) = match item {
                    syn::Item::Struct(s) => (&s.attrs, "struct", s.ident.to_string()),
                    syn::Item::Trait(t) => (&t.attrs, "trait", t.ident.to_string()),
                    syn::Item::Mod(m) => (&m.attrs, "mod", m.ident.to_string()),
                    syn::Item::Use(u) => (&u.attrs, "use", String::new()),
                    syn::Item::Impl(i) => (&i.attrs, "impl", String::new()),
                    syn::Item::Macro(m) => (
                        &m.attrs,
                        "macro",
                        m.mac.path.to_token_stream().to_string().replace(' ', ""),
                    ),
                    _ => return None,
                };
                let gate = attrs
                    .iter()
                    .map(|a| a.meta.to_token_stream().to_string().replace(' ', ""))
                    .find(|meta| meta.starts_with("cfg("))
                    .unwrap_or_else(|| "-".to_string());
                Some(format!("{gate} {kind} {name}").trim().to_string())
            })
            .collect()
    }

    #[test]
    fn rustdoc_sees_the_items_in_place_and_the_compiler_sees_them_sealed() {
        let input = quote::quote!(
            struct Span {
                #[owned_by(f)]
                to: usize,
            }
        );
        assert_eq!(
            items(crate::guarded::expand(
                quote::quote!(init = Parts),
                input.clone()
            )),
            [
                "cfg(not(doc)) mod sealed_Span",
                "cfg(not(doc)) use",
                "- struct Parts",
                "- struct SpanFieldsMut",
                "cfg(doc) macro ::kvown::__private::guarded_documented",
            ]
        );
        // What rustdoc expands that call to: the struct, its impls and owner traits in place.
        assert_eq!(
            items(crate::guarded::expand_documented(
                quote::quote!((init = Parts) #input)
            )),
            [
                "- mod sealed_Span",
                "- struct Span",
                "- impl",
                "- impl",
                "- trait SpanToOwner",
                "- impl",
                "- impl",
            ]
        );
    }

    #[test]
    fn the_borrow_lifetime_avoids_every_lifetime_of_the_struct() {
        let plain: syn::ItemStruct = parse_quote!(
            struct S<'a> {
                x: &'a u8,
            }
        );
        assert_eq!(borrow_lifetime(&plain).to_string(), "'kvown");
        let taken: syn::ItemStruct = parse_quote!(
            struct S<'kvown> {
                x: &'kvown u8,
                f: for<'kvown_> fn(&'kvown_ u8),
            }
        );
        assert_eq!(borrow_lifetime(&taken).to_string(), "'kvown__");
    }

    #[test]
    fn owner_tokens_are_found_from_the_hidden_module() {
        for (owner, token) in [
            (quote::quote!(alloc), "super::alloc"),
            (quote::quote!(sched::retract), "super::sched::retract"),
            (quote::quote!(Batch::retract), "super::Batch_retract"),
            (
                quote::quote!(sched::Batch::retract),
                "super::sched::Batch_retract",
            ),
            (quote::quote!(a::b::Req::r#move), "super::a::b::Req_move"),
            (quote::quote!(crate::a::Batch::go), "crate::a::Batch_go"),
        ] {
            let path: Path = syn::parse2(owner.clone()).unwrap();
            let found = path_from_child(&token_path(&path))
                .to_token_stream()
                .to_string();
            assert_eq!(found.replace(' ', ""), token, "{owner}");
        }
    }
}
