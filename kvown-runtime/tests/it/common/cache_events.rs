//! A router's view of a cache-event stream, for the suites that check it: the stream replayed
//! into the pages it says are cached, with every rule a router relies on asserted on the way,
//! and the page hash computed from its documented definition (not by the crate).

use std::collections::HashMap;

use kvown_runtime::alloc::PageId;
use kvown_runtime::radix::{CacheEvent, Namespace, PageHash};

/// 64-bit FNV-1a over the namespace and the whole prefix, each as little-endian `u32`s: the
/// definition [`PageHash`] documents, written out independently of the crate.
pub fn reference_hash(namespace: Namespace, prefix: &[u32]) -> PageHash {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for word in std::iter::once(namespace.0).chain(prefix.iter().copied()) {
        for byte in word.to_le_bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x100_0000_01b3);
        }
    }
    PageHash(hash)
}

/// One page a replayed stream says is cached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayedPage {
    pub parent: Option<PageHash>,
    pub page: PageId,
    pub namespace: Namespace,
    /// Every token from the key's start through this page.
    pub prefix: Vec<u32>,
}

/// The pages a stream says are cached, by hash.
#[derive(Debug, Default)]
pub struct Replay {
    pub pages: HashMap<PageHash, ReplayedPage>,
}

impl Replay {
    /// Applies `events` in order, asserting that a stored page's parent is cached (in its
    /// namespace) and the page is not, that its hash is the reference hash of its prefix, that
    /// an event's pages tile its tokens in equal pages, and that a removed page is cached and
    /// leaves no cached child behind.
    pub fn apply(&mut self, events: impl IntoIterator<Item = CacheEvent>) {
        for event in events {
            match event {
                CacheEvent::Cleared => self.pages.clear(),
                CacheEvent::Stored {
                    namespace,
                    parent_hash,
                    pages,
                    tokens,
                } => {
                    assert!(!pages.is_empty(), "a store names pages");
                    let page_size = tokens.len() / pages.len();
                    assert_eq!(page_size * pages.len(), tokens.len(), "whole pages");
                    let mut prefix = match parent_hash {
                        None => Vec::new(),
                        Some(parent) => {
                            let entry = self
                                .pages
                                .get(&parent)
                                .unwrap_or_else(|| panic!("parent {parent} is not cached"));
                            assert_eq!(entry.namespace, namespace, "parent's namespace");
                            entry.prefix.clone()
                        }
                    };
                    let mut parent = parent_hash;
                    for (index, page) in pages.into_iter().enumerate() {
                        assert_eq!(page.tokens, index * page_size..(index + 1) * page_size);
                        prefix.extend_from_slice(&tokens[page.tokens]);
                        assert_eq!(page.hash, reference_hash(namespace, &prefix));
                        let entry = ReplayedPage {
                            parent,
                            page: page.page,
                            namespace,
                            prefix: prefix.clone(),
                        };
                        let before = self.pages.insert(page.hash, entry);
                        assert!(before.is_none(), "page {} stored twice", page.hash);
                        parent = Some(page.hash);
                    }
                }
                CacheEvent::Removed { hashes } => {
                    assert!(!hashes.is_empty(), "a removal names pages");
                    for hash in hashes {
                        assert!(self.pages.remove(&hash).is_some(), "{hash} is not cached");
                        assert!(
                            self.pages.values().all(|entry| entry.parent != Some(hash)),
                            "{hash} removed before its children"
                        );
                    }
                }
            }
        }
    }

    /// What the stream says is cached: the page of each (namespace, prefix through the page).
    pub fn by_prefix(&self) -> HashMap<(Namespace, Vec<u32>), PageId> {
        self.pages
            .values()
            .map(|entry| ((entry.namespace, entry.prefix.clone()), entry.page))
            .collect()
    }
}
