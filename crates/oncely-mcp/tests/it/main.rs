//! oncely-mcp against the official MCP SDKs and real servers, all on 127.0.0.1.
//!
//! Needs `crates/oncely-mcp/tests/setup.sh` (a venv with `mcp` from PyPI; `npm ci` of the
//! TypeScript SDK and server-everything in tests/node). Without them a test says so and
//! passes, except under `CI`, where it fails loudly.

mod actions;
mod bench;
mod edges;
mod harness;
mod node;
mod stories;
mod synthesised;
mod tasks;
