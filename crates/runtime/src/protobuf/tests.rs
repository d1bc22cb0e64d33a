use super::*;

/// Protobuf encoding of test messages, field by field.
fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes_field(number: u32, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    varint(u64::from(number) << 3 | 2, &mut out);
    varint(bytes.len() as u64, &mut out);
    out.extend_from_slice(bytes);
    out
}

fn varint_field(number: u32, v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    varint(u64::from(number) << 3, &mut out);
    varint(v, &mut out);
    out
}

/// A view that keeps `metadata.name`.
#[derive(Debug, PartialEq)]
struct Named(String);

impl FromProtobuf for Named {
    fn from_protobuf(raw: &[u8]) -> Result<Self, WireError> {
        let mut name = String::new();
        for field in fields(raw) {
            if let (1, meta) = field? {
                for field in fields(meta.bytes()?) {
                    if let (1, v) = field? {
                        name = v.string()?;
                    }
                }
            }
        }
        Ok(Named(name))
    }
}

fn enveloped(kind: &str, raw: &[u8]) -> Vec<u8> {
    let type_meta = [bytes_field(1, b"v1"), bytes_field(2, kind.as_bytes())].concat();
    let unknown = [bytes_field(1, &type_meta), bytes_field(2, raw)].concat();
    [&MAGIC[..], &unknown].concat()
}

fn event(kind: &str, object_kind: &str, raw: &[u8]) -> Vec<u8> {
    let extension = bytes_field(1, &enveloped(object_kind, raw));
    [bytes_field(1, kind.as_bytes()), bytes_field(2, &extension)].concat()
}

fn pod_named(name: &str) -> Vec<u8> {
    // Unknown fields around the one read: a varint, a fixed64, bytes.
    let meta = [
        varint_field(7, 300),
        bytes_field(1, name.as_bytes()),
        bytes_field(4, b"x"),
    ]
    .concat();
    [
        vec![0x19],
        42u64.to_le_bytes().to_vec(),
        bytes_field(1, &meta),
    ]
    .concat()
}

fn framed(frame: &[u8]) -> Vec<u8> {
    [(frame.len() as u32).to_be_bytes().to_vec(), frame.to_vec()].concat()
}

#[test]
fn fields_skip_what_they_do_not_know_and_stop_at_broken_bytes() {
    assert_eq!(
        Named::from_protobuf(&pod_named("web-0")).unwrap(),
        Named("web-0".into())
    );
    let large = varint_field(3, 1 << 40);
    let read: Vec<_> = fields(&large).collect();
    assert_eq!(read, [Ok((3, Value::Varint(1 << 40)))]);

    // A length past the end: one error, then nothing.
    let broken = [vec![0x0a, 0x05], b"ab".to_vec(), varint_field(2, 1)].concat();
    let read: Vec<_> = fields(&broken).collect();
    assert_eq!(read.len(), 1);
    assert!(read[0].is_err());
    // A group (wire type 3) is refused.
    assert!(fields(&[0x0b]).next().unwrap().is_err());
    // A varint of 11 bytes is refused.
    assert!(
        fields(&[[0x08].as_slice(), &[0xff; 11]].concat())
            .next()
            .unwrap()
            .is_err()
    );
}

#[test]
fn times_are_read_to_the_second() {
    let t = time(&[varint_field(1, 1_764_064_800), varint_field(2, 999_000_000)].concat()).unwrap();
    assert_eq!(t.0.to_string(), "2025-11-25T10:00:00Z");
}

#[test]
fn watch_events_decode_objects_bookmarks_and_errors() {
    let added: WatchEvent<Named> = watch_event(&event("ADDED", "Pod", &pod_named("a"))).unwrap();
    assert!(matches!(added, WatchEvent::Added(Named(ref n)) if n == "a"));
    let deleted: WatchEvent<Named> =
        watch_event(&event("DELETED", "Pod", &pod_named("b"))).unwrap();
    assert!(matches!(deleted, WatchEvent::Deleted(Named(ref n)) if n == "b"));

    let annotation = [
        bytes_field(1, b"k8s.io/initial-events-end"),
        bytes_field(2, b"true"),
    ]
    .concat();
    let meta = [bytes_field(6, b"1234"), bytes_field(12, &annotation)].concat();
    let mark: WatchEvent<Named> =
        watch_event(&event("BOOKMARK", "Pod", &bytes_field(1, &meta))).unwrap();
    let WatchEvent::Bookmark(mark) = mark else {
        panic!("not a bookmark: {mark:?}")
    };
    assert_eq!(mark.metadata.resource_version, "1234");
    assert_eq!(
        mark.metadata.annotations["k8s.io/initial-events-end"],
        "true"
    );

    let status = [
        bytes_field(2, b"Failure"),
        bytes_field(3, b"too old resource version"),
        bytes_field(4, b"Expired"),
        varint_field(6, 410),
    ]
    .concat();
    let error: WatchEvent<Named> = watch_event(&event("ERROR", "Status", &status)).unwrap();
    let WatchEvent::Error(status) = error else {
        panic!("not an error: {error:?}")
    };
    assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));

    // An object without the envelope, an unknown event type.
    let bare = [
        bytes_field(1, b"ADDED"),
        bytes_field(2, &bytes_field(1, &pod_named("c"))),
    ]
    .concat();
    assert!(watch_event::<Named>(&bare).is_err());
    assert!(watch_event::<Named>(&event("SYNC", "Pod", &pod_named("d"))).is_err());
}

#[test]
fn frames_are_cut_from_chunks_of_any_size() {
    let one = event("ADDED", "Pod", &pod_named("a"));
    let two = event("MODIFIED", "Pod", &pod_named("b"));
    let stream = [framed(&one), framed(&two)].concat();
    for chunk in [1, 3, 7, stream.len()] {
        let mut frames = Frames::default();
        let mut out = Vec::new();
        for piece in stream.chunks(chunk) {
            frames.push(piece);
            while let Some(frame) = frames.next_frame().unwrap() {
                out.push(frame.to_vec());
            }
        }
        assert_eq!(out, [one.clone(), two.clone()], "chunks of {chunk}");
        assert!(frames.is_empty());
    }
    let mut frames = Frames::default();
    frames.push(&((MAX_FRAME as u32) + 1).to_be_bytes());
    assert!(
        frames.next_frame().is_err(),
        "a frame past the bound is refused, not awaited"
    );
}

/// The kinds of the read errors a body of these bytes gives.
async fn error_kinds(body: Vec<u8>) -> Vec<std::io::ErrorKind> {
    events::<Named>(kube::client::Body::from(body))
        .filter_map(|e| async move {
            match e {
                Err(kube::Error::ReadEvents(io)) => Some(io.kind()),
                _ => None,
            }
        })
        .collect()
        .await
}

/// The events a body of these bytes gives, one line each.
async fn read_names(body: Vec<u8>) -> Vec<String> {
    events::<Named>(kube::client::Body::from(body))
        .map(|e| match e {
            Ok(WatchEvent::Added(Named(n))) => format!("added {n}"),
            Ok(WatchEvent::Modified(Named(n))) => format!("modified {n}"),
            Ok(other) => format!("{other:?}"),
            Err(e) => format!("error {e}"),
        })
        .collect()
        .await
}

#[tokio::test]
async fn a_body_gives_its_events_and_an_error_for_a_cut_frame() {
    let whole = [
        framed(&event("ADDED", "Pod", &pod_named("a"))),
        framed(&event("MODIFIED", "Pod", &pod_named("a"))),
    ]
    .concat();
    assert_eq!(read_names(whole.clone()).await, ["added a", "modified a"]);

    let cut = [whole, framed(&pod_named("b"))[..6].to_vec()].concat();
    let read = read_names(cut).await;
    assert_eq!(read.len(), 3, "{read:?}");
    assert!(read[2].contains("ended inside a frame"), "{read:?}");
    // ... as an unexpected end (a transport fault), which leaves the
    // watch in protobuf; only a frame that does not decode is invalid.
    let cut = framed(&pod_named("b"))[..6].to_vec();
    assert_eq!(error_kinds(cut).await, [std::io::ErrorKind::UnexpectedEof]);
    assert_eq!(
        error_kinds(framed(b"\x0b")).await,
        [std::io::ErrorKind::InvalidData]
    );

    // A frame that does not decode ends the stream after its error.
    let bad = [
        framed(b"\x0b"),
        framed(&event("ADDED", "Pod", &pod_named("c"))),
    ]
    .concat();
    let read = read_names(bad).await;
    assert_eq!(read.len(), 1, "{read:?}");
    assert!(read[0].starts_with("error"), "{read:?}");
}
