//! dra-claim-controller: flags and logging. The process itself is
//! `dra_claim_controller::app::run`.

use std::process::ExitCode;

use clap::Parser;
use tracing::error;

use dra_claim_controller::app;
use dra_claim_controller::cli::Args;

fn main() -> ExitCode {
    let args = Args::parse();
    app::init_logging(&args);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dra-claim-controller: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(app::run(args)) {
        Ok(code) => code,
        Err(e) => {
            error!(error = %format!("{e:#}"), "exiting");
            eprintln!("dra-claim-controller: {e:#}");
            ExitCode::from(1)
        }
    }
}
