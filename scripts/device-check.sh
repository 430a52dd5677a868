#!/usr/bin/env bash
# Device check for kvown-cuda, for a machine with an NVIDIA GPU: builds in release, runs the
# NVRTC compile test, the CUDA-vs-CPU differential tests, and the kernel timing table.
# A test that prints "skipped:" here means the GPU path did NOT run; the script then fails.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
# NVRTC: the host's own libnvrtc.so.12 if the loader finds it, else the venv copy.
if lib_dir="$(scripts/nvrtc-lib-dir.sh 2>/dev/null || scripts/install-nvrtc.sh)"; then
    export LD_LIBRARY_PATH="${lib_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv || true
cargo build --release -p kvown-cuda --all-targets
log="$(mktemp)"
cargo test --release -p kvown-cuda -- --nocapture --test-threads=1 2>&1 | tee "$log"
if grep -q '^skipped:' "$log"; then
    echo "device-check: a GPU test was skipped (see 'skipped:' above); nothing was verified" >&2
    exit 1
fi
cargo run --release -p kvown-cuda --example kernel_timing
