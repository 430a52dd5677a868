#!/usr/bin/env bash
# kvown-events' KV-event stream decoded by vLLM's and sglang's own event classes: for each
# dialect, the oldest and newest engine version the README claims. Makes a virtual environment
# with msgspec and pyzmq (the engines' decoder and ZMQ binding), builds the `event_stream`
# example, and runs scripts/event_decoders.py, which fetches each engine wheel without its
# dependencies (`pip download --no-deps`; about 1.4 GB of vLLM wheels the first time), keeps
# only its `kv_events.py` (and vLLM's `kv_cache_utils.py`) under target/event-decoders/engines,
# and decodes a live stream published by kvown over ZMQ on 127.0.0.1 with every version.
# Needs python3 (3.10 or later, with venv) and the network to PyPI on the first run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-$root/target}"
work="$target/event-decoders"
venv="$work/venv"
if ! "$venv/bin/python" -c 'import msgspec, zmq' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        msgspec==0.23.0 pyzmq==27.3.0
fi
cargo build -p kvown-events --example event_stream --quiet
"$venv/bin/python" scripts/event_decoders.py \
    --stream "$target/debug/examples/event_stream" --cache "$work/engines"
