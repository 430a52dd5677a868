// The step's table writes, shipped from the host (src/staging/): one packet of 32-bit words per
// batch-flow call, copied to the device as is and applied by `scatter_step`. The host allocator
// already made every decision; the device only stores what the host wrote.
//
// Packet layout (src/staging/packet.rs builds it; the word indices are shared by name):
//   [0] n_out     slots of the step's out_cache_loc, at words [HEADER, HEADER + n_out)
//   [1] n_decode  decode writes: table[flat[i]] = slots[i], flat at [flat_at, flat_at + n_decode)
//   [2] n_runs    runs of 4 words (row, start, len, src) at [runs_at, runs_at + 4 * n_runs):
//                 table[row * row_stride + start + j] = slots[src + j] for j < len
//   [3] flat_at   [4] runs_at   [5] n_slots: words of the slot area (out_cache_loc, then the
//                 slots that runs copy from beyond it), at [HEADER, HEADER + n_slots)
//   [6], [7]      zero
// Writes outside the table or reads outside the slot area are skipped: the host never builds
// them, and a damaged packet then cannot write past the table.
typedef unsigned int u32;
typedef unsigned long long u64;

#define PACKET_HEADER 8u

extern "C" __global__ void scatter_step(const u32* packet, u32* table, u32 row_stride,
                                        u64 table_len) {
    const u32* slots = packet + PACKET_HEADER;
    const u32 n_decode = packet[1];
    const u32 n_runs = packet[2];
    const u32* flat = packet + packet[3];
    const u32* runs = packet + packet[4];
    const u32 n_slots = packet[5];
    const u32 stride = gridDim.x * blockDim.x;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n_decode; i += stride) {
        const u32 at = flat[i];
        if (i < n_slots && (u64)at < table_len) {
            table[at] = slots[i];
        }
    }
    for (u32 r = blockIdx.x; r < n_runs; r += gridDim.x) {
        const u32 row = runs[4 * r];
        const u32 start = runs[4 * r + 1];
        const u32 len = runs[4 * r + 2];
        const u32 src = runs[4 * r + 3];
        const u64 first = (u64)row * row_stride + start;
        if (first + len > table_len || (u64)src + len > n_slots) {
            continue;
        }
        for (u32 j = threadIdx.x; j < len; j += blockDim.x) {
            table[first + j] = slots[src + j];
        }
    }
}
