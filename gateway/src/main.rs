//! The `cellgate` binary: the HTTP gateway (`http`), the command line
//! (`cli`), the webhook triggers (`triggers`) and the `cellgate.yaml` model (`config`) that composes the
//! options of the store (`cellgate-store`) and of the GraphQL API
//! (`cellgate-graphql`). `main` parses the command line and runs it on a
//! tokio runtime; errors are printed here, once, with their causes on one
//! line (`{:#}`), and exit 1.

mod cli;
mod config;
mod demo;
mod http;
mod telemetry;
mod triggers;

use std::process::ExitCode;

use clap::Parser as _;
use cli::Cli;

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
