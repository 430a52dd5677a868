#!/usr/bin/env bash
# Device check for kvown-cuda, for a machine with an NVIDIA GPU: the NVRTC compile test, every
# GPU test (`gpu_*`: the K/V pool, and the staged allocator's device table and out_cache_loc
# under the real batch flow, with and without decode graphs, each against the CPU), the engine
# end to end on CUDA with the invariant checker and the device table's verification after every
# step, the engine timed on CUDA and on the CPU in the same run (the CUDA median must be within
# 5 us of the CPU's), the kernel timing table (decode step with graph and with copy + launch,
# extend, store_kv, copy_pages), the scatter's and store_kv's own device time (Nsight Compute)
# and compute-sanitizer memcheck over the GPU tests (both where the runtime lets them read the
# device). Every stage runs even when
# an earlier one fails (one device session should bring back as much as it can); the script
# fails at the end if any stage failed, or if a GPU test printed "skipped:" (then the GPU path
# did not run and nothing was verified).
#
# With cargo it builds in release first. Without cargo (a lent GPU machine has no Rust toolchain
# and no network) it runs the binaries of device-bundle/, made beforehand on a build machine by
# scripts/device-bundle.sh and carried along. The log also goes to $OUT/device-check.log when
# OUT is set.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
log="${OUT:-$(mktemp -d)}/device-check.log"

failures=()
tests_log=""
# Runs stage `$1` (the command that follows), recording its failure and printing its duration.
stage() {
    local name="$1" started=$SECONDS
    shift
    echo "== $name"
    "$@" || failures+=("$name")
    echo "== $name: $((SECONDS - started)) s"
}

# Runs the command under a limit of `$1` seconds where `timeout` exists (a device session's time
# is short: a hung stage must not take the rest of it).
limit() {
    local seconds="$1"
    shift
    if command -v timeout >/dev/null; then
        timeout --kill-after=5 "$seconds" "$@"
    else
        "$@"
    fi
}

# The device time of the first launches of each timed kernel, without the host's part: Nsight
# Compute over the timing program (clocks left alone), one kernel at a time, since its launch
# count would otherwise be spent on the first kernels the program launches.
kernel_durations() {
    local kernel rc=0
    for kernel in scatter_step store_kv_w16; do
        limit 60 ncu --clock-control none --metrics gpu__time_duration.sum \
            -k "regex:^${kernel}\$" --launch-count 3 "$1" >"${tests_log}.ncu" 2>&1 || rc=1
        grep -E "^  ${kernel} |gpu__time_duration" "${tests_log}.ncu" || rc=1
    done
    return $rc
}

# The engine timed on CUDA and on the CPU, one after the other (`$1`: the engine), each median
# kvown time per step printed; fails unless the CUDA median is at most the CPU's plus 5 us (one
# copy and one launch per step). Both JSON summaries go to $OUT when it is set.
engine_cuda_vs_cpu() {
    local dir="${OUT:-$(mktemp -d)}" backend rc=0
    for backend in cuda cpu; do
        limit 120 "$1" --backend "$backend" --requests 1024 --json >"$dir/engine-$backend.json" || rc=1
    done
    [ $rc = 0 ] || return 1
    python3 - "$dir/engine-cuda.json" "$dir/engine-cpu.json" <<'PY'
import json, sys
cuda, cpu = (json.load(open(path))["kvown_ns_per_step_median"] / 1e3 for path in sys.argv[1:])
print(f"engine median kvown time per step: CUDA {cuda:.2f} us, CPU {cpu:.2f} us, "
      f"difference {cuda - cpu:+.2f} us (target: at most +5 us)")
sys.exit(0 if cuda <= cpu + 5 else 1)
PY
}

# Runs the timing program `$1` once more, its JSON report to $OUT/kernel-timing.json.
kernel_timing_json() {
    limit 120 "$1" --json >"$OUT/kernel-timing.json"
}

# What the machine offers: GPU, driver, CUDA libraries, C library. Printed before anything runs,
# so a failure to load CUDA or NVRTC can be explained from the log alone.
machine() {
    echo "== machine"
    uname -srm
    ldd --version 2>/dev/null | head -1
    nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total,clocks.max.sm \
        --format=csv 2>/dev/null || echo "nvidia-smi: not available"
    ldconfig -p 2>/dev/null | grep -E 'libcuda\.so|libnvrtc' || echo "ldconfig: no libcuda/libnvrtc"
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
}

# Runs the command, printing its output and appending it to the tests log.
logged() {
    local out rc
    out="$(mktemp)"
    "$@" >"$out" 2>&1
    rc=$?
    tee -a "$tests_log" <"$out"
    return $rc
}

main() {
    # NVRTC: the venv's, the machine's CUDA toolkit's or its Python packages'; installed from
    # PyPI only on a build machine (a lent GPU machine has no network).
    local path
    if path="$(scripts/nvrtc-lib-dir.sh 2>/dev/null)" ||
        { command -v cargo >/dev/null && path="$(scripts/install-nvrtc.sh)"; }; then
        export LD_LIBRARY_PATH="${path}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "NVRTC from: $path"
    else
        echo "NVRTC: none found; the compile test will skip"
    fi
    machine

    local examples
    if command -v cargo >/dev/null; then
        export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
        cargo build --release -p kvown-cuda --all-targets &&
            cargo build --release --example engine || return 1
        examples="$CARGO_TARGET_DIR/release/examples"
        sanitized=""
        nvrtc_test() { cargo test --release -p kvown-cuda --test it -- --nocapture nvrtc_compile::; }
        gpu_tests() { cargo test --release -p kvown-cuda -- --nocapture --test-threads=1 gpu_; }
    elif [ -d device-bundle ]; then
        echo "no cargo: running device-bundle/ (built from $(cat device-bundle/COMMIT))"
        examples=device-bundle/examples
        sanitized="device-bundle/tests/it --test-threads=1 gpu_"
        nvrtc_test() { limit 60 device-bundle/tests/it --nocapture nvrtc_compile::; }
        gpu_tests() {
            local test rc=0
            for test in device-bundle/tests/*; do
                limit 150 "$test" --nocapture --test-threads=1 gpu_ || rc=1
            done
            return $rc
        }
    else
        echo "device-check: no cargo and no device-bundle/ (make it with scripts/device-bundle.sh)"
        return 1
    fi

    tests_log="$(mktemp)"
    stage "NVRTC compile test" logged nvrtc_test
    stage "GPU tests" logged gpu_tests
    # A skip notice goes to stderr, so it can land mid-line after the test's name.
    if grep -q 'skipped:' "$tests_log"; then
        failures+=("a GPU test was skipped (see 'skipped:' above): the GPU path did not run")
    fi
    stage "engine on CUDA, checker and device table verification every step" \
        limit 120 "$examples/engine" --backend cuda --requests 256 --check
    stage "engine on CUDA and on the CPU, timed (no per-step checks)" \
        engine_cuda_vs_cpu "$examples/engine"
    stage "kernel timing" limit 120 "$examples/kernel_timing"
    if [ -n "${OUT:-}" ]; then
        stage "kernel timing as JSON (\$OUT/kernel-timing.json; a second run)" \
            kernel_timing_json "$examples/kernel_timing"
    fi
    # Nsight Compute and compute-sanitizer read the device only under Firecracker; gVisor
    # (kernel 4.4.0) refuses them.
    if command -v ncu >/dev/null && [ "$(uname -r)" != 4.4.0 ]; then
        stage "kernel-only durations (Nsight Compute)" kernel_durations "$examples/kernel_timing"
    else
        echo "== Nsight Compute: not run (not installed, or gVisor)"
    fi
    if command -v compute-sanitizer >/dev/null && [ "$(uname -r)" != 4.4.0 ] && [ -n "$sanitized" ]; then
        stage "compute-sanitizer memcheck of the GPU differential tests" limit 150 \
            compute-sanitizer --tool memcheck --error-exitcode 1 $sanitized
    else
        echo "== compute-sanitizer: not run (not installed, gVisor, or no bundle)"
    fi

    if [ ${#failures[@]} -gt 0 ]; then
        printf 'device-check: FAILED: %s\n' "${failures[@]}"
        return 1
    fi
    echo "device-check: every stage passed"
}

main 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
