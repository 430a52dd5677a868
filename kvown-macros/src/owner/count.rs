//! The syntactic write count of an owner body, for the audit register.

use std::collections::BTreeMap;

use syn::ext::IdentExt;
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

/// The field an accessor writes: `set_<field>` and `<field>_mut` name `<field>`. A name that is
/// both (`set_x_mut`) names none: the fields it could belong to (`x_mut`, `set_x`) are refused by
/// `#[guarded]`, so such a call is some other method that takes the capability (a delegation).
fn written_field(method: &str) -> Option<&str> {
    match (method.strip_prefix("set_"), method.strip_suffix("_mut")) {
        (Some(field), None) | (None, Some(field)) => Some(field),
        _ => None,
    }
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
        let method = call.method.unraw().to_string();
        let first_is_capability = call.args.first().is_some_and(|a| self.is_capability(a));
        let field = if first_is_capability {
            written_field(&method)
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
}
