//! A real Prometheus server for tests of metrics and the chart's alerts:
//! it scrapes given targets every second and evaluates rule groups taken
//! from the rendered chart. Found as `PROMETHEUS_BIN`, else `prometheus` on
//! `PATH` (Debian's `prometheus` package, which `.ci/run` installs when it
//! can); without it, the tests that need it print one SKIP line.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use crate::cluster::free_port;
use crate::procs::Proc;
use crate::rawhttp;

/// The Prometheus binary, if this machine has one.
pub fn binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PROMETHEUS_BIN") {
        return Some(PathBuf::from(path)).filter(|p| p.is_file());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("prometheus"))
        .find(|p| p.is_file())
}

/// `promtool` beside the Prometheus binary, if present.
pub fn promtool(prometheus: &Path) -> Option<PathBuf> {
    Some(prometheus.with_file_name("promtool")).filter(|p| p.is_file())
}

/// How Prometheus scrapes: an endpoint of the chart's ServiceMonitor
/// translated to a Prometheus scrape config, with the token the
/// ServiceMonitor would read from Prometheus' service account.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    /// `http` or `https`.
    pub scheme: String,
    /// File holding the bearer token (`bearerTokenFile`).
    pub bearer_token_file: Option<PathBuf>,
    /// `tlsConfig.insecureSkipVerify`.
    pub insecure_skip_verify: bool,
}

impl Scrape {
    /// The scrape settings of the first endpoint of a rendered
    /// ServiceMonitor, the token in `token_file` standing in for the file
    /// it names.
    pub fn from_service_monitor(monitor: &Value, token_file: &Path) -> Self {
        let endpoint = &monitor["spec"]["endpoints"][0];
        Scrape {
            scheme: endpoint["scheme"].as_str().unwrap_or("http").to_string(),
            bearer_token_file: endpoint["bearerTokenFile"]
                .as_str()
                .map(|_| token_file.to_path_buf()),
            insecure_skip_verify: endpoint["tlsConfig"]["insecureSkipVerify"]
                .as_bool()
                .unwrap_or(false),
        }
    }

    fn config(&self) -> Value {
        let mut job = json!({"job_name": "dra-claim-controller", "scheme": self.scheme});
        if let Some(file) = &self.bearer_token_file {
            job["authorization"] = json!({"type": "Bearer", "credentials_file": file});
        }
        if self.scheme == "https" {
            job["tls_config"] = json!({"insecure_skip_verify": self.insecure_skip_verify});
        }
        job
    }
}

/// A running Prometheus.
#[derive(Debug)]
pub struct Prometheus {
    pub proc: Proc,
    pub addr: SocketAddr,
}

impl Prometheus {
    /// Starts Prometheus in `dir`, scraping `targets` (host:port, path
    /// `/metrics`) every second and evaluating `rule_groups` (the `groups`
    /// of a PrometheusRule's spec) every second.
    pub async fn start(
        binary: &Path,
        dir: &Path,
        targets: &[SocketAddr],
        rule_groups: &Value,
    ) -> anyhow::Result<Self> {
        let plain = Scrape {
            scheme: "http".into(),
            ..Scrape::default()
        };
        Self::start_scraping(binary, dir, targets, &plain, rule_groups).await
    }

    /// As [`Prometheus::start`], scraping as `scrape` says.
    pub async fn start_scraping(
        binary: &Path,
        dir: &Path,
        targets: &[SocketAddr],
        scrape: &Scrape,
        rule_groups: &Value,
    ) -> anyhow::Result<Self> {
        let dir = dir.join("prometheus");
        std::fs::create_dir_all(&dir)?;
        let rules = dir.join("rules.yaml");
        std::fs::write(
            &rules,
            serde_yaml::to_string(&json!({ "groups": rule_groups }))?,
        )?;
        let mut job = scrape.config();
        job["static_configs"] =
            json!([{"targets": targets.iter().map(ToString::to_string).collect::<Vec<_>>()}]);
        let config = json!({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [rules],
            "scrape_configs": [job],
        });
        let config_file = dir.join("prometheus.yaml");
        std::fs::write(&config_file, serde_yaml::to_string(&config)?)?;
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse()?;
        let args = vec![
            format!("--config.file={}", config_file.display()),
            format!("--storage.tsdb.path={}", dir.join("data").display()),
            format!("--web.listen-address={addr}"),
        ];
        let proc = Proc::spawn("prometheus", binary, &args, &dir.join("prometheus.log"))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok((200, _)) = rawhttp::get(addr, "/-/ready").await {
                return Ok(Prometheus { proc, addr });
            }
            if Instant::now() > deadline {
                bail!("prometheus not ready within 30s:\n{}", proc.log_tail(20));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The result vector of an instant query.
    pub async fn query(&self, promql: &str) -> anyhow::Result<Vec<Value>> {
        let path = format!("/api/v1/query?query={}", encode(promql));
        let (status, body) = rawhttp::get(self.addr, &path).await?;
        anyhow::ensure!(status == 200, "query {promql:?}: HTTP {status}: {body}");
        let doc: Value = serde_json::from_str(&body).context("query answer")?;
        Ok(doc["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// The value of a query that returns one sample, if it does.
    pub async fn scalar(&self, promql: &str) -> anyhow::Result<Option<f64>> {
        let result = self.query(promql).await?;
        Ok(result
            .first()
            .and_then(|s| s["value"][1].as_str())
            .and_then(|v| v.parse().ok()))
    }

    /// Alerts by name and state (`pending`, `firing`).
    pub async fn alerts(&self) -> anyhow::Result<Vec<(String, String)>> {
        let (status, body) = rawhttp::get(self.addr, "/api/v1/alerts").await?;
        anyhow::ensure!(status == 200, "alerts: HTTP {status}: {body}");
        let doc: Value = serde_json::from_str(&body)?;
        Ok(doc["data"]["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                (
                    a["labels"]["alertname"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    a["state"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect())
    }
}

/// Percent-encodes a query parameter.
fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
