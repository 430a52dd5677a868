//! Inserting page-aligned keys with their slots.

use super::node::{Node, NodeId};
use super::{InsertOutcome, RadixCache, RadixError, TreePos};
use crate::alloc::KvSlot;

impl RadixCache {
    /// Inserts `key` (page-aligned) with `slots` (one per key token, whole pages) from the root.
    /// Same as [`RadixCache::insert_from`] with [`TreePos::ROOT`].
    ///
    /// Cost: O(key length + nodes on the path).
    pub fn insert(&mut self, key: &[u32], slots: &[KvSlot]) -> Result<InsertOutcome, RadixError> {
        self.insert_from(TreePos::ROOT, key, slots)
    }

    /// Inserts `key` with `slots`, trusting that `key[..from.len]` is already cached on the path
    /// through `from` (a position this caller got from a match or insert of the same key and
    /// whose node it has locked). Only `key[from.len..]` and `slots[from.len..]` are read.
    ///
    /// The uncached suffix becomes a new unlocked leaf, or, when `from.node` is a leaf ending at
    /// `from.len` whose only lock is the caller's, is appended to it in place (so its tokens are
    /// protected by that lock). A node ends exactly at `key.len()` afterwards (splitting one if
    /// needed); it is returned as [`InsertOutcome::last_node`] and stamped as accessed. The
    /// tree takes the slots of `[prefix_len, key.len())`; the caller frees its duplicates.
    ///
    /// Cost: O(key.len() - from.len + nodes on the path below `from`) plus at most one split;
    /// extending the caller's own leaf by one page is O(page size), amortized.
    ///
    /// # Errors
    /// Refuses (changing nothing) unaligned or overlong keys, `slots` of another length or not
    /// in whole pages, an unknown or unlocked `from.node`, and a `from.len` off its path.
    #[inline]
    pub fn insert_from(
        &mut self,
        from: TreePos,
        key: &[u32],
        slots: &[KvSlot],
    ) -> Result<InsertOutcome, RadixError> {
        if key.len() > from.len && self.is_own_leaf_end(from) {
            return self.extend_own_leaf(from, key, slots);
        }
        self.insert_walk(from, key, slots)
    }

    /// [`RadixCache::insert_from`] in general: checks the arguments, then walks down from
    /// `from` comparing pages, splitting a node or adding or extending a leaf where the key
    /// leaves the tree.
    #[inline(never)]
    fn insert_walk(
        &mut self,
        from: TreePos,
        key: &[u32],
        slots: &[KvSlot],
    ) -> Result<InsertOutcome, RadixError> {
        let page_size = self.page_size;
        let mut node = self.validate_insert(from, key, slots)?;
        let now = self.tick();
        let mut pos = from.len;
        let mut extend_in_place = node == from.node;
        loop {
            let entry = &self.arena[node];
            let node_end = entry.end(page_size);
            if pos < node_end {
                let first_page = (pos - entry.start()) / page_size;
                pos += self.common_pages(node, first_page, &key[pos..]) * page_size;
                if pos == self.arena[node].start() {
                    // Entered by the hint at a node start and the first page differs: the key
                    // continues in a sibling.
                    node = self.arena[node].parent;
                    continue;
                }
                if pos < node_end {
                    node = self.split(node, pos);
                    if pos < key.len() {
                        node = self.add_leaf(node, pos, key, slots, now);
                    }
                    break;
                }
            }
            if pos == key.len() {
                break;
            }
            let entry = &self.arena[node];
            if extend_in_place
                && node != NodeId::ROOT
                && entry.child_count == 0
                && entry.lock_ref == 1
            {
                self.extend_leaf(node, pos, key, slots);
                break;
            }
            extend_in_place = false;
            let first_page = &key[pos..pos + page_size];
            match self.children.find(&self.arena, page_size, node, first_page) {
                Some(child) => node = child,
                None => {
                    node = self.add_leaf(node, pos, key, slots, now);
                    break;
                }
            }
        }
        self.stamp(node, now);
        Ok(InsertOutcome {
            prefix_len: pos,
            last_node: node,
        })
    }

    /// Whether `from` is the end of a live leaf whose only lock is the caller's: the case that
    /// [`RadixCache::insert_from`] extends in place, and the common one when a request
    /// registers its pages as they fill.
    #[inline]
    fn is_own_leaf_end(&self, from: TreePos) -> bool {
        from.node != NodeId::ROOT && self.arena.is_live(from.node) && {
            let entry = &self.arena[from.node];
            entry.child_count == 0 && entry.lock_ref == 1 && entry.end(self.page_size) == from.len
        }
    }

    /// [`RadixCache::insert_from`] when [`RadixCache::is_own_leaf_end`] holds and the key goes
    /// past `from.len`: the checks of the key and of the new slots, then the suffix appended to
    /// the leaf (the general path's outcome, without its walk and its checks of a hint that is
    /// known to be good).
    #[inline]
    fn extend_own_leaf(
        &mut self,
        from: TreePos,
        key: &[u32],
        slots: &[KvSlot],
    ) -> Result<InsertOutcome, RadixError> {
        self.validate_key(key, slots)?;
        if self.page_size > 1 {
            validate_pages(&slots[from.len..], from.len, self.page_size)?;
        }
        let now = self.tick();
        self.extend_leaf(from.node, from.len, key, slots);
        self.stamp(from.node, now);
        Ok(InsertOutcome {
            prefix_len: from.len,
            last_node: from.node,
        })
    }

    /// Checks an insert's arguments; returns the node on whose key `from.len` lies.
    fn validate_insert(
        &self,
        from: TreePos,
        key: &[u32],
        slots: &[KvSlot],
    ) -> Result<NodeId, RadixError> {
        let page_size = self.page_size;
        self.validate_key(key, slots)?;
        self.ensure_live(from.node)?;
        if self.arena[from.node].lock_ref == 0 {
            return Err(RadixError::HintNotLocked { node: from.node });
        }
        if from.len > key.len() {
            return Err(RadixError::HintOutOfRange {
                node: from.node,
                len: from.len,
                node_end: self.arena[from.node].end(page_size),
                key_len: key.len(),
                page_size,
            });
        }
        let node = self.node_at(from)?;
        if page_size > 1 {
            validate_pages(&slots[from.len..], from.len, page_size)?;
        }
        Ok(node)
    }

    /// Checks what an insert's key and slots must be wherever it starts: whole pages, no longer
    /// than a `u32` position can count, one slot per token.
    fn validate_key(&self, key: &[u32], slots: &[KvSlot]) -> Result<(), RadixError> {
        let page_size = self.page_size;
        if !key.len().is_multiple_of(page_size) {
            return Err(RadixError::UnalignedKey {
                len: key.len(),
                page_size,
            });
        }
        if key.len() > u32::MAX as usize {
            return Err(RadixError::KeyTooLong {
                len: key.len(),
                max: u32::MAX as usize,
            });
        }
        if slots.len() != key.len() {
            return Err(RadixError::LengthMismatch {
                key: key.len(),
                slots: slots.len(),
            });
        }
        Ok(())
    }

    /// Adds `key[pos..]` with its slots as a new unlocked leaf under `parent`.
    fn add_leaf(
        &mut self,
        parent: NodeId,
        pos: usize,
        key: &[u32],
        slots: &[KvSlot],
        now: u64,
    ) -> NodeId {
        let page_size = self.page_size;
        let mut data = Vec::with_capacity((key.len() - pos) / page_size * (page_size + 1));
        append_pages(&mut data, &key[pos..], &slots[pos..], page_size);
        let leaf = self.arena.alloc(Node::new(data, parent, pos, now));
        self.children.link(&mut self.arena, page_size, leaf);
        self.arena[parent].child_count += 1;
        self.refresh_leaf_status(parent);
        self.refresh_leaf_status(leaf);
        self.add_tokens(leaf, key.len() - pos);
        leaf
    }

    /// Appends `key[pos..]` with its slots to the leaf `node`, which ends at `pos`.
    fn extend_leaf(&mut self, node: NodeId, pos: usize, key: &[u32], slots: &[KvSlot]) {
        let page_size = self.page_size;
        let data = &mut self.arena[node].data;
        let needed = (key.len() - pos) / page_size * (page_size + 1);
        if data.capacity() - data.len() < needed {
            // Double: appends stay amortized O(1), each token copied about once. The spare is
            // given back when the last lock on the leaf goes (`unlock_path`), so only leaves
            // that are still growing carry it.
            data.reserve_exact(needed.max(data.len()));
        }
        append_pages(data, &key[pos..], &slots[pos..], page_size);
        self.add_tokens(node, key.len() - pos);
    }
}

/// Appends each page of `key` followed by its page id (taken from the page's first slot).
fn append_pages(data: &mut Vec<u32>, key: &[u32], slots: &[KvSlot], page_size: usize) {
    for (tokens, page_slots) in key
        .chunks_exact(page_size)
        .zip(slots.chunks_exact(page_size))
    {
        data.extend_from_slice(tokens);
        data.push(page_slots[0] / page_size as u32);
    }
}

/// Checks that `slots` (starting at key position `start`, page-aligned) are whole pages: each
/// page's slots are the run `first, first + 1, …` of a page-aligned `first`. One branch-free
/// pass per page (vectorised); the offending slot is looked for only when a page fails.
#[inline]
fn validate_pages(slots: &[KvSlot], start: usize, page_size: usize) -> Result<(), RadixError> {
    let mut broken = false;
    for page_slots in slots.chunks_exact(page_size) {
        let first = page_slots[0];
        let expected = (0..page_size as u32).map(|offset| first.wrapping_add(offset));
        let differs = page_slots
            .iter()
            .zip(expected)
            .fold(0, |differs, (&found, expected)| {
                differs | (found ^ expected)
            });
        broken |= differs != 0 || !(first as usize).is_multiple_of(page_size);
    }
    if broken {
        return Err(first_broken_page(slots, start, page_size));
    }
    Ok(())
}

/// The error [`validate_pages`] reports: the first page that is misaligned or not a run.
#[cold]
#[inline(never)]
fn first_broken_page(slots: &[KvSlot], start: usize, page_size: usize) -> RadixError {
    for (page, page_slots) in slots.chunks_exact(page_size).enumerate() {
        let position = start + page * page_size;
        let first = page_slots[0];
        if !(first as usize).is_multiple_of(page_size) {
            return RadixError::MisalignedPage {
                position,
                slot: first,
                page_size,
            };
        }
        let expected = (0..page_size as u32).map(|offset| first.wrapping_add(offset));
        if let Some((offset, (&found, expected))) = page_slots
            .iter()
            .zip(expected)
            .enumerate()
            .find(|(_, (found, expected))| **found != *expected)
        {
            return RadixError::BrokenPage {
                position: position + offset,
                found,
                expected,
            };
        }
    }
    unreachable!("validate_pages found a broken page that first_broken_page does not")
}
