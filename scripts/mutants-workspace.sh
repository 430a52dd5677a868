#!/usr/bin/env bash
# Mutation testing at workspace scope: each mutant cargo-mutants finds is tested with tests of
# other packages too. `cargo mutants -p kvown-macros` runs only the macro crate's own tests (and
# cargo-mutants 27.1 did the same for `-p kvown-runtime` here even with `--test-workspace=true`),
# but the macro crate's behaviour is pinned down by the root crate's trybuild suite and audit
# test, so those runs report caught mutants as missed. This script lists the mutants with
# cargo-mutants (which applies `.cargo/mutants.toml`'s exclusions), then applies each one's diff
# in a scratch worktree of HEAD and runs the test command there.
#
#   scripts/mutants-workspace.sh [CARGO-MUTANTS FILTER ARGS...]
#   scripts/mutants-workspace.sh -p kvown-macros -f seal.rs
#   MUTANTS_TEST='cargo test -q --test it audit' scripts/mutants-workspace.sh -p kvown-ownership -f audit.rs
#
# MUTANTS_TEST is the test command (default: the tests that pin the macros down: the root
# integration tests (the audit among them), the trybuild suite, the macro crate's unit tests and the runtime's ownership table; about
# 30 s a mutant on 2 cores once built). The mutated package is built first: a mutant that does not
# build is "unviable". A test command that fails (a macro that breaks its users' build included)
# or runs past MUTANTS_TIMEOUT seconds (default 600) "caught" it; one that passes "missed" it. Results go
# to mutants-workspace.out/outcomes.txt (one line per mutant) and the missed ones' diffs to
# mutants-workspace.out/missed.diff. The scratch worktree builds in its own target directory,
# `$CARGO_TARGET_DIR-mutants-ws` (or `target/mutants-ws`), so the first mutant takes a full build.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
command -v cargo-mutants >/dev/null || {
    echo "mutants-workspace.sh: cargo-mutants is not installed (cargo install cargo-mutants)" >&2
    exit 1
}
default_tests="cargo test -q --test it --test ui && cargo test -q -p kvown-macros"
default_tests+=" && cargo test -q -p kvown-runtime --test it ownership_table::"
test_cmd="${MUTANTS_TEST:-$default_tests}"
limit="${MUTANTS_TIMEOUT:-600}"
out="$root/mutants-workspace.out"
target="${CARGO_TARGET_DIR:+$CARGO_TARGET_DIR-mutants-ws}"
export CARGO_TARGET_DIR="${target:-$root/target/mutants-ws}"

work="$(mktemp -d)"
trap 'git worktree remove --force "$work/tree" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
cargo mutants --list --json --diff "$@" >"$work/mutants.json"
count="$(jq length "$work/mutants.json")"
[ "$count" -gt 0 ] || { echo "no mutants match: $*" >&2; exit 1; }
git worktree add --detach --quiet "$work/tree" HEAD
rm -rf "$out" && mkdir -p "$out"
: >"$out/outcomes.txt"
: >"$out/missed.diff"

cd "$work/tree"
echo "baseline: $test_cmd" >&2
bash -c "$test_cmd" >"$work/log" 2>&1 || {
    echo "the tests fail without any mutant (HEAD, log below); fix that first" >&2
    tail -40 "$work/log" >&2
    exit 1
}
declare -A tally=([caught]=0 [missed]=0 [unviable]=0)
for index in $(seq 0 $((count - 1))); do
    name="$(jq -r ".[$index].name" "$work/mutants.json")"
    file="$(jq -r ".[$index].file" "$work/mutants.json")"
    package="$(jq -r ".[$index].package" "$work/mutants.json")"
    # cargo-mutants names the new side of its diff after the mutation; patch wants the file.
    jq -r ".[$index].diff" "$work/mutants.json" | sed "2s|^+++ .*|+++ $file|" >"$work/mutant.diff"
    patch --quiet -p0 <"$work/mutant.diff"
    if ! cargo build -q -p "$package" >"$work/log" 2>&1; then
        outcome=unviable
    elif timeout "$limit" bash -c "$test_cmd" >"$work/log" 2>&1; then
        outcome=missed
        cat "$work/mutant.diff" >>"$out/missed.diff"
    else
        outcome=caught
    fi
    git checkout --quiet -- .
    tally[$outcome]=$((tally[$outcome] + 1))
    printf '%-8s %s\n' "$outcome" "$name" | tee -a "$out/outcomes.txt"
done
echo "$count mutants: ${tally[caught]} caught, ${tally[missed]} missed, ${tally[unviable]} unviable" |
    tee -a "$out/outcomes.txt"
