//! A plain TCP proxy that blackholes connections: the network failure no
//! HTTP-level fault imitates.
//!
//! It forwards bytes both ways, untouched (TLS and HTTP/2 pass through),
//! until a connection is older than the configured age, or until the test
//! blackholes everything open at once. From then on nothing more is
//! forwarded in either direction and both sockets stay open, as after an
//! expired NAT or conntrack entry or a load balancer that dropped a flow
//! without a reset: the client sees neither data, nor an end, nor an error.
//! New connections work as usual (unless every new one is blackholed too,
//! [`BlackholeProxy::blackhole_everything`], a client cut off entirely).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

/// When connections stop forwarding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Forward everything.
    Forward,
    /// Blackhole each connection once it is this old.
    OlderThan(Duration),
    /// Blackhole every connection, open or new, at once.
    Everything,
}

#[derive(Debug)]
struct State {
    upstream: SocketAddr,
    policy: watch::Sender<Policy>,
    /// Bumped by [`BlackholeProxy::darken_open_connections`]: connections
    /// opened under an older value go dark.
    darkened: watch::Sender<u64>,
    opened: AtomicU64,
    blackholed: AtomicU64,
    /// Dropped with the proxy: held sockets are released then.
    shutdown: watch::Sender<bool>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// What the proxy did, for the test's report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlackholeCounts {
    pub opened: u64,
    pub blackholed: u64,
}

#[derive(Debug)]
pub struct BlackholeProxy {
    pub addr: SocketAddr,
    state: Arc<State>,
}

impl BlackholeProxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr, policy: Policy) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind the blackhole proxy")?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            upstream,
            policy: watch::Sender::new(policy),
            darkened: watch::Sender::new(0),
            opened: AtomicU64::new(0),
            blackholed: AtomicU64::new(0),
            shutdown: watch::Sender::new(false),
            tasks: Mutex::new(Vec::new()),
        });
        let accept = tokio::spawn(accept_loop(listener, state.clone()));
        state.tasks.lock().unwrap().push(accept);
        Ok(Self { addr, state })
    }

    /// Changes the policy for open and new connections.
    pub fn set_policy(&self, policy: Policy) {
        self.state.policy.send_replace(policy);
    }

    /// Blackholes every connection open now; later ones follow the policy.
    /// The worst moment for a client: every connection it has just died.
    pub fn darken_open_connections(&self) {
        self.state
            .darkened
            .send_modify(|generation| *generation += 1);
    }

    pub fn counts(&self) -> BlackholeCounts {
        BlackholeCounts {
            opened: self.state.opened.load(Ordering::SeqCst),
            blackholed: self.state.blackholed.load(Ordering::SeqCst),
        }
    }

    /// Writes `original` with its server replaced by this proxy. The API
    /// server's certificate names 127.0.0.1, so TLS verifies as before.
    pub fn write_kubeconfig(&self, original: &Path, out: &Path) -> anyhow::Result<PathBuf> {
        let mut kc: serde_json::Value = serde_yaml::from_str(&std::fs::read_to_string(original)?)?;
        let server = kc["clusters"][0]["cluster"]["server"]
            .as_str()
            .context("kubeconfig without a server")?
            .to_owned();
        let scheme = server.split("://").next().unwrap_or("https").to_owned();
        kc["clusters"][0]["cluster"]["server"] =
            serde_json::Value::String(format!("{scheme}://{}", self.addr));
        std::fs::write(out, serde_yaml::to_string(&kc)?)?;
        Ok(out.to_path_buf())
    }
}

impl Drop for BlackholeProxy {
    fn drop(&mut self) {
        self.state.shutdown.send_replace(true);
        for task in self.state.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let state2 = state.clone();
        let task = tokio::spawn(async move {
            let Ok(upstream) = TcpStream::connect(state2.upstream).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = upstream.set_nodelay(true);
            state2.opened.fetch_add(1, Ordering::SeqCst);
            connection(client, upstream, state2).await;
        });
        let mut tasks = state.tasks.lock().unwrap();
        tasks.retain(|t| !t.is_finished());
        tasks.push(task);
    }
}

/// When a connection opened at `opened` is to go dark under `policy`.
fn dark_at(policy: Policy, opened: Instant) -> Option<Instant> {
    match policy {
        Policy::Forward => None,
        Policy::OlderThan(age) => Some(opened + age),
        Policy::Everything => Some(opened),
    }
}

async fn connection(mut client: TcpStream, mut upstream: TcpStream, state: Arc<State>) {
    let opened = Instant::now();
    let mut policy = state.policy.subscribe();
    let mut darkened = state.darkened.subscribe();
    let born = *darkened.borrow_and_update();
    let mut shutdown = state.shutdown.subscribe();
    let (mut a, mut b) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        let at = dark_at(*policy.borrow_and_update(), opened);
        let go_dark = async {
            match at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = go_dark => break,
            changed = darkened.changed() => {
                if changed.is_err() { return; }
                if *darkened.borrow_and_update() > born { break; }
            }
            changed = policy.changed() => {
                if changed.is_err() { return; }
            }
            _ = shutdown.changed() => return,
            read = client.read(&mut a) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => if upstream.write_all(&a[..n]).await.is_err() { return },
            },
            read = upstream.read(&mut b) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => if client.write_all(&b[..n]).await.is_err() { return },
            },
        }
    }
    // Dark: hold both sockets open, read nothing, forward nothing.
    state.blackholed.fetch_add(1, Ordering::SeqCst);
    let _held = (client, upstream);
    let _ = shutdown.wait_for(|stop| *stop).await;
}
