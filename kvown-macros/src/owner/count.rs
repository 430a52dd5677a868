//! The syntactic write count of an owner body, for the audit register.

use std::collections::BTreeMap;

use syn::visit::{self, Visit};
use syn::{Block, Expr, Ident};

/// Guarded writes an owner body makes, found by syntax: `x.set_<field>(owner, ..)` and
/// `x.<field>_mut(owner)` are writes of `<field>`; any other call that passes `owner` delegates.
#[derive(Default)]
pub(crate) struct WriteCount {
    /// Writes per field name.
    pub(crate) per_field: BTreeMap<String, u32>,
    /// Calls that hand the capability to a helper.
    pub(crate) delegations: u32,
}

/// Counts the writes in `block` made with the capability bound as `binding`.
pub(crate) fn count_writes(block: &Block, binding: &Ident) -> WriteCount {
    let mut counter = Counter {
        binding,
        count: WriteCount::default(),
    };
    counter.visit_block(block);
    counter.count
}

struct Counter<'a> {
    binding: &'a Ident,
    count: WriteCount,
}

impl Counter<'_> {
    fn is_capability(&self, expr: &Expr) -> bool {
        match expr {
            Expr::Path(path) => path.qself.is_none() && path.path.is_ident(self.binding),
            Expr::Paren(inner) => self.is_capability(&inner.expr),
            _ => false,
        }
    }
}

impl<'ast> Visit<'ast> for Counter<'_> {
    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        let method = call.method.to_string();
        let first_is_capability = call.args.first().is_some_and(|a| self.is_capability(a));
        let field = if first_is_capability {
            method
                .strip_prefix("set_")
                .or_else(|| method.strip_suffix("_mut"))
        } else {
            None
        };
        match field {
            Some(field) => *self.count.per_field.entry(field.to_string()).or_default() += 1,
            None if call.args.iter().any(|a| self.is_capability(a)) => self.count.delegations += 1,
            None => {}
        }
        visit::visit_expr_method_call(self, call);
    }

    fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
        if call.args.iter().any(|a| self.is_capability(a)) {
            self.count.delegations += 1;
        }
        visit::visit_expr_call(self, call);
    }
}
