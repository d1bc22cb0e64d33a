//! The accept loop of a listener, with the limits a port open to the pod
//! network needs: a bound on concurrent connections, deadlines for the TLS
//! handshake, for the request headers and for the handler, and TLS when
//! the listener has a certificate.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;
use tracing::{debug, warn};

/// Connections served at once; more are closed on accept. Prometheus
/// needs one per scraper, the kubelet one per probe.
pub const MAX_CONNECTIONS: usize = 64;
/// A client must finish the TLS handshake within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// ... and send each request's headers within this (an idle keep-alive
/// connection is closed after it too).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// A handler that takes longer is answered 503.
pub const HANDLER_TIMEOUT: Duration = Duration::from_secs(30);

/// Answers 503 for a request whose handler outlives [`HANDLER_TIMEOUT`].
pub(crate) async fn handler_deadline(req: Request, next: Next) -> Response {
    match tokio::time::timeout(HANDLER_TIMEOUT, next.run(req)).await {
        Ok(response) => response,
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "handler timed out\n").into_response(),
    }
}

/// Serves `router` on `listener` (over TLS with `tls`) until `shutdown`
/// resolves; connections still open then end with the process.
pub async fn accept_loop(
    listener: TcpListener,
    router: Router,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) {
    let router = router.layer(axum::middleware::from_fn(handler_deadline));
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(err) => {
                    // Out of file descriptors, say: pause rather than spin.
                    warn!(error = %err, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => return,
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            debug!(
                limit = MAX_CONNECTIONS,
                "connection limit reached; closing a new connection"
            );
            continue;
        };
        let router = router.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tls {
                None => serve_connection(stream, router).await,
                Some(acceptor) => {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => serve_connection(stream, router).await,
                        Ok(Err(err)) => debug!(error = %err, "TLS handshake failed"),
                        Err(_) => debug!("TLS handshake timed out"),
                    }
                }
            }
        });
    }
}

async fn serve_connection<S>(stream: S, router: Router)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = TowerToHyperService::new(
        router.map_request(|req: Request<Incoming>| req.map(axum::body::Body::new)),
    );
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service);
    if let Err(err) = connection.await {
        debug!(error = %err, "HTTP connection ended with an error");
    }
}
