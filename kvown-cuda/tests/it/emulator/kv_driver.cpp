// Host emulator of the KV row kernels (src/kernels/kv.cu), driven line by line by
// tests/it/emulator/kv.rs. It models device memory as numbered byte buffers, 16-byte aligned like
// cuMemAlloc's, each between two guard zones that no launch may write, and runs each launch of
// the `extern "C"` entry point named in the command with `launch` (cuda_shim.hpp).
//
// Commands (a buffer's bytes travel as one lowercase hex token; pointer arguments are IDs):
//   zeros BYTES                                   -> ID    new zeroed buffer (alloc_zeros)
//   upload HEX                                    -> ID    new buffer holding HEX (clone_htod)
//   download ID                                   -> HEX   the buffer's bytes (clone_dtoh)
//   release ID                                    -> "ok"
//   store_kv_wN BLOCKS THREADS BUFFER ROWS SLOTS NUM_ROWS ROW_WORDS NUM_SLOTS -> "ok"
//   gather_kv_wN BLOCKS THREADS ROWS BUFFER SLOTS NUM_ROWS ROW_WORDS NUM_SLOTS -> "ok"
//   copy_pages_wN BLOCKS THREADS BUFFER SRC_PAGES DST_PAGES NUM_PAGES PAGE_SIZE ROW_WORDS
//                 NUM_SLOTS                       -> "ok"
// A launch that writes a guard zone ends the process with status 3.
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "cuda_shim.hpp"
#include "protocol.hpp"
#include "kv.cu"

static_assert(__STDCPP_DEFAULT_NEW_ALIGNMENT__ >= 16, "buffers must be 16-byte aligned");

static const size_t GUARD_BYTES = 4096;
static const unsigned char GUARD_FILL = 0xa5;

// One device allocation: GUARD_BYTES of guard, the data, then guard up to the next 16 bytes
// and GUARD_BYTES more.
struct Buffer {
    size_t bytes;
    std::vector<unsigned char> storage;

    explicit Buffer(size_t bytes)
        : bytes(bytes), storage(2 * GUARD_BYTES + (bytes + 15) / 16 * 16, GUARD_FILL) {
        std::memset(data(), 0, bytes);
    }

    unsigned char* data() { return storage.data() + GUARD_BYTES; }

    bool guards_intact() const {
        const auto intact = [this](size_t from, size_t to) {
            for (size_t k = from; k < to; ++k) {
                if (storage[k] != GUARD_FILL) {
                    return false;
                }
            }
            return true;
        };
        return intact(0, GUARD_BYTES) && intact(GUARD_BYTES + bytes, storage.size());
    }
};

static std::map<u32, Buffer> memory;
static u32 next_id = 1;

static u32 allocate(size_t bytes) {
    memory.emplace(next_id, Buffer(bytes));
    return next_id++;
}

template <typename Word>
static Word* words(u32 id) {
    return reinterpret_cast<Word*>(memory.at(id).data());
}

// Launches a store_kv_wN or gather_kv_wN: (out, in, slots, num_rows, row_words, num_slots).
template <typename Word, void (*kernel)(Word*, const Word*, const u32*, u32, u32, u32)>
static void launch_rows(u32 blocks, u32 threads, const u32* a) {
    Word* out = words<Word>(a[0]);
    const Word* in = words<Word>(a[1]);
    const u32* slots = words<u32>(a[2]);
    launch(blocks, threads, [&] { kernel(out, in, slots, a[3], a[4], a[5]); });
}

// Launches a copy_pages_wN: (buffer, src_pages, dst_pages, num_pages, page_size, row_words,
// num_slots).
template <typename Word, void (*kernel)(Word*, const u32*, const u32*, u32, u32, u32, u32)>
static void launch_pages(u32 blocks, u32 threads, const u32* a) {
    Word* buffer = words<Word>(a[0]);
    const u32* src_pages = words<u32>(a[1]);
    const u32* dst_pages = words<u32>(a[2]);
    launch(blocks, threads,
           [&] { kernel(buffer, src_pages, dst_pages, a[3], a[4], a[5], a[6]); });
}

// One kernel entry point: its argument count after BLOCKS THREADS, and its launcher.
struct Kernel {
    unsigned args;
    void (*launch)(u32 blocks, u32 threads, const u32* args);
};

#define ENTRY_POINTS(BYTES, WORD)                                                 \
    {"store_kv_w" #BYTES, {6, launch_rows<WORD, store_kv_w##BYTES>}},            \
    {"gather_kv_w" #BYTES, {6, launch_rows<WORD, gather_kv_w##BYTES>}},          \
    {"copy_pages_w" #BYTES, {7, launch_pages<WORD, copy_pages_w##BYTES>}}

static const std::map<std::string, Kernel> KERNELS = {
    ENTRY_POINTS(16, uint4),
    ENTRY_POINTS(8, uint2),
    ENTRY_POINTS(4, unsigned int),
    ENTRY_POINTS(2, unsigned short),
};

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    std::fprintf(stderr, "emulator: bad hex digit %c\n", c);
    std::exit(2);
}

static void reply_hex(const unsigned char* bytes, size_t len) {
    static const char DIGITS[] = "0123456789abcdef";
    std::string text(2 * len, '0');
    for (size_t k = 0; k < len; ++k) {
        text[2 * k] = DIGITS[bytes[k] >> 4];
        text[2 * k + 1] = DIGITS[bytes[k] & 15];
    }
    std::printf("%s\n", text.c_str());
    std::fflush(stdout);
}

static void reply_id(u32 id) {
    std::printf("%u\n", id);
    std::fflush(stdout);
}

int main() {
    std::string command;
    while (std::cin >> command) {
        if (command == "zeros") {
            reply_id(allocate(read_u32()));
        } else if (command == "upload") {
            std::string hex;
            std::cin >> hex;
            const u32 id = allocate(hex.size() / 2);
            unsigned char* data = memory.at(id).data();
            for (size_t k = 0; k < hex.size() / 2; ++k) {
                data[k] = (unsigned char)(hex_digit(hex[2 * k]) << 4 | hex_digit(hex[2 * k + 1]));
            }
            reply_id(id);
        } else if (command == "download") {
            Buffer& buffer = memory.at(read_u32());
            reply_hex(buffer.data(), buffer.bytes);
        } else if (command == "release") {
            memory.erase(read_u32());
            reply_ok();
        } else if (auto kernel = KERNELS.find(command); kernel != KERNELS.end()) {
            const u32 blocks = read_u32();
            const u32 threads = read_u32();
            u32 args[7] = {};
            for (unsigned k = 0; k < kernel->second.args; ++k) {
                args[k] = read_u32();
            }
            kernel->second.launch(blocks, threads, args);
            for (const auto& [id, buffer] : memory) {
                if (!buffer.guards_intact()) {
                    std::fprintf(stderr, "emulator: %s wrote outside buffer %u\n",
                                 command.c_str(), id);
                    return 3;
                }
            }
            reply_ok();
        } else {
            return unknown_command(command);
        }
    }
    return 0;
}
