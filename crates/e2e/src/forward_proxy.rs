//! Forward proxies as a kubeconfig's `proxy-url` names them: an HTTP proxy
//! that serves CONNECT tunnels, and a SOCKS5 proxy (no authentication,
//! names resolved here). Each counts the tunnels it opened, so a test can
//! tell that the client really went through it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context as _, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Which protocol the proxy speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    HttpConnect,
    Socks5,
}

/// A running proxy on loopback.
#[derive(Debug)]
pub struct ForwardProxy {
    pub addr: SocketAddr,
    pub kind: Kind,
    tunnels: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ForwardProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ForwardProxy {
    pub async fn start(kind: Kind) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let tunnels = Arc::new(AtomicU64::new(0));
        let counted = tunnels.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let counted = counted.clone();
                tokio::spawn(async move {
                    let upstream = match kind {
                        Kind::HttpConnect => connect_handshake(client).await,
                        Kind::Socks5 => socks5_handshake(client).await,
                    };
                    if let Ok((mut client, mut upstream)) = upstream {
                        counted.fetch_add(1, Ordering::SeqCst);
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                    }
                });
            }
        });
        Ok(Self {
            addr,
            kind,
            tunnels,
            task,
        })
    }

    /// Tunnels opened so far.
    pub fn tunnels(&self) -> u64 {
        self.tunnels.load(Ordering::SeqCst)
    }

    /// The `proxy-url` that names this proxy.
    pub fn url(&self) -> String {
        match self.kind {
            Kind::HttpConnect => format!("http://{}", self.addr),
            Kind::Socks5 => format!("socks5://{}", self.addr),
        }
    }

    /// Writes `original` with its cluster's `proxy-url` set to this proxy.
    pub fn write_kubeconfig(&self, original: &Path, out: &Path) -> anyhow::Result<PathBuf> {
        let mut kc: serde_json::Value = serde_yaml::from_str(&std::fs::read_to_string(original)?)?;
        kc["clusters"][0]["cluster"]["proxy-url"] = serde_json::Value::String(self.url());
        std::fs::write(out, serde_yaml::to_string(&kc)?)?;
        Ok(out.to_path_buf())
    }
}

/// `CONNECT host:port HTTP/1.1`, then `200` and the tunnel.
async fn connect_handshake(mut client: TcpStream) -> anyhow::Result<(TcpStream, TcpStream)> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if client.read(&mut byte).await? == 0 || head.len() > 16 * 1024 {
            bail!("no CONNECT request");
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    let mut words = head.split_whitespace();
    let (Some("CONNECT"), Some(target)) = (words.next(), words.next()) else {
        client
            .write_all(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
            .await?;
        bail!("not a CONNECT request: {head}");
    };
    let upstream = TcpStream::connect(target).await?;
    client
        .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        .await?;
    Ok((client, upstream))
}

/// RFC 1928 without authentication: greeting, a CONNECT request by IPv4,
/// domain name or IPv6, success, then the tunnel.
async fn socks5_handshake(mut client: TcpStream) -> anyhow::Result<(TcpStream, TcpStream)> {
    let mut greeting = [0u8; 2];
    client.read_exact(&mut greeting).await?;
    anyhow::ensure!(greeting[0] == 5, "not SOCKS5");
    let mut methods = vec![0u8; usize::from(greeting[1])];
    client.read_exact(&mut methods).await?;
    client.write_all(&[5, 0]).await?;
    let mut request = [0u8; 4];
    client.read_exact(&mut request).await?;
    anyhow::ensure!(request[1] == 1, "only CONNECT");
    let host = match request[3] {
        1 => {
            let mut ip = [0u8; 4];
            client.read_exact(&mut ip).await?;
            std::net::Ipv4Addr::from(ip).to_string()
        }
        3 => {
            let mut len = [0u8; 1];
            client.read_exact(&mut len).await?;
            let mut name = vec![0u8; usize::from(len[0])];
            client.read_exact(&mut name).await?;
            String::from_utf8(name).context("a name that is not UTF-8")?
        }
        4 => {
            let mut ip = [0u8; 16];
            client.read_exact(&mut ip).await?;
            format!("[{}]", std::net::Ipv6Addr::from(ip))
        }
        other => bail!("address type {other}"),
    };
    let mut port = [0u8; 2];
    client.read_exact(&mut port).await?;
    let upstream = TcpStream::connect(format!("{host}:{}", u16::from_be_bytes(port))).await?;
    client.write_all(&[5, 0, 0, 1, 0, 0, 0, 0, 0, 0]).await?;
    Ok((client, upstream))
}
