"""sglang 0.5.23's own allocator, request-to-token pool and radix cache, run on CPU on the
examples that kvown's tests pin for issue 42; each line prints what sglang does and the kvown
test that expects the same. Not part of CI (it needs torch and most of sglang's dependencies).

    pip download --no-deps sglang==0.5.23 -d /tmp/sgl && unzip -q /tmp/sgl/*.whl -d /tmp/sgl/x
    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch numpy   # + what the import asks
    PYTHONPATH=/tmp/sgl/x /tmp/venv/bin/python kvown-runtime/tests/sglang_reference/check.py
"""
from array import array
from types import SimpleNamespace

import torch
from sglang.srt.mem_cache.allocation import alloc_paged_token_slots_extend
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey


def cache(page_size, pages, policy="lru", need_sort=False):
    if page_size == 1:
        alloc = TokenToKVPoolAllocator(pages, torch.int64, "cpu", None, need_sort)
    else:
        alloc = PagedTokenToKVPoolAllocator(
            pages * page_size, page_size, torch.int64, "cpu", None, need_sort
        )
    rows = ReqToTokenPool(size=8, max_context_len=64, device="cpu", enable_memory_saver=False)
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=rows,
        token_to_kv_pool_allocator=alloc,
        page_size=page_size,
        eviction_policy=policy,
    )
    return RadixCache(params), alloc, rows


def request(row, prompt, outputs):
    kv = SimpleNamespace(
        req_pool_idx=row, swa_evict_floor=0, cache_inserted_len=0, cache_protected_len=0
    )
    return SimpleNamespace(
        kv=kv,
        full_untruncated_fill_ids=array("q", prompt + outputs),
        extra_key=None,
        cache_salt=None,
        priority=0,
        origin_input_ids=array("q", prompt),
        lock=None,
        last_node=None,
    )


def recording(alloc):
    """The pages of each free call that reaches the allocator."""
    calls = []
    name = "free" if alloc.page_size == 1 else "free_page_ids"
    inner = getattr(alloc, name)
    setattr(alloc, name, lambda ids: (calls.append(ids.tolist()), inner(ids)))
    return calls


def key(tokens):
    return RadixKey(array("q", tokens))


# _split_node: the upper part is a new node (eviction_replay.rs,
# under_fifo_a_split_off_upper_part_is_younger_than_older_leaves).
tree, alloc, _ = cache(1, 16, policy="fifo")
calls = recording(alloc)
tree.insert(InsertParams(key=key([1, 2]), value=alloc.alloc(2)))
tree.insert(InsertParams(key=key([3]), value=alloc.alloc(1)))
tree.match_prefix(MatchPrefixParams(key=key([1])))
tree.evict(EvictParams(num_tokens=2))
print("fifo split: frees", calls, "(slots 2 then 3: [2] then [3])")

# evict: one free per node, each node's pages in key order (eviction_replay.rs,
# an_evicted_nodes_pages_are_freed_in_key_order_one_call_per_node).
tree, alloc, _ = cache(4, 8)
first, second = alloc.alloc(8), alloc.alloc(4)
alloc.free(first[:4])
alloc.free(second)
tree.insert(InsertParams(key=key(range(8)), value=alloc.alloc(8)))
tree.insert(InsertParams(key=key([9] * 4), value=alloc.alloc(4)))
calls = recording(alloc)
tree.evict(EvictParams(num_tokens=12))
print("eviction: frees", calls, "free list head", alloc.free_pages[:4].tolist())

# need_sort: an out-of-memory answer keeps the merge (need_sort_replay.rs,
# an_out_of_memory_answer_keeps_the_merge_as_sglang_does).
_, alloc, _ = cache(4, 3, need_sort=True)
taken = alloc.alloc(8)
alloc.free(taken[:4])
refused = alloc.alloc(12)
print(
    "need_sort: alloc of 3 pages",
    refused,
    "free pages",
    alloc.free_pages.tolist(),
    "then",
    (alloc.alloc(4)[::4] // 4).tolist(),
)

# checkpoint's prompt split (batch_release_edges.rs,
# a_registration_past_the_prompt_ends_a_node_at_the_prompt).
tree, alloc, rows = cache(1, 64)
slots = alloc.alloc(4)
rows.req_to_token[1, :4] = slots.to(torch.int32)
req = request(1, [5, 6], [7, 8])
tree.checkpoint(req, up_to=4)
tree.unlock(req.lock)
evicted = tree.evict(EvictParams(num_tokens=1)).num_tokens_evicted
print("prompt split: evicting 1 token frees", evicted, "and keeps", tree.evictable_size())

# alloc_paged_token_slots_extend's demand (batch_extend_edges.rs,
# an_extend_evicts_what_the_free_slots_lack_of_sglangs_demand).
tree, alloc, rows = cache(16, 3)
slots = alloc.alloc(32)
rows.req_to_token[1, :32] = slots.to(torch.int32)
req = request(1, list(range(17)), [])
tree.checkpoint(req, up_to=17)
alloc.free_segment(slots[16:], start_pos=16)
tree.unlock(req.lock)
zero = torch.zeros(1, dtype=torch.int64)
out = alloc_paged_token_slots_extend(
    tree, zero, zero, torch.tensor([18]), torch.tensor([18]), torch.tensor([-1]), 18
)
print(
    "extend demand: out_cache_loc",
    out.tolist()[0],
    "..",
    out.tolist()[-1],
    "evictable",
    tree.evictable_size(),
)
