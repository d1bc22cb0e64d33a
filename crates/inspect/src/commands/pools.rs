//! `pools`: reads every pool's devices and prints them by state.

use super::{PoolsArgs, connect, emit};
use crate::pools::read_pools;
use crate::report::exit;

/// Runs `pools`; its exit code.
pub(super) async fn run(args: PoolsArgs) -> u8 {
    let client = match connect(&args.connection).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let pools = match read_pools(&client, args.driver.as_deref(), args.node.as_deref()).await {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::INCOMPLETE;
        }
    };
    emit(&pools, args.output);
    exit::CLEAN
}
