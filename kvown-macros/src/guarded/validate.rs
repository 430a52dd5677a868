//! Checks on a parsed `#[guarded]` struct that the macro can see itself.

use quote::ToTokens;
use syn::ext::IdentExt;
use syn::visit::{self, Visit};
use syn::{Type, Visibility};

use super::expand::owner_trait_name;
use super::parse::GuardedStruct;
use crate::diag::Diagnostics;

/// Types whose content can change through a shared reference: a getter would leak a write.
/// Every type whose name starts with `Atomic` counts too (`AtomicUsize`, the `atomic` crate's
/// `Atomic<T>`, crossbeam's `AtomicCell`).
const INTERIOR_MUTABLE: &[&str] = &[
    "Cell",
    "RefCell",
    "UnsafeCell",
    "SyncUnsafeCell",
    "OnceCell",
    "OnceLock",
    "LazyCell",
    "LazyLock",
    "Once",
    "Mutex",
    "RwLock",
];

/// Records every problem of `model` in `diagnostics`. Returns the owned fields whose generated
/// names were refused (their accessors and owner trait are left out of the expansion, so the
/// error is not followed by duplicate-definition errors from the generated code).
pub(crate) fn validate<'m>(
    model: &'m GuardedStruct,
    diagnostics: &mut Diagnostics,
) -> Vec<&'m syn::Ident> {
    let mut refused = Vec::new();
    let mut any_owned = false;
    let mut owner_traits: Vec<(syn::Ident, &syn::Ident)> = Vec::new();
    for field in &model.fields {
        let Some(ownership) = &field.ownership else {
            continue;
        };
        any_owned = true;
        let trait_name = owner_trait_name(&model.item.ident, &field.ident);
        if !accessor_names_are_clear(&field.ident, diagnostics) {
            refused.push(&field.ident);
        } else if let Some((_, earlier)) = owner_traits.iter().find(|(name, _)| *name == trait_name)
        {
            refused.push(&field.ident);
            diagnostics.error_at(
                &field.ident,
                format!(
                    "owned fields `{earlier}` and `{}` would share the owner trait `{trait_name}` \
                     (its name drops the `_`s of the field's); rename one of them",
                    field.ident
                ),
            );
        } else {
            owner_traits.push((trait_name, &field.ident));
        }
        if let Visibility::Public(token) = &field.vis {
            diagnostics.error_at(
                token,
                format!(
                    "owned field `{}` cannot be `pub`: writes must go through its owners; \
                     reads are already public through `.{}()`",
                    field.ident, field.ident
                ),
            );
        }
        if let Some(cell) = interior_mutable_part(&field.ty) {
            diagnostics.error_at(
                &cell,
                format!(
                    "owned field `{}` has an interior-mutable type (`{}`): it could be written \
                     through a shared read, bypassing its owners",
                    field.ident,
                    type_text(&cell)
                ),
            );
        }
        if ownership.owners.is_empty() && !ownership.malformed {
            diagnostics.error_at(
                &ownership.attr,
                format!(
                    "`#[owned_by]` on `{}` lists no owner; name at least one function or `Type::method`",
                    field.ident
                ),
            );
        }
        for (i, owner) in ownership.owners.iter().enumerate() {
            let text = owner.to_token_stream().to_string();
            if ownership.owners[..i]
                .iter()
                .any(|earlier| earlier.to_token_stream().to_string() == text)
            {
                diagnostics.error_at(
                    owner,
                    format!(
                        "duplicate owner `{}` of `{}`",
                        text.replace(' ', ""),
                        field.ident
                    ),
                );
            }
        }
        for repeated in &ownership.repeated {
            diagnostics.error_at(
                repeated,
                format!(
                    "`{}` has more than one `#[owned_by]`; list every owner in one attribute",
                    field.ident
                ),
            );
        }
    }
    refuse_code_inside_the_seal(model, diagnostics);
    if !any_owned {
        diagnostics.error_at(
            &model.item.ident,
            format!(
                "#[kvown::guarded] struct `{}` has no `#[owned_by(..)]` field",
                model.item.ident
            ),
        );
    }
    refused
}

/// Errors when an owned field's name would make an accessor name ambiguous: `set_x` and `x_mut`
/// would read as the setter of `x_mut` or the `_mut` accessor of `set_x` (to readers and to the
/// owners' write count, which tells writes apart by accessor name), and `fields` and
/// `into_init` would clash with the generated `fields_mut()` and `into_init()`. Returns whether
/// the names are clear (no error recorded).
fn accessor_names_are_clear(ident: &syn::Ident, diagnostics: &mut Diagnostics) -> bool {
    let name = ident.unraw().to_string();
    let problem = if let Some(rest) = name.strip_prefix("set_") {
        format!(
            "starts with `set_`, so its `_mut` accessor `{name}_mut` reads as the setter of `{rest}_mut`"
        )
    } else if let Some(rest) = name.strip_suffix("_mut") {
        format!(
            "ends with `_mut`, so its setter `set_{name}` reads as the `_mut` accessor of `set_{rest}`"
        )
    } else if name == "fields" {
        "would get a `fields_mut` accessor, the name of the generated split-borrow view".to_string()
    } else if name == "into_init" {
        "would get an `into_init` getter, the name of the generated conversion into the init struct"
            .to_string()
    } else {
        return true;
    };
    diagnostics.error_at(
        ident,
        format!("owned field `{ident}` {problem}; rename the field"),
    );
    false
}

/// Errors on every item and macro call inside the field types and generics. Those are emitted in
/// the hidden module, where the owned fields are accessible: an item declared in an array
/// length's block (`[u8; { fn f(r: &mut Req) { r.len = 9; } 4 }]`), or one a macro call
/// expands to, could write owned fields or implement the sealed owner traits without being
/// listed. Refusing them keeps the seal free of user code by construction (derives aside).
fn refuse_code_inside_the_seal(model: &GuardedStruct, diagnostics: &mut Diagnostics) {
    let name = &model.item.ident;
    let mut finder = CodeFinder::default();
    for field in &model.fields {
        finder.visit_type(&field.ty);
        finder.report(
            diagnostics,
            &format!("the type of `{name}::{}`", field.ident),
        );
    }
    finder.visit_generics(&model.item.generics);
    finder.report(diagnostics, &format!("the generics of `{name}`"));
}

/// Items and macro calls found in a syntax tree, with their spans.
#[derive(Default)]
struct CodeFinder {
    items: Vec<proc_macro2::TokenStream>,
    macros: Vec<syn::Path>,
}

impl CodeFinder {
    /// Records an error for each finding, saying it is in `place`, and forgets them.
    fn report(&mut self, diagnostics: &mut Diagnostics, place: &str) {
        for item in self.items.drain(..) {
            diagnostics.error_at(
                item,
                format!(
                    "an item inside {place} would be compiled inside #[kvown::guarded]'s seal, \
                     where it could write owned fields; declare it outside the struct (a `const` \
                     or type alias in the struct's module) and name that here"
                ),
            );
        }
        for path in self.macros.drain(..) {
            diagnostics.error_at(
                &path,
                format!(
                    "a macro call inside {place} would expand inside #[kvown::guarded]'s seal, \
                     where items it declares could write owned fields; move it to a type alias \
                     or `const` outside the struct and name that here"
                ),
            );
        }
    }
}

impl<'ast> Visit<'ast> for CodeFinder {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        // Spanned on the item's first tokens (its attributes or keyword and name).
        let head: proc_macro2::TokenStream = item.to_token_stream().into_iter().take(2).collect();
        self.items.push(head);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.macros.push(mac.path.clone());
    }
}

/// The first interior-mutable type inside `ty` (also inside generic arguments), if any.
fn interior_mutable_part(ty: &Type) -> Option<syn::PathSegment> {
    struct Finder(Option<syn::PathSegment>);
    impl<'ast> Visit<'ast> for Finder {
        fn visit_path_segment(&mut self, segment: &'ast syn::PathSegment) {
            let name = segment.ident.to_string();
            let atomic = name.starts_with("Atomic");
            if self.0.is_none() && (atomic || INTERIOR_MUTABLE.contains(&name.as_str())) {
                self.0 = Some(segment.clone());
            }
            visit::visit_path_segment(self, segment);
        }
    }
    let mut finder = Finder(None);
    finder.visit_type(ty);
    finder.0
}

/// Type tokens as a reader writes them: `Cell<usize>`, not `Cell < usize >`.
fn type_text(tokens: &impl ToTokens) -> String {
    tokens
        .to_token_stream()
        .to_string()
        .replace(' ', "")
        .replace(',', ", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_and_macros_in_field_types_and_generics_are_refused() {
        let count = |input: proc_macro2::TokenStream| {
            let mut diagnostics = Diagnostics::new();
            let model = crate::guarded::parse::parse(quote::quote!(), input, &mut diagnostics)
                .unwrap_or_else(|_| panic!("a struct with named fields"));
            refuse_code_inside_the_seal(&model, &mut diagnostics);
            let errors = diagnostics.into_compile_errors().to_string();
            errors.matches("compile_error").count()
        };
        let clean = quote::quote!(
            struct S<T, const N: usize = { 2 + 2 }>
            where
                [T; N]: Sized,
            {
                #[owned_by(f)]
                a: [u8; { Self::N / 2 }],
                b: Vec<[T; N]>,
            }
        );
        assert_eq!(
            count(clean),
            0,
            "blocks without items are plain expressions"
        );
        let dirty = quote::quote!(
            struct S<
                const N: usize = {
                    const M: usize = 1;
                    M
                },
            >
            where
                [(); m!()]: Sized,
            {
                #[owned_by(f)]
                a: [u8; {
                    fn sneak() {}
                    impl S {}
                    4
                }],
                b: ty!(u8),
                c: [u8; {
                    n!();
                    1
                }],
            }
        );
        assert_eq!(count(dirty), 6, "three items, three macro calls");
    }

    #[test]
    fn owned_fields_with_refused_names_are_returned() {
        let mut diagnostics = Diagnostics::new();
        let model = crate::guarded::parse::parse(
            quote::quote!(),
            quote::quote!(
                struct S {
                    #[owned_by(f)]
                    len: usize,
                    #[owned_by(f)]
                    set_cap: usize,
                    #[owned_by(f)]
                    top_k: usize,
                    #[owned_by(f)]
                    top_k_: usize,
                    set_unowned: usize,
                }
            ),
            &mut diagnostics,
        )
        .unwrap_or_else(|_| panic!("a struct with named fields"));
        let refused: Vec<String> = validate(&model, &mut diagnostics)
            .iter()
            .map(|ident| ident.to_string())
            .collect();
        assert_eq!(
            refused,
            ["set_cap", "top_k_"],
            "an accessor name read two ways, and the second field of one owner trait name"
        );
        let errors = diagnostics.into_compile_errors().to_string();
        assert_eq!(errors.matches("compile_error").count(), 2, "{errors}");
    }

    #[test]
    fn accessor_names_of_owned_fields_must_read_one_way() {
        for (name, clear) in [
            ("len", true),
            ("settings", true),
            ("r#type", true),
            ("mutex", true),
            ("field", true),
            ("into", true),
            ("set_len", false),
            ("r#set_len", false),
            ("len_mut", false),
            ("fields", false),
            ("into_init", false),
        ] {
            let mut diagnostics = Diagnostics::new();
            let ident: syn::Ident = syn::parse_str(name).unwrap();
            assert_eq!(
                accessor_names_are_clear(&ident, &mut diagnostics),
                clear,
                "{name}"
            );
            let errors = diagnostics.into_compile_errors().to_string();
            assert_eq!(errors.is_empty(), clear, "{name}: {errors}");
        }
    }
}
