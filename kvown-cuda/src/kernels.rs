//! The CUDA C kernel sources (`src/kernels/*.cu`, embedded at build time), their run-time NVRTC
//! compilation, and the loaded kernel functions.

use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{Ptx, result as nvrtc, sys as nvrtc_sys};

use crate::error::{Unavailable, panic_message};

/// One `.cu` file: its name, its text, and the `extern "C"` kernels it must define.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// File name, used as the NVRTC program name in diagnostics.
    pub name: &'static str,
    /// The CUDA C source.
    pub source: &'static str,
    /// Kernel entry points the Rust side loads from it.
    pub functions: &'static [&'static str],
}

/// The step scatter: `scatter_step` writes a staged packet's table writes on the device.
pub const SCATTER_SOURCE: KernelSource = KernelSource {
    name: "scatter.cu",
    source: include_str!("kernels/scatter.cu"),
    functions: &["scatter_step"],
};

/// The KV row kernels, one per word width: `store_kv_wN`, `gather_kv_wN`, `copy_pages_wN`.
pub const KV_SOURCE: KernelSource = KernelSource {
    name: "kv.cu",
    source: include_str!("kernels/kv.cu"),
    functions: &[
        "store_kv_w16",
        "store_kv_w8",
        "store_kv_w4",
        "store_kv_w2",
        "gather_kv_w16",
        "gather_kv_w8",
        "gather_kv_w4",
        "gather_kv_w2",
        "copy_pages_w16",
        "copy_pages_w8",
        "copy_pages_w4",
        "copy_pages_w2",
    ],
};

/// Every kernel source of the crate.
pub const KERNEL_SOURCES: [KernelSource; 2] = [SCATTER_SOURCE, KV_SOURCE];

/// Word widths of the KV row kernels, widest first; index `i` matches the `_w{WORD_BYTES[i]}`
/// kernels.
pub const WORD_BYTES: [usize; 4] = [16, 8, 4, 2];

/// Why a kernel source did not compile.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// `libnvrtc.so.12` could not be loaded.
    #[error(
        "NVRTC not found: no libnvrtc.so.12 on the library path (run scripts/install-nvrtc.sh)"
    )]
    NvrtcMissing,
    /// NVRTC rejected the source; `log` is its program log.
    #[error("NVRTC could not compile {source_name} for {arch}:\n{log}")]
    Rejected {
        /// The source's file name.
        source_name: &'static str,
        /// Target architecture, e.g. `sm_90`.
        arch: String,
        /// NVRTC's program log.
        log: String,
    },
    /// An NVRTC call other than the compilation itself failed.
    #[error("NVRTC call failed for {source_name}: {error}")]
    Nvrtc {
        /// The source's file name.
        source_name: &'static str,
        /// The NVRTC status.
        error: nvrtc::NvrtcError,
    },
    /// cudarc panicked inside NVRTC (for example a symbol missing from an old libnvrtc).
    #[error("NVRTC panicked while compiling {source_name}: {message}")]
    Panicked {
        /// The source's file name.
        source_name: &'static str,
        /// The panic message.
        message: String,
    },
}

/// PTX produced by NVRTC, with the program log (empty when there were no warnings).
#[derive(Debug, Clone)]
pub struct CompiledPtx {
    /// The PTX text.
    pub ptx: String,
    /// NVRTC's program log.
    pub log: String,
}

/// True when `libnvrtc.so.12` can be loaded. Never panics.
pub fn nvrtc_available() -> bool {
    // SAFETY: is_culib_present only tries libloading::Library::new on candidate names.
    unsafe { nvrtc_sys::is_culib_present() }
}

/// The `sm_XY` architecture name for a compute capability.
pub fn arch_for(compute_capability: (i32, i32)) -> String {
    format!("sm_{}{}", compute_capability.0, compute_capability.1)
}

/// Compiles `source` to PTX for `arch` (e.g. `"sm_90"`) with NVRTC. Never panics.
pub fn compile(source: &KernelSource, arch: &str) -> Result<CompiledPtx, CompileError> {
    if !nvrtc_available() {
        return Err(CompileError::NvrtcMissing);
    }
    catch_unwind(AssertUnwindSafe(|| compile_loaded(source, arch))).unwrap_or_else(|panic| {
        Err(CompileError::Panicked {
            source_name: source.name,
            message: panic_message(panic.as_ref()),
        })
    })
}

/// An NVRTC program, destroyed on drop.
struct Program(nvrtc_sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: self.0 came from create_program and is destroyed only here. A failure to
        // destroy leaks the program, which is all we could do about it anyway.
        let _ = unsafe { nvrtc::destroy_program(self.0) };
    }
}

fn c_chars_to_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn compile_loaded(source: &KernelSource, arch: &str) -> Result<CompiledPtx, CompileError> {
    let nvrtc_error = |error| CompileError::Nvrtc {
        source_name: source.name,
        error,
    };
    let text = CString::new(source.source).expect("kernel sources contain no NUL byte");
    let name = CString::new(source.name).expect("kernel file names contain no NUL byte");
    let program = Program(nvrtc::create_program(&text, Some(&name)).map_err(nvrtc_error)?);
    let options = [
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_owned(),
    ];
    // SAFETY: program.0 is a live program; `text` and `name` outlive it (dropped after it).
    let compiled = unsafe { nvrtc::compile_program(program.0, &options) };
    // SAFETY: program.0 is a live program.
    let log =
        c_chars_to_string(&unsafe { nvrtc::get_program_log(program.0) }.map_err(nvrtc_error)?);
    if compiled.is_err() {
        return Err(CompileError::Rejected {
            source_name: source.name,
            arch: arch.to_owned(),
            log,
        });
    }
    // SAFETY: program.0 is a live, successfully compiled program.
    let ptx = c_chars_to_string(&unsafe { nvrtc::get_ptx(program.0) }.map_err(nvrtc_error)?);
    Ok(CompiledPtx { ptx, log })
}

/// Kernels of one word width (see [`WORD_BYTES`]).
#[derive(Debug)]
pub(crate) struct RowKernels {
    pub(crate) store_kv: CudaFunction,
    pub(crate) gather_kv: CudaFunction,
    pub(crate) copy_pages: CudaFunction,
}

/// Every kernel, loaded into one context.
#[derive(Debug)]
pub(crate) struct Kernels {
    pub(crate) scatter_step: CudaFunction,
    /// Indexed like [`WORD_BYTES`].
    pub(crate) rows: Vec<RowKernels>,
}

impl Kernels {
    /// Compiles both sources for `arch` and loads them into `ctx`.
    pub(crate) fn load(ctx: &Arc<CudaContext>, arch: &str) -> Result<Self, Unavailable> {
        let module = |source: &KernelSource| {
            let compiled = compile(source, arch).map_err(|error| match error {
                CompileError::NvrtcMissing => Unavailable::NoNvrtc,
                other => Unavailable::KernelCompile {
                    arch: arch.to_owned(),
                    detail: other.to_string(),
                },
            })?;
            ctx.load_module(Ptx::from_src(compiled.ptx))
                .map_err(|error| Unavailable::ModuleLoad {
                    detail: format!("{}: {error}", source.name),
                })
        };
        let scatter = module(&SCATTER_SOURCE)?;
        let kv = module(&KV_SOURCE)?;
        let function = |module: &Arc<cudarc::driver::CudaModule>, name: &str| {
            module
                .load_function(name)
                .map_err(|error| Unavailable::ModuleLoad {
                    detail: format!("kernel {name}: {error}"),
                })
        };
        let rows = WORD_BYTES
            .iter()
            .map(|bytes| {
                Ok(RowKernels {
                    store_kv: function(&kv, &format!("store_kv_w{bytes}"))?,
                    gather_kv: function(&kv, &format!("gather_kv_w{bytes}"))?,
                    copy_pages: function(&kv, &format!("copy_pages_w{bytes}"))?,
                })
            })
            .collect::<Result<_, Unavailable>>()?;
        Ok(Self {
            scatter_step: function(&scatter, "scatter_step")?,
            rows,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_names_follow_the_compute_capability() {
        assert_eq!(arch_for((9, 0)), "sm_90");
        assert_eq!(arch_for((8, 6)), "sm_86");
    }
}
