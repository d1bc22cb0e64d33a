//! dra-claim-controller: flags and logging. The process itself is
//! `dra_claim_controller::app::run`; the admin subcommands (read-only
//! but for `drain` and `uncordon`) are `dra_claim_controller::inspect`.

use std::process::ExitCode;

use clap::Parser;

use dra_claim_controller::app;
use dra_claim_controller::cli::Args;

fn main() -> ExitCode {
    app::exit_on_panic();
    let mut args = Args::try_parse().unwrap_or_else(|e| app::exit_usage(e));
    if let Some(tool) = args.tool.take() {
        return dra_claim_controller::inspect::run_tool("dra-claim-controller", tool);
    }
    app::init_logging(&args);
    app::block_on_exit("dra-claim-controller", app::run(args))
}
