//! Moving items into a generated child module ("sealing") without changing what they mean:
//! visibilities are widened one level and relative paths are re-rooted one level up.

use proc_macro2::{Group, Ident, Punct, Spacing, TokenStream, TokenTree};
use syn::visit_mut::{self, VisitMut};
use syn::{ItemMod, Path, UseTree, VisRestricted, Visibility, parse_quote};

/// The visibility an item needs inside a child module to keep the reach it had when written
/// in the parent: private becomes `pub(super)`, `pub(super)` becomes `pub(in super::super)`.
pub(crate) fn widen_one_level(vis: &Visibility) -> Visibility {
    match vis {
        Visibility::Public(_) => vis.clone(),
        Visibility::Inherited => parse_quote!(pub(super)),
        Visibility::Restricted(restricted) => {
            let first = restricted
                .path
                .segments
                .first()
                .map(|s| s.ident.to_string());
            match first.as_deref() {
                Some("self") if restricted.path.segments.len() == 1 => parse_quote!(pub(super)),
                Some("super") | Some("self") => {
                    let mut path = restricted.path.as_ref().clone();
                    deepen_path(&mut path);
                    parse_quote!(pub(in #path))
                }
                _ => vis.clone(),
            }
        }
    }
}

/// Re-roots a relative path for use one module deeper: `super::x` -> `super::super::x`,
/// `self::x` -> `super::x`. Absolute paths and single-segment `self` are left alone.
fn deepen_path(path: &mut Path) {
    deepen_path_at(path, 0);
}

/// [`deepen_path`] for a path written `depth` modules below the moved item (in a module
/// declared inside an owner's body): only a path whose leading `super`s reach the moved item's
/// module or beyond changes, since modules inside the item move with it.
fn deepen_path_at(path: &mut Path, depth: usize) {
    if path.leading_colon.is_some() || path.segments.is_empty() {
        return;
    }
    // A leading `self` before the `super`s (`self::super::x`) changes nothing.
    let skip = usize::from(path.segments[0].ident == "self");
    let supers = path
        .segments
        .iter()
        .skip(skip)
        .take_while(|s| s.ident == "super")
        .count();
    let span = path.segments[0].ident.span();
    if supers > 0 && supers >= depth {
        path.segments.insert(skip, Ident::new("super", span).into());
    } else if supers == 0
        && depth == 0
        && path.segments[0].ident == "self"
        && path.segments.len() > 1
    {
        path.segments[0].ident = Ident::new("super", span);
    }
}

/// Prefixes a path that resolves like a `use` path from the parent module so that it resolves
/// the same from a child module.
pub(crate) fn path_from_child(path: &Path) -> Path {
    let first = path.segments.first().map(|s| s.ident.to_string());
    match first.as_deref() {
        _ if path.leading_colon.is_some() => path.clone(),
        Some("crate") => path.clone(),
        Some("super") | Some("self") => {
            let mut path = path.clone();
            deepen_path(&mut path);
            path
        }
        _ => {
            let mut path = path.clone();
            let root = Ident::new("super", path.segments[0].ident.span());
            path.segments.insert(0, root.into());
            path
        }
    }
}

/// Rewrites every relative path in a syntax tree (including inside macro invocations) so the
/// tree means the same one module deeper. Paths and visibilities inside modules declared in the
/// tree change only where they reach out of those modules.
#[derive(Default)]
pub(crate) struct DeeperPaths {
    /// How many modules declared inside the tree enclose the node being visited.
    depth: usize,
}

impl VisitMut for DeeperPaths {
    fn visit_path_mut(&mut self, path: &mut Path) {
        deepen_path_at(path, self.depth);
        visit_mut::visit_path_mut(self, path);
    }

    fn visit_vis_restricted_mut(&mut self, vis: &mut VisRestricted) {
        self.visit_path_mut(&mut vis.path);
        // `pub(super)` deepened is `pub(in super::super)`: a longer path needs `in`.
        if vis.in_token.is_none() && vis.path.segments.len() > 1 {
            vis.in_token = Some(Default::default());
        }
    }

    fn visit_item_mod_mut(&mut self, module: &mut ItemMod) {
        self.depth += 1;
        visit_mut::visit_item_mod_mut(self, module);
        self.depth -= 1;
    }

    fn visit_use_tree_mut(&mut self, tree: &mut UseTree) {
        self.deepen_use_tree(tree, 0);
    }

    fn visit_macro_mut(&mut self, mac: &mut syn::Macro) {
        mac.tokens = deepen_tokens(std::mem::take(&mut mac.tokens), self.depth);
        visit_mut::visit_macro_mut(self, mac);
    }
}

impl DeeperPaths {
    /// Deepens a use tree that `supers` leading `super`s precede (1 for `super::x` in
    /// `use super::{super::x}`): the `super` at which the path leaves the modules declared
    /// around it (the first one, outside them) gains another; `self::` becomes `super::` outside
    /// them.
    fn deepen_use_tree(&mut self, tree: &mut UseTree, supers: usize) {
        match tree {
            UseTree::Path(use_path) if use_path.ident == "super" && supers + 1 >= self.depth => {
                let inner = std::mem::replace(
                    &mut *use_path.tree,
                    UseTree::Glob(syn::UseGlob {
                        star_token: Default::default(),
                    }),
                );
                *use_path.tree = UseTree::Path(syn::UsePath {
                    ident: Ident::new("super", use_path.ident.span()),
                    colon2_token: use_path.colon2_token,
                    tree: Box::new(inner),
                });
            }
            UseTree::Path(use_path) if use_path.ident == "super" => {
                self.deepen_use_tree(&mut use_path.tree, supers + 1);
            }
            UseTree::Path(use_path) if use_path.ident == "self" => {
                if self.depth == 0 {
                    use_path.ident = Ident::new("super", use_path.ident.span());
                } else {
                    self.deepen_use_tree(&mut use_path.tree, supers);
                }
            }
            UseTree::Group(group) => {
                for item in &mut group.items {
                    self.deepen_use_tree(item, supers);
                }
            }
            // Past a name, no `super` can follow.
            _ => {}
        }
    }
}

/// Token-level form of [`DeeperPaths`] for macro arguments, which are not parsed: a path
/// starting `super ::` (or `self :: super ::`) gains one more `super` (when its `super`s reach
/// out of the `depth` modules around it), `self ::` becomes `super ::` (outside any such module).
fn deepen_tokens(tokens: TokenStream, depth: usize) -> TokenStream {
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    let followed_by_path_sep = |i: usize| {
        matches!(
            (trees.get(i + 1), trees.get(i + 2)),
            (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
                if a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':'
        )
    };
    let is_super = |i: usize| matches!(trees.get(i), Some(TokenTree::Ident(id)) if id == "super");
    let mut out = Vec::with_capacity(trees.len());
    for (i, tree) in trees.iter().enumerate() {
        let preceded_by_path_sep =
            i > 0 && matches!(&trees[i - 1], TokenTree::Punct(p) if p.as_char() == ':');
        match tree {
            TokenTree::Ident(ident) if followed_by_path_sep(i) && !preceded_by_path_sep => {
                // A leading `self` before the `super`s (`self::super::x`) changes nothing.
                let first = if ident == "self" { i + 3 } else { i };
                let mut supers = 0;
                while is_super(first + 3 * supers) && followed_by_path_sep(first + 3 * supers) {
                    supers += 1;
                }
                if supers > 0 && supers >= depth {
                    out.push(TokenTree::Ident(ident.clone()));
                    out.push(TokenTree::Punct(Punct::new(':', Spacing::Joint)));
                    out.push(TokenTree::Punct(Punct::new(':', Spacing::Alone)));
                    out.push(TokenTree::Ident(Ident::new("super", ident.span())));
                } else if ident == "self" && depth == 0 {
                    out.push(TokenTree::Ident(Ident::new("super", ident.span())));
                } else {
                    out.push(tree.clone());
                }
            }
            TokenTree::Group(group) => {
                let mut inner = Group::new(group.delimiter(), deepen_tokens(group.stream(), depth));
                inner.set_span(group.span());
                out.push(TokenTree::Group(inner));
            }
            _ => out.push(tree.clone()),
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use quote::ToTokens;
    use syn::{File, parse_quote};

    use super::*;

    /// Tokens as text without spaces, for comparing.
    fn text(tokens: &impl ToTokens) -> String {
        tokens.to_token_stream().to_string().replace(' ', "")
    }

    #[test]
    fn visibilities_keep_their_reach_one_module_deeper() {
        for (written, sealed) in [
            (quote::quote!(pub), "pub"),
            (quote::quote!(), "pub(super)"),
            (quote::quote!(pub(self)), "pub(super)"),
            (quote::quote!(pub(crate)), "pub(crate)"),
            (quote::quote!(pub(super)), "pub(insuper::super)"),
            (
                quote::quote!(pub(in super::super)),
                "pub(insuper::super::super)",
            ),
            (quote::quote!(pub(in self::inner)), "pub(insuper::inner)"),
            (quote::quote!(pub(in crate::a)), "pub(incrate::a)"),
        ] {
            let vis: Visibility = syn::parse2(written.clone()).unwrap();
            assert_eq!(text(&widen_one_level(&vis)), sealed, "{written}");
        }
    }

    #[test]
    fn paths_resolve_the_same_one_module_deeper() {
        for (written, sealed) in [
            (quote::quote!(alloc), "super::alloc"),
            (
                quote::quote!(sched::Batch::retract),
                "super::sched::Batch::retract",
            ),
            (quote::quote!(self::alloc), "super::alloc"),
            (quote::quote!(super::alloc), "super::super::alloc"),
            (quote::quote!(crate::batch::alloc), "crate::batch::alloc"),
            (quote::quote!(::std::mem::swap), "::std::mem::swap"),
        ] {
            let path: Path = syn::parse2(written.clone()).unwrap();
            assert_eq!(text(&path_from_child(&path)), sealed, "{written}");
        }
    }

    #[test]
    fn a_sealed_tree_rewrites_relative_paths_and_use_trees() {
        let mut file: File = parse_quote! {
            use {super::x, self::y};
            use super::a::b;
            use self::c;
            use std::cell::Cell;
            fn f() -> self::D { super::g(); ::std::mem::drop(1); h() }
            fn l(&self) -> usize { self.len() }
        };
        DeeperPaths::default().visit_file_mut(&mut file);
        assert_eq!(
            text(&file),
            "use{super::super::x,super::y};usesuper::super::a::b;usesuper::c;usestd::cell::Cell;\
             fnf()->super::D{super::super::g();::std::mem::drop(1);h()}\
             fnl(&self)->usize{self.len()}"
        );
    }

    #[test]
    fn macro_arguments_are_rewritten_token_by_token() {
        let mut file: File = parse_quote! {
            fn f(&self) {
                check!(super::g(), self::h, (super::super::k), self.len(), a::b);
            }
        };
        DeeperPaths::default().visit_file_mut(&mut file);
        assert_eq!(
            text(&file),
            "fnf(&self){check!(super::super::g(),super::h,(super::super::super::k),\
             self.len(),a::b);}"
        );
    }

    #[test]
    fn modules_inside_the_tree_keep_their_own_relative_paths() {
        let mut file: File = parse_quote! {
            fn f() {
                mod helpers {
                    pub(super) fn two() -> usize { super::x() + self::inner::y() }
                    pub(self) fn z() { super::super::w(); }
                    use super::a;
                    use self::inner::b;
                    mod inner {
                        pub(super) fn y() -> usize { super::super::x() + super::v() }
                        use super::super::p;
                        use super::u;
                        fn n() { check!(x, super::super::q(), super::v(), super::a::b); }
                    }
                    fn m() { check!(super::x(), self::inner::y(), super::super::q()); }
                }
            }
        };
        DeeperPaths::default().visit_file_mut(&mut file);
        assert_eq!(
            text(&file),
            "fnf(){modhelpers{pub(insuper::super)fntwo()->usize{super::super::x()+self::inner::y()}\
             pub(self)fnz(){super::super::super::w();}\
             usesuper::super::a;useself::inner::b;\
             modinner{pub(super)fny()->usize{super::super::super::x()+super::v()}\
             usesuper::super::super::p;usesuper::u;\
             fnn(){check!(x,super::super::super::q(),super::v(),super::a::b);}}\
             fnm(){check!(super::super::x(),self::inner::y(),super::super::super::q());}}}"
        );
    }

    #[test]
    fn a_leading_self_before_supers_changes_nothing() {
        let mut file: File = parse_quote! {
            use self::super::a;
            fn f() {
                self::super::g();
                check!(self::super::h());
                mod helpers {
                    pub(in self::super) fn two() { self::super::x(); }
                    use self::super::b;
                    fn m() { check!(self::super::y(), self::z()); }
                    mod inner {
                        use self::super::c;
                        use super::{super::d, e};
                        use self::super::{self as up, super::super::f};
                        fn n() { self::super::w(); }
                    }
                }
            }
        };
        DeeperPaths::default().visit_file_mut(&mut file);
        assert_eq!(
            text(&file),
            "usesuper::super::a;\
             fnf(){self::super::super::g();check!(self::super::super::h());\
             modhelpers{pub(inself::super::super)fntwo(){self::super::super::x();}\
             useself::super::super::b;\
             fnm(){check!(self::super::super::y(),self::z());}\
             modinner{useself::super::c;usesuper::{super::super::d,e};\
             useself::super::{selfasup,super::super::super::f};fnn(){self::super::w();}}}}"
        );
    }
}
