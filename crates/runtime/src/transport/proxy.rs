//! The kubeconfig's `proxy-url` (or, without one, `HTTPS_PROXY`/`HTTP_PROXY`
//! and `NO_PROXY` from the environment), as kubectl honours it: the API server is
//! reached through an HTTP proxy (`http://` proxy URL; a CONNECT tunnel, so
//! TLS stays end to end with the API server; a proxy spoken to over TLS,
//! `https://`, is refused with a message) or a
//! SOCKS5 proxy (`socks5://`, names resolved by the proxy as Go's dialer
//! does). Credentials in the URL are sent to the proxy (Basic for HTTP,
//! user/password for SOCKS5). The tunnel is made over the same TCP
//! settings as a direct connection, so keepalive and the connect timeout
//! still apply to the hop to the proxy.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use anyhow::{Context as _, bail};
use http::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::proxy::{SocksV5, Tunnel};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower::{BoxError, Service};

/// How a connection to the API server is dialled.
#[derive(Clone, Debug)]
pub(crate) enum Dial {
    Direct(HttpConnector),
    HttpProxy(Tunnel<HttpConnector>),
    Socks5(SocksV5<HttpConnector>),
}

/// What a `proxy-url` asks for, parsed (pure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxySettings {
    pub kind: ProxyKind,
    /// The proxy's own address, without credentials.
    pub address: Uri,
    /// User and password, percent-decoded.
    pub credentials: Option<(String, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyKind {
    Http,
    Socks5,
}

/// Reads a kubeconfig `proxy-url`; an error names the URL and the schemes
/// that are understood.
pub fn parse(proxy_url: &str) -> anyhow::Result<ProxySettings> {
    let uri: Uri = proxy_url
        .parse()
        .with_context(|| format!("the proxy URL {proxy_url:?} is not a URL"))?;
    let kind = match uri.scheme_str() {
        Some("http") => ProxyKind::Http,
        Some("socks5" | "socks5h") => ProxyKind::Socks5,
        // The hop to such a proxy would need TLS of its own; sending the
        // CONNECT (and its credentials) in the clear to it instead would
        // fail at best.
        Some("https") => bail!(
            "the proxy URL {proxy_url:?} asks for TLS to the proxy itself, which is not \
             supported: use http:// (the tunnel still carries TLS end to end to the API server) \
             or socks5://"
        ),
        other => bail!(
            "the proxy URL {proxy_url:?} has scheme {other:?}; http, socks5 and socks5h are \
             understood"
        ),
    };
    let authority = uri
        .authority()
        .with_context(|| format!("the proxy URL {proxy_url:?} names no host"))?;
    let (credentials, host_port) = match authority.as_str().rsplit_once('@') {
        Some((userinfo, host_port)) => {
            let (user, pass) = userinfo.split_once(':').unwrap_or((userinfo, ""));
            (Some((decode(user)?, decode(pass)?)), host_port)
        }
        None => (None, authority.as_str()),
    };
    let default_port = match kind {
        ProxyKind::Http => 80,
        ProxyKind::Socks5 => 1080,
    };
    let host_port = if host_port
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        host_port.to_string()
    } else {
        format!("{host_port}:{default_port}")
    };
    // The tunnel's first hop is plain TCP to the proxy.
    let address: Uri = format!("http://{host_port}")
        .parse()
        .with_context(|| format!("the proxy URL {proxy_url:?}"))?;
    Ok(ProxySettings {
        kind,
        address,
        credentials,
    })
}

/// The proxy for the API server at `server` when the kubeconfig names
/// none, from the environment as client-go reads it (Go's
/// `ProxyFromEnvironment`): `HTTPS_PROXY` for an `https://` server,
/// `HTTP_PROXY` for `http://` (upper or lower case, upper first), unless
/// `NO_PROXY` matches the server's host or the server is on loopback. A
/// value without a scheme is an HTTP proxy. `env` reads a variable.
pub(crate) fn from_environment(
    server: &Uri,
    env: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<Option<ProxySettings>> {
    // As Go: the upper-case name first, an empty value as unset.
    let read = |name: &str| {
        env(name)
            .filter(|v| !v.is_empty())
            .or_else(|| env(&name.to_lowercase()).filter(|v| !v.is_empty()))
    };
    let variable = match server.scheme_str() {
        Some("https") => "HTTPS_PROXY",
        Some("http") => "HTTP_PROXY",
        _ => return Ok(None),
    };
    let Some(value) = read(variable) else {
        return Ok(None);
    };
    let host = server.host().unwrap_or_default();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if loopback {
        return Ok(None);
    }
    // NO_PROXY as Go reads it (domains and their subdomains, IPs, CIDRs,
    // `*`), through hyper-util's matcher of the same rules.
    let matcher = hyper_util::client::proxy::matcher::Matcher::builder()
        .https("http://proxy.invalid")
        .http("http://proxy.invalid")
        .no(read("NO_PROXY").unwrap_or_default())
        .build();
    if matcher.intercept(server).is_none() {
        return Ok(None);
    }
    let url = if value.contains("://") {
        value
    } else {
        format!("http://{value}")
    };
    parse(&url)
        .map(Some)
        .with_context(|| format!("the environment's {variable}"))
}

fn decode(part: &str) -> anyhow::Result<String> {
    percent_encoding::percent_decode_str(part)
        .decode_utf8()
        .map(|s| s.into_owned())
        .context("the credentials of the proxy URL are not UTF-8")
}

impl Dial {
    /// Dials through the proxy `settings` says, over `tcp`, or directly.
    pub(crate) fn new(tcp: HttpConnector, settings: Option<ProxySettings>) -> anyhow::Result<Dial> {
        let Some(settings) = settings else {
            return Ok(Dial::Direct(tcp));
        };
        Ok(match settings.kind {
            ProxyKind::Http => {
                let mut tunnel = Tunnel::new(settings.address, tcp);
                if let Some((user, pass)) = &settings.credentials {
                    use base64::Engine as _;
                    let token =
                        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
                    tunnel = tunnel.with_auth(
                        http::HeaderValue::from_str(&format!("Basic {token}"))
                            .context("the proxy-url's credentials")?,
                    );
                }
                Dial::HttpProxy(tunnel)
            }
            ProxyKind::Socks5 => {
                let mut socks = SocksV5::new(settings.address, tcp).local_dns(false);
                if let Some((user, pass)) = settings.credentials {
                    socks = socks.with_auth(user, pass);
                }
                Dial::Socks5(socks)
            }
        })
    }
}

type Dialled = TokioIo<TcpStream>;

impl Service<Uri> for Dial {
    type Response = Dialled;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Dialled, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        match self {
            Dial::Direct(c) => c.poll_ready(cx).map_err(Into::into),
            Dial::HttpProxy(c) => c.poll_ready(cx).map_err(Into::into),
            Dial::Socks5(c) => c.poll_ready(cx).map_err(Into::into),
        }
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        match self {
            Dial::Direct(c) => {
                let f = c.call(dst);
                Box::pin(async move { f.await.map_err(Into::into) })
            }
            Dial::HttpProxy(c) => {
                let f = c.call(dst);
                Box::pin(async move { f.await.map_err(Into::into) })
            }
            Dial::Socks5(c) => {
                let f = c.call(dst);
                Box::pin(async move { f.await.map_err(Into::into) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_urls_as_kubectl_reads_them() {
        let rows = [
            (
                "http://proxy.corp:3128",
                ProxyKind::Http,
                "http://proxy.corp:3128/",
                None,
            ),
            (
                "http://proxy.corp",
                ProxyKind::Http,
                "http://proxy.corp:80/",
                None,
            ),
            (
                "http://alice:s%40cret@10.0.0.1:8080",
                ProxyKind::Http,
                "http://10.0.0.1:8080/",
                Some(("alice", "s@cret")),
            ),
            (
                "socks5://127.0.0.1:1080",
                ProxyKind::Socks5,
                "http://127.0.0.1:1080/",
                None,
            ),
            (
                "socks5h://bastion",
                ProxyKind::Socks5,
                "http://bastion:1080/",
                None,
            ),
            (
                "socks5://bob@bastion:9050",
                ProxyKind::Socks5,
                "http://bastion:9050/",
                Some(("bob", "")),
            ),
        ];
        for (url, kind, address, credentials) in rows {
            let got = parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(got.kind, kind, "{url}");
            assert_eq!(got.address.to_string(), address, "{url}");
            assert_eq!(
                got.credentials,
                credentials.map(|(u, p): (&str, &str)| (u.to_string(), p.to_string())),
                "{url}"
            );
        }
        let err = parse("ftp://proxy:21").unwrap_err().to_string();
        assert!(err.contains("socks5") && err.contains("ftp"), "{err}");
        let err = parse("https://proxy.corp").unwrap_err().to_string();
        assert!(
            err.contains("TLS to the proxy itself") && err.contains("http://"),
            "{err}"
        );
    }

    #[test]
    fn the_environment_as_client_go_reads_it() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        let server: Uri = "https://api.corp.example:6443".parse().unwrap();
        let address = |got: anyhow::Result<Option<ProxySettings>>| {
            got.unwrap().map(|p| p.address.to_string())
        };
        type Vars = &'static [(&'static str, &'static str)];
        let rows: [(Vars, Option<&str>); 10] = [
            (&[], None),
            (
                &[("HTTPS_PROXY", "http://proxy:3128")],
                Some("http://proxy:3128/"),
            ),
            (&[("https_proxy", "proxy:3128")], Some("http://proxy:3128/")),
            (
                &[("HTTPS_PROXY", "http://a:1"), ("https_proxy", "http://b:2")],
                Some("http://a:1/"),
            ),
            (
                &[("HTTPS_PROXY", ""), ("https_proxy", "http://b:2")],
                Some("http://b:2/"),
            ),
            // HTTP_PROXY is for http:// servers only.
            (&[("HTTP_PROXY", "http://proxy:3128")], None),
            (
                &[
                    ("HTTPS_PROXY", "http://proxy:3128"),
                    ("NO_PROXY", "corp.example"),
                ],
                None,
            ),
            (
                &[
                    ("HTTPS_PROXY", "http://proxy:3128"),
                    ("NO_PROXY", ".example"),
                ],
                None,
            ),
            (
                &[("HTTPS_PROXY", "http://proxy:3128"), ("no_proxy", "*")],
                None,
            ),
            (
                &[
                    ("HTTPS_PROXY", "http://proxy:3128"),
                    ("NO_PROXY", "other.example"),
                ],
                Some("http://proxy:3128/"),
            ),
        ];
        for (vars, want) in rows {
            assert_eq!(
                address(from_environment(&server, env(vars))),
                want.map(String::from),
                "{vars:?}"
            );
        }
        let by_ip: Uri = "https://10.1.2.3:6443".parse().unwrap();
        let vars: &[(&str, &str)] = &[
            ("HTTPS_PROXY", "socks5://proxy:1080"),
            ("NO_PROXY", "10.0.0.0/8"),
        ];
        assert_eq!(address(from_environment(&by_ip, env(vars))), None);
        let vars: &[(&str, &str)] = &[("HTTPS_PROXY", "socks5://proxy:1080")];
        assert_eq!(
            from_environment(&by_ip, env(vars)).unwrap().map(|p| p.kind),
            Some(ProxyKind::Socks5)
        );
        // Loopback is never proxied.
        for local in [
            "https://127.0.0.1:6443",
            "https://localhost:6443",
            "https://[::1]:6443",
        ] {
            let local: Uri = local.parse().unwrap();
            assert_eq!(
                address(from_environment(&local, env(vars))),
                None,
                "{local}"
            );
        }
    }
}
