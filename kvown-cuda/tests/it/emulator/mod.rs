//! The kernels of `src/kernels/` compiled as host C++ (with `cuda_shim.hpp`) and driven as the
//! CUDA backend drives them (the staging ring's packets, [`kvown_cuda::KvPlanner`]'s launches):
//! the same launches, run on the CPU block by block and thread by thread. This checks the
//! kernels' index arithmetic and the host side on machines without a GPU; only the driver calls
//! (copy, launch, copy back) are left to the GPU check.
//!
//! Each emulator is a C++ driver program (`*_driver.cpp`) that includes one `.cu` file, owns the
//! emulated device memory and answers each command line on stdin with one line on stdout. This
//! module builds and runs the drivers; `alloc` and `kv` speak their protocols.

mod kv;
mod scatter;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::OnceLock;

pub use kv::EmulatedKvPool;
pub use scatter::{EmulatedLink, Pace};

/// A driver program, `tests/it/emulator/<source>`, built at most once per test binary.
pub struct Driver {
    source: &'static str,
    binary: OnceLock<Result<PathBuf, String>>,
}

impl Driver {
    /// The driver compiled from `source`.
    pub const fn new(source: &'static str) -> Self {
        Self {
            source,
            binary: OnceLock::new(),
        }
    }

    /// Starts a driver process, building the driver first if needed. `Err` says why it cannot
    /// be built here (no C++ compiler); sources that do not compile panic.
    pub fn start(&'static self) -> Result<Process, &'static str> {
        let binary = self.binary.get_or_init(|| self.build());
        binary
            .as_ref()
            .map(|binary| Process::start(binary))
            .map_err(String::as_str)
    }

    fn build(&self) -> Result<PathBuf, String> {
        let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".to_string());
        let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let stem = self.source.trim_end_matches(".cpp");
        let output = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("kvown-{stem}-{}", std::process::id()));
        let status = Command::new(&compiler)
            .args(["-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-I"])
            .arg(crate_dir.join("src/kernels"))
            .arg("-I")
            .arg(crate_dir.join("tests/it/emulator"))
            .arg(crate_dir.join("tests/it/emulator").join(self.source))
            .arg("-o")
            .arg(&output)
            .status();
        match status {
            Err(error) => Err(format!("no C++ compiler `{compiler}` ({error})")),
            Ok(status) if status.success() => Ok(output),
            Ok(status) => panic!("{} does not compile as host C++ ({status})", self.source),
        }
    }
}

/// One running driver process; killed on drop.
pub struct Process {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Process {
    fn start(binary: &Path) -> Process {
        let mut child = Command::new(binary)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the emulator starts");
        let input = child.stdin.take().expect("piped stdin");
        let output = BufReader::new(child.stdout.take().expect("piped stdout"));
        Process {
            child,
            input,
            output,
        }
    }

    /// Sends one command and returns the reply line, without its newline. Panics when the
    /// driver exits instead of answering (its stderr says why).
    pub fn send(&mut self, command: &str) -> String {
        writeln!(self.input, "{command}").expect("the emulator reads");
        self.input.flush().expect("the emulator reads");
        let mut line = String::new();
        self.output
            .read_line(&mut line)
            .expect("the emulator answers");
        assert!(
            !line.is_empty(),
            "the emulator exited on `{}`",
            head(command)
        );
        line.truncate(line.trim_end().len());
        line
    }

    /// Sends a command whose reply must be `ok`.
    pub fn send_ok(&mut self, command: &str) {
        let reply = self.send(command);
        assert_eq!(reply, "ok", "emulator command `{}`", head(command));
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The start of a command, for messages (uploads carry whole buffers).
fn head(command: &str) -> &str {
    let end = command
        .char_indices()
        .nth(120)
        .map_or(command.len(), |(index, _)| index);
    &command[..end]
}
