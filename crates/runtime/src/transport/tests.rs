use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

#[test]
fn request_kinds() {
    let rows = [
        (
            Method::GET,
            "/api/v1/pods?watch=true&resourceVersion=5",
            RequestKind::Watch,
        ),
        (
            Method::GET,
            "/api/v1/pods?resourceVersion=5&watch=1",
            RequestKind::Watch,
        ),
        (
            Method::GET,
            "/api/v1/watch/namespaces/a/pods",
            RequestKind::Watch,
        ),
        (Method::GET, "/api/v1/pods?limit=500", RequestKind::Read),
        // A pod named "watch" is not a watch.
        (
            Method::GET,
            "/api/v1/namespaces/a/pods/watcher",
            RequestKind::Read,
        ),
        (Method::GET, "/api/v1/pods?watchdog=true", RequestKind::Read),
        (
            Method::POST,
            "/api/v1/namespaces/a/pods?watch=true",
            RequestKind::Write,
        ),
        (
            Method::PATCH,
            "/apis/resource.k8s.io/v1/namespaces/a/resourceclaims/c/status",
            RequestKind::Write,
        ),
        (
            Method::PUT,
            "/apis/coordination.k8s.io/v1/namespaces/a/leases/l",
            RequestKind::Write,
        ),
        (
            Method::DELETE,
            "/apis/resource.k8s.io/v1/namespaces/a/resourceclaims/c",
            RequestKind::Write,
        ),
    ];
    for (method, uri, want) in rows {
        let uri: http::Uri = uri.parse().unwrap();
        assert_eq!(RequestKind::of(&method, &uri), want, "{method} {uri}");
    }
}

#[test]
fn every_kind_has_a_deadline_of_seconds() {
    let d = Deadlines::default();
    for kind in [RequestKind::Watch, RequestKind::Read, RequestKind::Write] {
        let deadline = d.for_kind(kind);
        assert!(
            deadline.headers >= Duration::from_secs(5)
                && deadline.headers <= Duration::from_secs(15),
            "{kind:?}: {deadline:?}"
        );
        // Only a watch streams without a bound here (the informer bounds
        // its silence); every other answer ends within the server's own
        // request timeout.
        assert_eq!(
            deadline.whole.is_none(),
            kind == RequestKind::Watch,
            "{kind:?}"
        );
        if let Some(whole) = deadline.whole {
            assert!(whole > deadline.headers && whole <= Duration::from_secs(60));
        }
    }
    // A dead HTTP/2 connection is found before a watch's silence bound
    // (15 s) would find its streams one by one.
    assert!(H2_READ_IDLE + H2_PING_TIMEOUT < Duration::from_secs(15));
}

type TestBody = StreamBody<futures::stream::Pending<Result<Frame<Bytes>, Infallible>>>;

fn never_answers() -> impl Service<
    Request<()>,
    Response = Response<Full<Bytes>>,
    Error = BoxError,
    Future = impl Send + 'static,
> + Send
+ 'static {
    tower::service_fn(|_req: Request<()>| {
        futures::future::pending::<Result<Response<Full<Bytes>>, BoxError>>()
    })
}

/// Headers come at once, the body never ends.
fn endless_body() -> impl Service<
    Request<()>,
    Response = Response<TestBody>,
    Error = BoxError,
    Future = impl Send + 'static,
> + Send
+ 'static {
    tower::service_fn(|_req: Request<()>| async {
        Ok::<_, BoxError>(Response::new(StreamBody::new(futures::stream::pending())))
    })
}

fn request(method: Method, uri: &str) -> Request<()> {
    Request::builder().method(method).uri(uri).body(()).unwrap()
}

fn timed_out(err: &BoxError) -> &TimedOut {
    err.downcast_ref::<TimedOut>()
        .unwrap_or_else(|| panic!("not a TimedOut: {err}"))
}

#[tokio::test(start_paused = true)]
async fn a_request_without_answer_fails_at_its_kinds_deadline() {
    let d = Deadlines::default();
    let rows = [
        (
            Method::PATCH,
            "/api/v1/namespaces/a/pods/p/status",
            d.write_headers,
            RequestKind::Write,
        ),
        (
            Method::GET,
            "/api/v1/namespaces/a/pods/p",
            d.read_headers,
            RequestKind::Read,
        ),
        (
            Method::GET,
            "/api/v1/pods?watch=true",
            d.watch_first_byte,
            RequestKind::Watch,
        ),
    ];
    for (method, uri, want, kind) in rows {
        let mut svc = DeadlineLayer::default().layer(never_answers());
        let started = Instant::now();
        let err = svc
            .ready()
            .await
            .unwrap()
            .call(request(method.clone(), uri))
            .await
            .expect_err("no answer must end in an error");
        assert_eq!(started.elapsed(), want, "{method} {uri}");
        let t = timed_out(&err);
        assert_eq!((t.kind, t.missed, t.after), (kind, Missed::Headers, want));
        let text = err.to_string();
        assert!(
            text.contains(&format!("{method} ")) && text.contains(uri.split('?').next().unwrap()),
            "the error names the request: {text}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_body_that_never_ends_fails_at_the_whole_answer_deadline() {
    let d = Deadlines::default();
    let mut svc = DeadlineLayer::default().layer(endless_body());
    let started = Instant::now();
    let response = svc
        .ready()
        .await
        .unwrap()
        .call(request(Method::GET, "/api/v1/pods?limit=500"))
        .await
        .expect("headers came");
    let err = response
        .into_body()
        .collect()
        .await
        .expect_err("a body that never ends must fail");
    assert_eq!(started.elapsed(), d.whole_answer);
    assert_eq!(timed_out(&err).missed, Missed::WholeAnswer);
}

#[tokio::test(start_paused = true)]
async fn a_watch_stream_is_not_cut_by_the_transport() {
    let d = Deadlines::default();
    let mut svc = DeadlineLayer::default().layer(endless_body());
    let response = svc
        .ready()
        .await
        .unwrap()
        .call(request(Method::GET, "/api/v1/pods?watch=true"))
        .await
        .expect("headers came");
    let mut body = response.into_body();
    let waited = tokio::time::timeout(d.whole_answer * 3, body.frame()).await;
    assert!(
        waited.is_err(),
        "the watch body ended or failed: {waited:?}"
    );
}

/// An HTTP/1.1 server on loopback that answers the first request on each
/// connection and then goes silent on it with the socket held open (a
/// blackholed connection, as far as the client can tell).
async fn answers_once_per_connection() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                let mut seen = Vec::new();
                // Read up to the end of the first request's headers.
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                let answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
                if socket.write_all(answer).await.is_err() {
                    return;
                }
                // Then swallow everything and never answer again.
                loop {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            });
        }
    });
    (addr, accepted)
}

#[tokio::test]
async fn a_request_retried_after_a_timeout_goes_out_on_another_connection() {
    let (addr, accepted) = answers_once_per_connection().await;
    let short = Duration::from_millis(300);
    let deadlines = Deadlines {
        write_headers: short,
        read_headers: short,
        watch_first_byte: short,
        whole_answer: Duration::from_secs(2),
    };
    let client = http_client(HttpConnector::new());
    let mut svc = DeadlineLayer { deadlines }.layer(client.map_err(BoxError::from));
    let get = |path: &str| {
        Request::builder()
            .uri(format!("http://{addr}{path}"))
            .body(Body::empty())
            .unwrap()
    };

    // The first request is answered; its connection goes back to the pool.
    let first = svc
        .ready()
        .await
        .unwrap()
        .call(get("/a"))
        .await
        .expect("answered");
    first.into_body().collect().await.expect("whole body");
    // The second reuses it and gets nothing.
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(get("/b"))
        .await
        .expect_err("the pooled connection is blackholed");
    assert_eq!(timed_out(&err).missed, Missed::Headers);
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "one connection so far");
    // The retry must not be sent on the connection that just failed it.
    let third = svc
        .ready()
        .await
        .unwrap()
        .call(get("/b"))
        .await
        .expect("the retry is answered on a fresh connection");
    third.into_body().collect().await.expect("whole body");
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        2,
        "a second connection was opened"
    );
}
