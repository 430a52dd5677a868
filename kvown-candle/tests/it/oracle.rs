//! The oracle: candle-transformers' `models::llama::Llama` on the same checkpoint, one dense
//! `Cache` per request, fed the tokens the server's requests hold.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::llama::{Cache, Config, Llama, LlamaConfig};

/// One request's dense cache and the tokens fed into it.
struct Dense {
    cache: Cache,
    fed: Vec<u32>,
    /// The logits after each position it returned, by position.
    logits: HashMap<usize, Vec<f32>>,
}

/// candle-transformers' Llama with a dense cache per request.
pub struct Oracle {
    model: Llama,
    config: Config,
    requests: HashMap<u64, Dense>,
    /// Tokens the oracle computed (for the test's own accounting).
    pub tokens_computed: usize,
}

impl Oracle {
    /// Loads `dir` (`config.json`, `model.safetensors`) as candle-transformers reads them.
    pub fn load(dir: &Path) -> Oracle {
        let json = std::fs::read_to_string(dir.join("config.json")).expect("config.json");
        let config: LlamaConfig = serde_json::from_str(&json).expect("candle reads the config");
        let config = config.into_config(false);
        let tensors = candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu)
            .expect("candle reads the weights");
        let vb = VarBuilder::from_tensors(tensors, DType::F32, &Device::Cpu);
        Oracle {
            model: Llama::load(vb, &config).expect("candle-transformers loads the model"),
            config,
            requests: HashMap::new(),
            tokens_computed: 0,
        }
    }

    /// The logits after `tokens[..=position]` of request `rid`. Its dense cache grows by the
    /// tokens it has not seen; a request whose tokens do not extend what was fed (a position
    /// computed again after a retraction) is answered from the logits kept, or fed again from
    /// scratch.
    pub fn logits(&mut self, rid: u64, tokens: &[u32], position: usize) -> Vec<f32> {
        let want = &tokens[..=position];
        let config = &self.config;
        let dense = self.requests.entry(rid).or_insert_with(|| Dense {
            cache: Cache::new(true, DType::F32, config, &Device::Cpu).expect("a dense cache"),
            fed: Vec::new(),
            logits: HashMap::new(),
        });
        if dense.fed.len() >= want.len()
            && dense.fed[..want.len()] == *want
            && let Some(logits) = dense.logits.get(&position)
        {
            return logits.clone();
        }
        if dense.fed.len() >= want.len() || dense.fed[..] != want[..dense.fed.len()] {
            *dense = Dense {
                cache: Cache::new(true, DType::F32, config, &Device::Cpu).expect("a dense cache"),
                fed: Vec::new(),
                logits: HashMap::new(),
            };
        }
        let start = dense.fed.len();
        let input = Tensor::new(&want[start..], &Device::Cpu)
            .and_then(|t| t.unsqueeze(0))
            .expect("an input tensor");
        let logits: Vec<f32> = self
            .model
            .forward(&input, start, &mut dense.cache)
            .and_then(|logits| logits.squeeze(0))
            .and_then(|logits| logits.to_vec1())
            .expect("the oracle computes");
        self.tokens_computed += want.len() - start;
        dense.fed = want.to_vec();
        dense.logits.insert(position, logits.clone());
        logits
    }

    /// Drops a finished request's cache.
    pub fn forget(&mut self, rid: u64) {
        self.requests.remove(&rid);
    }
}
