//! Builds the controller's container image as an archive without a
//! registry or a Docker engine (the Dockerfile stays the release path):
//!
//! ```sh
//! cargo build --release --locked
//! cargo run --release --example image-archive -- target/dra-claim-controller-image.tar
//! ```
//!
//! Load it with `ctr -n k8s.io images import <archive>` (containerd) or
//! `docker load -i <archive>`. The image is named
//! `dra-claim-controller.local/dra-claim-controller:<version>` unless a
//! second argument names it; it holds the release binary, the shared
//! libraries it loads, the CA bundle, and a passwd naming uid 65532, and
//! runs as 65532:65532.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let out = PathBuf::from(
        args.next()
            .unwrap_or_else(|| "target/dra-claim-controller-image.tar".into()),
    );
    let name = args.next().unwrap_or_else(|| {
        format!(
            "dra-claim-controller.local/dra-claim-controller:{}",
            env!("CARGO_PKG_VERSION")
        )
    });
    let binary = PathBuf::from("target/release/dra-claim-controller");
    let work = out.with_extension("work");
    match dra_e2e::image::write_controller_archive(&binary, &work, &name) {
        Ok(archive) => match std::fs::rename(&archive, &out) {
            Ok(()) => {
                println!("{} ({name})", out.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!(
                    "image-archive: moving {} to {}: {e}",
                    archive.display(),
                    out.display()
                );
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("image-archive: {e:#}");
            ExitCode::FAILURE
        }
    }
}
