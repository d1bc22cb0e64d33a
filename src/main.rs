//! dra-claim-controller: flags and logging. The process itself is
//! `dra_claim_controller::app::run`.

use std::process::ExitCode;

use clap::Parser;

use dra_claim_controller::app;
use dra_claim_controller::cli::Args;

fn main() -> ExitCode {
    let args = Args::parse();
    app::init_logging(&args);
    app::block_on_exit("dra-claim-controller", app::run(args))
}
