//! Checks on a parsed `#[guarded]` struct that the macro can see itself.

use quote::ToTokens;
use syn::visit::{self, Visit};
use syn::{Type, Visibility};

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
    "Mutex",
    "RwLock",
];

/// Records every problem of `model` in `diagnostics`.
pub(crate) fn validate(model: &GuardedStruct, diagnostics: &mut Diagnostics) {
    let mut any_owned = false;
    for field in &model.fields {
        let Some(ownership) = &field.ownership else {
            continue;
        };
        any_owned = true;
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
    if !any_owned {
        diagnostics.error_at(
            &model.item.ident,
            format!(
                "#[kvown::guarded] struct `{}` has no `#[owned_by(..)]` field",
                model.item.ident
            ),
        );
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
