//! The `oncely` binary: everything lives in the library; see `oncely::cli`.

// mimalloc: the request path allocates and frees many small buffers (headers, log
// lines, records) across threads; glibc's malloc was ~12% of the gateway's CPU.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    oncely::cli::main()
}
