#!/usr/bin/env bash
# Prints the directory holding libnvrtc.so.12 from the .venv made by scripts/install-nvrtc.sh,
# whatever the venv's Python version. Exits 1 (printing nothing) when it is not installed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for dir in "$root"/.venv/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib; do
    if [ -e "$dir/libnvrtc.so.12" ]; then
        echo "$dir"
        exit 0
    fi
done
exit 1
