//! Misuse of the raw public API that used to corrupt state silently or abort the process
//! (issue 29): each case is now a typed error that changes nothing, or is named by the
//! checker with both holders.

use std::process::Command;

use kvown_runtime::alloc::{
    AllocError, DecodeShape, ExtendShape, KvAllocator, PageState, PagedAllocator, SlotCalls,
    TokenAllocator,
};
use kvown_runtime::batch::Req;
use kvown_runtime::batch::init_next_round_input;
use kvown_runtime::batch::{
    ScheduleBatch, alloc_for_extend, alloc_for_spec_decode, prepare_for_extend,
    prepare_for_spec_decode, release_kv_cache,
};
use kvown_runtime::cache::{KvCache, TreeCache};
use kvown_runtime::check::check_radix;
use kvown_runtime::check::{Holder, PageLedger, Violation};
use kvown_runtime::error::KvError;
use kvown_runtime::radix::{Insert, RadixCache, RadixConfig, RadixError, TreePos};
use kvown_runtime::slots::ReqToTokenPool;

/// Request 1 extends one token into page 1; request 2's raw extend passes request 1's slot as
/// its `last_loc`, and request 1 then decodes. The allocator cannot know whose partial page it
/// is, and hands request 2 slots 5 and 6; but request 1's decode from slot 4, no longer the
/// page's last, is refused (it would be handed slot 5 too, and `check` would pass). The ledger
/// names the page and both requests.
#[test]
fn a_page_continued_by_two_requests_is_named_with_both_holders() {
    let mut allocator = PagedAllocator::new(64, 4, false).unwrap();
    let (mut first, mut second) = (Vec::new(), Vec::new());
    let fresh = ExtendShape {
        prefix_len: 0,
        seq_len: 1,
        last_loc: None,
    };
    allocator.alloc_extend(&[fresh], &mut first).unwrap();
    let foreign = ExtendShape {
        prefix_len: 1,
        seq_len: 3,
        last_loc: Some(first[0]),
    };
    allocator.alloc_extend(&[foreign], &mut second).unwrap();
    let decode = DecodeShape {
        seq_len: 2,
        last_loc: first[0],
    };
    let before = allocator.clone();
    assert_eq!(
        allocator.alloc_decode(&[decode], &mut first),
        Err(AllocError::LastLocNotLatest {
            request: 0,
            last_loc: 4,
            page: 1,
            latest: 6
        })
    );
    assert_eq!(allocator, before);
    assert_eq!(
        (first.as_slice(), second.as_slice()),
        (&[4][..], &[5, 6][..])
    );
    assert_eq!(
        allocator.check(),
        Ok(()),
        "the allocator alone cannot see whose page it is"
    );

    let mut ledger = PageLedger::new(&allocator).unwrap();
    ledger.claim_slots(Holder::Request(1), &first).unwrap();
    let twice = ledger.claim_slots(Holder::Request(2), &second).unwrap_err();
    assert_eq!(
        twice,
        Violation::PageHeldTwice {
            page: 1,
            first: Holder::Request(1),
            second: Holder::Request(2),
        }
    );
    let message = twice.to_string();
    assert!(
        message.contains("request 1") && message.contains("request 2"),
        "{message}"
    );
}

/// The ledger also finds a page held by the free list and a request, a held page nobody
/// claims, and a tree page that is not allocated, naming the node.
#[test]
fn the_ledger_names_every_kind_of_holder() {
    let mut allocator = PagedAllocator::new(64, 4, false).unwrap();
    let mut slots = Vec::new();
    allocator.alloc(8, &mut slots).unwrap();
    let free_slot = 4 * 9;
    let mut ledger = PageLedger::new(&allocator).unwrap();
    assert_eq!(
        ledger.claim_slots(Holder::Request(3), &[free_slot]),
        Err(Violation::PageHeldTwice {
            page: 9,
            first: Holder::Free,
            second: Holder::Request(3),
        })
    );
    let mut ledger = PageLedger::new(&allocator).unwrap();
    ledger.claim_slots(Holder::Request(3), &slots[..4]).unwrap();
    assert_eq!(
        ledger.finish(),
        Err(Violation::UnclaimedPages { first: 2, count: 1 })
    );

    // A plain insert trusts its caller: page 5 was never handed out.
    let mut tree = RadixCache::new(RadixConfig::new(4)).unwrap();
    let node = tree
        .insert(Insert::new(&[1, 2, 3, 4], &[20, 21, 22, 23]))
        .unwrap()
        .last_node;
    let mut ledger = PageLedger::new(&allocator).unwrap();
    ledger.claim_slots(Holder::Request(3), &slots).unwrap();
    assert_eq!(
        ledger.claim_tree(&tree),
        Err(Violation::PageHeldTwice {
            page: 5,
            first: Holder::Free,
            second: Holder::Tree(node),
        })
    );
}

/// A page nobody allocated is refused by an insert checked against the allocator
/// (`Insert::allocated_in`), changing nothing; inserted by a trusting one, it blocks eviction,
/// which the ledger explains.
#[test]
fn an_insert_of_a_never_allocated_page_is_refused() {
    let mut allocator = PagedAllocator::new(64, 4, false).unwrap();
    let mut tree = RadixCache::new(RadixConfig::new(4)).unwrap();
    let refused = tree.insert(
        Insert::new(&[1, 2, 3, 4], &[20, 21, 22, 23])
            .from(TreePos::ROOT)
            .allocated_in(&allocator),
    );
    assert_eq!(
        refused,
        Err(RadixError::PageNotAllocated {
            position: 0,
            page: 5,
            state: Some(PageState::Unused),
        })
    );
    assert_eq!(tree.sizes().total(), 0);
    assert!(
        refused
            .unwrap_err()
            .to_string()
            .contains("insert only pages")
    );

    let mut held = Vec::new();
    allocator.alloc(4, &mut held).unwrap();
    tree.insert(
        Insert::new(&[1, 2, 3, 4], &held)
            .from(TreePos::ROOT)
            .allocated_in(&allocator),
    )
    .unwrap();
    // Freed behind the tree's back: no longer allocated.
    allocator.free(&held).unwrap();
    let refused = tree.insert(
        Insert::new(
            &[1, 2, 3, 4, 5, 6, 7, 8],
            &[held.clone(), vec![8, 9, 10, 11]].concat(),
        )
        .from(TreePos::ROOT)
        .allocated_in(&allocator),
    );
    assert!(
        matches!(
            refused,
            Err(RadixError::PageCached { .. } | RadixError::PageNotAllocated { .. })
        ),
        "{refused:?}"
    );
}

/// A handle kept past its node's eviction, whose arena entry now holds another node, is
/// refused instead of locking that node.
#[test]
fn a_stale_node_id_is_refused_though_its_entry_was_reused() {
    let mut allocator = PagedAllocator::new(64, 4, false).unwrap();
    let mut tree = RadixCache::new(RadixConfig::new(4)).unwrap();
    let mut slots = Vec::new();
    allocator.alloc(4, &mut slots).unwrap();
    let stale = tree
        .insert(Insert::new(&[1, 2, 3, 4], &slots))
        .unwrap()
        .last_node;
    tree.evict(4, &mut allocator).unwrap();
    slots.clear();
    allocator.alloc(16, &mut slots).unwrap();
    let reused = tree
        .insert(Insert::new(&(10..26).collect::<Vec<u32>>(), &slots))
        .unwrap()
        .last_node;
    assert_ne!(stale, reused);
    assert_eq!(tree.sizes().protected, 0);
    for result in [
        tree.inc_lock_ref(stale),
        tree.dec_lock_ref(stale),
        tree.move_lock(stale, reused),
    ] {
        assert_eq!(result, Err(RadixError::UnknownNode { node: stale }));
    }
    assert_eq!(tree.sizes().protected, 0, "no other node was locked");
    assert_eq!(tree.sizes().evictable, 16);
    check_radix(&tree).unwrap();
}

/// `PagedAllocator::new` rounds a size down to whole pages, as documented; `new_exact`
/// refuses it and names the size to pass.
#[test]
fn a_pool_size_that_is_not_whole_pages_is_refused_by_new_exact() {
    assert_eq!(PagedAllocator::new(100, 16, false).unwrap().capacity(), 96);
    let refused = PagedAllocator::new_exact(100, 16, false).unwrap_err();
    assert_eq!(
        refused,
        AllocError::UnalignedPoolSize {
            size: 100,
            page_size: 16,
            nearest: 96
        }
    );
    assert!(
        refused.to_string().contains("pass 96 (6 pages)"),
        "{refused}"
    );
    assert_eq!(
        PagedAllocator::new_exact(10, 16, false),
        Err(AllocError::UnalignedPoolSize {
            size: 10,
            page_size: 16,
            nearest: 16
        })
    );
}

/// Set by [`huge_pools_are_typed_errors_under_a_memory_limit`] for the child it runs.
const CHILD: &str = "KVOWN_MISUSE_HUGE_POOLS";

/// Pools whose bookkeeping the host cannot hold (9 bytes a page: 18 and 36 GiB here, under a
/// 2 GiB address-space limit) are typed errors, where they aborted the process. Runs the
/// check in a child process of this test binary under `ulimit -v`, so that the outcome does
/// not depend on the machine's memory and a failure cannot take the machine's memory.
#[test]
#[cfg(target_os = "linux")]
fn huge_pools_are_typed_errors_under_a_memory_limit() {
    let exe = std::env::current_exe().unwrap();
    let output = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 2097152 && exec \"$0\" --exact misuse::huge_pools_child --ignored --test-threads 1")
        .arg(exe)
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the child failed ({:?}): {stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("1 passed"), "{stdout}");
}

/// The child of [`huge_pools_are_typed_errors_under_a_memory_limit`]; ignored in a plain run,
/// which has no memory limit, and does nothing when run by hand (`--ignored`) without it: the
/// host might then grant the memory and the test would take it.
#[test]
#[ignore = "run by huge_pools_are_typed_errors_under_a_memory_limit under ulimit -v"]
fn huge_pools_child() {
    if std::env::var_os(CHILD).is_none() {
        eprintln!("huge_pools_child: skipped, not run under the parent's memory limit");
        return;
    }
    let too_large = |result: Result<_, AllocError>| match result {
        Err(AllocError::PoolTooLarge { .. }) => {}
        other => panic!(
            "expected PoolTooLarge, got {:?}",
            other.map(|_: PagedAllocator| ())
        ),
    };
    too_large(PagedAllocator::new(u32::MAX as usize - 1, 1, false));
    too_large(PagedAllocator::new(1 << 31, 1, false));
    let token = TokenAllocator::new(1 << 31, false);
    assert!(
        matches!(token, Err(AllocError::PoolTooLarge { num_pages, .. }) if num_pages == 1 << 31),
        "{:?}",
        token.map(|_| ())
    );
    let message = PagedAllocator::new(1 << 31, 1, false)
        .unwrap_err()
        .to_string();
    assert!(message.contains("take fewer pages"), "{message}");
}

/// An extend refused because a request holds a speculative reservation ticks no request's
/// extend clock.
#[test]
fn an_extend_refused_for_a_reservation_ticks_no_clock() {
    let allocator = PagedAllocator::new(256, 4, false).unwrap();
    let rows = ReqToTokenPool::new(8, 256).unwrap();
    let mut cache = KvCache::new(allocator, rows, TreeCache::Disabled).unwrap();
    let mut req = Req::new(1, (0..5).collect());
    init_next_round_input(&mut req, &mut cache, usize::MAX).unwrap();
    let batch = alloc_for_extend(
        prepare_for_extend(ScheduleBatch::new(vec![req])),
        &mut cache,
    )
    .map_err(|failure| failure.error)
    .unwrap();
    let prepared = prepare_for_spec_decode(batch, &cache, 8)
        .map_err(|(_, error)| error)
        .unwrap();
    let mut reqs = alloc_for_spec_decode(prepared, &mut cache)
        .map_err(|failure| failure.error)
        .unwrap()
        .into_reqs();
    let mut other = Req::new(2, (0..3).collect());
    init_next_round_input(&mut other, &mut cache, usize::MAX).unwrap();
    reqs.push(other);
    let clocks: Vec<u64> = reqs.iter().map(|r| r.kv().extend_batch_idx()).collect();
    let failure =
        alloc_for_extend(prepare_for_extend(ScheduleBatch::new(reqs)), &mut cache).unwrap_err();
    assert!(
        matches!(failure.error, KvError::ReservationHeld { rid: 1, .. }),
        "{:?}",
        failure.error
    );
    let mut reqs = failure.batch.cancel().into_reqs();
    let after: Vec<u64> = reqs.iter().map(|r| r.kv().extend_batch_idx()).collect();
    assert_eq!(after, clocks);
    release_kv_cache(&mut reqs[0], &mut cache, false).unwrap();
    cache.check(&reqs).unwrap();
}
