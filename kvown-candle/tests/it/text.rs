//! Text in and out through a checkpoint's tokenizer.json: a word-level tokenizer over the tiny
//! model's vocabulary turns a prompt into tokens the server serves and its output back into
//! words.

use kvown_candle::text::TextCodec;
use kvown_candle::{ModelError, Request, ServeConfig, Server};

use crate::fixture::{scratch, tiny_model};

/// A word-level tokenizer.json whose words are `w0` .. `w255`.
fn word_level() -> String {
    let vocab: serde_json::Map<String, serde_json::Value> = (0..256)
        .map(|id| (format!("w{id}"), serde_json::json!(id)))
        .collect();
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": { "type": "Whitespace" },
        "post_processor": null,
        "decoder": null,
        "model": { "type": "WordLevel", "vocab": vocab, "unk_token": "w0" },
    })
    .to_string()
}

#[test]
fn a_prompt_in_words_is_served_and_its_output_read_back() {
    let dir = scratch("tokenizer");
    assert!(
        TextCodec::load(&dir).unwrap().is_none(),
        "no tokenizer.json yet"
    );
    std::fs::write(dir.join("tokenizer.json"), word_level()).unwrap();
    let codec = TextCodec::load(&dir).unwrap().expect("a tokenizer");
    let prompt = codec.encode("w5 w17 w200 w3").unwrap();
    assert_eq!(prompt, [5, 17, 200, 3]);
    let mut server = Server::new(tiny_model(), ServeConfig::default()).unwrap();
    server
        .submit(Request {
            rid: 1,
            prompt,
            max_new_tokens: 5,
        })
        .unwrap();
    let mut finished = Vec::new();
    while !server.is_idle() {
        finished.extend(server.step().unwrap().finished);
    }
    let text = codec.decode(&finished[0].output).unwrap();
    let words: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(words.len(), 5, "{text}");
    assert!(words.iter().all(|word| word.starts_with('w')));
    server.finish().unwrap();

    std::fs::write(dir.join("tokenizer.json"), "{ not json").unwrap();
    assert!(matches!(
        TextCodec::load(&dir),
        Err(ModelError::Tokenizer { path, .. }) if path == dir.join("tokenizer.json")
    ));
}
