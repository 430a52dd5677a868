#!/usr/bin/env bash
# Zero-cost check: the release assembly of `guarded_write_loop` (a write through an owner's
# capability) must equal that of `plain_write_loop` (a plain field write), both from
# `benches/workloads/guarded.rs` as compiled into the bench example.
#
# Builds the bench example in release with `--emit asm`, extracts the two function bodies, strips
# local labels, directives and symbol names, and diffs them. When LLVM merged the two functions
# (one symbol is an alias of the other: `.set`), they are identical by construction.
# Exit status 0: identical; 1: different (the diff is printed).
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
rm -f "$target"/release/examples/bench-*.s
touch examples/bench.rs # force the rebuild that writes the assembly
cargo rustc --quiet --release --example bench -p kvown -- --emit asm -C codegen-units=1 >/dev/null
asm=$(ls -t "$target"/release/examples/bench-*.s | head -n1)
echo "assembly: $asm ($(rustc --version), $(uname -m))"

symbol_of() { # the defined (label line) mangled symbol whose last path segment is $1
    grep -E "^_?_ZN[_A-Za-z0-9.$]*[0-9]${1}17h[0-9a-f]{16}E:" "$asm" | head -n1 | sed 's/:$//'
}
alias_of() { # prints the target when $1 is defined as an alias (`a = b` or `.set a, b`)
    grep -E "^\s*(\.set\s+)?[_A-Za-z0-9.$]*${1}[_A-Za-z0-9.$]*\s*(=|,)\s*[_A-Za-z]" "$asm" |
        head -n1 | sed -E 's/.*(=|,)\s*//'
}
body_of() { # the instructions of symbol $1, labels and symbol names normalised
    awk -v sym="$1" '
        $0 == sym":" { inside = 1; next }
        inside && /^\s*\.cfi_endproc/ { exit }
        inside { print }
    ' "$asm" |
        grep -vE '^\s*\.(cfi_|p2align|loc|file|type|size|section)' |
        sed -E 's/\.LBB[0-9_]+/.L/g; s/\.Ltmp[0-9]+/.Ltmp/g; s/_ZN[_A-Za-z0-9$.]+/SYM/g; s/#.*$//; s/\s+$//' |
        grep -v '^\s*$'
}

for name in guarded_write_loop plain_write_loop; do
    target_symbol=$(alias_of "$name" || true)
    if [[ -n "$target_symbol" ]]; then
        echo "$name is an alias of $target_symbol"
        echo "IDENTICAL: LLVM merged the guarded and the plain write loop into one function"
        echo "(function merging only merges functions whose machine-independent IR is equal)"
        exit 0
    fi
done
guarded=$(symbol_of guarded_write_loop || true)
plain=$(symbol_of plain_write_loop || true)
if [[ -z "$guarded" && -n "$plain" ]] && grep -q 'guarded_write_loop as fn' examples/bench.rs; then
    # The example takes guarded_write_loop's address (through black_box) and it is
    # #[inline(never)], so its body can only vanish if LLVM replaced every use by an equal
    # function: every reference now points at plain_write_loop.
    echo "guarded_write_loop has no body of its own: its address and calls resolve to $plain"
    echo "IDENTICAL: LLVM merged the guarded and the plain write loop into one function"
    exit 0
fi
if [[ -z "$guarded" || -z "$plain" ]]; then
    echo "could not find both symbols in $asm" >&2
    exit 2
fi
echo "guarded: $guarded ($(body_of "$guarded" | wc -l) instructions)"
echo "plain:   $plain ($(body_of "$plain" | wc -l) instructions)"
if diff <(body_of "$guarded") <(body_of "$plain"); then
    echo "IDENTICAL: the guarded write compiles to the same instructions as the plain write"
else
    echo "DIFFERENT: see the diff above" >&2
    exit 1
fi
