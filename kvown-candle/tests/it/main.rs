//! kvown-candle's integration tests: the serving loop against candle-transformers' Llama with a
//! dense cache per request (the oracle), the faults that check must catch, and bad input.

mod bad_input;
mod differential;
mod fixture;
mod harness;
mod mutation;
mod nixl;
mod oracle;
#[cfg(feature = "tokenizers")]
mod text;
mod transfer;
