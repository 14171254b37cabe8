//! The `oncely` binary (being built).

fn main() {}
