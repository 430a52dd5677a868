// Host emulator of the allocation kernels (src/kernels/alloc.cu), driven line by line by
// tests/emulator/alloc.rs. It owns the device buffers (the free-page ring and the
// request-to-token table) and runs each launch with `launch` (cuda_shim.hpp: every block, every
// thread, in order), which is exact for these kernels.
//
// Commands (whitespace-separated; a buffer is its length followed by its elements):
//   init RING_LEN TABLE_LEN                      -> "ok"   ring = 1..=RING_LEN, table zeroed
//   alloc_extend|alloc_decode BLOCKS THREADS NUM_REQS PARAMS FREE_CAPACITY FREE_HEAD
//                ROW_STRIDE OUT_LEN PAGE_SIZE    -> out_cache_loc buffer
//   free_pages_write BLOCKS THREADS FREE_CAPACITY FIRST PAGES -> "ok"
//   write START VALUES                           -> "ok"   table[START..] = VALUES
//   read START LEN                               -> buffer table[START..START+LEN]
//   ring                                         -> buffer of the whole ring
#include <cstdio>
#include <string>
#include <vector>

#include "cuda_shim.hpp"
#include "protocol.hpp"
#include "alloc.cu"

typedef std::vector<u32> Buffer;

static Buffer read_buffer() {
    Buffer buffer(read_u32());
    for (u32& value : buffer) {
        value = read_u32();
    }
    return buffer;
}

static void reply(const Buffer& buffer) {
    std::printf("%zu", buffer.size());
    for (u32 value : buffer) {
        std::printf(" %u", value);
    }
    std::printf("\n");
    std::fflush(stdout);
}

int main() {
    Buffer ring;
    Buffer table;
    std::string command;
    while (std::cin >> command) {
        if (command == "init") {
            ring.assign(read_u32(), 0);
            for (u32 k = 0; k < ring.size(); ++k) {
                ring[k] = k + 1;
            }
            table.assign(read_u32(), 0);
            reply_ok();
        } else if (command == "alloc_extend" || command == "alloc_decode") {
            const u32 blocks = read_u32();
            const u32 threads = read_u32();
            const u32 num_reqs = read_u32();
            const Buffer params = read_buffer();
            const u32 free_capacity = read_u32();
            const u32 free_head = read_u32();
            const u32 row_stride = read_u32();
            Buffer out(read_u32(), 0xffffffffu);
            const u32 page_size = read_u32();
            const bool extend = command == "alloc_extend";
            launch(blocks, threads, [&] {
                if (extend) {
                    alloc_extend(params.data(), num_reqs, ring.data(), free_capacity, free_head,
                                 table.data(), row_stride, out.data(), page_size);
                } else {
                    alloc_decode(params.data(), num_reqs, ring.data(), free_capacity, free_head,
                                 table.data(), row_stride, out.data(), page_size);
                }
            });
            reply(out);
        } else if (command == "free_pages_write") {
            const u32 blocks = read_u32();
            const u32 threads = read_u32();
            const u32 free_capacity = read_u32();
            const u32 first = read_u32();
            const Buffer pages = read_buffer();
            launch(blocks, threads, [&] {
                free_pages_write(ring.data(), free_capacity, first, pages.data(),
                                 (u32)pages.size());
            });
            reply_ok();
        } else if (command == "write") {
            const u32 start = read_u32();
            const Buffer values = read_buffer();
            for (u32 k = 0; k < values.size(); ++k) {
                table.at(start + k) = values[k];
            }
            reply_ok();
        } else if (command == "read") {
            const u32 start = read_u32();
            const u32 len = read_u32();
            reply(Buffer(table.begin() + start, table.begin() + start + len));
        } else if (command == "ring") {
            reply(ring);
        } else {
            return unknown_command(command);
        }
    }
    return 0;
}
