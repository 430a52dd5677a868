//! `#[owner]` on free functions and `#[owners]` on inherent impl blocks: parse -> validate ->
//! expand. Each owner moves, with its capability token, into its own hidden child module, so
//! only its body can build the token.

mod count;
mod expand;
mod parse;

use proc_macro2::TokenStream;
use quote::{ToTokens, quote};
use syn::ext::IdentExt;
use syn::{FnArg, ImplItem, ItemFn, ItemImpl, Signature};

use crate::cfg_attr::hides_attribute;
use crate::diag::Diagnostics;
use crate::method_token::is_type_name;
use expand::OwnerPlan;

/// Expands `#[owner]` on a free function.
pub(crate) fn expand_fn(args: TokenStream, input: TokenStream) -> TokenStream {
    let mut diagnostics = Diagnostics::new();
    let options = parse::owner_options(args.clone(), &mut diagnostics);
    let item: ItemFn = match syn::parse2(input.clone()) {
        Ok(item) => item,
        Err(_) => {
            diagnostics.push(syn::Error::new(
                proc_macro2::Span::call_site(),
                "#[kvown::owner] applies to a function with a body; for methods put \
                 #[kvown::owners] on the inherent impl block and #[owner] on the method",
            ));
            let errors = diagnostics.into_compile_errors();
            return quote!(#errors #input);
        }
    };
    if let Some(receiver) = item.sig.receiver() {
        diagnostics.error_at(
            receiver,
            "#[owner] on a method needs #[kvown::owners] on its impl block, which must be \
             inherent: a trait method cannot be an owner, since any code can reach it through \
             the trait",
        );
        let errors = diagnostics.into_compile_errors();
        return quote!(#errors #item);
    }
    if is_type_name(&item.sig.ident) {
        diagnostics.error_at(
            &item.sig.ident,
            format!(
                "#[owner] function `{}` needs a snake_case name: kvown finds a method owner \
                 `Type::method` by a name that starts with the type's, so a function named with \
                 an upper-case letter could pass for one",
                item.sig.ident
            ),
        );
    }
    if let Some(primitive) = primitive_type_name(&item.sig.ident) {
        diagnostics.error_at(
            &item.sig.ident,
            format!(
                "#[owner] function `{primitive}` would define its capability token, a type named \
                 `{primitive}`, in its module, where it would shadow the primitive type \
                 `{primitive}`; rename the function"
            ),
        );
    }
    let binds = check_binding_is_free(&item.sig, &options.binding, &mut diagnostics);
    let plan = OwnerPlan::free_fn(&options, &item, binds);
    let expansion = expand::free_fn(&plan, item, &args, &input);
    let errors = diagnostics.into_compile_errors();
    quote!(#errors #expansion)
}

/// `owner_documented! { (args) fn .. }`: the documented form of an `#[owner]` function, which
/// `#[owner]` leaves to rustdoc (behind `cfg(doc)`). Its errors were reported by `#[owner]`; a
/// function that does not parse is emitted as written.
pub(crate) fn expand_fn_documented(input: TokenStream) -> TokenStream {
    let mut tokens = input.into_iter();
    let args = match tokens.next() {
        Some(proc_macro2::TokenTree::Group(group))
            if group.delimiter() == proc_macro2::Delimiter::Parenthesis =>
        {
            group.stream()
        }
        _ => return TokenStream::new(),
    };
    let rest: TokenStream = tokens.collect();
    let mut diagnostics = Diagnostics::new();
    let options = parse::owner_options(args, &mut diagnostics);
    let documented = match syn::parse2::<ItemFn>(rest.clone()) {
        Ok(item) => {
            let binds = check_binding_is_free(&item.sig, &options.binding, &mut diagnostics);
            let plan = OwnerPlan::free_fn(&options, &item, binds);
            expand::free_fn_in_place(&plan, item)
        }
        Err(_) => rest,
    };
    // Reported by `#[owner]` already, in the same build.
    drop(diagnostics.into_compile_errors());
    documented
}

/// Expands `#[owners]` on an inherent impl block.
pub(crate) fn expand_impl(args: TokenStream, input: TokenStream) -> TokenStream {
    let mut diagnostics = Diagnostics::new();
    let support = parse::owners_options(args, &mut diagnostics);
    let mut item: ItemImpl = match syn::parse2(input.clone()) {
        Ok(item) => item,
        Err(_) => {
            diagnostics.push(syn::Error::new(
                proc_macro2::Span::call_site(),
                "#[kvown::owners] applies to an inherent impl block",
            ));
            let errors = diagnostics.into_compile_errors();
            return quote!(#errors #input);
        }
    };
    if let Some((_, path, _)) = &item.trait_ {
        diagnostics.error_at(
            path,
            "#[kvown::owners] applies to inherent impl blocks only: a trait method cannot be an \
             owner, since any code can reach it through the trait",
        );
        strip_owner_attrs(&mut item);
        let errors = diagnostics.into_compile_errors();
        return quote!(#errors #item);
    }
    let type_name = match parse::self_type_name(&item.self_ty) {
        Ok(type_name) => type_name,
        Err(error) => {
            diagnostics.push(error);
            strip_owner_attrs(&mut item);
            let errors = diagnostics.into_compile_errors();
            return quote!(#errors #item);
        }
    };

    let mut owner_methods = Vec::new();
    let mut kept = Vec::new();
    for impl_item in std::mem::take(&mut item.items) {
        match impl_item {
            ImplItem::Fn(mut method) => match parse::take_owner_attr(&mut method.attrs) {
                Some(attr) => {
                    let options = parse::method_options(&attr, &support, &mut diagnostics);
                    let binds =
                        check_binding_is_free(&method.sig, &options.binding, &mut diagnostics);
                    owner_methods.push((options, method, binds));
                }
                None => {
                    refuse_owner_in_cfg_attr(&mut method.attrs, &mut diagnostics);
                    kept.push(ImplItem::Fn(method));
                }
            },
            other => kept.push(other),
        }
    }
    if owner_methods.is_empty() {
        diagnostics.error_at(
            &item.self_ty,
            "#[kvown::owners] found no #[owner] method in this impl block",
        );
    }
    let mut output = TokenStream::new();
    for (options, method, binds) in owner_methods {
        let plan = OwnerPlan::method(&options, &type_name, &method, binds);
        output.extend(expand::method(&plan, &item, method));
    }
    if !kept.is_empty() {
        item.items = kept;
        item.to_tokens(&mut output);
    }
    let errors = diagnostics.into_compile_errors();
    quote!(#errors #output)
}

/// The primitive type an owner function's name would shadow (its token is a type of its name).
fn primitive_type_name(ident: &syn::Ident) -> Option<String> {
    const PRIMITIVES: &[&str] = &[
        "bool", "char", "str", "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32",
        "i64", "i128", "isize", "f16", "f32", "f64", "f128",
    ];
    let name = ident.unraw().to_string();
    PRIMITIVES.contains(&name.as_str()).then_some(name)
}

/// Errors when a parameter already uses the capability binding's name; returns whether the
/// binding is free (when it is not, the body is emitted without it, so the parameter keeps its
/// meaning and the one error is all the user sees).
fn check_binding_is_free(
    sig: &Signature,
    binding: &syn::Ident,
    diagnostics: &mut Diagnostics,
) -> bool {
    let mut free = true;
    for input in &sig.inputs {
        let FnArg::Typed(typed) = input else {
            continue;
        };
        // The binding would shadow a name bound anywhere in the parameter's pattern
        // (`(owner, n): (u32, u32)`, `S { owner, .. }: S`), not only a plain `owner: T`.
        let mut finder = BindingFinder {
            binding,
            found: Vec::new(),
        };
        syn::visit::Visit::visit_pat(&mut finder, &typed.pat);
        for ident in finder.found {
            free = false;
            diagnostics.error_at(
                ident,
                format!(
                    "parameter `{binding}` clashes with the owner's capability binding; \
                     rename it, or rename the binding with #[owner(token = name)]"
                ),
            );
        }
    }
    free
}

/// The identifiers a pattern binds under the capability binding's name.
struct BindingFinder<'a> {
    binding: &'a syn::Ident,
    found: Vec<&'a syn::Ident>,
}

impl<'a> syn::visit::Visit<'a> for BindingFinder<'a> {
    fn visit_pat_ident(&mut self, pat: &'a syn::PatIdent) {
        if pat.ident.unraw() == self.binding.unraw() {
            self.found.push(&pat.ident);
        }
        syn::visit::visit_pat_ident(self, pat);
    }
}

/// Errors on (and drops) a `#[cfg_attr(.., owner)]` on a method of an `#[owners]` block:
/// rustc expands it after `#[owners]` has run, so the method would not be made an owner and
/// the expanded `#[owner]` would meet a method inside an impl ("module is not supported in
/// impls").
fn refuse_owner_in_cfg_attr(attrs: &mut Vec<syn::Attribute>, diagnostics: &mut Diagnostics) {
    attrs.retain(|attr| {
        let hidden_owner = hides_attribute(attr, "owner");
        if hidden_owner {
            diagnostics.error_at(
                attr,
                "`#[owner]` inside `#[cfg_attr]` is not seen by #[kvown::owners], which runs \
                 before `cfg_attr` is expanded; write `#[owner]` on the method itself (a \
                 `#[cfg]` on the method is honoured)",
            );
        }
        !hidden_owner
    });
}

/// Removes `#[owner]` attributes so an erroneous block is still emitted as plain Rust.
fn strip_owner_attrs(item: &mut ItemImpl) {
    for impl_item in &mut item.items {
        if let ImplItem::Fn(method) = impl_item {
            parse::take_owner_attr(&mut method.attrs);
        }
    }
}
