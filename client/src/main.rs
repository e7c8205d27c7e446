//! The `orderly-client` binary: `place`, `resume`, `status` and `receive`.

mod cli;
mod failure;
mod receive;

fn main() -> std::process::ExitCode {
    cli::run()
}
