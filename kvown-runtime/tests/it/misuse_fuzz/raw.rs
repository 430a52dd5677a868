//! The raw world: the allocator, the request-to-token pool and the radix cache called
//! directly, with what each raw request holds by its own account, and the constructors.

use std::sync::atomic::Ordering;

use kvown_runtime::alloc::{
    AllocError, DecodeShape, ExtendShape, FreeOrder, KvAllocator, KvSlot, PageId, PagedAllocator,
    SlotCalls, TokenAllocator,
};
use kvown_runtime::batch::Req;
use kvown_runtime::check::check_radix;
use kvown_runtime::check::{Holder, PageLedger};
use kvown_runtime::radix::{Insert, NodeId, RadixCache, RadixConfig, TreePos};
use kvown_runtime::slots::{ReqRow, ReqToTokenPool};

use super::{CAUGHT, Op, RAW_PAGES, ROWS, TreeSnapshot, census, tree_snapshot};

/// The raw allocator, pool and tree, with what each raw request holds by its own account.
pub(super) struct RawWorld {
    page_size: usize,
    alloc: PagedAllocator,
    /// Each raw request's slots, in row order (position `i` at `slots[i]`).
    reqs: Vec<Vec<KvSlot>>,
    tree: RadixCache,
    /// Node ids from inserts, with the key whose end they were (some evicted since).
    nodes: Vec<(NodeId, Vec<u32>)>,
    /// Locks taken and not released, with the key each keeps cached.
    locks: Vec<(NodeId, Vec<u32>)>,
    /// Keys given to the tree.
    keys: Vec<Vec<u32>>,
    next_token: u32,
    /// Slots freed before (for double frees).
    freed: Vec<KvSlot>,
    rows: ReqToTokenPool,
    held_rows: Vec<ReqRow>,
}

/// What a raw call must leave unchanged when it fails.
#[derive(Debug, PartialEq)]
struct RawSnapshot {
    alloc: PagedAllocator,
    tree: TreeSnapshot,
    rows: ReqToTokenPool,
}

impl RawWorld {
    pub(super) fn new(page_size: usize) -> RawWorld {
        RawWorld {
            page_size,
            alloc: PagedAllocator::new(RAW_PAGES * page_size, page_size, false).unwrap(),
            reqs: Vec::new(),
            tree: RadixCache::new(RadixConfig::new(page_size)).unwrap(),
            nodes: vec![(NodeId::ROOT, Vec::new())],
            locks: Vec::new(),
            keys: Vec::new(),
            next_token: 0,
            freed: Vec::new(),
            rows: ReqToTokenPool::new(ROWS, 8).unwrap(),
            held_rows: Vec::new(),
        }
    }

    fn snapshot(&self) -> RawSnapshot {
        RawSnapshot {
            alloc: self.alloc.clone(),
            tree: tree_snapshot(&self.tree),
            rows: self.rows.clone(),
        }
    }

    /// The independent census and the checker's verdict: `Ok(true)` clean, `Ok(false)` a
    /// corruption both see.
    fn verdicts(&self) -> Result<bool, String> {
        let independent = census(
            &self.alloc,
            Some(&self.tree),
            self.reqs
                .iter()
                .enumerate()
                .map(|(i, s)| (i as u64, &s[..])),
        );
        let checker = (|| {
            let mut ledger = PageLedger::new(&self.alloc)?;
            ledger.claim_tree(&self.tree)?;
            for (rid, slots) in self.reqs.iter().enumerate() {
                ledger.claim_slots(Holder::Request(rid as u64), slots)?;
            }
            ledger.finish()
        })();
        match (&independent, &checker) {
            (Ok(()), Ok(())) => Ok(true),
            (Err(_), Err(_)) => Ok(false),
            _ => Err(format!(
                "census {independent:?} but checker {checker:?}; requests {:?}",
                self.reqs
            )),
        }
    }

    /// The checks every raw call ends with; `may_corrupt` calls may leave a corruption that
    /// the checker must report (the world then starts over).
    fn after(&mut self, before: RawSnapshot, ok: bool, may_corrupt: bool, op: &Op) {
        if !ok {
            assert_eq!(
                self.snapshot(),
                before,
                "a refused {op:?} changed the state"
            );
            return;
        }
        self.alloc.check().unwrap();
        check_radix(&self.tree).unwrap();
        let clean = self
            .verdicts()
            .unwrap_or_else(|error| panic!("{op:?}: {error}"));
        assert!(clean || may_corrupt, "{op:?} corrupted the state silently");
        if !clean {
            CAUGHT.fetch_add(1, Ordering::Relaxed);
            *self = RawWorld::new(self.page_size);
            return;
        }
        for (node, key) in &self.locks {
            let hit = self.tree.match_prefix(key);
            assert_eq!(
                hit.len,
                key.len(),
                "{op:?}: locked key of {node} not cached"
            );
        }
        let held = self.held_rows.len();
        assert_eq!(self.rows.available_size() + held, ROWS, "{op:?}");
        assert!(self.held_rows.iter().all(|&row| self.rows.is_held(row)));
    }

    fn last_slot(&self, who: usize) -> Option<KvSlot> {
        self.reqs.get(who).and_then(|slots| slots.last().copied())
    }

    pub(super) fn run(&mut self, op: &Op) -> bool {
        let before = self.snapshot();
        let page_size = self.page_size;
        let (ok, may_corrupt) = match *op {
            Op::RawExtend { who, len, foreign } => {
                let (prefix_len, own) = match self.reqs.get(who) {
                    Some(slots) => (slots.len(), slots.last().copied()),
                    None => (0, None),
                };
                let foreign_last = foreign
                    .and_then(|f| self.last_slot(f))
                    .filter(|_| own.is_some());
                let shape = ExtendShape {
                    prefix_len,
                    seq_len: prefix_len + len,
                    last_loc: foreign_last.or(own),
                };
                let mut out = Vec::new();
                let ok = self.alloc.alloc_extend(&[shape], &mut out).is_ok();
                if ok {
                    match self.reqs.get_mut(who) {
                        Some(slots) => slots.extend(out),
                        None => self.reqs.push(out),
                    }
                }
                (ok, foreign_last.is_some())
            }
            Op::RawDecode { who, foreign } => {
                let who = who % self.reqs.len().max(1);
                let Some(own) = self.last_slot(who) else {
                    return false;
                };
                let foreign_last = foreign.and_then(|f| self.last_slot(f));
                let shape = DecodeShape {
                    seq_len: self.reqs[who].len() + 1,
                    last_loc: foreign_last.unwrap_or(own),
                };
                let mut out = Vec::new();
                let ok = self.alloc.alloc_decode(&[shape], &mut out).is_ok();
                if ok {
                    self.reqs[who].extend(out);
                }
                (ok, foreign_last.is_some())
            }
            Op::RawStale { who, extend } => {
                let who = who % self.reqs.len().max(1);
                let Some(slots) = self.reqs.get(who) else {
                    return false;
                };
                // The slot before the last, when it lies in the last one's page.
                let len = slots.len();
                let Some(&earlier) = slots.len().checked_sub(2).and_then(|i| slots.get(i)) else {
                    return false;
                };
                if earlier as usize / page_size != slots[len - 1] as usize / page_size {
                    return false;
                }
                let mut out = Vec::new();
                let result = match extend {
                    true => self.alloc.alloc_extend(
                        &[ExtendShape {
                            prefix_len: len - 1,
                            seq_len: len,
                            last_loc: Some(earlier),
                        }],
                        &mut out,
                    ),
                    false => self.alloc.alloc_decode(
                        &[DecodeShape {
                            seq_len: len,
                            last_loc: earlier,
                        }],
                        &mut out,
                    ),
                };
                // A request whose slots start mid-page (a malformed shape's, kept) may fail the
                // offset check first; any other is refused for the stale slot.
                let aligned = (earlier as usize + 1) % page_size == (len - 1) % page_size;
                assert!(
                    match aligned {
                        true => matches!(result, Err(AllocError::LastLocNotLatest { .. })),
                        false => result.is_err(),
                    },
                    "{op:?}: a stale last_loc gave {result:?} (it would hand out slot {})",
                    slots[len - 1]
                );
                (false, false)
            }
            Op::RawBadShape { kind, who, value } => {
                let len = self.reqs.get(who).map_or(0, Vec::len);
                let last = self.last_slot(who).unwrap_or(0);
                let mut out = Vec::new();
                let slot = value as KvSlot;
                let result = match kind {
                    0 => self.alloc.alloc_extend(
                        &[ExtendShape {
                            prefix_len: value,
                            seq_len: value / 2,
                            last_loc: Some(slot),
                        }],
                        &mut out,
                    ),
                    1 => self.alloc.alloc_extend(
                        &[ExtendShape {
                            prefix_len: len.max(1),
                            seq_len: len + 2,
                            last_loc: None,
                        }],
                        &mut out,
                    ),
                    2 => self.alloc.alloc_extend(
                        &[ExtendShape {
                            prefix_len: 0,
                            seq_len: 2,
                            last_loc: Some(slot),
                        }],
                        &mut out,
                    ),
                    3 => self.alloc.alloc_extend(
                        &[ExtendShape {
                            prefix_len: len,
                            seq_len: len + 1,
                            last_loc: Some(slot),
                        }],
                        &mut out,
                    ),
                    4 => self.alloc.alloc_extend(
                        &[ExtendShape {
                            prefix_len: len,
                            seq_len: value,
                            last_loc: Some(last),
                        }],
                        &mut out,
                    ),
                    5 => self.alloc.alloc_decode(
                        &[DecodeShape {
                            seq_len: value,
                            last_loc: last,
                        }],
                        &mut out,
                    ),
                    6 => self.alloc.alloc_decode(
                        &[DecodeShape {
                            seq_len: len + 1,
                            last_loc: slot,
                        }],
                        &mut out,
                    ),
                    // The same request twice in one batch.
                    _ => self.alloc.alloc_decode(
                        &[
                            DecodeShape {
                                seq_len: len + 1,
                                last_loc: last,
                            },
                            DecodeShape {
                                seq_len: len + 1,
                                last_loc: last,
                            },
                        ],
                        &mut out,
                    ),
                };
                // Slots handed out to no request's account are given back at once.
                if result.is_ok() && !out.is_empty() {
                    self.reqs.push(out);
                }
                (result.is_ok(), true)
            }
            Op::RawFree { who, by_pages } => {
                let who = who % self.reqs.len().max(1);
                let Some(slots) = self.reqs.get(who).cloned() else {
                    return false;
                };
                let result = if by_pages {
                    let mut pages: Vec<PageId> =
                        slots.iter().map(|&s| s / page_size as KvSlot).collect();
                    pages.dedup();
                    self.alloc.free_page_ids(&pages, FreeOrder::Given)
                } else {
                    self.alloc.free(&slots)
                };
                if result.is_ok() {
                    self.reqs.remove(who);
                    self.freed.extend(slots);
                }
                (result.is_ok(), false)
            }
            Op::RawFreeBad { kind, value } => {
                let slot = match kind {
                    0 => self
                        .freed
                        .get(value % self.freed.len().max(1))
                        .copied()
                        .unwrap_or(1),
                    1 => (value % page_size) as KvSlot,
                    2 => ((RAW_PAGES + 1) * page_size).wrapping_add(value) as KvSlot,
                    3 => KvSlot::MAX,
                    _ => value as KvSlot,
                };
                let result = match kind {
                    4 => self
                        .alloc
                        .free_page_ids(&[value as PageId], FreeOrder::Given),
                    5 => self.alloc.free(&[]),
                    _ => self.alloc.free(&[slot]),
                };
                // A freed slot may have been handed out again: freeing it then is a free behind
                // its holder's back, which the allocator cannot tell from the holder's own.
                (result.is_ok(), true)
            }
            Op::RawAlloc { tokens } => {
                let mut out = Vec::new();
                let ok = self.alloc.alloc(tokens, &mut out).is_ok();
                if ok && !out.is_empty() {
                    self.reqs.push(out);
                }
                (ok, false)
            }
            Op::RawGroup {
                explicit_commit,
                nested,
                free,
            } => {
                let mut group = self.alloc.free_group().unwrap();
                if nested {
                    let inside = (*group).clone();
                    assert!(group.free_group().is_err(), "nested group");
                    assert_eq!(*group, inside);
                }
                if let Some(who) = free.filter(|&who| who < self.reqs.len()) {
                    let slots = self.reqs.remove(who);
                    group.free(&slots).unwrap();
                    assert!(PageLedger::new(&*group).is_err(), "checked in a group");
                }
                if explicit_commit {
                    group.commit();
                }
                (true, false)
            }
            Op::Donate {
                who,
                reuse_key,
                checked,
            } => {
                let who = who % self.reqs.len().max(1);
                let Some(slots) = self.reqs.get(who).cloned() else {
                    return false;
                };
                let whole = slots.len() / page_size * page_size;
                let key: Vec<u32> = match self.keys.iter().find(|k| reuse_key && k.len() >= whole) {
                    Some(key) => key[..whole].to_vec(),
                    None => {
                        let start = self.next_token;
                        self.next_token += whole as u32;
                        (start..start + whole as u32).collect()
                    }
                };
                let result = if checked {
                    self.tree.insert(
                        Insert::new(&key, &slots[..whole])
                            .from(TreePos::ROOT)
                            .allocated_in(&self.alloc),
                    )
                } else {
                    self.tree.insert(Insert::new(&key, &slots[..whole]))
                };
                let Ok(outcome) = result else {
                    return self.finish(before, false, false, op);
                };
                // The caller frees its duplicates and its partial tail.
                self.alloc.free(&slots[..outcome.prefix_len]).unwrap();
                self.alloc.free(&slots[whole..]).unwrap();
                self.reqs.remove(who);
                self.nodes.push((outcome.last_node, key.clone()));
                self.keys.push(key);
                (true, false)
            }
            Op::ForeignInsert { page, checked } => {
                let first = page * page_size as KvSlot;
                let slots: Vec<KvSlot> = (first..first + page_size as KvSlot).collect();
                let start = self.next_token;
                self.next_token += page_size as u32;
                let key: Vec<u32> = (start..start + page_size as u32).collect();
                let result = if checked {
                    self.tree.insert(
                        Insert::new(&key, &slots)
                            .from(TreePos::ROOT)
                            .allocated_in(&self.alloc),
                    )
                } else {
                    self.tree.insert(Insert::new(&key, &slots))
                };
                if let Ok(outcome) = &result {
                    self.nodes.push((outcome.last_node, key));
                }
                (result.is_ok(), true)
            }
            Op::TreeLock { pick } => {
                let (node, key) = self.nodes[pick % self.nodes.len()].clone();
                let ok = self.tree.inc_lock_ref(node).is_ok();
                if ok && node != NodeId::ROOT {
                    self.locks.push((node, key));
                }
                (ok, false)
            }
            Op::TreeUnlock { pick } => {
                let (node, _) = self.nodes[pick % self.nodes.len()].clone();
                let ok = self.tree.dec_lock_ref(node).is_ok();
                if ok && node != NodeId::ROOT {
                    let held = self.locks.iter().position(|(locked, _)| *locked == node);
                    let held = held.unwrap_or_else(|| panic!("unlocked {node}, never locked"));
                    self.locks.remove(held);
                }
                (ok, false)
            }
            Op::TreeEvict { tokens } => (self.tree.evict(tokens, &mut self.alloc).is_ok(), false),
            Op::RowsAlloc { count } => match self.rows.alloc(count) {
                Ok(rows) => {
                    assert_eq!(rows.len(), count);
                    self.held_rows.extend(rows);
                    (true, false)
                }
                Err(_) => (false, false),
            },
            Op::RowsFree { pick } => {
                let row = self.pick_row(pick);
                let ok = self.rows.free(row).is_ok();
                if ok {
                    let held = self.held_rows.iter().position(|&r| r == row);
                    self.held_rows
                        .remove(held.expect("freed a row nobody held"));
                }
                (ok, false)
            }
            Op::RowsWrite { pick, start, len } => {
                let row = self.pick_row(pick);
                let ok = self.rows.write(row, start, &vec![7; len]).is_ok();
                assert!(
                    !ok || self.held_rows.contains(&row),
                    "wrote row {row}, not held"
                );
                (ok, false)
            }
            Op::Construct { which, a, b } => {
                construct(which, a, b);
                (true, false)
            }
            _ => unreachable!("not a raw call: {op:?}"),
        };
        self.finish(before, ok, may_corrupt, op)
    }

    fn finish(&mut self, before: RawSnapshot, ok: bool, may_corrupt: bool, op: &Op) -> bool {
        self.after(before, ok, may_corrupt, op);
        ok
    }

    /// A held row, or one nobody holds (freed, padding, out of range).
    fn pick_row(&self, pick: usize) -> ReqRow {
        if pick.is_multiple_of(2) && !self.held_rows.is_empty() {
            return self.held_rows[pick / 2 % self.held_rows.len()];
        }
        [0, 1, ROWS, ROWS + 1, usize::MAX][pick % 5]
    }
}

/// Calls a constructor with edge sizes: nothing aborts or panics. Sizes whose bookkeeping the
/// arithmetic does not refuse are kept small, so that the fuzzer takes no real memory (the
/// host's refusal is tested under `ulimit` in `misuse.rs`).
fn construct(which: u8, a: usize, b: usize) {
    const SMALL: usize = 1 << 16;
    let refused_by_arithmetic =
        |pages: usize, page_size: usize| (pages as u128 + 1) * page_size as u128 > u32::MAX as u128;
    match which {
        0 if b == 0 || a / b <= SMALL || refused_by_arithmetic(a / b, b) => {
            if let Ok(alloc) = PagedAllocator::new(a, b, false) {
                assert_eq!(alloc.capacity(), a / b * b);
                alloc.check().unwrap();
            }
            let exact = PagedAllocator::new_exact(a, b, false);
            assert!(exact.is_err() || (b != 0 && a.is_multiple_of(b)));
        }
        1 if a <= SMALL || refused_by_arithmetic(a, 1) => {
            if let Ok(alloc) = TokenAllocator::new(a, true) {
                assert_eq!(alloc.capacity(), a);
            }
        }
        2 => {
            // Rows and entries small, or a table (or its rows' bookkeeping) past the address
            // space.
            let entries = (a as u128 + 1) * b as u128;
            let small = a <= SMALL && entries <= SMALL as u128;
            let past =
                a == usize::MAX || (a as u128 + 1) * (b as u128).max(16) > isize::MAX as u128;
            if (small || past)
                && let Ok(rows) = ReqToTokenPool::new(a, b)
            {
                assert_eq!(rows.available_size(), a);
            }
        }
        3 => assert_eq!(
            RadixCache::new(RadixConfig::new(a)).is_ok(),
            a != 0 && a <= KvSlot::MAX as usize / 2
        ),
        4 => {
            assert!(Req::try_new(a as u64, Vec::new()).is_err());
            assert!(Req::try_new(a as u64, vec![b as u32]).is_ok());
        }
        _ => {}
    }
}
