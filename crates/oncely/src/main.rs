//! The `oncely` binary: everything lives in the library; see `oncely::cli`.

fn main() -> std::process::ExitCode {
    oncely::cli::main()
}
