#!/usr/bin/env bash
# Installs NVIDIA NIXL's C API for kvown-nixl: downloads the nixl-cu12 wheel from PyPI (without
# its dependencies: torch and numpy are not needed) and unpacks its libraries into
# .nixl/<version>/ at the repository root, where kvown-nixl looks first after KVOWN_NIXL_LIB:
#   .nixl/<version>/lib/             libnixl_capi.so, libnixl.so and the NIXL plugins (plugins/)
#   .nixl/<version>/nixl_cu12.libs/  UCX and the other libraries they link (found via RPATH)
# The wheel's libraries are the same for every Python version; the CPython 3.11 wheel is taken
# whatever python3 runs this. No GPU or CUDA is needed to run the UCX backend on host memory.
# Idempotent: an existing install is left alone. Prints the folder holding libnixl_capi.so last.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="${NIXL_VERSION:-1.5.1}"
dest="$root/.nixl/$version"
if [ -e "$dest/lib/libnixl_capi.so" ]; then
    echo "$dest/lib"
    exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.11 --platform manylinux_2_28_x86_64 \
    --dest "$work" "nixl-cu12==${version}" >&2
wheel="$(ls "$work"/nixl_cu12-"$version"-*.whl)"
# Only the two library folders (the wheel's Python modules and its 110 MB of torch extensions
# are not needed), into a staging folder renamed into place at the end.
python3 - "$wheel" "$work/unpacked" <<'PY'
import os, stat, sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
renames = {".nixl_cu12.mesonpy.libs/": "lib/", "nixl_cu12.libs/": "nixl_cu12.libs/"}
with zipfile.ZipFile(wheel) as archive:
    for info in archive.infolist():
        for prefix, target in renames.items():
            if info.filename.startswith(prefix) and not info.is_dir():
                path = os.path.join(out, target + info.filename[len(prefix):])
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with archive.open(info) as source, open(path, "wb") as sink:
                    sink.write(source.read())
                os.chmod(path, stat.S_IRUSR | stat.S_IWUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
PY
mkdir -p "$root/.nixl"
rm -rf "$dest"
mv "$work/unpacked" "$dest"
echo "$dest/lib"
