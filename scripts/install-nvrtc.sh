#!/usr/bin/env bash
# Installs NVRTC (PyPI package nvidia-cuda-nvrtc-cu12) into .venv at the repository root, so the
# kvown-cuda NVRTC compile test can run on a machine with no GPU and no CUDA toolkit.
# Idempotent: an existing, working install is left alone. Prints the library directory last.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="${NVRTC_VERSION:-12.9.86}"
cd "$root"
if ! "$root/scripts/nvrtc-lib-dir.sh" >/dev/null 2>&1; then
    [ -x .venv/bin/python ] || python3 -m venv .venv
    .venv/bin/pip install --quiet --disable-pip-version-check "nvidia-cuda-nvrtc-cu12==${version}" >&2
fi
"$root/scripts/nvrtc-lib-dir.sh"
