//! `kubectl dra`: the read-only checks of dra-claim-controller as a kubectl
//! plugin. On `PATH`, `kubectl dra drain-check --node N` and
//! `kubectl dra audit` run the same code as `dra-claim-controller
//! drain-check` and `dra-claim-controller audit`.

use std::process::ExitCode;

use clap::Parser;

use dra_claim_controller::app;
use dra_claim_controller::inspect::Tool;

#[derive(Debug, Parser)]
#[command(
    name = "kubectl-dra",
    bin_name = "kubectl dra",
    version,
    about = "DRA checks for cluster admins: may a node's driver go (drain-check), where do ResourceClaims leak (audit)."
)]
struct Cli {
    #[command(subcommand)]
    tool: Tool,
}

fn main() -> ExitCode {
    let cli = Cli::try_parse().unwrap_or_else(|e| app::exit_usage(e));
    app::run_tool("kubectl dra", cli.tool)
}
