#!/usr/bin/env bash
# rustdoc check: a guarded struct, its accessors and its init struct are documented as items of
# the user's module, never of kvown's hidden module, whether the struct is public or private.
#
# Renders the downstream example crate (`examples/downstream`, the place to start) twice: as a
# library's public API, and with `--document-private-items` (what `cargo doc` does for a binary
# crate), both with warnings as errors. Then greps the HTML for each struct's page, its getter,
# setter and `_mut` accessor, its `Init` struct, and the owner functions, and checks that no
# page lives under or links to a hidden `sealed_*` module. Last, documents every compile-pass
# case of the ui suite.
# Exit status 0: everything found; 1: a miss (each miss is printed).
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
doc="$target/doc/kvown_downstream"
misses=0

miss() {
    echo "MISS ($1): $2"
    misses=$((misses + 1))
}

# has PASS FILE PATTERN WHAT: FILE (under the rendered crate) contains PATTERN.
has() {
    local file="$doc/$2"
    if [[ ! -f "$file" ]]; then
        miss "$1" "$4: no page $2"
    elif ! grep -q -- "$3" "$file"; then
        miss "$1" "$4: $2 lacks $3"
    fi
}

# struct PASS MODULE STRUCT FIELD: the struct's page with its accessors, and its Init struct.
struct_page() {
    local pass=$1 module=$2 name=$3 field=$4
    has "$pass" "$module/struct.$name.html" "id=\"method.$field\"" "getter of $name::$field"
    has "$pass" "$module/struct.$name.html" "id=\"method.set_$field\"" "setter of $name::$field"
    has "$pass" "$module/struct.$name.html" "id=\"method.${field}_mut\"" "_mut of $name::$field"
    has "$pass" "$module/struct.${name}Init.html" "struct ${name}Init" "init struct of $name"
    has "$pass" "$module/index.html" "struct.$name.html" "$name listed in $module"
    has "$pass" "$module/index.html" "struct.${name}Init.html" "${name}Init listed in $module"
}

render() { # PASS RUSTDOCFLAGS
    rm -rf "$doc"
    RUSTDOCFLAGS="$2" cargo doc --quiet --no-deps -p kvown-downstream
    echo "rendered ($1): $doc"
}

public() {
    struct_page public ledger Account balance
    struct_page public orders Order state
    struct_page public storage Bin items
    has public "ledger/index.html" "fn.deposit.html" "owner fn deposit listed in ledger"
    has public "orders/struct.Order.html" "id=\"method.ship\"" "method owner Order::ship"
    has public "storage/struct.Bin.html" "id=\"method.put\"" "method owner Bin::put"
    has public "ledger/trait.AccountBalanceOwner.html" "AccountBalanceOwner" "owner trait page"
}

render public "-D warnings"
public
if [[ -e "$doc/journal/struct.Journal.html" ]]; then
    miss public "the private struct Journal is documented without --document-private-items"
fi
hidden_pages() {
    # Redirect pages (rustdoc's stubs for re-exported items) are the only pages allowed under a
    # hidden module; a real page there, or a link to one, means an item was not inlined.
    local found
    found=$(find "$doc" -path '*/sealed_*' -name '*.html' -exec grep -L 'http-equiv="refresh"' {} + || true)
    [[ -z "$found" ]] || miss "$1" "pages under a hidden module: $found"
    if grep -rlq 'href="[^"]*sealed_[^"]*"' "$doc" --include='*.html' --exclude-dir='sealed_*'; then
        miss "$1" "links into a hidden module: $(grep -rl 'href="[^"]*sealed_' "$doc" --include='*.html' | head -3)"
    fi
}
hidden_pages public

render private "--document-private-items -D warnings"
public
struct_page private journal Journal events
has private "journal/index.html" "fn.record.html" "private owner fn record listed in journal"
has private "journal/struct.Journal.html" "id=\"method.into_init\"" "Journal::into_init"
has private "journal/struct.Journal.html" "id=\"method.clear\"" "private method owner Journal::clear"
hidden_pages private

# Every compile-pass case (`tests/ui/pass/`, modules of the `ui` test binary) also documents,
# private items included: the form rustdoc sees is not the compiled one, so each pattern that must
# compile must document too. One rustdoc run over `tests/ui.rs` as a library renders them all
# (its tests are compiled out there, so trybuild is not needed).
rlib=$(cargo build --quiet -p kvown --message-format=json |
    grep -o '"filenames":\["[^"]*/libkvown\.rlib"' | tail -n1 | sed 's/.*\["//; s/"$//')
[[ -f "$rlib" ]] || { echo "no kvown rlib from cargo build"; exit 1; }
out=$(mktemp -d)
if ! log=$(rustdoc --edition 2024 --crate-type lib --crate-name ui_pass_cases \
    --document-private-items -D warnings -L "dependency=$target/debug/deps" \
    --extern "kvown=$rlib" -o "$out" tests/ui.rs 2>&1); then
    miss pass-cases "rustdoc fails on the compile-pass cases:
$log"
fi
cases=$(find "$out/ui_pass_cases/pass" -mindepth 3 -maxdepth 3 -name index.html | wc -l)
expected=$(ls tests/ui/pass/*/*.rs | wc -l)
((cases == expected)) || miss pass-cases "$cases of $expected compile-pass cases rendered"
rm -rf "$out"
echo "documented: $cases compile-pass cases"

if ((misses > 0)); then
    echo "rustdoc check: $misses miss(es)"
    exit 1
fi
echo "rustdoc check: every struct page, accessor and Init struct found, in both renderings"
