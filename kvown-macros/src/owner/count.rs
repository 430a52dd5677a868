//! The syntactic write count of an owner body, for the audit register.

use std::collections::{BTreeMap, BTreeSet};

use proc_macro2::{Delimiter, TokenStream, TokenTree};
use syn::ext::IdentExt;
use syn::visit::{self, Visit};
use syn::{Block, Expr, Ident, Local, Pat};

/// Guarded writes an owner body makes, found by syntax: `x.set_<field>(cap, ..)`,
/// `x.<field>_mut(cap)` and `Type::set_<field>(x, cap, ..)` are writes of `<field>`, where `cap`
/// is the capability binding or a local it was moved into (`let cap = owner;`), within that
/// local's scope; a name bound to anything else (a `let`, a closure parameter, a `match` arm or
/// `for` pattern) is not the capability where it is in scope. Macro arguments are scanned token
/// by token for the same shapes. Any other use of the capability hands it on.
#[derive(Default)]
pub(crate) struct WriteCount {
    /// Writes per field name.
    pub(crate) per_field: BTreeMap<String, u32>,
    /// Calls that hand the capability to a helper, and other uses the count cannot follow
    /// (the capability stored in a struct or tuple, or passed to a macro).
    pub(crate) delegations: u32,
}

/// Counts the writes in `block` made with the capability bound as `binding`.
pub(crate) fn count_writes(block: &Block, binding: &Ident) -> WriteCount {
    let mut counter = Counter {
        names: BTreeSet::from([binding.unraw().to_string()]),
        count: WriteCount::default(),
    };
    counter.visit_block(block);
    counter.count
}

/// The field an accessor writes: `set_<field>` and `<field>_mut` name `<field>`. A name that is
/// both (`set_x_mut`) names none: the fields it could belong to (`x_mut`, `set_x`) are refused by
/// `#[guarded]`, so such a call is some other method that takes the capability (a delegation).
fn written_field(method: &str) -> Option<&str> {
    match (method.strip_prefix("set_"), method.strip_suffix("_mut")) {
        (Some(field), None) | (None, Some(field)) => Some(field),
        _ => None,
    }
}

struct Counter {
    /// The capability's names where the visit is: the binding and the locals it was moved into,
    /// less the names a pattern in scope binds to something else.
    names: BTreeSet<String>,
    count: WriteCount,
}

impl Counter {
    /// Visits a scope (a block, closure, `match` arm...): the names its patterns bind or rebind
    /// are restored when it ends.
    fn scoped(&mut self, visit: impl FnOnce(&mut Self)) {
        let outer = self.names.clone();
        visit(self);
        self.names = outer;
    }

    fn is_name(&self, ident: &Ident) -> bool {
        self.names.contains(&ident.unraw().to_string())
    }

    fn is_capability(&self, expr: &Expr) -> bool {
        match expr {
            Expr::Path(path) => {
                path.qself.is_none() && path.path.get_ident().is_some_and(|i| self.is_name(i))
            }
            Expr::Paren(inner) => self.is_capability(&inner.expr),
            Expr::Group(inner) => self.is_capability(&inner.expr),
            _ => false,
        }
    }

    fn record_write(&mut self, field: &str) {
        *self.count.per_field.entry(field.to_string()).or_default() += 1;
    }

    /// Records a call whose arguments are `args` and whose argument at `write_position` is the
    /// capability when the call is the write of `field`; visits the other arguments.
    fn record_call<'ast>(
        &mut self,
        field: Option<&str>,
        write_position: usize,
        args: impl IntoIterator<Item = &'ast Expr>,
    ) {
        let args: Vec<&Expr> = args.into_iter().collect();
        let writes = field.filter(|_| {
            args.get(write_position)
                .is_some_and(|arg| self.is_capability(arg))
        });
        match writes {
            Some(field) => self.record_write(field),
            None if args.iter().any(|arg| self.is_capability(arg)) => self.count.delegations += 1,
            None => {}
        }
        for arg in args {
            if !self.is_capability(arg) {
                self.visit_expr(arg);
            }
        }
    }

    /// Scans a macro's tokens, which syn leaves unparsed, for the write shapes; any other mention
    /// of a capability name (not a field `.cap`, a path segment `a::cap` or a metavariable `$cap`)
    /// counts as handing it on.
    fn scan_tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let punct_before = |i: usize| match i.checked_sub(1).map(|j| &trees[j]) {
            Some(TokenTree::Punct(p)) => Some(p.as_char()),
            _ => None,
        };
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(group) => self.scan_tokens(group.stream()),
                TokenTree::Ident(ident) => {
                    let before = punct_before(i);
                    let call_args = match trees.get(i + 1) {
                        Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Parenthesis => {
                            Some(split_arguments(g.stream()))
                        }
                        _ => None,
                    };
                    let write_position = match before {
                        Some('.') => Some(0),
                        Some(':') => Some(1),
                        _ => None,
                    };
                    let method = ident.unraw().to_string();
                    if let (Some(args), Some(position), Some(field)) =
                        (&call_args, write_position, written_field(&method))
                        && args
                            .get(position)
                            .is_some_and(|a| self.is_capability_tokens(a))
                    {
                        self.record_write(field);
                        for (k, arg) in args.iter().enumerate() {
                            if k != position {
                                self.scan_tokens(arg.clone());
                            }
                        }
                        i += 2;
                        continue;
                    }
                    if !matches!(before, Some('.' | ':' | '$')) && self.is_name(ident) {
                        self.count.delegations += 1;
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }

    /// Whether a macro argument is exactly a capability name (possibly in parentheses).
    fn is_capability_tokens(&self, tokens: &TokenStream) -> bool {
        let mut trees = tokens.clone().into_iter();
        match (trees.next(), trees.next()) {
            (Some(TokenTree::Ident(ident)), None) => self.is_name(&ident),
            (Some(TokenTree::Group(group)), None)
                if matches!(group.delimiter(), Delimiter::Parenthesis | Delimiter::None) =>
            {
                self.is_capability_tokens(&group.stream())
            }
            _ => false,
        }
    }
}

/// Splits call arguments at their top-level commas.
fn split_arguments(tokens: TokenStream) -> Vec<TokenStream> {
    let mut args = vec![TokenStream::new()];
    for tree in tokens {
        match &tree {
            TokenTree::Punct(p) if p.as_char() == ',' => args.push(TokenStream::new()),
            _ => args.last_mut().expect("one argument").extend([tree]),
        }
    }
    args
}

/// The name a `let` pattern binds to the whole value (`cap`, `cap: &T`, `cap @ _`).
fn bound_name(pat: &Pat) -> Option<String> {
    match pat {
        Pat::Ident(pat) => Some(pat.ident.unraw().to_string()),
        Pat::Type(typed) => bound_name(&typed.pat),
        _ => None,
    }
}

impl<'ast> Visit<'ast> for Counter {
    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        if self.is_capability(&call.receiver) {
            // A method of the capability itself (a helper trait implemented for tokens).
            self.count.delegations += 1;
        } else {
            self.visit_expr(&call.receiver);
        }
        let method = call.method.unraw().to_string();
        self.record_call(written_field(&method), 0, &call.args);
    }

    fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
        self.visit_expr(&call.func);
        // `Type::set_<field>(x, cap, ..)`: the receiver comes first, the capability second.
        let method = match &*call.func {
            Expr::Path(path) => path
                .path
                .segments
                .last()
                .map(|s| s.ident.unraw().to_string()),
            _ => None,
        };
        let field = method.as_deref().and_then(written_field);
        self.record_call(field, 1, &call.args);
    }

    fn visit_expr_path(&mut self, path: &'ast syn::ExprPath) {
        if path.qself.is_none() && path.path.get_ident().is_some_and(|i| self.is_name(i)) {
            self.count.delegations += 1;
        }
        visit::visit_expr_path(self, path);
    }

    /// The initialiser is visited with the names before the `let`; its pattern then binds its
    /// names (to the capability when it is moved in whole, otherwise to something else) until the
    /// enclosing block ends.
    fn visit_local(&mut self, local: &'ast Local) {
        if let Some(init) = &local.init {
            if init.diverge.is_none()
                && self.is_capability(&init.expr)
                && let Some(name) = bound_name(&local.pat)
            {
                self.names.insert(name);
                return;
            }
            self.visit_expr(&init.expr);
            if let Some((_, diverge)) = &init.diverge {
                self.visit_expr(diverge);
            }
        }
        self.visit_pat(&local.pat);
    }

    /// A name a pattern binds is not the capability while the binding is in scope.
    fn visit_pat_ident(&mut self, pat: &'ast syn::PatIdent) {
        self.names.remove(&pat.ident.unraw().to_string());
        visit::visit_pat_ident(self, pat);
    }

    fn visit_block(&mut self, block: &'ast syn::Block) {
        self.scoped(|counter| visit::visit_block(counter, block));
    }

    fn visit_expr_closure(&mut self, closure: &'ast syn::ExprClosure) {
        self.scoped(|counter| visit::visit_expr_closure(counter, closure));
    }

    fn visit_arm(&mut self, arm: &'ast syn::Arm) {
        self.scoped(|counter| visit::visit_arm(counter, arm));
    }

    fn visit_expr_for_loop(&mut self, for_loop: &'ast syn::ExprForLoop) {
        self.visit_expr(&for_loop.expr);
        self.scoped(|counter| {
            counter.visit_pat(&for_loop.pat);
            counter.visit_block(&for_loop.body);
        });
    }

    /// An `if let` binds its names in the condition and the `then` branch, not in `else`.
    fn visit_expr_if(&mut self, expr: &'ast syn::ExprIf) {
        self.scoped(|counter| {
            counter.visit_expr(&expr.cond);
            counter.visit_block(&expr.then_branch);
        });
        if let Some((_, else_branch)) = &expr.else_branch {
            self.visit_expr(else_branch);
        }
    }

    fn visit_expr_while(&mut self, expr: &'ast syn::ExprWhile) {
        self.scoped(|counter| visit::visit_expr_while(counter, expr));
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.scan_tokens(mac.tokens.clone());
    }

    /// An item nested in the body (a helper `fn`, an `impl`, a `mod`...) cannot capture the
    /// body's locals, so a capability name in it is some other binding: the helper's own
    /// `owner: &impl ..` parameter, or a nested owner's capability, which has its own site.
    /// Only a `macro_rules!` defined in the body is scanned (counted where written).
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if let syn::Item::Macro(mac) = item {
            self.visit_item_macro(mac);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(field, writes)` pairs and the delegation count of `block`, with the binding `owner`.
    fn count(block: Block) -> (Vec<(String, u32)>, u32) {
        let binding = Ident::new("owner", proc_macro2::Span::call_site());
        let count = count_writes(&block, &binding);
        (count.per_field.into_iter().collect(), count.delegations)
    }

    #[test]
    fn accessor_names_resolve_one_way() {
        let (writes, delegations) = count(syn::parse_quote! {{
            r.set_size(owner, 1);
            *r.size_mut(owner) += 1;
            r.set_size_mut(owner);
        }});
        assert_eq!(writes, [("size".to_string(), 2)]);
        assert_eq!(delegations, 1, "`set_size_mut` is neither accessor");
    }

    #[test]
    fn writes_through_a_rebound_capability_and_in_ufcs_form_count() {
        let (writes, delegations) = count(syn::parse_quote! {{
            let cap = owner;
            let typed: &alloc = cap;
            r.set_len(cap, 1);
            *r.len_mut((typed)) += 1;
            Req::set_len(r, owner, 2);
            helper(r, typed);
        }});
        assert_eq!(writes, [("len".to_string(), 3)]);
        assert_eq!(delegations, 1);
    }

    #[test]
    fn writes_inside_macros_count_and_other_mentions_delegate() {
        let (writes, delegations) = count(syn::parse_quote! {{
            assert!({ r.set_len(owner, 7); true });
            macro_rules! bump { () => { *r.len_mut(owner) += 1 }; ($o:expr) => { $o } }
            debug_assert_eq!(Req::set_cap(r, owner, 1), ());
            bump!(owner);
            println!("{}", r.owner);
        }});
        assert_eq!(writes, [("cap".to_string(), 1), ("len".to_string(), 2)]);
        assert_eq!(delegations, 1, "the macro that is handed the capability");
    }

    #[test]
    fn a_capability_in_an_invisible_group_is_still_the_capability() {
        // Macro-expanded input wraps an `$owner:expr` in a group without delimiters.
        let owner = proc_macro2::Group::new(Delimiter::None, quote::quote!(owner));
        let (writes, delegations) = count(syn::parse_quote! {{ r.set_len(#owner, 1); }});
        assert_eq!(writes, [("len".to_string(), 1)]);
        assert_eq!(delegations, 0);
    }

    #[test]
    fn a_rebound_capability_is_the_capability_only_in_its_scope() {
        let (writes, delegations) = count(syn::parse_quote! {{
            {
                let cap = owner;
                r.set_len(cap, 1);
            }
            {
                let cap = &log;
                write(cap);
            }
            let cap = 3;
            r.set_len(cap, 2);
            print(cap);
        }});
        assert_eq!(writes, [("len".to_string(), 1)]);
        assert_eq!(
            delegations, 0,
            "`cap` outside the block is not the capability"
        );
    }

    #[test]
    fn a_name_bound_to_something_else_shadows_the_capability_in_its_scope() {
        let (writes, delegations) = count(syn::parse_quote! {{
            let cap = owner;
            {
                let cap = 5;
                print(cap);
            }
            r.set_len(cap, 1);
            let bump = |r: &mut Req, owner: &Tok| r.set_len(owner, 2);
            for cap in caps { print(cap); }
            match found {
                Some(owner) => print(owner),
                None => r.set_len(owner, 3),
            }
            if let Some(owner) = found { print(owner) } else { *r.len_mut(owner) += 1 }
            while let Some(cap) = next() { print(cap); }
            let (owner, n) = (4, 5);
            print(owner);
            bump(r, cap);
        }});
        assert_eq!(writes, [("len".to_string(), 3)]);
        assert_eq!(
            delegations, 1,
            "only `bump(r, cap)` hands the capability on"
        );
    }

    #[test]
    fn writes_in_closures_and_loop_bodies_count() {
        let (writes, delegations) = count(syn::parse_quote! {{
            let bump = || *r.len_mut(owner) += 1;
            for r in batch.iter_mut() { r.set_len(owner, 0); }
            while r.len() < 4 { Req::set_cap(r, owner, 1); }
            for _ in take(owner) {}
        }});
        assert_eq!(writes, [("cap".to_string(), 1), ("len".to_string(), 2)]);
        assert_eq!(
            delegations, 1,
            "the capability handed to the loop's iterator"
        );
    }

    #[test]
    fn a_binding_with_a_subpattern_is_another_name_of_the_capability() {
        let (writes, delegations) = count(syn::parse_quote! {{
            let cap @ _ = owner;
            r.set_len(cap, 1);
        }});
        assert_eq!(writes, [("len".to_string(), 1)]);
        assert_eq!(delegations, 0);
    }

    #[test]
    fn macro_writes_take_the_capability_exactly_and_calls_only_in_parentheses() {
        let (writes, delegations) = count(syn::parse_quote! {{
            check!(*r.len_mut((owner)) += 1);
            check!(Req::set_len(r.inner, owner, 1));
            check!(r.set_cap(owner.clone(), 1));
        }});
        assert_eq!(writes, [("len".to_string(), 2)]);
        assert_eq!(
            delegations, 1,
            "`owner.clone()` is not the capability itself"
        );
        let (writes, delegations) = count(syn::parse_quote! {{
            check!(r.set_len({ owner }, 1));
            check!(r.set_len[owner]);
        }});
        assert!(
            writes.is_empty(),
            "a block or index is not a capability argument or call"
        );
        assert_eq!(delegations, 2);
    }

    #[test]
    fn macro_scanning_resumes_after_a_write() {
        let (writes, delegations) = count(syn::parse_quote! {{
            check!(r.len(), r.set_len(owner, 7), owner);
        }});
        assert_eq!(writes, [("len".to_string(), 1)]);
        assert_eq!(
            delegations, 1,
            "the capability after the write is handed on"
        );
    }

    #[test]
    fn in_macros_only_a_bare_capability_name_is_handed_on() {
        let (_, delegations) = count(syn::parse_quote! {{
            check!(r.owner, a::owner, $owner);
        }});
        assert_eq!(delegations, 0);
        let (_, delegations) = count(syn::parse_quote! {{ check!(owner); }});
        assert_eq!(delegations, 1);
    }

    #[test]
    fn items_nested_in_the_body_are_not_its_writes() {
        let (writes, delegations) = count(syn::parse_quote! {{
            fn bump(r: &mut Req, owner: &impl ReqLenOwner) { *r.len_mut(owner) += 1; }
            mod nested {
                #[kvown::owner]
                fn inner(r: &mut Req) { r.set_len(owner, 1); helper(owner); }
            }
            impl Req { fn twice(&mut self, owner: &impl ReqLenOwner) { self.set_len(owner, 2); } }
            macro_rules! bump_here { () => { *r.len_mut(owner) += 1 } }
            r.set_len(owner, 1);
            bump(r, owner);
        }});
        assert_eq!(writes, [("len".to_string(), 2)]);
        assert_eq!(delegations, 1);
    }

    #[test]
    fn other_uses_of_the_capability_delegate() {
        let (writes, delegations) = count(syn::parse_quote! {{
            let stored = Holder { cap: owner };
            let pair = (owner, 1);
            owner.act(r);
            r.set_len(stored.cap, 1);
        }});
        assert!(writes.is_empty());
        assert_eq!(delegations, 3);
    }
}
