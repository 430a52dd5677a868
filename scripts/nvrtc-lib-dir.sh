#!/usr/bin/env bash
# Prints the LD_LIBRARY_PATH entries that let cudarc load NVRTC, or exits 1 (printing nothing)
# when no NVRTC is found. Looks, in order, at the .venv made by scripts/install-nvrtc.sh (NVRTC
# 12.9 from PyPI), then at CUDA toolkits and Python packages already on the machine (a GPU
# machine's CUDA 12 or 13, PyTorch's own NVRTC). cudarc (built for CUDA 12.8) tries
# `libnvrtc.so` and `libnvrtc.so.12` among others, but not `libnvrtc.so.13`: a directory that
# holds only a versioned library gets a `libnvrtc.so` link to it in a temporary directory, printed
# before the library's own directory (which still serves its libnvrtc-builtins).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
shopt -s nullglob
candidates=(
    "$root"/.venv/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib
    /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib
    /usr/local/cuda-1[23]*/lib64 /usr/local/cuda-1[23]*/targets/x86_64-linux/lib
    /usr/lib/x86_64-linux-gnu
    /opt/*/.venv/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib
    /opt/*/.venv/lib/python3*/site-packages/nvidia/cu13/lib
    /usr/local/lib/python3*/dist-packages/nvidia/cuda_nvrtc/lib
    /usr/local/lib/python3*/dist-packages/nvidia/cu13/lib
)
for dir in "${candidates[@]}"; do
    if [ -e "$dir/libnvrtc.so" ] || [ -e "$dir/libnvrtc.so.12" ]; then
        echo "$dir"
        exit 0
    fi
done
for dir in "${candidates[@]}"; do
    for lib in "$dir"/libnvrtc.so.1[3-9]; do
        links="$(mktemp -d)"
        ln -s "$lib" "$links/libnvrtc.so"
        echo "$links:$dir"
        exit 0
    done
done
exit 1
