#!/usr/bin/env bash
# Compares the engine's admission policies (`--admission next-step` and `ratio`) over several
# workloads and seeds: runs the release engine on the CPU for each (workload, seed, policy) and
# prints a Markdown table of the medians over the seeds of steps, retractions, tokens prefilled
# and prefix-cache hit rate, with the median per-seed ratio/next-step quotient of steps and
# tokens prefilled; a last row gives the median quotients over all runs and the retractions
# in all. The counts are deterministic (a function of the flags), so one run each
# suffices.
#
#   scripts/admission-compare.sh [SEED...]      (default seeds: 42 1 2 3)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
seeds=("$@")
[ ${#seeds[@]} -gt 0 ] || seeds=(42 1 2 3)
workloads=(
    "default|"
    "half pool (--pool-tokens 32768)|--pool-tokens 32768"
    "--spec|--spec"
    "--page-size 1|--page-size 1"
    "--page-size 64|--page-size 64"
    "long outputs (--output-len 8..2048)|--output-len 8..2048"
    "burst (--arrival-rate 4)|--arrival-rate 4"
)

cargo build -q --release --example engine
engine="${CARGO_TARGET_DIR:-$root/target}/release/examples/engine"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for index in "${!workloads[@]}"; do
    flags="${workloads[$index]#*|}"
    for seed in "${seeds[@]}"; do
        for policy in next-step ratio; do
            # shellcheck disable=SC2086 # the flags split into words on purpose
            "$engine" --backend cpu --json --plot "$work/plot.svg" --seed "$seed" \
                --admission "$policy" $flags >"$work/$index-$seed-$policy.json"
        done
    done
done

python3 - "$work" "${#workloads[@]}" "${workloads[@]%%|*}" -- "${seeds[@]}" <<'EOF'
import json, statistics, sys

work, count = sys.argv[1], int(sys.argv[2])
names = sys.argv[3:3 + count]
seeds = sys.argv[4 + count:]
median = statistics.median
pairs = []

def quotient(pairs, key):
    """The median of ratio / next-step over (next-step, ratio) run pairs."""
    return median(r[key] / n[key] for n, r in pairs)
print("| workload | steps (next-step / ratio, quotient) | retractions | tokens prefilled"
      " (quotient) | prefix-cache hit rate |")
print("|---|---|---|---|---|")
for index, name in enumerate(names):
    runs = {policy: [json.load(open(f"{work}/{index}-{seed}-{policy}.json")) for seed in seeds]
            for policy in ("next-step", "ratio")}
    def med(policy, key):
        return median(run[key] for run in runs[policy])
    for run in runs["next-step"] + runs["ratio"]:
        assert run["aborted"] == 0 and run["finished"] == run["requests"], run
    workload_pairs = list(zip(runs["next-step"], runs["ratio"]))
    pairs += workload_pairs
    print(f"| {name} | {med('next-step', 'steps'):g} / {med('ratio', 'steps'):g}, "
          f"{quotient(workload_pairs, 'steps'):.3f} | {med('next-step', 'retractions'):g} / "
          f"{med('ratio', 'retractions'):g} | {med('next-step', 'tokens_prefilled'):g} / "
          f"{med('ratio', 'tokens_prefilled'):g}, "
          f"{quotient(workload_pairs, 'tokens_prefilled'):.3f} | "
          f"{100 * med('next-step', 'prefix_cache_hit_rate'):.1f} % / "
          f"{100 * med('ratio', 'prefix_cache_hit_rate'):.1f} % |")
retractions = [sum(run["retractions"] for run in side) for side in zip(*pairs)]
print(f"| all {len(pairs)} runs (median quotient; total retractions) | "
      f"{quotient(pairs, 'steps'):.3f} | "
      f"{retractions[0]} / {retractions[1]} | {quotient(pairs, 'tokens_prefilled'):.3f} | "
      f"{quotient(pairs, 'prefix_cache_hit_rate'):.3f} |")
EOF
