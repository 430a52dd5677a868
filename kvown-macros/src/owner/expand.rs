//! Code generation for owners: the sealed module, the capability token (which carries the
//! owner's audit site) and the body prologue.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::visit_mut::VisitMut;
use syn::{Attribute, Block, Ident, ImplItemFn, ItemFn, ItemImpl, Visibility};

use super::count::count_writes;
use super::parse::OwnerOptions;
use crate::method_token::token_name;
use crate::seal::{DeeperPaths, widen_one_level};

/// Everything that names one owner.
pub(crate) struct OwnerPlan {
    support: TokenStream,
    binding: Ident,
    /// The name the capability token is re-exported under in the owner's module: the function's
    /// name, or `Type_method` (what `#[owned_by(..)]` entries resolve to).
    token: Ident,
    /// The name the token type is defined under in the hidden module, which rustc prints: the
    /// function's or the method's name (`Type_method` for a method named like a primitive type,
    /// which the token would shadow in the method's body).
    defined: Ident,
    /// Whether the owner is a method (`Type::method`), not a free function.
    is_method: bool,
    /// The hidden module the owner moves into.
    module: Ident,
    /// `f` or `Type::method`, as the audit register shows it.
    site_name: String,
    /// The owner's visibility as written.
    vis: Visibility,
    /// `#[cfg]` attributes (and `#[cfg_attr]`s reduced to the `cfg`s they carry), repeated on
    /// the module and the re-export.
    cfg_attrs: Vec<Attribute>,
    /// Whether the body gets the capability binding (not when a parameter already has its name).
    binds: bool,
}

impl OwnerPlan {
    pub(crate) fn free_fn(options: &OwnerOptions, item: &ItemFn, binds: bool) -> Self {
        let name = &item.sig.ident;
        OwnerPlan {
            support: options.support.clone(),
            binding: options.binding.clone(),
            token: name.clone(),
            defined: name.clone(),
            is_method: false,
            module: format_ident!("sealed_fn_{}", name),
            site_name: name.unraw().to_string(),
            vis: item.vis.clone(),
            cfg_attrs: cfg_attrs(&item.attrs),
            binds,
        }
    }

    pub(crate) fn method(
        options: &OwnerOptions,
        type_name: &Ident,
        method: &ImplItemFn,
        binds: bool,
    ) -> Self {
        let name = &method.sig.ident;
        OwnerPlan {
            support: options.support.clone(),
            binding: options.binding.clone(),
            token: token_name(type_name, name),
            defined: if super::primitive_type_name(name).is_some() {
                token_name(type_name, name)
            } else {
                name.clone()
            },
            is_method: true,
            module: format_ident!("sealed_fn_{}_{}", type_name, name),
            site_name: format!("{}::{}", type_name.unraw(), name.unraw()),
            vis: method.vis.clone(),
            cfg_attrs: cfg_attrs(&method.attrs),
            binds,
        }
    }
}

fn cfg_attrs(attrs: &[Attribute]) -> Vec<Attribute> {
    crate::cfg_attr::cfg_conditions(attrs)
}

/// `#[owner] fn f` -> a hidden module holding the token `f` and the function, re-exported (what
/// the compiler builds), and a call of `owner_documented!`, which rustdoc alone expands
/// (`cfg(doc)`) into the function where it is written, so that it is documented as its module's
/// own item, private or not (rustdoc inlines a re-export only on a public path). `args` and
/// `input` are the attribute's arguments and the function as written.
pub(crate) fn free_fn(
    plan: &OwnerPlan,
    item: ItemFn,
    args: &TokenStream,
    input: &TokenStream,
) -> TokenStream {
    let compiled = free_fn_sealed(plan, item);
    let support = &plan.support;
    quote! {
        #compiled
        #[cfg(doc)]
        #support::__private::owner_documented! { (#args) #input }
    }
}

/// The documented form of a free owner: the function in place, its token in the hidden module
/// (buildable from the function there: nothing is compiled from this form).
pub(crate) fn free_fn_in_place(plan: &OwnerPlan, mut item: ItemFn) -> TokenStream {
    let OwnerPlan {
        support,
        defined,
        module,
        vis,
        cfg_attrs,
        ..
    } = plan;
    let token_export_vis = crate_at_most(vis);
    let site = site(plan, &item.block, item.sig.ident.span());
    prepend_prologue(
        plan,
        quote!(#module::capability_of::#defined),
        &mut item.block,
    );
    quote! {
        #(#cfg_attrs)*
        #[doc(hidden)]
        #[allow(non_snake_case)]
        mod #module {
            pub mod capability_of {
                #[doc(hidden)]
                #[allow(non_camel_case_types)]
                pub struct #defined {
                    pub _seal: #support::__private::OwnerSeal,
                }

                impl #support::__private::OwnerToken for #defined {
                    const SITE: &'static #support::__private::OwnerSite = #site;
                }
            }
        }

        #(#cfg_attrs)*
        #[doc(hidden)]
        #[allow(unused_imports)]
        #token_export_vis use self::#module::capability_of::#defined;

        #item
    }
}

fn free_fn_sealed(plan: &OwnerPlan, mut item: ItemFn) -> TokenStream {
    let site = site(plan, &item.block, item.sig.ident.span());
    DeeperPaths::default().visit_signature_mut(&mut item.sig);
    DeeperPaths::default().visit_block_mut(&mut item.block);
    item.vis = widen_one_level(&item.vis);
    prepend_prologue(plan, plan.defined.to_token_stream(), &mut item.block);
    wrap(plan, quote!(#item), site)
}

/// `#[owner] fn method` of `#[owners] impl Type` -> a hidden module holding the token (named
/// `method` there) and an inherent impl with the method, the token re-exported as `Type_method`.
pub(crate) fn method(plan: &OwnerPlan, block: &ItemImpl, mut method: ImplItemFn) -> TokenStream {
    let site = site(plan, &method.block, method.sig.ident.span());
    DeeperPaths::default().visit_signature_mut(&mut method.sig);
    DeeperPaths::default().visit_block_mut(&mut method.block);
    method.vis = widen_one_level(&method.vis);
    prepend_prologue(plan, plan.defined.to_token_stream(), &mut method.block);
    let mut generics = block.generics.clone();
    DeeperPaths::default().visit_generics_mut(&mut generics);
    let mut self_ty = (*block.self_ty).clone();
    DeeperPaths::default().visit_type_mut(&mut self_ty);
    let (impl_generics, _, where_clause) = generics.split_for_impl();
    let attrs = &block.attrs;
    let unsafety = &block.unsafety;
    let impl_block = quote! {
        #(#attrs)*
        #unsafety impl #impl_generics #self_ty #where_clause {
            #method
        }
    };
    wrap(plan, impl_block, site)
}

/// The hidden module around an owner, and the re-export of its items; `site` is the owner's
/// audit site, which its token carries. Compiled only (`cfg(not(doc))`) for a free function,
/// whose documented form is [`free_fn_in_place`]; a method has one form.
fn wrap(plan: &OwnerPlan, owner_item: TokenStream, site: TokenStream) -> TokenStream {
    let OwnerPlan {
        support,
        token,
        defined,
        module,
        vis,
        cfg_attrs,
        ..
    } = plan;
    // Never beyond the crate: owners live in the struct's crate, so only that crate names tokens,
    // and a glob import of a library's module does not bring them into another crate.
    let token_export_vis = crate_at_most(vis);
    let token_vis = crate_at_most(&widen_one_level(vis));
    let binding_placeholder = binding_placeholder(plan);
    let compiled_only = (!plan.is_method).then(|| quote!(#[cfg(not(doc))]));
    // The token's field is private to the owner's hidden module: only the owner's body, there,
    // builds a token.
    let token_struct = quote! {
        #[allow(non_camel_case_types)]
        #token_vis struct #defined {
            _seal: #support::__private::OwnerSeal,
        }

        #[diagnostic::do_not_recommend]
        impl #support::__private::OwnerToken for #defined {
            const SITE: &'static #support::__private::OwnerSite = #site;
        }
    };
    // A free function's token shares its name (types and functions live in different
    // namespaces), so one re-export brings both; the token's own visibility keeps it inside the
    // crate. A method's token is defined under the method's name (what rustc prints) and
    // re-exported as `Type_method` (what `#[owned_by(Type::method)]` finds); a method has no
    // documented form of its own, so its token is hidden from rustdoc.
    let (token_def, exports) = if !plan.is_method {
        (
            token_struct,
            quote! {
                #compiled_only
                #(#cfg_attrs)*
                // Moving a `#[deprecated]` function out of its hidden module is not a use of it.
                #[allow(unused_imports, deprecated)]
                #vis use self::#module::#defined;
            },
        )
    } else {
        (
            quote! {
                #[doc(hidden)]
                #token_struct
            },
            // `as`, also where the names agree (a method named like a primitive type).
            quote! {
                #(#cfg_attrs)*
                #[doc(hidden)]
                #[allow(unused_imports)]
                #token_export_vis use self::#module::#defined as #token;
            },
        )
    };
    quote! {
        #compiled_only
        #(#cfg_attrs)*
        #[doc(hidden)]
        #[allow(non_snake_case)]
        mod #module {
            #[allow(unused_imports)]
            use super::*;
            #binding_placeholder

            #token_def

            #owner_item
        }

        #exports
    }
}

/// The visibility of a token's re-export: the owner's, but never beyond the crate. Owners live
/// in the struct's crate, so only that crate names tokens; capped, a glob import of a library's
/// module (`use kvown::batch::*`) does not bring them into another crate.
fn crate_at_most(vis: &Visibility) -> Visibility {
    match vis {
        Visibility::Public(_) => syn::parse_quote!(pub(crate)),
        other => other.clone(),
    }
}

/// A function named like the capability binding, in the owner's hidden module, when the body
/// gets the binding. It shadows what `use super::*` would bring in under that name in the value
/// namespace: a `const owner`, a `static owner` or a unit `struct owner` there would turn
/// `let owner = ..` into a pattern that matches the constant (or refuses to shadow it), while a
/// function never does. Not needed (and it would clash) when the owner function has that name.
/// It is an import of `core::convert::identity`, not a function defined here, so that rustc does
/// not list one inaccessible `owner` per owner of the crate when a plain function names `owner`.
fn binding_placeholder(plan: &OwnerPlan) -> Option<TokenStream> {
    let OwnerPlan {
        binding,
        token,
        binds,
        ..
    } = plan;
    (*binds && binding.unraw() != token.unraw()).then(|| {
        quote! {
            #[allow(unused_imports)]
            use ::core::convert::identity as #binding;
        }
    })
}

/// Binds the capability at the top of the body. The token itself lives in a hygienic local
/// that user code cannot name; the body sees only the borrow.
///
/// The binding is made once with the attribute's hygiene and once more for each mention of its
/// name in the body: a body that a `macro_rules!` pastes in from its caller (`fn $name() $body`)
/// names `owner` with the caller's hygiene, which a binding spanned on the attribute (written
/// in the macro) does not reach. Only tokens written in the body carry those spans. Each binding
/// is made from the one before, so that only the last can go unused.
fn prepend_prologue(plan: &OwnerPlan, token: TokenStream, block: &mut Block) {
    if !plan.binds {
        return;
    }
    let OwnerPlan {
        support, binding, ..
    } = plan;
    let capability = Ident::new("__kvown_capability", Span::mixed_site());
    let mut bindings = vec![binding.clone()];
    bindings.extend(mentions(block.to_token_stream(), binding));
    let mut prologue =
        quote!(let #capability = #token { _seal: #support::__private::OwnerSeal::new() };);
    let mut previous = quote!(&#capability);
    let last = bindings.len() - 1;
    for (index, binding) in bindings.iter().enumerate() {
        let allow = (index == last).then(|| quote!(#[allow(unused_variables)]));
        prologue.extend(quote!(#allow let #binding = #previous;));
        previous = quote!(#binding);
    }
    let prologue: Block = syn::parse_quote!({ #prologue });
    let mut stmts = prologue.stmts;
    stmts.append(&mut block.stmts);
    block.stmts = stmts;
}

/// The owner's audit site, with the syntactic write count of its body: what its token's
/// `OwnerToken::SITE` is, and what each `#[guarded]` struct that lists the owner registers.
fn site(plan: &OwnerPlan, body: &Block, name_span: Span) -> TokenStream {
    let support = &plan.support;
    let count = count_writes(body, &plan.binding);
    let fields = count.per_field.keys();
    let counts = count.per_field.values();
    let delegations = count.delegations;
    let site_name = &plan.site_name;
    let line = quote_spanned!(name_span=> ::core::line!());
    quote! {
        &#support::__private::OwnerSite::new(
            #site_name,
            ::core::module_path!(),
            ::core::file!(),
            #line,
            &[#(#support::__private::FieldWrites::new(#fields, #counts)),*],
            #delegations,
        )
    }
}

/// The binding's name as each bare mention of it in `tokens` spells it (with that mention's span
/// and hygiene). A name after `.`, `::` or `$` is a field, a path segment or a metavariable.
fn mentions(tokens: TokenStream, binding: &Ident) -> Vec<Ident> {
    let mut found = Vec::new();
    let mut after_punct = None;
    for tree in tokens {
        match &tree {
            TokenTree::Group(group) => found.extend(mentions(group.stream(), binding)),
            TokenTree::Ident(ident)
                if ident.unraw() == binding.unraw()
                    && !matches!(after_punct, Some('.' | ':' | '$')) =>
            {
                let mut named = binding.clone();
                named.set_span(ident.span());
                found.push(named);
            }
            _ => {}
        }
        after_punct = match &tree {
            TokenTree::Punct(punct) => Some(punct.as_char()),
            _ => None,
        };
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The functions in the hidden module of `#[owner(args)] input`, imported ones included.
    fn module_fns(args: TokenStream, input: TokenStream) -> Vec<String> {
        let expanded: syn::File = syn::parse2(crate::owner::expand_fn(args, input))
            .expect("the expansion is a list of items");
        let module = expanded
            .items
            .iter()
            .find_map(|item| match item {
                syn::Item::Mod(module) => module.content.as_ref(),
                _ => None,
            })
            .expect("the owner's hidden module");
        /// The names a use tree imports under a new name.
        fn renames(tree: &syn::UseTree, found: &mut Vec<String>) {
            match tree {
                syn::UseTree::Path(path) => renames(&path.tree, found),
                syn::UseTree::Group(group) => group.items.iter().for_each(|t| renames(t, found)),
                syn::UseTree::Rename(rename) => found.push(rename.rename.to_string()),
                _ => {}
            }
        }
        let mut found = Vec::new();
        for item in &module.1 {
            match item {
                syn::Item::Fn(function) => found.push(function.sig.ident.to_string()),
                syn::Item::Use(import) => renames(&import.tree, &mut found),
                _ => {}
            }
        }
        found
    }

    #[test]
    fn a_placeholder_fn_takes_the_binding_name_unless_the_owner_has_it() {
        let grow = quote!(
            fn grow(r: &mut Req) {
                r.set_len(owner, 1);
            }
        );
        assert_eq!(module_fns(quote!(), grow.clone()), ["owner", "grow"]);
        assert_eq!(
            module_fns(quote!(token = cap), grow.clone()),
            ["cap", "grow"]
        );
        // A second `fn grow` would clash with the owner; the local binding shadows the owner.
        assert_eq!(module_fns(quote!(token = grow), grow), ["grow"]);
    }

    #[test]
    fn rustdoc_sees_a_free_owner_in_place_and_the_compiler_sees_it_sealed() {
        let grow = quote!(
            fn grow(r: &mut Req) {
                r.set_len(owner, 1);
            }
        );
        // `cfg(..) kind name` of each top-level item (`-` without a `cfg`).
        let items = |tokens: TokenStream| -> Vec<String> {
            let expanded: syn::File = syn::parse2(tokens).unwrap();
            expanded
                .items
                .iter()
                .filter_map(|item| {
                    let (attrs, name) = match item {
                        syn::Item::Fn(f) => (&f.attrs, format!("fn {}", f.sig.ident)),
                        syn::Item::Mod(m) => (&m.attrs, format!("mod {}", m.ident)),
                        syn::Item::Use(u) => (&u.attrs, "use".to_string()),
                        syn::Item::Macro(m) => (
                            &m.attrs,
                            format!(
                                "macro {}",
                                m.mac.path.to_token_stream().to_string().replace(' ', "")
                            ),
                        ),
                        _ => return None,
                    };
                    let gate = attrs
                        .iter()
                        .map(|a| a.meta.to_token_stream().to_string().replace(' ', ""))
                        .find(|meta| meta.starts_with("cfg("))
                        .unwrap_or_else(|| "-".to_string());
                    Some(format!("{gate} {name}"))
                })
                .collect()
        };
        assert_eq!(
            items(crate::owner::expand_fn(quote!(), grow.clone())),
            [
                "cfg(not(doc)) mod sealed_fn_grow",
                "cfg(not(doc)) use",
                "cfg(doc) macro ::kvown::__private::owner_documented"
            ]
        );
        assert_eq!(
            items(crate::owner::expand_fn_documented(quote!(() #grow))),
            ["- mod sealed_fn_grow", "- use", "- fn grow"]
        );
    }

    #[test]
    fn only_bare_mentions_of_the_binding_get_a_binding() {
        let binding = Ident::new("owner", Span::call_site());
        let body = quote!({
            r.set_len(owner, 1);
            check!(r.owner, a::owner, $owner, (r#owner));
            owners(owner2);
        });
        assert_eq!(mentions(body, &binding).len(), 2);
    }
}
