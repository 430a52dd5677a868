#!/usr/bin/env bash
# Instructions per unit of work of the W1_k1, W1p_k1, W2, W2c, W2e, W2_staged, W2c_staged, D1024,
# D1024_staged, W3 and W3c workloads, counted by valgrind's callgrind: a figure that does not
# move with machine noise, for comparing changes on a busy machine. Each workload runs twice
# under callgrind (`--repeats 1` and `--repeats 2`); the difference is exactly one measurement
# (2^20 pages for W1_k1 and W1p_k1, 2,000 steps for W2, W2c, W2e and their staged forms, 256
# steps for D1024 and D1024_staged, 20 batches of 144,602 tokens for W3 and W3c), so setup and
# warm-up cancel out.
# Needs valgrind; takes about 30 seconds.
# Caveat: callgrind counts every iteration of a `rep movsb` (glibc's large memmove) as one
# instruction, so a change that swaps many small copies for one bulk move can count higher
# while running faster; read such a change with the timings too.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
command -v valgrind >/dev/null || { echo "instructions.sh: valgrind is not installed" >&2; exit 1; }
cargo build --release --example bench --quiet
bench="${CARGO_TARGET_DIR:-$root/target}/release/examples/bench"
collected() { # workload repeats -> instructions executed by the whole run
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bench" --only "$1" --repeats "$2" 2>&1 \
        >/dev/null | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
printf '%-12s %14s  %s\n' workload instructions unit
for spec in "W1_k1 1048576 page" "W1p_k1 1048576 page" "W2 2000 step" "W2c 2000 step" "W2e 2000 step" \
    "W2_staged 2000 step" "W2c_staged 2000 step" "D1024 256 step" "D1024_staged 256 step" \
    "W3 2892040 token" "W3c 2892040 token"; do
    read -r name units unit <<<"$spec"
    one="$(collected "$name" 1)"
    two="$(collected "$name" 2)"
    awk -v a="$one" -v b="$two" -v n="$units" -v w="$name" -v u="$unit" \
        'BEGIN { printf "%-12s %14.1f  per %s\n", w, (b - a) / n, u }'
done
