//! Namespaces of the radix prefix cache: the same tokens cached in two namespaces are two
//! entries, a match or an insert never crosses from one namespace to another, and eviction,
//! splits and the checker treat every namespace's paths alike.

use crate::common::radix_setup;

use kvown_runtime::alloc::{KvAllocator, SlotCalls};
use kvown_runtime::check::check_radix;
use kvown_runtime::radix::{Insert, Namespace, RadixCache, RadixConfig, RadixError, TreePos};
use radix_setup::{alloc_slots, allocator, key, path_slots};

const PAGE_SIZES: [usize; 3] = [1, 4, 16];
const ADAPTER_A: Namespace = Namespace(1);
const ADAPTER_B: Namespace = Namespace(2);

#[test]
fn the_same_tokens_in_two_namespaces_are_two_entries_matched_apart() {
    for ps in PAGE_SIZES {
        let mut alloc = allocator(ps, 16);
        let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
        let prompt = key(ps, 3, 100);
        let default_slots = alloc_slots(&mut alloc, prompt.len());
        let a_slots = alloc_slots(&mut alloc, prompt.len());
        assert_eq!(
            cache
                .insert(Insert::new(&prompt, &default_slots))
                .unwrap()
                .prefix_len,
            0
        );
        // Nothing of the default namespace's copy counts as cached in adapter A's.
        let a = cache
            .insert(Insert::new(ADAPTER_A.key(&prompt), &a_slots))
            .unwrap();
        assert_eq!(a.prefix_len, 0, "page size {ps}");
        check_radix(&cache).unwrap();
        assert_eq!(cache.sizes().total(), 2 * prompt.len());

        for (namespace, slots) in [(Namespace::DEFAULT, &default_slots), (ADAPTER_A, &a_slots)] {
            let hit = cache.match_prefix(namespace.key(&prompt));
            assert_eq!(hit.len, prompt.len(), "{namespace}, page size {ps}");
            assert_eq!(&path_slots(&cache, hit), slots, "{namespace}'s own slots");
        }
        assert_eq!(cache.match_prefix(&prompt), cache.match_prefix(&prompt));
        assert_eq!(cache.match_prefix(ADAPTER_B.key(&prompt)), TreePos::ROOT);
        check_radix(&cache).unwrap();
    }
}

#[test]
fn a_shared_first_page_splits_only_within_its_namespace() {
    for ps in PAGE_SIZES {
        let mut alloc = allocator(ps, 16);
        let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
        let first = key(ps, 2, 0);
        let mut second = key(ps, 1, 0);
        second.extend(key(ps, 1, 500));
        let first_slots = alloc_slots(&mut alloc, first.len());
        cache
            .insert(Insert::new(ADAPTER_A.key(&first), &first_slots))
            .unwrap();
        // In adapter B the shared first page is new: no split, a second entry.
        let b_slots = alloc_slots(&mut alloc, second.len());
        assert_eq!(
            cache
                .insert(Insert::new(ADAPTER_B.key(&second), &b_slots))
                .unwrap()
                .prefix_len,
            0
        );
        // In adapter A it is cached: the first entry splits after it.
        let a_slots = alloc_slots(&mut alloc, second.len());
        let outcome = cache
            .insert(Insert::new(ADAPTER_A.key(&second), &a_slots))
            .unwrap();
        assert_eq!(outcome.prefix_len, ps, "page size {ps}");
        alloc.free_segment(&a_slots[..ps], 0).unwrap();
        check_radix(&cache).unwrap();

        let hit = cache.match_prefix(ADAPTER_A.key(&second));
        assert_eq!(hit.len, 2 * ps);
        let mut expected = first_slots[..ps].to_vec();
        expected.extend_from_slice(&a_slots[ps..]);
        assert_eq!(
            path_slots(&cache, hit),
            expected,
            "A's shared page, then its own"
        );
        let hit = cache.match_prefix(ADAPTER_B.key(&first));
        assert_eq!(hit.len, ps, "B shares its first page with nothing of A's");
        assert_eq!(path_slots(&cache, hit), b_slots[..ps]);
    }
}

#[test]
fn an_insert_continues_a_position_of_its_namespace_and_refuses_another() {
    let ps = 4;
    let mut alloc = allocator(ps, 16);
    let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
    let prompt = key(ps, 3, 7);
    let slots = alloc_slots(&mut alloc, prompt.len());
    // An empty match is the root of every namespace: the insert says which.
    let empty = cache.match_prefix(ADAPTER_A.key(&prompt));
    assert_eq!(empty, TreePos::ROOT);
    let node = cache
        .insert(Insert::new(ADAPTER_A.key(&prompt[..ps]), &slots[..ps]).from(empty))
        .unwrap()
        .last_node;
    cache.inc_lock_ref(node).unwrap();
    let from = TreePos { node, len: ps };
    // Continuing A's node in another namespace is refused, changing nothing.
    for (namespace, error) in [
        (
            Namespace::DEFAULT,
            cache.insert(Insert::new(&prompt, &slots).from(from)),
        ),
        (
            ADAPTER_B,
            cache.insert(Insert::new(ADAPTER_B.key(&prompt), &slots).from(from)),
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
                && message.contains("namespace.key"),
            "{message}"
        );
    }
    assert_eq!(cache.sizes().total(), ps);
    check_radix(&cache).unwrap();
    let outcome = cache
        .insert(Insert::new(ADAPTER_A.key(&prompt[..2 * ps]), &slots[..2 * ps]).from(from))
        .unwrap();
    assert_eq!(outcome.prefix_len, ps);
    check_radix(&cache).unwrap();
    assert_eq!(cache.match_prefix(ADAPTER_A.key(&prompt)).len, 2 * ps);
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
    let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
    let prompt = key(ps, 2, 0);
    for namespace in [ADAPTER_A, ADAPTER_B, Namespace::DEFAULT] {
        let slots = alloc_slots(&mut alloc, prompt.len());
        cache
            .insert(Insert::new(namespace.key(&prompt), &slots))
            .unwrap();
    }
    // Touch A's copy: B's is now the least recently used.
    cache.match_prefix(ADAPTER_A.key(&prompt));
    assert_eq!(cache.evict(1, &mut alloc).unwrap(), prompt.len());
    check_radix(&cache).unwrap();
    assert_eq!(cache.match_prefix(ADAPTER_B.key(&prompt)), TreePos::ROOT);
    assert_eq!(cache.match_prefix(ADAPTER_A.key(&prompt)).len, prompt.len());
    assert_eq!(cache.match_prefix(&prompt).len, prompt.len());
    // Evicting everything gives every page back.
    cache.evict(usize::MAX, &mut alloc).unwrap();
    assert_eq!(cache.sizes().total(), 0);
    assert_eq!(alloc.available_size(), alloc.capacity());
    check_radix(&cache).unwrap();
}
