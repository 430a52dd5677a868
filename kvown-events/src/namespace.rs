//! How a kvown [`Namespace`] travels on the wire: as a LoRA name or as a cache salt. The
//! router seeds its block hashes with the label, so a request's query must carry the label of
//! the namespace it runs in.

use std::borrow::Cow;
use std::collections::HashMap;

use kvown_runtime::radix::Namespace;

use crate::error::EncodeError;

/// The `BlockStored` field that carries a namespace's label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NamespaceField {
    /// `lora_name`: the namespace is an adapter (Dynamo's `lora_name` in the query).
    #[default]
    LoraName,
    /// `cache_salt`: the namespace is a tenant's salt (Dynamo's `cache_namespace` in the
    /// query).
    CacheSalt,
}

/// The label of one namespace, and the field it goes in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceLabel<'a> {
    /// Where the label goes.
    pub field: NamespaceField,
    /// The label: never empty (a router reads an empty one as no namespace).
    pub name: Cow<'a, str>,
}

impl NamespaceLabel<'_> {
    /// The label as a `lora_name`, when it is one.
    pub fn lora_name(&self) -> Option<&str> {
        (self.field == NamespaceField::LoraName).then_some(&*self.name)
    }

    /// The label as a cache salt, when it is one.
    pub fn cache_salt(&self) -> Option<&str> {
        (self.field == NamespaceField::CacheSalt).then_some(&*self.name)
    }
}

/// The labels of the namespaces a cache uses. [`Namespace::DEFAULT`] has no label unless
/// given one (the base model, unsalted); any other namespace not named here is labelled
/// `kvown-namespace-<n>`.
#[derive(Debug, Clone, Default)]
pub struct NamespaceLabels {
    field: NamespaceField,
    names: HashMap<Namespace, String>,
}

impl NamespaceLabels {
    /// Labels carried as `lora_name`.
    pub fn lora_names() -> NamespaceLabels {
        NamespaceLabels::default()
    }

    /// Labels carried as `cache_salt`.
    pub fn cache_salts() -> NamespaceLabels {
        NamespaceLabels {
            field: NamespaceField::CacheSalt,
            names: HashMap::new(),
        }
    }

    /// Names `namespace` `name` (an adapter's name, a tenant's salt). Fails on an empty name,
    /// which a router would read as no namespace and so mix with the default's pages.
    pub fn with_name(
        mut self,
        namespace: Namespace,
        name: impl Into<String>,
    ) -> Result<NamespaceLabels, EncodeError> {
        let name = name.into();
        if name.is_empty() {
            return Err(EncodeError::EmptyNamespaceName {
                namespace: namespace.0,
            });
        }
        self.names.insert(namespace, name);
        Ok(self)
    }

    /// The field the labels go in.
    pub fn field(&self) -> NamespaceField {
        self.field
    }

    /// The label of `namespace`; `None` for an unnamed [`Namespace::DEFAULT`].
    pub fn label(&self, namespace: Namespace) -> Option<NamespaceLabel<'_>> {
        let name = match self.names.get(&namespace) {
            Some(name) => Cow::Borrowed(name.as_str()),
            None if namespace == Namespace::DEFAULT => return None,
            None => Cow::Owned(format!("kvown-namespace-{}", namespace.0)),
        };
        Some(NamespaceLabel {
            field: self.field,
            name,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_namespace_is_unlabelled_unless_named() {
        let labels = NamespaceLabels::cache_salts();
        assert_eq!(labels.label(Namespace::DEFAULT), None);
        let other = labels.label(Namespace(3)).unwrap();
        assert_eq!(other.cache_salt(), Some("kvown-namespace-3"));
        assert_eq!(other.lora_name(), None);
        let named = NamespaceLabels::lora_names()
            .with_name(Namespace::DEFAULT, "base")
            .unwrap()
            .with_name(Namespace(3), "sql-adapter")
            .unwrap();
        assert_eq!(
            named.label(Namespace::DEFAULT).unwrap().lora_name(),
            Some("base")
        );
        assert_eq!(
            named.label(Namespace(3)).unwrap().lora_name(),
            Some("sql-adapter")
        );
    }

    #[test]
    fn an_empty_name_is_refused() {
        let error = NamespaceLabels::lora_names()
            .with_name(Namespace(2), "")
            .unwrap_err();
        assert!(matches!(
            error,
            EncodeError::EmptyNamespaceName { namespace: 2 }
        ));
        assert!(error.to_string().contains("namespace 2"), "{error}");
    }
}
