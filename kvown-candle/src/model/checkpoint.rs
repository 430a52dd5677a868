//! Reading a checkpoint's weights: the `*.safetensors` files of a directory, every tensor a
//! config calls for found once and with its shape, before any model is built.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

use crate::config::LlamaConfig;
use crate::error::ModelError;

/// The tensors `config` calls for, with their shapes, under the names Hugging Face's Llama
/// (and candle-transformers' `Llama::load`) use.
pub fn expected_tensors(config: &LlamaConfig) -> Vec<(String, Vec<usize>)> {
    let hidden = config.hidden_size;
    let kv_width = config.num_key_value_heads() * config.head_dim();
    let inner = config.intermediate_size;
    let mut tensors = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![config.vocab_size, hidden],
    )];
    for layer in 0..config.num_hidden_layers {
        let name = |part: &str| format!("model.layers.{layer}.{part}.weight");
        tensors.extend([
            (name("input_layernorm"), vec![hidden]),
            (name("self_attn.q_proj"), vec![hidden, hidden]),
            (name("self_attn.k_proj"), vec![kv_width, hidden]),
            (name("self_attn.v_proj"), vec![kv_width, hidden]),
            (name("self_attn.o_proj"), vec![hidden, hidden]),
            (name("post_attention_layernorm"), vec![hidden]),
            (name("mlp.gate_proj"), vec![inner, hidden]),
            (name("mlp.up_proj"), vec![inner, hidden]),
            (name("mlp.down_proj"), vec![hidden, inner]),
        ]);
    }
    tensors.push(("model.norm.weight".to_string(), vec![hidden]));
    if !config.tied_embeddings() {
        tensors.push((
            "lm_head.weight".to_string(),
            vec![config.vocab_size, hidden],
        ));
    }
    tensors
}

/// The `*.safetensors` files of `dir`, in name order.
pub(crate) fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let entries = std::fs::read_dir(dir).map_err(|source| ModelError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|source| ModelError::Io {
                path: dir.to_path_buf(),
                source,
            })?
            .path();
        if path.extension().is_some_and(|ext| ext == "safetensors") {
            files.push(path);
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(ModelError::NoWeights {
            dir: dir.to_path_buf(),
        });
    }
    Ok(files)
}

/// A checkpoint's tensors, each with the file it came from.
pub(crate) struct Weights {
    /// Every tensor, by name.
    pub(crate) tensors: HashMap<String, Tensor>,
    origin: HashMap<String, PathBuf>,
    files: Vec<PathBuf>,
}

impl Weights {
    /// Every tensor of `files`, each once, or the file that is unreadable or repeats a name.
    pub(crate) fn read(files: &[PathBuf]) -> Result<Weights, ModelError> {
        let mut weights = Weights {
            tensors: HashMap::new(),
            origin: HashMap::new(),
            files: files.to_vec(),
        };
        for file in files {
            let bytes = std::fs::read(file).map_err(|source| ModelError::Io {
                path: file.clone(),
                source,
            })?;
            let loaded =
                candle_core::safetensors::load_buffer(&bytes, &Device::Cpu).map_err(|source| {
                    ModelError::Safetensors {
                        path: file.clone(),
                        source,
                    }
                })?;
            for (name, tensor) in loaded {
                if let Some(first) = weights.origin.get(&name) {
                    return Err(ModelError::DuplicateTensor {
                        tensor: name,
                        first: first.clone(),
                        second: file.clone(),
                    });
                }
                weights.origin.insert(name.clone(), file.clone());
                weights.tensors.insert(name, tensor);
            }
        }
        Ok(weights)
    }

    /// Tensors built in memory (no file): errors name `source` as their file.
    pub(crate) fn in_memory(tensors: HashMap<String, Tensor>, source: &Path) -> Weights {
        let origin = tensors
            .keys()
            .map(|name| (name.clone(), source.to_path_buf()))
            .collect();
        Weights {
            tensors,
            origin,
            files: vec![source.to_path_buf()],
        }
    }

    /// Checks that every tensor `config` calls for is here, with its shape.
    ///
    /// # Errors
    /// [`ModelError::MissingTensor`] naming the tensor and the files searched, or
    /// [`ModelError::TensorShape`] naming the tensor, its file and both shapes.
    pub(crate) fn check(&self, config: &LlamaConfig) -> Result<(), ModelError> {
        for (name, shape) in expected_tensors(config) {
            let Some(tensor) = self.tensors.get(&name) else {
                return Err(ModelError::MissingTensor {
                    tensor: name,
                    files: self.files.clone(),
                });
            };
            if tensor.dims() != shape.as_slice() {
                return Err(ModelError::TensorShape {
                    file: self.origin[&name].clone(),
                    tensor: name,
                    expected: shape,
                    found: tensor.dims().to_vec(),
                });
            }
        }
        Ok(())
    }
}
