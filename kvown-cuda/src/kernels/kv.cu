// KV pool row copies, generic over bytes. A row (one token's K or V, every head) is moved as
// `row_words` words of W bytes; the host picks the widest W in {16, 8, 4, 2} that divides the
// row's byte size, so f32, f16 and bf16 share these kernels. Buffers come from cuMemAlloc and
// rows start at multiples of W bytes, so every access is W-aligned.
//
// One block per row, threads stride over the row's words. Slots at or past `num_slots` are
// skipped (the host validates them first; this only keeps a bad launch in bounds).

typedef unsigned int u32;
typedef unsigned long long u64;

// Moves row t between a packed batch of rows and the pool buffer: with Scatter,
// buffer[slots[t]] = rows[t] (sglang set_kv_buffer); without, rows[t] = buffer[slots[t]].
template <typename Word, bool Scatter>
__device__ __forceinline__ void move_rows(Word* __restrict__ buffer, Word* __restrict__ rows,
                                          const u32* __restrict__ slots, u32 num_rows,
                                          u32 row_words, u32 num_slots)
{
    const u32 t = blockIdx.x;
    if (t >= num_rows) {
        return;
    }
    const u32 slot = slots[t];
    if (slot >= num_slots) {
        return;
    }
    Word* pooled = buffer + (u64)slot * row_words;
    Word* packed = rows + (u64)t * row_words;
    Word* dst = Scatter ? pooled : packed;
    const Word* src = Scatter ? packed : pooled;
    for (u32 w = threadIdx.x; w < row_words; w += blockDim.x) {
        dst[w] = src[w];
    }
}

// Page dst_pages[i] = page src_pages[i] inside one buffer; one block per row of the pages. The
// host guarantees the two page lists are disjoint, so no block reads a row another writes.
template <typename Word>
__device__ __forceinline__ void copy_page_rows(Word* buffer, const u32* __restrict__ src_pages,
                                               const u32* __restrict__ dst_pages, u32 num_pages,
                                               u32 page_size, u32 row_words, u32 num_slots)
{
    const u32 r = blockIdx.x;
    if (r >= num_pages * page_size) {
        return;
    }
    const u64 src_slot = (u64)src_pages[r / page_size] * page_size + r % page_size;
    const u64 dst_slot = (u64)dst_pages[r / page_size] * page_size + r % page_size;
    if (src_slot >= num_slots || dst_slot >= num_slots) {
        return;
    }
    const Word* src = buffer + src_slot * row_words;
    Word* dst = buffer + dst_slot * row_words;
    for (u32 w = threadIdx.x; w < row_words; w += blockDim.x) {
        dst[w] = src[w];
    }
}

#define KV_KERNELS(BYTES, WORD)                                                                   \
    extern "C" __global__ void store_kv_w##BYTES(WORD* buffer, const WORD* rows,                  \
                                                 const u32* slots, u32 num_rows, u32 row_words,   \
                                                 u32 num_slots)                                   \
    {                                                                                             \
        move_rows<WORD, true>(buffer, const_cast<WORD*>(rows), slots, num_rows, row_words,        \
                              num_slots);                                                         \
    }                                                                                             \
    extern "C" __global__ void gather_kv_w##BYTES(WORD* rows, const WORD* buffer,                 \
                                                  const u32* slots, u32 num_rows, u32 row_words,  \
                                                  u32 num_slots)                                  \
    {                                                                                             \
        move_rows<WORD, false>(const_cast<WORD*>(buffer), rows, slots, num_rows, row_words,       \
                               num_slots);                                                        \
    }                                                                                             \
    extern "C" __global__ void copy_pages_w##BYTES(WORD* buffer, const u32* src_pages,            \
                                                   const u32* dst_pages, u32 num_pages,           \
                                                   u32 page_size, u32 row_words, u32 num_slots)   \
    {                                                                                             \
        copy_page_rows<WORD>(buffer, src_pages, dst_pages, num_pages, page_size, row_words,       \
                             num_slots);                                                          \
    }

KV_KERNELS(16, uint4)
KV_KERNELS(8, uint2)
KV_KERNELS(4, unsigned int)
KV_KERNELS(2, unsigned short)
