#!/usr/bin/env bash
# Zero-cost check: the release assembly of `kvown::bench::guarded_write_loop` (a write through an
# owner's capability) must equal that of `kvown::bench::plain_write_loop` (a plain field write).
#
# Builds the facade crate in release with `--emit asm`, extracts the two function bodies, strips
# local labels, directives and symbol names, and diffs them. When LLVM merged the two functions
# (one symbol is an alias of the other: `.set`), they are identical by construction.
# Exit status 0: identical; 1: different (the diff is printed).
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
rm -f "$target"/release/deps/kvown-*.s
touch src/lib.rs # force the rebuild that writes the assembly
cargo rustc --quiet --release --lib -p kvown -- --emit asm -C codegen-units=1 >/dev/null
asm=$(ls -t "$target"/release/deps/kvown-*.s | head -n1)
echo "assembly: $asm ($(rustc --version), $(uname -m))"

symbol_of() { # the mangled symbol whose name contains $1 and that is defined (a label line)
    grep -E "^_?[_A-Za-z0-9.$]*${1}[_A-Za-z0-9.$]*:" "$asm" | head -n1 | sed 's/:$//'
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
    target_symbol=$(alias_of "$name")
    if [[ -n "$target_symbol" ]]; then
        echo "$name is an alias of $target_symbol"
        echo "IDENTICAL: LLVM merged the guarded and the plain write loop into one function"
        echo "(function merging only merges functions whose machine-independent IR is equal)"
        exit 0
    fi
done
guarded=$(symbol_of guarded_write_loop)
plain=$(symbol_of plain_write_loop)
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
