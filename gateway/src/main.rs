//! The `cellgate` binary: parses the command line and runs it on a tokio
//! runtime. Everything else lives in the library's `cli` module; errors are
//! printed here, once, with their causes on one line (`{:#}`), and exit 1.

use std::process::ExitCode;

use cellgate::cli::{self, Cli};
use clap::Parser as _;

// glibc's allocator took about a sixth of the CPU of a GraphQL request
// (many small, short-lived allocations across threads); mimalloc serves
// them from thread-local pages.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
