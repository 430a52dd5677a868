// Host emulator of the step scatter (src/kernels/scatter.cu), driven line by line by
// tests/it/emulator/scatter.rs. It owns the device memory a `CudaStepLink` has: one packet buffer
// per ring slot and the request-to-token table, and runs each launch with `launch`
// (cuda_shim.hpp: every block, every thread, in order).
//
// Commands (whitespace-separated; a buffer is its length followed by its elements):
//   init SLOTS SLOT_WORDS TABLE_LEN ROW_STRIDE -> "ok"  packets and table zeroed
//   copy K WORDS                              -> "ok"  packets[K][..WORDS] = WORDS (a buffer)
//   scatter K BLOCKS THREADS                  -> "ok"  scatter_step over packets[K]
//   read START LEN                            -> buffer table[START..START+LEN]
//   read_packet K START LEN                   -> buffer packets[K][START..START+LEN]
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda_shim.hpp"
#include "protocol.hpp"
#include "scatter.cu"

typedef std::vector<u32> Buffer;

static Buffer read_buffer() {
    Buffer buffer(read_u32());
    for (u32& value : buffer) {
        value = read_u32();
    }
    return buffer;
}

static void reply(const u32* values, size_t len) {
    std::printf("%zu", len);
    for (size_t i = 0; i < len; ++i) {
        std::printf(" %u", values[i]);
    }
    std::printf("\n");
    std::fflush(stdout);
}

static void bounds(size_t start, size_t len, size_t size) {
    if (start + len > size) {
        std::fprintf(stderr, "emulator: range %zu+%zu past %zu\n", start, len, size);
        std::exit(2);
    }
}

int main() {
    std::vector<Buffer> packets;
    Buffer table;
    u32 row_stride = 0;
    std::string command;
    while (std::cin >> command) {
        if (command == "init") {
            const u32 slots = read_u32();
            const u32 slot_words = read_u32();
            packets.assign(slots, Buffer(slot_words, 0));
            table.assign(read_u32(), 0);
            row_stride = read_u32();
            reply_ok();
        } else if (command == "copy") {
            const u32 k = read_u32();
            const Buffer words = read_buffer();
            bounds(k, 1, packets.size());
            bounds(0, words.size(), packets[k].size());
            std::copy(words.begin(), words.end(), packets[k].begin());
            reply_ok();
        } else if (command == "scatter") {
            const u32 k = read_u32();
            const u32 blocks = read_u32();
            const u32 threads = read_u32();
            bounds(k, 1, packets.size());
            launch(blocks, threads, [&] {
                scatter_step(packets[k].data(), table.data(), row_stride, table.size());
            });
            reply_ok();
        } else if (command == "read") {
            const u32 start = read_u32();
            const u32 len = read_u32();
            bounds(start, len, table.size());
            reply(table.data() + start, len);
        } else if (command == "read_packet") {
            const u32 k = read_u32();
            const u32 start = read_u32();
            const u32 len = read_u32();
            bounds(k, 1, packets.size());
            bounds(start, len, packets[k].size());
            reply(packets[k].data() + start, len);
        } else {
            return unknown_command(command);
        }
    }
    return 0;
}
