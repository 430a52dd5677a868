// Paged KV-slot allocation kernels: sglang alloc_extend_kernel / alloc_decode_kernel and the
// free-list write, for a free list kept on the device.
//
// The free list is a ring of `free_capacity` page ids; entry k of the list (0 = head) lives at
// free_pages[(free_head + k) % free_capacity]. The host keeps head and length, and computes every
// per-request offset (exclusive prefix sums of extend lengths and of new pages), so no kernel
// needs a device-to-host copy or a cross-block scan.
//
// req_to_token is row-major with `row_stride` entries per request row; each allocation writes the
// new slots both to out_cache_loc and to the request's row, in the same launch. A request whose
// row is NO_ROW has no row: its slots go to out_cache_loc only (a plain allocation of pages).

typedef unsigned int u32;
typedef unsigned long long u64;

constexpr u32 NO_ROW = 0xffffffffu;

__device__ __forceinline__ u32 free_list_entry(const u32* __restrict__ free_pages,
                                               u32 free_capacity, u32 free_head, u32 k)
{
    return free_pages[(u32)(((u64)free_head + k) % free_capacity)];
}

// One block per request; extend_params holds 6 words per request:
//   prefix_len, seq_len, last_loc, row, out_start, page_start.
// Positions [prefix_len, seq_len) get slots in three parts (sglang §4.5):
//   1. the rest of the old partial page: last_loc + 1 + k, up to ceil_align(prefix_len);
//   2. new full pages, list entries page_start, page_start + 1, ... in order;
//   3. the new partial last page, the request's last list entry.
// Parts 2 and 3 are one rule: position p >= ceil_align(prefix_len) uses list entry
// page_start + (p - ceil_align(prefix_len)) / page_size at offset p % page_size.
extern "C" __global__ void alloc_extend(const u32* __restrict__ extend_params, u32 num_reqs,
                                        const u32* __restrict__ free_pages, u32 free_capacity,
                                        u32 free_head, u32* __restrict__ req_to_token,
                                        u32 row_stride, u32* __restrict__ out_cache_loc,
                                        u32 page_size)
{
    const u32 req = blockIdx.x;
    if (req >= num_reqs) {
        return;
    }
    const u32* params = extend_params + (u64)6u * req;
    const u32 prefix_len = params[0];
    const u32 seq_len = params[1];
    const u32 last_loc = params[2];
    const u32 row = params[3];
    const u32 out_start = params[4];
    const u32 page_start = params[5];
    const u32 prefix_ceil = (prefix_len + page_size - 1u) / page_size * page_size;
    u32* row_slots = row == NO_ROW ? nullptr : req_to_token + (u64)row * row_stride;
    for (u32 k = threadIdx.x; k < seq_len - prefix_len; k += blockDim.x) {
        const u32 pos = prefix_len + k;
        u32 slot;
        if (pos < prefix_ceil) {
            slot = last_loc + 1u + k;
        } else {
            const u32 j = pos - prefix_ceil;
            const u32 page =
                free_list_entry(free_pages, free_capacity, free_head, page_start + j / page_size);
            slot = page * page_size + j % page_size;
        }
        out_cache_loc[out_start + k] = slot;
        if (row_slots != nullptr) {
            row_slots[pos] = slot;
        }
    }
}

// One thread per request; decode_params holds 4 words per request:
//   seq_len (after the new token), last_loc, row, page_start.
// A request needs a new page iff (seq_len - 1) % page_size == 0 (seq_len % ps == 1 for ps > 1;
// every step for ps == 1); it then takes list entry page_start and its first slot.
extern "C" __global__ void alloc_decode(const u32* __restrict__ decode_params, u32 num_reqs,
                                        const u32* __restrict__ free_pages, u32 free_capacity,
                                        u32 free_head, u32* __restrict__ req_to_token,
                                        u32 row_stride, u32* __restrict__ out_cache_loc,
                                        u32 page_size)
{
    const u32 req = blockIdx.x * blockDim.x + threadIdx.x;
    if (req >= num_reqs) {
        return;
    }
    const u32* params = decode_params + (u64)4u * req;
    const u32 seq_len = params[0];
    const u32 last_loc = params[1];
    const u32 row = params[2];
    const u32 page_start = params[3];
    u32 slot;
    if ((seq_len - 1u) % page_size == 0u) {
        slot = free_list_entry(free_pages, free_capacity, free_head, page_start) * page_size;
    } else {
        slot = last_loc + 1u;
    }
    out_cache_loc[req] = slot;
    if (row != NO_ROW) {
        req_to_token[(u64)row * row_stride + seq_len - 1u] = slot;
    }
}

// Writes `num_pages` freed page ids into the ring from position `first` on (the host chooses
// `first` = head - n to put them at the head, or head + len to put them at the tail).
extern "C" __global__ void free_pages_write(u32* __restrict__ free_pages, u32 free_capacity,
                                            u32 first, const u32* __restrict__ pages,
                                            u32 num_pages)
{
    const u32 k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k < num_pages) {
        free_pages[(u32)(((u64)first + k) % free_capacity)] = pages[k];
    }
}
