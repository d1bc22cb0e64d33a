//! Keys and certificates for one test API server, made with the `openssl`
//! CLI: a CA, a serving certificate for 127.0.0.1 signed by it (so both the
//! test client and the controller verify TLS for real), and the
//! service-account signing key pair that TokenRequest needs.

use std::path::{Path, PathBuf};

use crate::procs::run;

/// The gateway of a real node's pod network: the host's address on the
/// node's bridge, where pods reach the API server; the serving certificate
/// names it.
pub const POD_GATEWAY_IP: &str = "10.213.78.1";

#[derive(Debug, Clone)]
pub struct Pki {
    pub ca_crt: PathBuf,
    pub server_crt: PathBuf,
    pub server_key: PathBuf,
    pub sa_key: PathBuf,
    pub sa_pub: PathBuf,
}

pub fn generate(dir: &Path) -> anyhow::Result<Pki> {
    std::fs::create_dir_all(dir)?;
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    let mut ca_args = vec!["req", "-x509", "-nodes"];
    ca_args.extend(ec);
    ca_args.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "3",
        "-subj",
        "/CN=dra-e2e-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    run("openssl", &ca_args, dir)?;

    let mut csr_args = vec!["req", "-nodes"];
    csr_args.extend(ec);
    csr_args.extend([
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=kube-apiserver",
    ]);
    run("openssl", &csr_args, dir)?;
    std::fs::write(
        dir.join("server.ext"),
        // The pod network's gateway too: pods on a real node reach the
        // API server there.
        format!(
            "basicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage=serverAuth\n\
             subjectAltName=IP:127.0.0.1,DNS:localhost,IP:{}\n",
            POD_GATEWAY_IP
        ),
    )?;
    run(
        "openssl",
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "3",
            "-extfile",
            "server.ext",
            "-out",
            "server.crt",
        ],
        dir,
    )?;

    run("openssl", &["genrsa", "-out", "sa.key", "2048"], dir)?;
    run(
        "openssl",
        &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"],
        dir,
    )?;

    Ok(Pki {
        ca_crt: dir.join("ca.crt"),
        server_crt: dir.join("server.crt"),
        server_key: dir.join("server.key"),
        sa_key: dir.join("sa.key"),
        sa_pub: dir.join("sa.pub"),
    })
}
