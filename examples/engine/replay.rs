//! `--cache-events`: the router's side of the prefix cache's event stream. A router that sends
//! each request to the replica holding its prefix keeps, per replica, the set of page hashes
//! the replica caches, by replaying the replica's events; [`CacheReplay`] is that set, checked
//! as it is kept (every stored page's hash chains from its parent's over its tokens, and no
//! event names a page the set does not hold, or stores one it does).

use std::collections::HashMap;

use kvown::alloc::PageId;
use kvown::radix::{CacheEvent, PageHash};
use serde::Serialize;

/// What a replay has applied: events, and the pages they stored and removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct EventCounts {
    /// Events applied (`Cleared` included).
    pub events: u64,
    /// Pages named by `Stored` events.
    pub pages_stored: u64,
    /// Pages named by `Removed` events.
    pub pages_removed: u64,
}

/// The page hashes one replica holds according to its event stream, each with the page id the
/// stream named for it.
#[derive(Debug, Default)]
pub struct CacheReplay {
    held: HashMap<PageHash, PageId>,
    counts: EventCounts,
}

impl CacheReplay {
    /// The hashes held, with their page ids.
    pub fn held(&self) -> &HashMap<PageHash, PageId> {
        &self.held
    }

    /// What has been applied so far.
    pub fn counts(&self) -> EventCounts {
        self.counts
    }

    /// Applies `events` in order. Fails, naming the event, when one cannot be a faithful
    /// stream's: a `Stored` whose parent is not held, whose page hashes do not chain from the
    /// parent's (or the namespace's seed) over its tokens, or that stores a hash already held;
    /// a `Removed` of a hash not held. Events before the failing one stay applied.
    pub fn apply(&mut self, events: impl IntoIterator<Item = CacheEvent>) -> Result<(), String> {
        for event in events {
            self.counts.events += 1;
            let number = self.counts.events;
            match event {
                CacheEvent::Stored {
                    namespace,
                    parent_hash,
                    pages,
                    tokens,
                } => {
                    let mut hash = match parent_hash {
                        None => PageHash::seed(namespace),
                        Some(parent) if self.held.contains_key(&parent) => parent,
                        Some(parent) => {
                            return Err(format!(
                                "cache event {number}: stores pages below {parent}, which the \
                                 replica does not hold"
                            ));
                        }
                    };
                    for page in pages {
                        hash = hash.chain(&tokens[page.tokens.clone()]);
                        if page.hash != hash {
                            return Err(format!(
                                "cache event {number}: page {} is named {} but its tokens and \
                                 parent hash to {hash}",
                                page.page, page.hash
                            ));
                        }
                        if self.held.insert(hash, page.page).is_some() {
                            return Err(format!(
                                "cache event {number}: stores {hash} (page {}), already held",
                                page.page
                            ));
                        }
                        self.counts.pages_stored += 1;
                    }
                }
                CacheEvent::Removed { hashes } => {
                    for hash in hashes {
                        if self.held.remove(&hash).is_none() {
                            return Err(format!(
                                "cache event {number}: removes {hash}, which the replica does \
                                 not hold"
                            ));
                        }
                        self.counts.pages_removed += 1;
                    }
                }
                CacheEvent::Cleared => self.held.clear(),
            }
        }
        Ok(())
    }

    /// Fails unless this replay holds exactly the hashes and page ids of `expected`, naming the
    /// first differences.
    pub fn compare(&self, expected: &CacheReplay) -> Result<(), String> {
        let describe = |from: &CacheReplay, against: &CacheReplay| {
            let mut extra: Vec<String> = from
                .held
                .iter()
                .filter(|&(hash, page)| against.held.get(hash) != Some(page))
                .map(|(hash, page)| format!("{hash} (page {page})"))
                .collect();
            extra.sort_unstable();
            let count = extra.len();
            extra.truncate(3);
            (count, extra.join(", "))
        };
        let (extra, extra_named) = describe(self, expected);
        let (missing, missing_named) = describe(expected, self);
        if extra + missing == 0 {
            return Ok(());
        }
        Err(format!(
            "the replayed cache events disagree with the tree: {extra} replayed pages the tree \
             does not hold [{extra_named}], {missing} tree pages not replayed [{missing_named}]"
        ))
    }
}

#[cfg(test)]
mod tests {
    use kvown::alloc::{PagedAllocator, SlotCalls};
    use kvown::radix::{Insert, Namespace, RadixCache, RadixConfig};

    use super::*;

    /// A cache of pages of 4 with events on, holding `[1..=8]` (two pages) and `[1..=4, 9..=12]`
    /// (a page more below the first), the events that stored them, and the ids of the pages of
    /// `1..=4`, `5..=8` and `9..=12`.
    fn cache_with_two_keys() -> (RadixCache, PagedAllocator, Vec<CacheEvent>, [PageId; 3]) {
        let mut allocator = PagedAllocator::new(64, 4, false).unwrap();
        let mut tree = RadixCache::new(RadixConfig::new(4)).unwrap();
        tree.enable_events();
        let mut slots = Vec::new();
        allocator.alloc(12, &mut slots).unwrap();
        tree.insert(Insert::new(&[1, 2, 3, 4, 5, 6, 7, 8], &slots[..8]))
            .unwrap();
        let branch = [&slots[..4], &slots[8..]].concat();
        tree.insert(Insert::new(&[1, 2, 3, 4, 9, 10, 11, 12], &branch))
            .unwrap();
        let events = tree.take_events();
        let pages = [0, 4, 8].map(|slot| slots[slot] / 4);
        (tree, allocator, events, pages)
    }

    fn replayed(events: Vec<CacheEvent>) -> Result<CacheReplay, String> {
        let mut replay = CacheReplay::default();
        replay.apply(events)?;
        Ok(replay)
    }

    #[test]
    fn a_faithful_stream_replays_to_the_hashes_of_the_cached_pages() {
        let (mut tree, mut allocator, events, [first, second, branch]) = cache_with_two_keys();
        let mut replay = replayed(events).unwrap();
        let expected: HashMap<PageHash, PageId> =
            [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 10, 11, 12]]
                .iter()
                .flat_map(|key| PageHash::of_pages(Namespace::DEFAULT, key, 4).collect::<Vec<_>>())
                .zip([first, second, first, branch])
                .collect();
        assert_eq!(replay.held(), &expected);
        assert_eq!(
            replay.counts(),
            EventCounts {
                events: 3,
                pages_stored: 3,
                pages_removed: 0
            }
        );
        tree.evict(12, &mut allocator).unwrap();
        replay.apply(tree.take_events()).unwrap();
        assert!(replay.held().is_empty());
        assert_eq!(replay.counts().pages_removed, 3);
    }

    #[test]
    fn a_stream_that_cannot_be_the_caches_is_refused() {
        let (_, _, events, _) = cache_with_two_keys();
        let CacheEvent::Stored { pages, .. } = &events[1] else {
            panic!("{events:?}")
        };
        let first = pages[0].hash;
        let mut tampered = events.clone();
        let CacheEvent::Stored { tokens, .. } = &mut tampered[1] else {
            unreachable!()
        };
        tokens[7] ^= 1;
        let error = replayed(tampered).unwrap_err();
        assert!(
            error.contains("cache event 2: page") && error.contains("hash to"),
            "{error}"
        );
        // The second key's branch below a parent that was never stored.
        let error = replayed(vec![events[0].clone(), events[2].clone()]).unwrap_err();
        assert!(error.contains("which the replica does not hold"), "{error}");
        let twice = [events.clone(), vec![events[2].clone()]].concat();
        let error = replayed(twice).unwrap_err();
        assert!(error.contains("already held"), "{error}");
        let removed_twice = [
            events.clone(),
            vec![CacheEvent::Removed {
                hashes: vec![first, first],
            }],
        ]
        .concat();
        let error = replayed(removed_twice).unwrap_err();
        assert!(error.contains("removes"), "{error}");
        // After a restart the same pages may be stored again.
        let restarted = [events.clone(), vec![CacheEvent::Cleared], events].concat();
        assert_eq!(replayed(restarted).unwrap().held().len(), 3);
    }

    #[test]
    fn the_comparison_names_pages_on_either_side() {
        let (_, _, events, _) = cache_with_two_keys();
        let whole = replayed(events.clone()).unwrap();
        assert_eq!(whole.compare(&whole), Ok(()));
        let part = replayed(events[..2].to_vec()).unwrap();
        let error = whole.compare(&part).unwrap_err();
        assert!(
            error.contains("1 replayed pages the tree does not hold"),
            "{error}"
        );
        assert!(error.contains("0 tree pages not replayed"), "{error}");
        let error = part.compare(&whole).unwrap_err();
        assert!(error.contains("1 tree pages not replayed"), "{error}");
        // The same hashes under other page ids differ too.
        let mut moved = replayed(events).unwrap();
        moved.held.values_mut().for_each(|page| *page += 1);
        let error = moved.compare(&whole).unwrap_err();
        assert!(
            error.contains("3 replayed pages the tree does not hold"),
            "{error}"
        );
    }
}
