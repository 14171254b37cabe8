//! Integration tests: the layer inside a real axum server on 127.0.0.1, a real HTTP
//! client, and the SQLite ledger in a temporary file.

mod gateway;
mod json_field_key;
mod layering;
mod scenarios;
