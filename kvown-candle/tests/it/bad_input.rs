//! Bad input gets a typed error that names the file or tensor at fault, and changes nothing:
//! broken checkpoints, contexts longer than the table's row, malformed forward batches.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use kvown_candle::forward_batch::{ForwardBatch, LogitRows, SeqInput};
use kvown_candle::{
    BatchError, ModelError, PagedLlama, Request, RequestError, ServeConfig, ServeError, Server,
    random,
};
use kvown_runtime::kv::{KvDtype, KvPool};

use crate::fixture::{WEIGHTS_SEED, scratch, tiny_checkpoint, tiny_model};

/// A copy of the tiny checkpoint in `name`, its tensors passed through `edit` first.
fn edited_checkpoint(name: &str, edit: impl FnOnce(&mut HashMap<String, Tensor>)) -> PathBuf {
    let dir = scratch(name);
    std::fs::copy(
        tiny_checkpoint().join("config.json"),
        dir.join("config.json"),
    )
    .unwrap();
    let mut tensors = random::random_weights(&random::tiny_config(), WEIGHTS_SEED).unwrap();
    edit(&mut tensors);
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
    dir
}

/// A copy of the tiny checkpoint in `name` whose config.json is `edit`ed.
fn edited_config(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let dir = scratch(name);
    std::fs::copy(
        tiny_checkpoint().join("model.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    let text = std::fs::read_to_string(tiny_checkpoint().join("config.json")).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(&mut config);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    dir
}

fn message(error: &ModelError) -> String {
    error.to_string()
}

#[test]
fn a_missing_tensor_is_named_with_the_files_searched() {
    let tensor = "model.layers.1.mlp.down_proj.weight";
    let dir = edited_checkpoint("missing_tensor", |tensors| {
        tensors.remove(tensor);
    });
    let error = PagedLlama::load(&dir).expect_err("a tensor is missing");
    assert!(
        matches!(&error, ModelError::MissingTensor { tensor: named, files }
            if named == tensor && files == &[dir.join("model.safetensors")]),
        "{error:?}"
    );
    assert!(message(&error).contains(tensor) && message(&error).contains("model.safetensors"));
}

#[test]
fn a_tensor_of_the_wrong_shape_is_named_with_its_file_and_both_shapes() {
    let tensor = "model.layers.0.self_attn.k_proj.weight";
    let dir = edited_checkpoint("wrong_shape", |tensors| {
        let wrong = Tensor::zeros((16, 64), DType::F32, &Device::Cpu).unwrap();
        tensors.insert(tensor.to_string(), wrong);
    });
    let error = PagedLlama::load(&dir).expect_err("a tensor has the wrong shape");
    match &error {
        ModelError::TensorShape {
            tensor: named,
            file,
            expected,
            found,
        } => {
            assert_eq!(named, tensor);
            assert_eq!(file, &dir.join("model.safetensors"));
            // 2 K/V heads of 16 over a hidden size of 64.
            assert_eq!(
                (expected.as_slice(), found.as_slice()),
                (&[32, 64][..], &[16, 64][..])
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(message(&error).contains(tensor));
}

#[test]
fn an_unsupported_architecture_is_refused_naming_the_config() {
    let cases: [(&str, &str, serde_json::Value); 3] = [
        (
            "architectures",
            "Qwen2ForCausalLM",
            serde_json::json!(["Qwen2ForCausalLM"]),
        ),
        ("model_type", "mistral", serde_json::json!("mistral")),
        ("hidden_act", "gelu", serde_json::json!("gelu")),
    ];
    for (field, named, value) in cases {
        let dir = edited_config(&format!("arch_{field}"), |config| {
            config[field] = value;
        });
        let error = PagedLlama::load(&dir).expect_err("not a Llama");
        assert!(
            matches!(&error, ModelError::UnsupportedArchitecture { path, found }
                if path == &dir.join("config.json") && found.contains(named)),
            "{field}: {error:?}"
        );
        assert!(message(&error).contains("config.json"), "{error}");
    }
}

#[test]
fn configs_and_files_that_make_no_llama_are_refused() {
    let invalid = edited_config("heads", |config| {
        config["num_key_value_heads"] = serde_json::json!(3);
    });
    assert!(matches!(
        PagedLlama::load(&invalid),
        Err(ModelError::InvalidConfig { reason, .. }) if reason.contains("num_key_value_heads")
    ));
    let not_json = scratch("not_json");
    std::fs::write(not_json.join("config.json"), "{ hidden_size: ").unwrap();
    assert!(matches!(
        PagedLlama::load(&not_json),
        Err(ModelError::ConfigParse { path, .. }) if path.ends_with("config.json")
    ));
    let no_weights = edited_config("no_weights", |_| {});
    std::fs::remove_file(no_weights.join("model.safetensors")).unwrap();
    assert!(matches!(
        PagedLlama::load(&no_weights),
        Err(ModelError::NoWeights { dir }) if dir == no_weights
    ));
    let corrupt = edited_config("corrupt", |_| {});
    std::fs::write(corrupt.join("model.safetensors"), b"not a safetensors file").unwrap();
    assert!(matches!(
        PagedLlama::load(&corrupt),
        Err(ModelError::Safetensors { path, .. }) if path == corrupt.join("model.safetensors")
    ));
    // The same tensor in two shards.
    let sharded = edited_checkpoint("duplicate", |_| {});
    let mut one = HashMap::new();
    one.insert(
        "model.norm.weight".to_string(),
        Tensor::ones(64, DType::F32, &Device::Cpu).unwrap(),
    );
    candle_core::safetensors::save(&one, sharded.join("model-2.safetensors")).unwrap();
    assert!(matches!(
        PagedLlama::load(&sharded),
        Err(ModelError::DuplicateTensor { tensor, .. }) if tensor == "model.norm.weight"
    ));
    assert!(matches!(
        PagedLlama::load(Path::new("/nonexistent/kvown-candle")),
        Err(ModelError::Io { .. })
    ));
}

fn small_server() -> Server {
    let config = ServeConfig {
        max_context: 64,
        pool_tokens: 256,
        check_every_step: true,
        ..ServeConfig::default()
    };
    Server::new(tiny_model(), config).unwrap()
}

#[test]
fn a_context_longer_than_the_tables_row_is_refused_and_changes_nothing() {
    let mut server = small_server();
    let long = Request {
        rid: 1,
        prompt: vec![5; 60],
        max_new_tokens: 8,
    };
    assert_eq!(
        server.submit(long),
        Err(RequestError::ContextTooLong {
            rid: 1,
            prompt: 60,
            max_new_tokens: 8,
            // 67 positions, in whole pages of 16.
            needed: 80,
            row_width: 64,
        })
    );
    let refused = [
        Request {
            rid: 2,
            prompt: vec![],
            max_new_tokens: 1,
        },
        Request {
            rid: 3,
            prompt: vec![1],
            max_new_tokens: 0,
        },
        Request {
            rid: 4,
            prompt: vec![1, 256],
            max_new_tokens: 1,
        },
    ];
    for request in refused {
        assert!(server.submit(request).is_err());
    }
    assert!(server.is_idle());
    assert_eq!(server.in_flight(), 0);
    // The same id, now short enough, is served; the server was left whole.
    let fits = Request {
        rid: 1,
        prompt: vec![5; 40],
        max_new_tokens: 8,
    };
    server.submit(fits.clone()).unwrap();
    assert_eq!(
        server.submit(fits),
        Err(RequestError::DuplicateId { rid: 1 })
    );
    let mut outputs = Vec::new();
    while !server.is_idle() {
        outputs.extend(server.step().unwrap().finished);
    }
    assert_eq!(outputs.len(), 1);
    assert_eq!(outputs[0].output.len(), 8);
    server.finish().unwrap();
}

#[test]
fn a_context_past_the_models_positions_is_refused() {
    let config = ServeConfig {
        max_context: 1024,
        ..ServeConfig::default()
    };
    let mut server = Server::new(tiny_model(), config).unwrap();
    let refused = server.submit(Request {
        rid: 1,
        prompt: vec![1; 500],
        max_new_tokens: 20,
    });
    assert_eq!(
        refused,
        Err(RequestError::PastModelPositions {
            rid: 1,
            needed: 519,
            max_positions: 512,
        })
    );
    assert!(matches!(
        Server::new(
            tiny_model(),
            ServeConfig {
                pool_tokens: 100,
                ..ServeConfig::default()
            }
        ),
        Err(ServeError::Config(_))
    ));
}

#[test]
fn a_forward_batch_with_a_bad_slot_or_token_computes_and_stores_nothing() {
    let model = tiny_model();
    let mut pool = model.new_pool(64, 16, KvDtype::F32).unwrap();
    let before = pool.load_kv(0, &(0..80).collect::<Vec<_>>()).unwrap();
    let batch = |token: u32, slot: u32| {
        let mut batch = ForwardBatch::new();
        batch
            .push(SeqInput {
                rid: 9,
                tokens: &[1, token],
                start: 0,
                out_slots: &[16, slot],
                context: &[16, slot],
                logits: LogitRows::Last,
            })
            .unwrap();
        batch
    };
    assert_eq!(
        model
            .forward(&batch(2, 80), &mut pool)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        Err(ModelError::Batch(BatchError::SlotOutOfRange {
            rid: 9,
            slot: 80,
            slots: 80
        })
        .to_string())
    );
    assert!(matches!(
        model.forward(&batch(256, 17), &mut pool),
        Err(ModelError::Batch(BatchError::TokenOutOfVocab {
            token: 256,
            ..
        }))
    ));
    // A pool of 3 layers for a model of 2.
    let mut wrong_pool = kvown_candle::TensorKvPool::new(
        kvown_runtime::kv::KvLayout::new(3, 2, 16, 64, 16).unwrap(),
        KvDtype::F32,
    )
    .unwrap();
    assert!(matches!(
        model.forward(&batch(2, 17), &mut wrong_pool),
        Err(ModelError::Batch(BatchError::PoolMismatch { .. }))
    ));
    assert_eq!(
        pool.load_kv(0, &(0..80).collect::<Vec<_>>()).unwrap(),
        before
    );
    // And the good batch stores its two rows.
    model.forward(&batch(2, 17), &mut pool).unwrap();
    assert_ne!(
        pool.load_kv(0, &[16, 17]).unwrap(),
        pool.load_kv(0, &[18, 19]).unwrap()
    );
}
