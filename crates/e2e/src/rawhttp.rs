//! A plain-HTTP GET for the controller's /metrics and /healthz and etcd's
//! /health: loopback only, no TLS, so a few lines over a TcpStream do.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `(status code, body)` of `GET path`.
pub async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    tokio::time::timeout(Duration::from_secs(10), get_inner(addr, path))
        .await
        .with_context(|| format!("GET http://{addr}{path} timed out"))?
}

async fn get_inner(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr).await?;
    // HTTP/1.0: the server closes the connection after the response, so
    // reading to EOF yields exactly one response.
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: */*\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        bail!("malformed HTTP response from {addr}{path}: {text:?}");
    };
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .with_context(|| format!("no status line in {head:?}"))?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The value of the first sample of `metric` whose labels contain all of
/// `labels` (`name="value"` fragments), from a Prometheus text exposition.
pub fn metric_value(exposition: &str, metric: &str, labels: &[&str]) -> Option<f64> {
    samples(exposition, metric)
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .find_map(sample_value)
}

/// The sample lines of `metric` (not of metrics whose name it prefixes).
fn samples<'a>(exposition: &'a str, metric: &'a str) -> impl Iterator<Item = &'a str> {
    exposition.lines().filter(move |l| {
        !l.starts_with('#')
            && l.strip_prefix(metric)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
    })
}

fn sample_value(line: &str) -> Option<f64> {
    line.rsplit(' ').next()?.parse::<f64>().ok()
}

/// Sum of every sample of `metric` (all label sets).
pub fn metric_sum(exposition: &str, metric: &str) -> f64 {
    samples(exposition, metric).filter_map(sample_value).sum()
}
