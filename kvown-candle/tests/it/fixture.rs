//! The tiny checkpoint every test shares: random weights written to safetensors under the
//! test's target directory, and the model loaded back through the real loader.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use kvown_candle::{PagedLlama, random};

/// The seed of the tiny model's weights.
pub const WEIGHTS_SEED: u64 = 0x5EED;

/// A fresh directory for `name` under the test binary's scratch space.
pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("kvown-candle")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// The tiny checkpoint's directory (written once per test binary).
pub fn tiny_checkpoint() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch("tiny");
        random::write_random_checkpoint(&dir, &random::tiny_config(), WEIGHTS_SEED)
            .expect("the tiny checkpoint is written");
        dir
    })
}

/// The tiny model, loaded from [`tiny_checkpoint`].
pub fn tiny_model() -> Arc<PagedLlama> {
    static MODEL: OnceLock<Arc<PagedLlama>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            Arc::new(PagedLlama::load(tiny_checkpoint()).expect("the tiny model loads"))
        })
        .clone()
}
