//! `kubectl dra`: the admin commands of dra-claim-controller as a kubectl
//! plugin. On `PATH`, `kubectl dra drain-check NODE`, `kubectl dra audit`,
//! `kubectl dra pools`, `kubectl dra check-release`, `kubectl dra drain
//! NODE` and `kubectl dra uncordon NODE` run the same code as the
//! `dra-claim-controller` subcommands of those names;
//! `kubectl-dra completion SHELL` prints a completion script. All of them
//! only read, but for `drain` and `uncordon`, which create, patch and delete
//! DeviceTaintRules.

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use dra_inspect::{Tool, run_tool};
use dra_runtime::process::exit_usage;

#[derive(Debug, Parser)]
#[command(
    name = "kubectl-dra",
    bin_name = "kubectl-dra",
    version,
    about = "DRA for cluster admins: may a node's driver go (drain-check), where do ResourceClaims leak (audit), what does every pool offer (pools), does the installed controller work (check-release): these only read. drain and uncordon take a node's devices out of service before driver maintenance and back: these write DeviceTaintRules."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[command(flatten)]
    Tool(Box<Tool>),
    /// Print a completion script for SHELL (e.g. `source <(kubectl-dra completion bash)`).
    Completion { shell: clap_complete::Shell },
}

fn main() -> ExitCode {
    let cli = Cli::try_parse().unwrap_or_else(|e| exit_usage(e));
    match cli.command {
        Command::Tool(tool) => run_tool("kubectl dra", *tool),
        Command::Completion { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "kubectl-dra",
                &mut std::io::stdout(),
            );
            ExitCode::SUCCESS
        }
    }
}
