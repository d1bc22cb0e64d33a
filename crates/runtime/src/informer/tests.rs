use super::*;

#[test]
fn watch_timeouts_bound_the_silence() {
    for _ in 0..100 {
        let timeout = watch_config()
            .timeout
            .expect("a server-side timeout is set");
        assert!((8..=10).contains(&timeout), "{timeout}");
        assert!(timeout + WATCH_IDLE_MARGIN_SECS <= SILENT_STREAM_BOUND_SECS);
    }
}

/// Request-level tests of the watch loop against a mock API server.
mod over_the_wire {
    use std::sync::{Arc, Mutex};

    use std::convert::Infallible;

    use http::{Request, Response};
    use http_body_util::combinators::UnsyncBoxBody;
    use http_body_util::{BodyExt, Full, StreamBody};
    use hyper::body::{Bytes, Frame};
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::client::Body;
    use serde_json::{Value, json};
    use tower_test::mock;

    use super::super::*;

    /// Answers are whole bodies, or streams that go silent.
    type Answer = UnsyncBoxBody<Bytes, Infallible>;
    type MockHandle = mock::Handle<Request<Body>, Response<Answer>>;

    /// What the handler was told, in order.
    #[derive(Default)]
    struct Recorded(Mutex<Vec<String>>);

    impl Handler<ConfigMap> for Recorded {
        fn admit(&self, obj: ConfigMap) -> Option<ConfigMap> {
            // Drops "skip-*" objects, as the pod handler drops pods without claims.
            (!obj
                .metadata
                .name
                .as_deref()
                .unwrap_or_default()
                .starts_with("skip-"))
            .then_some(obj)
        }
        fn relisted(&self, objects: Vec<ConfigMap>) {
            let names: Vec<String> = objects
                .into_iter()
                .map(|o| o.metadata.name.unwrap())
                .collect();
            self.0
                .lock()
                .unwrap()
                .push(format!("relisted {}", names.join(",")));
        }
        fn applied(&self, obj: ConfigMap) {
            self.0
                .lock()
                .unwrap()
                .push(format!("applied {}", obj.metadata.name.unwrap()));
        }
        fn deleted(&self, obj: ConfigMap) {
            self.0
                .lock()
                .unwrap()
                .push(format!("deleted {}", obj.metadata.name.unwrap()));
        }
    }

    fn config_map(name: &str, version: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": "ns", "resourceVersion": version}})
    }

    fn event(kind: &str, object: Value) -> String {
        format!("{}\n", json!({"type": kind, "object": object}))
    }

    fn bookmark(version: &str, initial_end: bool) -> String {
        let annotations = if initial_end {
            json!({INITIAL_EVENTS_END: "true"})
        } else {
            json!({})
        };
        event(
            "BOOKMARK",
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"resourceVersion": version, "annotations": annotations}}),
        )
    }

    /// Takes the next request, answers it with `body`, returns its query.
    async fn answer(handle: &mut MockHandle, body: String) -> String {
        let (request, send) = handle.next_request().await.expect("a request");
        let query = request.uri().query().unwrap_or_default().to_string();
        let body = Full::new(Bytes::from(body)).boxed_unsync();
        send.send_response(Response::builder().status(200).body(body).unwrap());
        query
    }

    fn start(recorded: Arc<Recorded>) -> (Arc<Informer>, MockHandle) {
        let (service, handle) = mock::pair::<Request<Body>, Response<Answer>>();
        let api: Api<ConfigMap> = Api::namespaced(kube::Client::new(service, "default"), "ns");
        let informer = Arc::new(Informer::new("configmaps"));
        let running = informer.clone();
        tokio::spawn(async move { running.run(api, &*recorded).await });
        (informer, handle)
    }

    fn has(query: &str, pair: &str) -> bool {
        query.split('&').any(|p| p == pair)
    }

    #[tokio::test]
    async fn the_first_list_is_streamed_and_watching_goes_on_from_its_bookmark() {
        let recorded = Arc::new(Recorded::default());
        let (informer, mut handle) = start(recorded.clone());

        let initial = [
            event("ADDED", config_map("a", "5")),
            event("ADDED", config_map("skip-b", "6")),
            bookmark("7", false),
            event("ADDED", config_map("c", "8")),
            bookmark("10", true),
        ]
        .concat();
        let query = answer(&mut handle, initial).await;
        assert!(has(&query, "watch=true"), "{query}");
        assert!(has(&query, "sendInitialEvents=true"), "{query}");
        assert!(has(&query, "resourceVersionMatch=NotOlderThan"), "{query}");
        assert!(has(&query, "allowWatchBookmarks=true"), "{query}");
        assert!(has(&query, "timeoutSeconds=290"), "{query}");

        let query = answer(&mut handle, event("MODIFIED", config_map("a", "11"))).await;
        assert!(informer.is_synced());
        assert!(has(&query, "resourceVersion=10"), "{query}");
        assert!(!query.contains("sendInitialEvents"), "{query}");
        let timeout: u32 = query
            .split('&')
            .find_map(|p| p.strip_prefix("timeoutSeconds="))
            .unwrap()
            .parse()
            .unwrap();
        assert!((8..=10).contains(&timeout), "{query}");

        let query = answer(&mut handle, event("DELETED", config_map("c", "12"))).await;
        assert!(has(&query, "resourceVersion=11"), "{query}");
        let query = answer(&mut handle, String::new()).await;
        assert!(has(&query, "resourceVersion=12"), "{query}");
        assert_eq!(
            *recorded.0.lock().unwrap(),
            ["relisted a,c", "applied a", "deleted c"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_streaming_list_falls_back_to_pages_at_once_and_for_good() {
        let recorded = Arc::new(Recorded::default());
        let (informer, mut handle) = start(recorded.clone());

        // What kube-apiserver 1.36 answers when its etcd cannot serve
        // progress requests.
        let refusal = event(
            "ERROR",
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500,
                   "reason": "InternalError",
                   "message": "a watch stream was requested by the client but the required storage feature RequestWatchProgress is disabled"}),
        );
        let query = answer(&mut handle, refusal).await;
        assert!(has(&query, "sendInitialEvents=true"), "{query}");

        let page = |items: Vec<Value>, continue_: &str, version: &str| {
            json!({"apiVersion": "v1", "kind": "ConfigMapList", "items": items,
                   "metadata": {"continue": continue_, "resourceVersion": version}})
            .to_string()
        };
        let query = answer(&mut handle, page(vec![config_map("a", "3")], "next", "4")).await;
        assert!(!query.contains("watch"), "a list: {query}");
        assert!(has(&query, "limit=500"), "{query}");
        let query = answer(&mut handle, page(vec![config_map("skip-b", "4")], "", "5")).await;
        assert!(has(&query, "continue=next"), "{query}");

        // The watch goes on from the list; a 410 relists, in pages.
        let gone = event(
            "ERROR",
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
                   "reason": "Expired", "message": "too old resource version"}),
        );
        let query = answer(&mut handle, gone).await;
        assert!(has(&query, "resourceVersion=5"), "{query}");
        assert!(informer.is_synced());
        let query = answer(&mut handle, page(vec![config_map("d", "9")], "", "9")).await;
        assert!(
            !query.contains("watch") && has(&query, "limit=500"),
            "{query}"
        );
        let query = answer(&mut handle, String::new()).await;
        assert!(has(&query, "resourceVersion=9"), "{query}");
        assert_eq!(*recorded.0.lock().unwrap(), ["relisted a", "relisted d"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_watch_is_replaced_from_the_last_version_seen() {
        let recorded = Arc::new(Recorded::default());
        let (_informer, mut handle) = start(recorded.clone());
        answer(&mut handle, bookmark("3", true)).await;

        // A stream that delivers one event and then nothing, with its
        // connection open.
        let (request, send) = handle.next_request().await.expect("a watch");
        assert!(has(request.uri().query().unwrap(), "resourceVersion=3"));
        let first = Frame::data(Bytes::from(event("ADDED", config_map("a", "4"))));
        let silent = futures::stream::once(async { Ok::<_, Infallible>(first) })
            .chain(futures::stream::pending());
        let body = StreamBody::new(silent).boxed_unsync();
        send.send_response(Response::builder().status(200).body(body).unwrap());
        let opened = tokio::time::Instant::now();

        let (request, _send) = handle.next_request().await.expect("a new watch");
        let silent_for = opened.elapsed();
        assert!(has(request.uri().query().unwrap(), "resourceVersion=4"));
        assert!(
            silent_for >= Duration::from_secs(13) && silent_for <= SILENT_STREAM_BOUND,
            "{silent_for:?}"
        );
        assert_eq!(*recorded.0.lock().unwrap(), ["relisted ", "applied a"]);
    }
}
