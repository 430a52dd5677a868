//! The ownership table of the runtime: every owner site of every guarded bookkeeping field and
//! how many writes it makes. The compile-time successor of sglang's `_OWNER_SITES` test: the
//! compiler already rejects writes from non-owners; this snapshot catches an owner site that
//! was added or removed, or that changed its number of writes. Update it in the same change
//! that moves a write, and say why in the commit.

use kvown_runtime::ownership::audit::AuditTable;

/// `(struct, field, owner, writes)`. Resets to zero are counted too (sglang exempts them).
const EXPECTED: &[(&str, &str, &str, u32)] = &[
    ("ReqKvInfo", "req_pool_idx", "alloc_for_extend", 1),
    // Decode-side preallocation (sglang's `PD ::` rows, disaggregation/decode.py and
    // allocation.py): `_pre_alloc` + `alloc_for_decode_prealloc` are `prealloc_for_transfer`
    // (row, cache, allocated = fill, committed = prefix); the commit of a completed transfer
    // is `commit_transfer`, where sglang commits at preallocation already.
    ("ReqKvInfo", "req_pool_idx", "prealloc_for_transfer", 1),
    ("ReqKvInfo", "req_pool_idx", "release_kv_cache", 1),
    (
        "ReqKvInfo",
        "cache_protected_len",
        "init_next_round_input",
        1,
    ),
    (
        "ReqKvInfo",
        "cache_protected_len",
        "cache_unfinished_req",
        1,
    ),
    ("ReqKvInfo", "cache_protected_len", "reset_for_retract", 1),
    ("ReqKvInfo", "cache_protected_len", "release_kv_cache", 2),
    ("ReqKvInfo", "kv_committed_len", "alloc_for_extend", 1),
    ("ReqKvInfo", "kv_committed_len", "alloc_for_decode", 1),
    ("ReqKvInfo", "kv_committed_len", "commit_spec_tokens", 1),
    ("ReqKvInfo", "kv_committed_len", "prealloc_for_transfer", 1),
    ("ReqKvInfo", "kv_committed_len", "commit_transfer", 1),
    ("ReqKvInfo", "kv_committed_len", "release_kv_cache", 1),
    ("ReqKvInfo", "kv_allocated_len", "alloc_for_extend", 1),
    ("ReqKvInfo", "kv_allocated_len", "alloc_for_decode", 1),
    ("ReqKvInfo", "kv_allocated_len", "alloc_for_spec_decode", 1),
    ("ReqKvInfo", "kv_allocated_len", "prealloc_for_transfer", 1),
    ("ReqKvInfo", "kv_allocated_len", "release_kv_cache", 1),
    ("ReqKvInfo", "extend_batch_idx", "prepare_for_extend", 1),
    ("ReqKvInfo", "extend_batch_idx", "reset_for_retract", 1),
    ("ReqKvInfo", "decode_batch_idx", "prepare_for_decode", 2),
    (
        "ReqKvInfo",
        "decode_batch_idx",
        "prepare_for_spec_decode",
        1,
    ),
    ("ReqKvInfo", "decode_batch_idx", "reset_for_retract", 1),
    ("ReqKvInfo", "kv_cache", "init_next_round_input", 1),
    ("ReqKvInfo", "kv_cache", "alloc_for_extend", 1),
    ("ReqKvInfo", "kv_cache", "prealloc_for_transfer", 1),
    ("ReqKvInfo", "kv_cache", "release_kv_cache", 2),
    ("ReqKvInfo", "kv_cache", "reclaim_leaks", 1),
];

#[test]
fn runtime_ownership_table_matches_the_reviewed_owner_sites() {
    let table = AuditTable::collect()
        .expect("kvown-runtime registers its guarded fields")
        .of_crate("kvown_runtime");
    println!("{table}");
    table.assert_matches(EXPECTED);
}

#[test]
fn allocation_is_commitment_on_the_non_speculative_path() {
    let table = AuditTable::collect().unwrap();
    let committed_owners: Vec<&str> = table
        .rows_of("ReqKvInfo")
        .filter(|row| row.field == "kv_committed_len")
        .map(|row| row.owner)
        .collect();
    assert!(committed_owners.contains(&"alloc_for_extend"));
    assert!(committed_owners.contains(&"alloc_for_decode"));
    assert!(!committed_owners.contains(&"prepare_for_decode"));
    assert!(!committed_owners.contains(&"prepare_for_extend"));
}
