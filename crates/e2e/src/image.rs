//! Container images made on this machine, without a registry or a Docker
//! engine: a root filesystem directory packed as a `docker save` archive
//! (one uncompressed layer, an image config, a manifest), which
//! `ctr images import` and `docker load` both read.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, ensure};
use serde_json::{Value, json};

/// The parts of an image config the tests set.
#[derive(Debug, Clone)]
pub struct ImageConfig {
    pub entrypoint: Value,
    pub cmd: Value,
    /// `uid[:gid]`, `None` for root.
    pub user: Option<String>,
}

fn sha256_of(path: &Path) -> anyhow::Result<String> {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .context("run sha256sum")?;
    ensure!(out.status.success(), "sha256sum {}", path.display());
    let text = String::from_utf8(out.stdout)?;
    Ok(text
        .split_whitespace()
        .next()
        .context("sha256sum printed nothing")?
        .to_owned())
}

fn tar(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("tar").args(args).output().context("run tar")?;
    ensure!(
        out.status.success(),
        "tar {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Packs `rootfs` as image `name` (`registry/repo:tag`) into a `docker
/// save` archive under `work`; returns the archive's path. Files are
/// owned by root in the layer, whoever owns them here.
pub fn write_docker_archive(
    work: &Path,
    rootfs: &Path,
    name: &str,
    config: &ImageConfig,
) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(work)?;
    let layer = work.join("layer.tar");
    tar(&[
        "--owner=0",
        "--group=0",
        "--numeric-owner",
        "--sort=name",
        "--mtime=@0",
        "-C",
        &rootfs.display().to_string(),
        "-cf",
        &layer.display().to_string(),
        ".",
    ])?;
    let diff_id = sha256_of(&layer)?;
    let mut image_config = json!({
        "architecture": go_arch(),
        "os": "linux",
        "config": {
            "Entrypoint": config.entrypoint,
            "Cmd": config.cmd,
            "Env": ["PATH=/bin:/usr/bin"],
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
        "history": [{"created_by": "dra-e2e image writer"}],
    });
    if let Some(user) = &config.user {
        image_config["config"]["User"] = json!(user);
    }
    let config_path = work.join("config.json");
    std::fs::write(&config_path, serde_json::to_vec(&image_config)?)?;
    let config_name = format!("{}.json", sha256_of(&config_path)?);
    std::fs::rename(&config_path, work.join(&config_name))?;
    std::fs::write(
        work.join("manifest.json"),
        serde_json::to_vec(&json!([{
            "Config": config_name,
            "RepoTags": [name],
            "Layers": ["layer.tar"],
        }]))?,
    )?;
    let archive = work.with_extension("tar");
    tar(&[
        "-C",
        &work.display().to_string(),
        "-cf",
        &archive.display().to_string(),
        "manifest.json",
        &config_name,
        "layer.tar",
    ])?;
    Ok(archive)
}

/// Go's name of this machine's architecture, as image configs spell it.
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The controller's image from a built binary, with no registry and no
/// Docker engine: the binary at `/usr/local/bin/dra-claim-controller`, the
/// shared libraries it loads (as `ldd` resolves them here), the CA bundle
/// if this machine has one, and `/etc/passwd`/`/etc/group` naming uid/gid
/// 65532 (`nonroot`, as the distroless base of the Dockerfile). It runs as
/// 65532:65532, the same entrypoint as the Dockerfile's image; the chart's
/// securityContext (non-root, read-only root filesystem, no capabilities)
/// applies unchanged.
pub fn write_controller_archive(binary: &Path, work: &Path, name: &str) -> anyhow::Result<PathBuf> {
    ensure!(
        binary.is_file(),
        "{} not found: build it first (cargo build --release --locked)",
        binary.display()
    );
    let rootfs = work.join("rootfs");
    if rootfs.exists() {
        std::fs::remove_dir_all(&rootfs)?;
    }
    let place = |from: &Path, to: &str| -> anyhow::Result<()> {
        let dest = rootfs.join(to.trim_start_matches('/'));
        std::fs::create_dir_all(dest.parent().context("a path with a parent")?)?;
        std::fs::copy(from, &dest).with_context(|| format!("copy {}", from.display()))?;
        Ok(())
    };
    place(binary, "/usr/local/bin/dra-claim-controller")?;
    for lib in shared_libraries(binary)? {
        place(&lib, &lib.display().to_string())?;
    }
    let ca = Path::new("/etc/ssl/certs/ca-certificates.crt");
    if ca.is_file() {
        place(ca, "/etc/ssl/certs/ca-certificates.crt")?;
    }
    let etc = rootfs.join("etc");
    std::fs::create_dir_all(&etc)?;
    std::fs::write(
        etc.join("passwd"),
        "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
    )?;
    std::fs::write(etc.join("group"), "root:x:0:\nnonroot:x:65532:\n")?;
    std::fs::create_dir_all(rootfs.join("tmp"))?;
    write_docker_archive(
        &work.join("image"),
        &rootfs,
        name,
        &ImageConfig {
            entrypoint: json!(["/usr/local/bin/dra-claim-controller"]),
            cmd: json!([]),
            user: Some("65532:65532".into()),
        },
    )
}

/// The shared libraries `binary` loads, with the dynamic loader, as paths
/// on this machine (`ldd`'s resolution).
fn shared_libraries(binary: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .context("run ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if text.contains("not a dynamic executable") || text.contains("statically linked") {
        return Ok(Vec::new());
    }
    ensure!(
        out.status.success(),
        "ldd {}: {}",
        binary.display(),
        text.trim()
    );
    Ok(text
        .lines()
        .filter_map(|line| {
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
            // "/lib64/ld-linux-x86-64.so.2 (0x...)"; vdso has no file.
            let path = match line.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}
