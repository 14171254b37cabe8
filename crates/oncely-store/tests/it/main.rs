//! Integration tests of the stores: the conformance suite against each backend.

mod memory;
mod postgres;
mod sqlite;
