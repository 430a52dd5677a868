#!/usr/bin/env bash
# What `#[kvown::guarded]` costs to compile, against the same structs without it and with serde.
#
# Generates three library crates of N structs each, in one file:
#   plain    N plain structs (4 fields that stand for the owned ones, 4 other fields), 2
#            functions that write the first 4 fields and a reader each;
#   serde    the same with `#[derive(serde::Serialize, serde::Deserialize)]`;
#   guarded  the same with `#[kvown::guarded]`: the 4 fields `#[owned_by(..)]` by the 2 functions,
#            which are `#[kvown::owner]`s writing through the accessors.
# Builds their dependencies once, then times, in alternation (plain, serde, guarded, ... R
# rounds), `cargo check` and `cargo build` (debug) of each after touching its file, with
# incremental compilation off (the whole crate from source, its dependencies already built).
# Prints the median CPU seconds (user + system, rustc and cargo) and the medians of the per-round
# ratios, then the expansion (`-Zunpretty=expanded`, lines per struct) of each crate and what
# one more owned field and one more owner add to a guarded struct.
#
#   scripts/compile-cost.sh [--structs N] [--repeats R] [--per-module K] [--baseline KVOWN_DIR]
#
# Defaults: 200 structs, 5 rounds, all in the crate root. `--per-module K` puts them in modules of
# K structs each (each `#[guarded]` struct and `#[owner]` imports its module with `use super::*`,
# so the size of a module matters; see docs/design.md, "What it costs to compile"). `--baseline DIR` adds a fourth timed crate, the guarded one
# built against another kvown checkout (say an older revision, `git worktree add`), so that a
# change to the macros is measured before and after in one sitting. The crates are written to
# `$CARGO_TARGET_DIR/compile-cost` (default `target/compile-cost`), with the workspace's
# Cargo.lock, so no new dependency versions are fetched. A benchmark: it fails only when a build
# fails, never on the figures. Timings on a shared machine wander; read the ratios.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
structs=200
repeats=5
per_module=0
baseline=""
while [ $# -gt 0 ]; do
    case "$1" in
    --structs) structs="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --per-module) per_module="$2"; shift 2 ;;
    --baseline) baseline="$(cd "$2" && pwd)"; shift 2 ;;
    *) echo "usage: scripts/compile-cost.sh [--structs N] [--repeats R] [--per-module K] [--baseline KVOWN_DIR]" >&2; exit 2 ;;
    esac
done
work="${CARGO_TARGET_DIR:-$root/target}/compile-cost"
rm -rf "$work"
mkdir -p "$work"
# Each generated workspace builds in a target directory of its own (`$work/*/target`).
unset CARGO_TARGET_DIR

# struct_source KIND I OWNED OWNERS: struct I of a crate of KIND (plain, serde, guarded), with
# OWNED owned fields, each written by OWNERS owner functions, and 4 other fields.
struct_source() {
    local kind=$1 i=$2 owned=$3 owners=$4 f o list=""
    for ((o = 0; o < owners; o++)); do list+="${list:+, }item${i}_write${o}"; done
    [ "$kind" = guarded ] && echo "#[kvown::guarded]"
    [ "$kind" = serde ] && echo "#[derive(serde::Serialize, serde::Deserialize)]"
    echo "pub struct Item$i {"
    for ((f = 0; f < owned; f++)); do
        [ "$kind" = guarded ] && echo "    #[owned_by($list)]"
        case $((f % 4)) in
        0) echo "    count$f: usize," ;;
        1) echo "    total$f: u64," ;;
        2) echo "    tags$f: Vec<u32>," ;;
        3) echo "    label$f: String," ;;
        esac
    done
    echo "    pub id: u64,"
    echo "    pub weight: u32,"
    echo "    pub notes: Vec<String>,"
    echo "    pub name: String,"
    echo "}"
    for ((o = 0; o < owners; o++)); do
        [ "$kind" = guarded ] && echo "#[kvown::owner]"
        echo "pub fn item${i}_write$o(item: &mut Item$i, by: u32) {"
        for ((f = 0; f < owned; f++)); do
            if [ "$kind" = guarded ]; then
                case $((f % 4)) in
                0) echo "    item.set_count$f(owner, item.count$f() + $o);" ;;
                1) echo "    *item.total${f}_mut(owner) += u64::from(by);" ;;
                2) echo "    item.tags${f}_mut(owner).push(by);" ;;
                3) echo "    item.label${f}_mut(owner).push('+');" ;;
                esac
            else
                case $((f % 4)) in
                0) echo "    item.count$f = item.count$f + $o;" ;;
                1) echo "    item.total$f += u64::from(by);" ;;
                2) echo "    item.tags$f.push(by);" ;;
                3) echo "    item.label$f.push('+');" ;;
                esac
            fi
        done
        echo "}"
    done
    local call="" field
    for ((f = 0; f < owned; f++)); do
        case $((f % 4)) in
        0) field="count$f" ;;
        1) field="total$f" ;;
        2) field="tags$f" ;;
        3) field="label$f" ;;
        esac
        [ "$kind" = guarded ] && field+="()"
        case $((f % 4)) in
        0) call+=" + $field" ;;
        1) call+=" + $field as usize" ;;
        *) call+=" + $field.len()" ;;
        esac
    done
    echo "pub fn item${i}_read(item: &Item$i) -> usize {"
    echo "    item.name.len()$(sed 's/ + \([a-z]\)/ + item.\1/g' <<<"$call")"
    echo "}"
}

# crate DIR NAME KIND KVOWN OWNED OWNERS: writes the crate.
crate() {
    local dir=$1 name=$2 kind=$3 kvown=$4 owned=$5 owners=$6 i
    mkdir -p "$dir/$name/src"
    {
        echo "[package]"
        echo "name = \"$name\""
        echo "version = \"0.0.0\""
        echo "edition = \"2024\""
        echo "publish = false"
        echo "[dependencies]"
        case $kind in
        guarded) echo "kvown = { path = \"$kvown\", default-features = false }" ;;
        serde) echo "serde = { version = \"1\", features = [\"derive\"] }" ;;
        esac
    } >"$dir/$name/Cargo.toml"
    {
        echo "//! Generated by scripts/compile-cost.sh: $structs $kind structs."
        echo "#![allow(dead_code)]"
        for ((i = 0; i < structs; i++)); do
            if ((per_module > 0 && i % per_module == 0)); then
                ((i == 0)) || echo "}"
                echo "pub mod group$((i / per_module)) {"
            fi
            struct_source "$kind" "$i" "$owned" "$owners"
        done
        ((per_module == 0)) || echo "}"
    } >"$dir/$name/src/lib.rs"
}

# workspace DIR MEMBER...: a workspace of its own, pinned by the repository's lock file.
workspace() {
    local dir=$1
    shift
    mkdir -p "$dir"
    printf '[workspace]\nresolver = "3"\nmembers = [%s]\n' \
        "$(printf '"%s", ' "$@" | sed 's/, $//')" >"$dir/Cargo.toml"
    cp "$root/Cargo.lock" "$dir/Cargo.lock"
}

echo "generating $structs structs per crate in $work" >&2
# Package names start with `cost_`: a package named `serde` would shadow the dependency.
workspace "$work/head" cost_plain cost_serde cost_guarded cost_more_fields cost_more_owners
crate "$work/head" cost_plain plain "" 4 2
crate "$work/head" cost_serde serde "" 4 2
crate "$work/head" cost_guarded guarded "$root" 4 2
crate "$work/head" cost_more_fields guarded "$root" 5 2
crate "$work/head" cost_more_owners guarded "$root" 4 3
timed=(plain serde guarded)
if [ -n "$baseline" ]; then
    workspace "$work/baseline" cost_guarded
    crate "$work/baseline" cost_guarded guarded "$baseline" 4 2
    timed+=(baseline)
fi

# dir_of CRATE: the workspace and package of a timed crate.
dir_of() {
    case $1 in
    baseline) echo "$work/baseline cost_guarded" ;;
    *) echo "$work/head cost_$1" ;;
    esac
}

export CARGO_INCREMENTAL=0
echo "building the dependencies" >&2
for name in "${timed[@]}"; do
    read -r dir package < <(dir_of "$name")
    for command in check build; do
        (cd "$dir" && cargo "$command" --quiet -p "$package")
    done
done

# measure COMMAND CRATE: prints "CRATE COMMAND cpu-seconds wall-seconds" for one timed run.
measure() {
    local command=$1 name=$2 dir package times
    read -r dir package < <(dir_of "$name")
    touch "$dir/$package/src/lib.rs"
    times=$(cd "$dir" && TIMEFORMAT='%U %S %R' && { time cargo "$command" --quiet -p "$package" >/dev/null; } 2>&1 | tail -n1)
    read -r user system wall <<<"$times"
    echo "$name $command $(awk "BEGIN { print $user + $system }") $wall"
}

results="$work/times.txt"
: >"$results"
for ((round = 1; round <= repeats; round++)); do
    echo "round $round/$repeats" >&2
    for command in check build; do
        for name in "${timed[@]}"; do
            echo "$round $(measure "$command" "$name")" >>"$results"
        done
    done
done

# expanded CRATE: lines of `-Zunpretty=expanded` of a crate of the head workspace. rustc is run
# by hand on the dependencies `cargo check` built (RUSTC_BOOTSTRAP in cargo's environment would
# rebuild them all).
expanded() {
    local package="cost_$1" externs
    externs=$(cd "$work/head" && cargo check --quiet -p "$package" --message-format=json |
        python3 -c '
import json, sys
for line in sys.stdin:
    message = json.loads(line)
    if message.get("reason") != "compiler-artifact" or "lib" not in message["target"]["kind"]:
        continue
    name = message["target"]["name"]
    if name in ("kvown", "serde"):
        rmeta = [f for f in message["filenames"] if f.endswith(".rmeta")][0]
        print("--extern " + name + "=" + rmeta + " -L dependency=" + rmeta.rsplit("/", 1)[0])
')
    # shellcheck disable=SC2086 # one word per flag
    RUSTC_BOOTSTRAP=1 rustc --edition 2024 --crate-type lib --crate-name "$package" \
        "$work/head/$package/src/lib.rs" $externs -Zunpretty=expanded | wc -l
}
echo "expanding" >&2
expansion="$work/expansion.txt"
for name in plain serde guarded more_fields more_owners; do
    echo "$name $(expanded "$name")" >>"$expansion"
done

echo
layout="in the crate root"
((per_module == 0)) || layout="in modules of $per_module"
echo "$structs structs $layout, $repeats rounds, $(nproc) cores, $(rustc --version); uptime:$(uptime | sed 's/.*load average/ load average/')"
python3 - "$results" "$expansion" "$structs" <<'EOF'
import statistics
import sys

results, expansion, structs = sys.argv[1], sys.argv[2], int(sys.argv[3])
cpu, wall = {}, {}
for line in open(results):
    rnd, name, command, seconds, elapsed = line.split()
    cpu.setdefault((command, name), {})[int(rnd)] = float(seconds)
    wall.setdefault((command, name), {})[int(rnd)] = float(elapsed)
names = [n for n in ("plain", "serde", "guarded", "baseline") if ("check", n) in cpu]
label = {
    "plain": "plain structs",
    "serde": "plain + serde Serialize + Deserialize",
    "guarded": "#[kvown::guarded]",
    "baseline": "#[kvown::guarded], --baseline",
}


def ratio(command, name, base):
    pairs = cpu[(command, name)]
    return statistics.median(pairs[r] / cpu[(command, base)][r] for r in pairs)


print()
print("| crate | check CPU s | check vs plain | check vs serde | build CPU s | build vs plain | build vs serde |")
print("|---|---|---|---|---|---|---|")
for name in names:
    row = [label[name]]
    for command in ("check", "build"):
        row.append(f"{statistics.median(cpu[(command, name)].values()):.2f}")
        row.append(f"{ratio(command, name, 'plain'):.1f}x")
        row.append(f"{ratio(command, name, 'serde'):.2f}x")
    print("| " + " | ".join(row) + " |")
print()
print("wall seconds (median): " + ", ".join(
    f"{name} check {statistics.median(wall[('check', name)].values()):.2f} "
    f"build {statistics.median(wall[('build', name)].values()):.2f}" for name in names))

lines = dict(line.split() for line in open(expansion))
lines = {k: int(v) for k, v in lines.items()}
print()
print("| crate | expanded lines | per struct |")
print("|---|---|---|")
for name in ("plain", "serde", "guarded"):
    print(f"| {label[name]} | {lines[name]} | {lines[name] / structs:.0f} |")
print()
print(f"a guarded struct of this shape: {lines['guarded'] / structs:.0f} lines; "
      f"one more owned field adds {(lines['more_fields'] - lines['guarded']) / structs:.0f}, "
      f"one more owner (listed by every owned field) "
      f"{(lines['more_owners'] - lines['guarded']) / structs:.0f}")
EOF
