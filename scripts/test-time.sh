#!/usr/bin/env bash
# test-time.sh [DIR]: wall time of the README's test command (`cargo test --workspace`) in the
# checkout DIR (default: this repository), the way a developer meets it.
#
# Runs the command once to build and warm up, then times a plain re-run ("warm": nothing to
# compile, the tests alone), then touches every `.rs` file outside `target/` and times it again
# ("touched": every workspace crate recompiled from its incremental cache, then the tests).
# Prints both with the test count and the load average; logs go to `$TMPDIR/test-time-*.log`.
# Compare two revisions in one sitting on a quiet machine, e.g.
#   git worktree add /tmp/base REV && scripts/test-time.sh /tmp/base && scripts/test-time.sh
set -euo pipefail
dir=$(cd "${1:-$(dirname "$0")/..}" && pwd)
cd "$dir"
logs="${TMPDIR:-/tmp}/test-time-$(basename "$dir")"

seconds() {
    local start end
    start=$(date +%s.%N)
    cargo test --workspace >"$1" 2>&1 || { echo "cargo test failed; see $1" >&2; exit 1; }
    end=$(date +%s.%N)
    awk -v s="$start" -v e="$end" 'BEGIN { print e - s }'
}

seconds "$logs-warmup.log" >/dev/null
warm=$(seconds "$logs-warm.log")
find . -path ./target -prune -o -name '*.rs' -print0 | xargs -0 touch
touched=$(seconds "$logs-touched.log")
tests=$(awk '/^test result:/ { p += $4 } END { print p }' "$logs-warm.log")
printf '%s: %d tests, warm %.1f s, touched %.1f s (load %s)\n' \
    "$dir" "$tests" "$warm" "$touched" "$(cut -d' ' -f1-3 /proc/loadavg)"
