// The line protocol shared by the emulator drivers: whitespace-separated tokens in, one reply
// line out per command. A malformed command ends the process with status 2.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

static unsigned int read_u32() {
    unsigned long long value = 0;
    if (!(std::cin >> value)) {
        std::fprintf(stderr, "emulator: truncated command\n");
        std::exit(2);
    }
    return (unsigned int)value;
}

static void reply_ok() {
    std::printf("ok\n");
    std::fflush(stdout);
}

static int unknown_command(const std::string& command) {
    std::fprintf(stderr, "emulator: unknown command %s\n", command.c_str());
    return 2;
}
