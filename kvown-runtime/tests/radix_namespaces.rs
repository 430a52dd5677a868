//! Namespaces of the radix prefix cache: the same tokens cached in two namespaces are two
//! entries, a match or an insert never crosses from one namespace to another, and eviction,
//! splits and the checker treat every namespace's paths alike.

#[path = "common/radix_setup.rs"]
mod radix_setup;

use kvown_runtime::alloc::{KvAllocator, SlotCalls};
use kvown_runtime::radix::{Namespace, RadixCache, RadixError, TreePos};
use radix_setup::{alloc_slots, allocator, key, path_slots};

const PAGE_SIZES: [usize; 3] = [1, 4, 16];
const ADAPTER_A: Namespace = Namespace(1);
const ADAPTER_B: Namespace = Namespace(2);

#[test]
fn the_same_tokens_in_two_namespaces_are_two_entries_matched_apart() {
    for ps in PAGE_SIZES {
        let mut alloc = allocator(ps, 16);
        let mut cache = RadixCache::new(ps);
        let prompt = key(ps, 3, 100);
        let default_slots = alloc_slots(&mut alloc, prompt.len());
        let a_slots = alloc_slots(&mut alloc, prompt.len());
        assert_eq!(cache.insert(&prompt, &default_slots).unwrap().prefix_len, 0);
        // Nothing of the default namespace's copy counts as cached in adapter A's.
        let a = cache.insert_in(ADAPTER_A, &prompt, &a_slots).unwrap();
        assert_eq!(a.prefix_len, 0, "page size {ps}");
        cache.check().unwrap();
        assert_eq!(cache.total_size(), 2 * prompt.len());

        for (namespace, slots) in [(Namespace::DEFAULT, &default_slots), (ADAPTER_A, &a_slots)] {
            let hit = cache.match_prefix_in(namespace, &prompt);
            assert_eq!(hit.len, prompt.len(), "{namespace}, page size {ps}");
            assert_eq!(&path_slots(&cache, hit), slots, "{namespace}'s own slots");
        }
        assert_eq!(
            cache.match_prefix(&prompt),
            cache.match_prefix_in(Namespace::DEFAULT, &prompt)
        );
        assert_eq!(cache.match_prefix_in(ADAPTER_B, &prompt), TreePos::ROOT);
        cache.check().unwrap();
    }
}

#[test]
fn a_shared_first_page_splits_only_within_its_namespace() {
    for ps in PAGE_SIZES {
        let mut alloc = allocator(ps, 16);
        let mut cache = RadixCache::new(ps);
        let first = key(ps, 2, 0);
        let mut second = key(ps, 1, 0);
        second.extend(key(ps, 1, 500));
        let first_slots = alloc_slots(&mut alloc, first.len());
        cache.insert_in(ADAPTER_A, &first, &first_slots).unwrap();
        // In adapter B the shared first page is new: no split, a second entry.
        let b_slots = alloc_slots(&mut alloc, second.len());
        assert_eq!(
            cache
                .insert_in(ADAPTER_B, &second, &b_slots)
                .unwrap()
                .prefix_len,
            0
        );
        // In adapter A it is cached: the first entry splits after it.
        let a_slots = alloc_slots(&mut alloc, second.len());
        let outcome = cache.insert_in(ADAPTER_A, &second, &a_slots).unwrap();
        assert_eq!(outcome.prefix_len, ps, "page size {ps}");
        alloc.free_segment(&a_slots[..ps], 0).unwrap();
        cache.check().unwrap();

        let hit = cache.match_prefix_in(ADAPTER_A, &second);
        assert_eq!(hit.len, 2 * ps);
        let mut expected = first_slots[..ps].to_vec();
        expected.extend_from_slice(&a_slots[ps..]);
        assert_eq!(
            path_slots(&cache, hit),
            expected,
            "A's shared page, then its own"
        );
        let hit = cache.match_prefix_in(ADAPTER_B, &first);
        assert_eq!(hit.len, ps, "B shares its first page with nothing of A's");
        assert_eq!(path_slots(&cache, hit), b_slots[..ps]);
    }
}

#[test]
fn insert_from_in_continues_a_position_of_its_namespace_and_refuses_another() {
    let ps = 4;
    let mut alloc = allocator(ps, 16);
    let mut cache = RadixCache::new(ps);
    let prompt = key(ps, 3, 7);
    let slots = alloc_slots(&mut alloc, prompt.len());
    // An empty match is the root of every namespace: the insert says which.
    let empty = cache.match_prefix_in(ADAPTER_A, &prompt);
    assert_eq!(empty, TreePos::ROOT);
    let node = cache
        .insert_from_in(ADAPTER_A, empty, &prompt[..ps], &slots[..ps])
        .unwrap()
        .last_node;
    cache.inc_lock_ref(node).unwrap();
    let from = TreePos { node, len: ps };
    // Continuing A's node in another namespace is refused, changing nothing.
    for (namespace, error) in [
        (Namespace::DEFAULT, cache.insert_from(from, &prompt, &slots)),
        (
            ADAPTER_B,
            cache.insert_from_in(ADAPTER_B, from, &prompt, &slots),
        ),
    ] {
        assert_eq!(
            error,
            Err(RadixError::NamespaceMismatch {
                node,
                node_namespace: ADAPTER_A,
                namespace,
            })
        );
        let message = error.unwrap_err().to_string();
        assert!(
            message.contains(&format!("insert in namespace {}", namespace.0))
                && message.contains("which is in namespace 1")
                && message.contains("insert_from_in"),
            "{message}"
        );
    }
    assert_eq!(cache.total_size(), ps);
    cache.check().unwrap();
    let outcome = cache
        .insert_from_in(ADAPTER_A, from, &prompt[..2 * ps], &slots[..2 * ps])
        .unwrap();
    assert_eq!(outcome.prefix_len, ps);
    cache.check().unwrap();
    assert_eq!(cache.match_prefix_in(ADAPTER_A, &prompt).len, 2 * ps);
    assert_eq!(
        cache.match_prefix(&prompt),
        TreePos::ROOT,
        "nothing in the default one"
    );
}

#[test]
fn eviction_takes_leaves_of_every_namespace_in_lru_order() {
    let ps = 4;
    let mut alloc = allocator(ps, 8);
    let mut cache = RadixCache::new(ps);
    let prompt = key(ps, 2, 0);
    for namespace in [ADAPTER_A, ADAPTER_B, Namespace::DEFAULT] {
        let slots = alloc_slots(&mut alloc, prompt.len());
        cache.insert_in(namespace, &prompt, &slots).unwrap();
    }
    // Touch A's copy: B's is now the least recently used.
    cache.match_prefix_in(ADAPTER_A, &prompt);
    assert_eq!(cache.evict(1, &mut alloc).unwrap(), prompt.len());
    cache.check().unwrap();
    assert_eq!(cache.match_prefix_in(ADAPTER_B, &prompt), TreePos::ROOT);
    assert_eq!(cache.match_prefix_in(ADAPTER_A, &prompt).len, prompt.len());
    assert_eq!(cache.match_prefix(&prompt).len, prompt.len());
    // Evicting everything gives every page back.
    cache.evict(usize::MAX, &mut alloc).unwrap();
    assert_eq!(cache.total_size(), 0);
    assert_eq!(alloc.available_size(), alloc.capacity());
    cache.check().unwrap();
}
