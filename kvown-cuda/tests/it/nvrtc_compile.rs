//! Compiles every kernel source with NVRTC to PTX for sm_80 and sm_90, failing on any compile
//! error or warning. Needs no GPU, only NVRTC (scripts/install-nvrtc.sh puts libnvrtc.so.12 in
//! .venv). When the library is not on LD_LIBRARY_PATH but scripts/nvrtc-lib-dir.sh finds one,
//! the test re-runs itself with that path added, so a plain `cargo test` works.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use kvown_cuda::kernels::{KERNEL_SOURCES, compile, nvrtc_available};

use super::skip_notice;

const ARCHES: [&str; 2] = ["sm_80", "sm_90"];
const REEXEC_MARKER: &str = "KVOWN_NVRTC_REEXEC";

/// The NVRTC library path (directories joined by `:`) printed by scripts/nvrtc-lib-dir.sh, if
/// it finds one. The script's path is fixed at build time, so a binary run elsewhere (a device
/// bundle) finds no script; scripts/device-check.sh sets LD_LIBRARY_PATH before it runs there.
fn nvrtc_lib_path() -> Option<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/nvrtc-lib-dir.sh");
    let output = Command::new("bash").arg(script).output().ok()?;
    let dir = String::from_utf8(output.stdout).ok()?.trim().to_owned();
    (output.status.success() && !dir.is_empty()).then_some(dir)
}

/// Re-runs test `name` (of this module) with `dir` on LD_LIBRARY_PATH; returns its success.
fn rerun_with(dir: &str, name: &str) -> bool {
    let path = match std::env::var("LD_LIBRARY_PATH") {
        Ok(old) if !old.is_empty() => format!("{dir}:{old}"),
        _ => dir.to_owned(),
    };
    let status = Command::new(std::env::current_exe().expect("test binary path"))
        .args(["--exact", &format!("nvrtc_compile::{name}"), "--nocapture"])
        .env("LD_LIBRARY_PATH", path)
        .env(REEXEC_MARKER, "1")
        .status()
        .expect("re-running the test binary");
    status.success()
}

/// True when NVRTC is loadable here. Otherwise re-runs test `name` with the library path of
/// scripts/nvrtc-lib-dir.sh (asserting it passes) or prints why it is skipped, and returns false.
fn nvrtc_or_rerun(name: &str) -> bool {
    if nvrtc_available() {
        return true;
    }
    match nvrtc_lib_path() {
        Some(dir) if std::env::var_os(REEXEC_MARKER).is_none() => {
            println!("NVRTC not on LD_LIBRARY_PATH; re-running {name} with {dir}");
            assert!(
                rerun_with(&dir, name),
                "{name} failed with NVRTC from {dir}"
            );
        }
        Some(dir) => panic!("NVRTC from {dir} is on the library path but does not load"),
        None => skip_notice("skipped: NVRTC not found (run scripts/install-nvrtc.sh)"),
    }
    false
}

#[test]
fn every_kernel_compiles_without_warnings() {
    if !nvrtc_or_rerun("every_kernel_compiles_without_warnings") {
        return;
    }
    let mut failures = Vec::new();
    for arch in ARCHES {
        for source in &KERNEL_SOURCES {
            let started = Instant::now();
            match compile(source, arch) {
                Err(error) => failures.push(format!("{} {arch}: {error}", source.name)),
                Ok(compiled) => {
                    let elapsed = started.elapsed();
                    if !compiled.log.trim().is_empty() {
                        failures.push(format!(
                            "{} {arch}: NVRTC log is not empty (warnings are errors):\n{}",
                            source.name, compiled.log
                        ));
                    }
                    let target = format!(".target {arch}");
                    if !compiled.ptx.contains(&target) {
                        failures.push(format!("{} {arch}: PTX lacks `{target}`", source.name));
                    }
                    for function in source.functions {
                        if !compiled.ptx.contains(&format!(".entry {function}(")) {
                            failures.push(format!("{} {arch}: no entry {function}", source.name));
                        }
                    }
                    println!(
                        "compiled {} for {arch}: {} bytes of PTX, {} kernels, {:.1} ms",
                        source.name,
                        compiled.ptx.len(),
                        source.functions.len(),
                        elapsed.as_secs_f64() * 1e3
                    );
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A broken source is reported as an error carrying NVRTC's log, and a warning shows up in the
/// log of a successful compile (which the test above treats as a failure).
#[test]
fn errors_and_warnings_reach_the_log() {
    if !nvrtc_or_rerun("errors_and_warnings_reach_the_log") {
        return;
    }
    let broken = kvown_cuda::kernels::KernelSource {
        name: "broken.cu",
        source: "extern \"C\" __global__ void k() { undefined_symbol = 1; }",
        functions: &["k"],
    };
    let error = compile(&broken, "sm_90").expect_err("undefined identifier must not compile");
    assert!(error.to_string().contains("undefined_symbol"), "{error}");
    let warns = kvown_cuda::kernels::KernelSource {
        name: "warns.cu",
        source: "extern \"C\" __global__ void k(int* out) { int unused; *out = 1; }",
        functions: &["k"],
    };
    let compiled = compile(&warns, "sm_90").expect("a warning is not an error for NVRTC");
    assert!(compiled.log.contains("warning"), "log: {:?}", compiled.log);
}
