#!/usr/bin/env bash
# Builds, here, everything scripts/device-check.sh runs on a GPU machine, into device-bundle/
# (git-ignored): the release test binaries of kvown-cuda and the release `engine` and
# `kernel_timing` examples. A lent GPU machine has no Rust toolchain and no network, so a device
# session carries this folder (`carry: ["device-bundle"]`) and runs `scripts/device-check.sh`,
# which uses the bundle when there is no cargo. Rebuild it right before a device run: the bundle
# records the commit it was built from (`-dirty` when the tree had changes). Prints the bundle's
# size (the carry limit is 64 MiB with the working tree).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bundle="$root/device-bundle"
rm -rf "$bundle"
mkdir -p "$bundle/tests" "$bundle/examples"
# The executables cargo reports for the release test targets (unit and integration) of
# kvown-cuda, named after their target.
cargo test --release -p kvown-cuda --no-run --message-format=json |
    python3 -c '
import json, shutil, sys
for line in sys.stdin:
    message = json.loads(line)
    target = message.get("target", {})
    if message.get("executable") and {"lib", "test"} & set(target.get("kind", [])):
        shutil.copy(message["executable"], sys.argv[1] + "/" + target["name"])
' "$bundle/tests"
cargo build --release --example engine
cargo build --release -p kvown-cuda --example kernel_timing
target="${CARGO_TARGET_DIR:-$root/target}/release/examples"
cp "$target/engine" "$target/kernel_timing" "$bundle/examples/"
git describe --always --dirty >"$bundle/COMMIT"
ls "$bundle/tests" "$bundle/examples"
du -sh "$bundle"
