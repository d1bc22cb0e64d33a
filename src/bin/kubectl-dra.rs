//! `kubectl dra`: the read-only checks of dra-claim-controller as a kubectl
//! plugin. On `PATH`, `kubectl dra drain-check --node N` and
//! `kubectl dra audit` run the same code as `dra-claim-controller
//! drain-check` and `dra-claim-controller audit`.

use std::process::ExitCode;

use clap::Parser;

use dra_claim_controller::app;
use dra_claim_controller::inspect::{self, Tool};

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
    // Usage errors exit 3 ("not completed"), not clap's 2 ("warnings").
    let cli = Cli::try_parse().unwrap_or_else(|e| exit_usage(e));
    app::init_tool_logging();
    app::block_on_exit("kubectl dra", async { Ok(inspect::run(cli.tool).await) })
}

/// Prints clap's message; help and version exit 0, usage errors 3.
fn exit_usage(e: clap::Error) -> ! {
    let _ = e.print();
    std::process::exit(if e.exit_code() == 0 { 0 } else { 3 })
}
