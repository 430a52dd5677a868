//! Finding and loading `libnixl_capi.so` once per process.
//!
//! Candidates, in order: `KVOWN_NIXL_LIB` (the library, or a folder holding it), the folder
//! `scripts/install-nixl.sh` fills in this workspace (`.nixl/<version>/lib`), then the bare name
//! through the system loader (`LD_LIBRARY_PATH`, `ld.so.cache`). The wheel's libraries find
//! their own dependencies through their `RPATH`s, and NIXL finds its plugins beside `libnixl.so`
//! (`plugins/`), so no environment variable is needed once the library is found.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use libloading::Library;

use crate::error::Unavailable;
use crate::ffi::Api;

/// The NIXL version `scripts/install-nixl.sh` installs by default.
pub const NIXL_VERSION: &str = "1.5.1";

/// The library's file name.
const LIBRARY: &str = "libnixl_capi.so";

static API: OnceLock<Result<Arc<Api>, Unavailable>> = OnceLock::new();

/// The process-wide C API table, loading it on first use; every later call returns the same
/// answer.
pub(crate) fn api() -> Result<Arc<Api>, Unavailable> {
    API.get_or_init(|| load_first(&candidates()).map(Arc::new))
        .clone()
}

/// Whether NIXL's C API loads here, and if not, why. Loads it (once) to find out.
pub fn available() -> Result<(), Unavailable> {
    api().map(|_| ())
}

/// The paths tried, in order.
fn candidates() -> Vec<PathBuf> {
    let mut paths = Vec::new();
    if let Some(configured) = std::env::var_os("KVOWN_NIXL_LIB") {
        let configured = PathBuf::from(configured);
        paths.push(match configured.is_dir() {
            true => configured.join(LIBRARY),
            false => configured,
        });
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let workspace = manifest.parent().unwrap_or(manifest);
    paths.push(
        workspace
            .join(".nixl")
            .join(NIXL_VERSION)
            .join("lib")
            .join(LIBRARY),
    );
    paths.push(PathBuf::from(LIBRARY));
    paths
}

/// Loads the first candidate that is NIXL's C API.
fn load_first(candidates: &[PathBuf]) -> Result<Api, Unavailable> {
    let mut tried = Vec::new();
    for path in candidates {
        // A bare name goes to the system loader's search; a path that does not exist is skipped
        // with that reason (the loader's own message would be less clear).
        if path.components().count() > 1 && !path.exists() {
            tried.push(format!("{}: no such file", path.display()));
            continue;
        }
        // SAFETY: loading runs the library's initialisers; NIXL's C API and its dependencies
        // are ordinary shared libraries with no initialiser that needs more than a process.
        match unsafe { Library::new(path) } {
            Ok(library) => return load_api(library, path),
            Err(error) => match std::error::Error::source(&error) {
                Some(cause) => tried.push(format!("{}: {error}: {cause}", path.display())),
                None => tried.push(format!("{}: {error}", path.display())),
            },
        }
    }
    Err(Unavailable::NotFound { tried })
}

/// The table of `library`'s functions, unless a symbol is missing or the library is the stub.
fn load_api(library: Library, path: &Path) -> Result<Api, Unavailable> {
    let path = path.display().to_string();
    // SAFETY: a library exporting every `nixl_capi_*` symbol this crate declares is NIXL's C
    // API; a library lacking one is refused by `Api::load` before any call.
    let api = unsafe { Api::load(library, &path) }?;
    // SAFETY: `nixl_capi_is_stub` takes nothing and returns a bool.
    if unsafe { (api.nixl_capi_is_stub)() } {
        return Err(Unavailable::Stub { path });
    }
    Ok(api)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_unavailable_naming_every_path_tried() {
        let paths = [
            PathBuf::from("/nonexistent/kvown/libnixl_capi.so"),
            PathBuf::from("libkvown-no-such-library.so"),
        ];
        let Err(Unavailable::NotFound { tried }) = load_first(&paths) else {
            panic!("nothing to load");
        };
        assert_eq!(tried.len(), 2);
        assert!(tried[0].starts_with("/nonexistent/kvown/libnixl_capi.so: no such file"));
        assert!(tried[1].starts_with("libkvown-no-such-library.so: "));
        let message = Unavailable::NotFound { tried }.to_string();
        assert!(message.contains("scripts/install-nixl.sh"), "{message}");
    }

    #[test]
    fn a_library_that_is_not_nixl_is_unavailable_naming_the_first_missing_symbol() {
        // `nixl_capi_is_stub` is the first function `Api` declares.
        let error = load_first(&[PathBuf::from("libc.so.6")])
            .err()
            .expect("refused");
        assert!(
            matches!(
                &error,
                Unavailable::MissingSymbol { symbol, path, .. }
                    if *symbol == "nixl_capi_is_stub" && path == "libc.so.6"
            ),
            "{error}"
        );
    }
}
