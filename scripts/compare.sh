#!/usr/bin/env bash
# Times the working tree against a base commit on a noisy machine: builds the bench example of
# both, then runs them alternately, N rounds base-first and N rounds head-first (each run
# `--repeats 3` of the chosen workloads), and prints per workload the median of each side and
# the median head/base ratio of the pairs, by run order and overall, with its interquartile
# range. Averaging both orders cancels the bias of always running second; a VM that switches
# speed every few seconds still moves single pairs by 20%, so read a ratio together with its
# range and with the instruction counts of scripts/instructions.sh. A run of W2 and W2c takes
# well under a second, so 150 rounds (300 pairs) take a minute or two and resolve about 1% while
# the VM holds one speed. Two builds can still differ by up to 3% in code neither changes (the
# binary's layout), so add a workload the change does not touch as a control, and do not read
# a ratio within 0.97-1.03 as a change without the instruction counts.
#
#   scripts/compare.sh BASE_REV [ROUNDS] [WORKLOAD...]
#   scripts/compare.sh 4545fe7 150 W2 W2c
#
# Defaults: 100 rounds, workloads W1_k1 W1p_k1 W2 W2c. The base is built in a temporary git
# worktree with its own target directory (`$CARGO_TARGET_DIR-compare-base`, or
# `target/compare-base`), so the first build of a base takes a few minutes.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
base_rev="${1:?usage: scripts/compare.sh BASE_REV [ROUNDS] [WORKLOAD...]}"
rounds="${2:-100}"
shift $(($# < 2 ? $# : 2))
workloads=("$@")
[ ${#workloads[@]} -gt 0 ] || workloads=(W1_k1 W1p_k1 W2 W2c)

target="${CARGO_TARGET_DIR:-$root/target}"
base_target="${CARGO_TARGET_DIR:+$CARGO_TARGET_DIR-compare-base}"
base_target="${base_target:-$root/target/compare-base}"
work="$(mktemp -d)"
trap 'git worktree remove --force "$work/base" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

git worktree add --detach --quiet "$work/base" "$base_rev"
echo "building base $(git -C "$work/base" rev-parse --short HEAD) and head $(git describe --always --dirty)" >&2
(cd "$work/base" && CARGO_TARGET_DIR="$base_target" cargo build --release --example bench --quiet)
cargo build --release --example bench --quiet
cp "$base_target/release/examples/bench" "$work/bench-base"
cp "$target/release/examples/bench" "$work/bench-head"

only=()
for workload in "${workloads[@]}"; do only+=(--only "$workload"); done
run() { # side round
    "$work/bench-$1" "${only[@]}" --repeats 3 --json >"$work/$1-$2.json"
}
for round in $(seq 1 "$rounds"); do
    run base "$round"
    run head "$round"
done
for round in $(seq $((rounds + 1)) $((2 * rounds))); do
    run head "$round"
    run base "$round"
done

python3 - "$work" "$rounds" "${workloads[@]}" <<'EOF'
import json
import statistics
import sys

work, rounds, workloads = sys.argv[1], int(sys.argv[2]), sys.argv[3:]


def medians(side, round_):
    with open(f"{work}/{side}-{round_}.json") as f:
        return {w["name"]: w["median"] for w in json.load(f)["workloads"]}


runs = {side: [medians(side, r) for r in range(1, 2 * rounds + 1)] for side in ("base", "head")}
print(f"{'workload':<10} {'base':>10} {'head':>10} {'base first':>11} {'head first':>11} {'all':>7}  IQR")
for workload in workloads:
    base = [run[workload] for run in runs["base"]]
    head = [run[workload] for run in runs["head"]]
    ratios = [h / b for b, h in zip(base, head)]
    quartiles = statistics.quantiles(ratios, n=4)
    print(
        f"{workload:<10} {statistics.median(base):>10.4g} {statistics.median(head):>10.4g}"
        f" {statistics.median(ratios[:rounds]):>11.3f} {statistics.median(ratios[rounds:]):>11.3f}"
        f" {statistics.median(ratios):>7.3f}  {quartiles[0]:.3f}-{quartiles[2]:.3f}"
    )
EOF
