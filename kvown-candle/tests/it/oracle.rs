//! The oracle: candle-transformers' `models::llama::Llama` on the same checkpoint, one dense
//! `Cache` per request, fed the tokens the server's requests hold. The logits after a token
//! sequence are kept for the whole test binary: the differential tests serve the same workload
//! under every eviction policy, and the oracle computes each sequence once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::llama::{Cache, Config, Llama, LlamaConfig};

/// One request's dense cache and the tokens fed into it.
struct Dense {
    cache: Cache,
    fed: Vec<u32>,
}

/// The logits after each token sequence computed in this test binary, by checkpoint.
type Computed = HashMap<(PathBuf, Vec<u32>), Vec<f32>>;

fn computed() -> &'static Mutex<Computed> {
    static COMPUTED: OnceLock<Mutex<Computed>> = OnceLock::new();
    COMPUTED.get_or_init(Mutex::default)
}

/// candle-transformers' Llama with a dense cache per request.
pub struct Oracle {
    dir: PathBuf,
    model: Llama,
    config: Config,
    requests: HashMap<u64, Dense>,
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
            dir: dir.to_path_buf(),
            model: Llama::load(vb, &config).expect("candle-transformers loads the model"),
            config,
            requests: HashMap::new(),
        }
    }

    /// The logits after `tokens[..=position]` of request `rid`: the ones computed for the same
    /// sequence earlier in this test binary, or else computed now on the request's dense cache.
    pub fn logits(&mut self, rid: u64, tokens: &[u32], position: usize) -> Vec<f32> {
        let want = &tokens[..=position];
        let key = (self.dir.clone(), want.to_vec());
        if let Some(logits) = computed().lock().expect("the oracle's table").get(&key) {
            return logits.clone();
        }
        let logits = self.compute(rid, want);
        computed()
            .lock()
            .expect("the oracle's table")
            .insert(key, logits.clone());
        logits
    }

    /// Runs candle-transformers' model over the tokens of `want` that request `rid`'s dense
    /// cache lacks; a request whose tokens do not extend what was fed (a position computed again
    /// after a retraction) is fed again from scratch.
    fn compute(&mut self, rid: u64, want: &[u32]) -> Vec<f32> {
        let fresh = |config: &Config| Dense {
            cache: Cache::new(true, DType::F32, config, &Device::Cpu).expect("a dense cache"),
            fed: Vec::new(),
        };
        let dense = self
            .requests
            .entry(rid)
            .or_insert_with(|| fresh(&self.config));
        if dense.fed.len() >= want.len() || dense.fed[..] != want[..dense.fed.len()] {
            *dense = fresh(&self.config);
        }
        let start = dense.fed.len();
        let input = Tensor::new(&want[start..], &Device::Cpu)
            .and_then(|t| t.unsqueeze(0))
            .expect("an input tensor");
        let logits = self
            .model
            .forward(&input, start, &mut dense.cache)
            .and_then(|logits| logits.squeeze(0))
            .and_then(|logits| logits.to_vec1())
            .expect("the oracle computes");
        dense.fed = want.to_vec();
        logits
    }

    /// Drops a finished request's cache.
    pub fn forget(&mut self, rid: u64) {
        self.requests.remove(&rid);
    }
}
