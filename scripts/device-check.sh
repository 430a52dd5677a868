#!/usr/bin/env bash
# Device check for kvown-cuda, for a machine with an NVIDIA GPU: the NVRTC compile test, every
# GPU test (`gpu_*`: the CUDA allocator, the K/V pool and the device mirror under the real batch
# flow, each against the CPU), the engine end to end on CUDA with the invariant checker after
# every step, and the kernel timing table. Fails when any of them fails, and when a GPU test
# prints "skipped:" (the GPU path did not run, so nothing was verified).
#
# With cargo it builds in release first. Without cargo (a lent GPU machine has no Rust toolchain
# and no network) it runs the binaries of device-bundle/, made beforehand on a build machine by
# scripts/device-bundle.sh and carried along. Writes its log to $OUT/device-check.log when OUT
# is set.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
log="${OUT:-$(mktemp -d)}/device-check.log"
exec > >(tee "$log") 2>&1

# NVRTC: the venv's, the machine's CUDA toolkit's or its Python packages'; installed from PyPI
# only on a build machine (a lent GPU machine has no network).
if path="$(scripts/nvrtc-lib-dir.sh 2>/dev/null)" ||
    { command -v cargo >/dev/null && path="$(scripts/install-nvrtc.sh)"; }; then
    export LD_LIBRARY_PATH="${path}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "NVRTC from: $path"
else
    echo "NVRTC: none found; the compile test will skip" >&2
fi
nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv || true

if command -v cargo >/dev/null; then
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
    cargo build --release -p kvown-cuda --all-targets
    cargo build --release --example engine
    nvrtc_test() { cargo test --release -p kvown-cuda --test nvrtc_compile -- --nocapture; }
    gpu_tests() { cargo test --release -p kvown-cuda -- --nocapture --test-threads=1 gpu_; }
    examples="$CARGO_TARGET_DIR/release/examples"
elif [ -d device-bundle ]; then
    echo "no cargo: running device-bundle/ (built from commit $(cat device-bundle/COMMIT))"
    nvrtc_test() { device-bundle/tests/nvrtc_compile --nocapture; }
    gpu_tests() {
        for test in device-bundle/tests/*; do
            "$test" --nocapture --test-threads=1 gpu_
        done
    }
    examples=device-bundle/examples
else
    echo "device-check: no cargo and no device-bundle/ (make it with scripts/device-bundle.sh)" >&2
    exit 1
fi

echo "== NVRTC compile test and GPU tests"
tests_log="$(mktemp)"
{ nvrtc_test && gpu_tests; } 2>&1 | tee "$tests_log"
# A skip notice goes to stderr, so it can land mid-line after the test's name.
if grep -q 'skipped:' "$tests_log"; then
    echo "device-check: a GPU test was skipped (see 'skipped:' above); nothing was verified" >&2
    exit 1
fi
echo "== engine on CUDA, invariant checker after every step"
"$examples/engine" --backend cuda --requests 256 --check
echo "== kernel timing"
"$examples/kernel_timing"
