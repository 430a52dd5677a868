//! How a method owner's capability token is named, shared by `#[owners]` (which defines it) and
//! `#[guarded]` (which finds it from `Type::method` in `#[owned_by(..)]`).
//!
//! The token of `Type::method` is re-exported as `Type_method` in the impl block's module (it is
//! defined, under the method's name, in the method's sealed module `sealed_fn_Type_method`, so
//! rustc's messages print it as `method`). For that
//! name to designate exactly one owner, `Type` is an UpperCamelCase identifier without `_` (so
//! `Type_method` splits one way only) and no free owner function starts with an upper-case
//! letter (so no function's token has the shape of a method's).
//!
//! `#[guarded]` finds the token by name only, so an imported `Type_method` (a glob import the
//! module's own `Type` shadows only in part) is taken as the token of the `Type` named there; a
//! check through the type itself is not possible for a generic type named without its
//! parameters (README, "Known limits").

use proc_macro2::Ident;
use quote::format_ident;
use syn::ext::IdentExt;

/// Whether a path segment names a type: its first letter is an ASCII upper-case one.
pub(crate) fn is_type_name(ident: &Ident) -> bool {
    ident
        .unraw()
        .to_string()
        .starts_with(|c: char| c.is_ascii_uppercase())
}

/// Whether `ident` may be the self type of an `#[owners]` impl: a type name without `_`.
pub(crate) fn is_owner_type_name(ident: &Ident) -> bool {
    is_type_name(ident) && !ident.unraw().to_string().contains('_')
}

/// The capability token of `type_name::method`: `Type_method`, spanned on the method.
pub(crate) fn token_name(type_name: &Ident, method: &Ident) -> Ident {
    format_ident!("{}_{}", type_name, method, span = method.span())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ident(text: &str) -> Ident {
        syn::parse_str(text).unwrap()
    }

    #[test]
    fn type_names_start_upper_case_raw_or_not() {
        for (name, is_type) in [
            ("Batch", true),
            ("B", true),
            ("r#Batch", true),
            ("Batch_Req", true),
            ("batch", false),
            ("r#move", false),
            ("_Batch", false),
            ("Érable", false),
        ] {
            assert_eq!(is_type_name(&ident(name)), is_type, "{name}");
        }
    }

    #[test]
    fn owner_type_names_are_type_names_without_underscores() {
        for (name, allowed) in [
            ("Batch", true),
            ("ReqKvInfo", true),
            ("r#Batch", true),
            ("Batch_Req", false),
            ("Batch_", false),
            ("batch", false),
            ("batch_req", false),
            ("_Batch", false),
        ] {
            assert_eq!(is_owner_type_name(&ident(name)), allowed, "{name}");
        }
    }

    #[test]
    fn tokens_are_named_type_underscore_method_without_raw_prefixes() {
        for (type_name, method, token) in [
            ("Batch", "retract", "Batch_retract"),
            ("Req", "r#move", "Req_move"),
            ("r#Req", "set_len", "Req_set_len"),
        ] {
            assert_eq!(
                token_name(&ident(type_name), &ident(method)).to_string(),
                token
            );
        }
    }
}
