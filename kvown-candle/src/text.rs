//! Text in and out through a checkpoint's `tokenizer.json` (feature `tokenizers`).

use std::path::{Path, PathBuf};

use crate::error::ModelError;

/// A Hugging Face tokenizer loaded from a checkpoint directory.
#[derive(Debug, Clone)]
pub struct TextCodec {
    tokenizer: tokenizers::Tokenizer,
    path: PathBuf,
}

impl TextCodec {
    /// The tokenizer of `dir` (`tokenizer.json`), or `None` when it has none.
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] naming the file when it cannot be read.
    pub fn load(dir: &Path) -> Result<Option<TextCodec>, ModelError> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Ok(None);
        }
        let tokenizer =
            tokenizers::Tokenizer::from_file(&path).map_err(|error| ModelError::Tokenizer {
                path: path.clone(),
                reason: error.to_string(),
            })?;
        Ok(Some(TextCodec { tokenizer, path }))
    }

    /// The tokens of `text` (with the tokenizer's special tokens, a BOS for Llama).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        self.tokenizer
            .encode(text, true)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|error| self.error(error))
    }

    /// The text of `tokens`, special tokens left out.
    pub fn decode(&self, tokens: &[u32]) -> Result<String, ModelError> {
        self.tokenizer
            .decode(tokens, true)
            .map_err(|error| self.error(error))
    }

    fn error(&self, error: tokenizers::Error) -> ModelError {
        ModelError::Tokenizer {
            path: self.path.clone(),
            reason: error.to_string(),
        }
    }
}
