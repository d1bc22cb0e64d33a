//! Kubernetes' protobuf wire format, as far as a watch needs it: the
//! length-delimited frames of a watch stream, the `k8s\0` envelope around
//! each object, and a reader of protobuf fields for the views that decode
//! themselves from it ([`FromProtobuf`]).
//!
//! Why: kube-apiserver encodes protobuf several times faster than JSON. A
//! streaming list of 100,000 pods took 2.4–2.9 s as JSON and 1.0–1.1 s as
//! protobuf on the same server, and that encoding is most of a start-up's
//! wait. kube-rs speaks JSON only, so the watches whose views implement
//! [`FromProtobuf`] (pods) ask for protobuf here; every other request stays
//! JSON.

use std::collections::BTreeMap;

use bytes::{Buf, Bytes, BytesMut};
use futures::StreamExt;
use http_body_util::BodyExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::WatchEvent;
use kube::core::response::StatusSummary;
use kube::core::watch::{Bookmark, BookmarkMeta};
use kube::core::{Status, TypeMeta};

/// What a protobuf watch asks for. JSON stays acceptable, so a server (or
/// a resource) without protobuf answers in JSON, which the caller sees from
/// the response's content type.
pub const ACCEPT: &str = "application/vnd.kubernetes.protobuf, application/json";

/// The media type of protobuf answers (a watch adds `;stream=watch`).
const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The prefix of every enveloped object.
const MAGIC: &[u8; 4] = b"k8s\0";

/// The largest frame accepted. An object in etcd is at most 1.5 MiB; a
/// length beyond this is a broken stream, not an object to buffer.
const MAX_FRAME: usize = 16 << 20;

/// A view decoded from an object's protobuf bytes (the envelope removed).
pub trait FromProtobuf: Sized {
    fn from_protobuf(raw: &[u8]) -> Result<Self, WireError>;
}

/// Bytes that are not what the wire format says they must be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("protobuf: {0}")]
pub struct WireError(pub String);

impl WireError {
    fn new(what: impl Into<String>) -> Self {
        WireError(what.into())
    }
}

/// One field's value. Groups (wire types 3 and 4) do not occur in
/// Kubernetes' messages and are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
}

impl<'a> Value<'a> {
    /// A length-delimited field: bytes, string or message.
    pub fn bytes(self) -> Result<&'a [u8], WireError> {
        match self {
            Value::Bytes(b) => Ok(b),
            other => Err(WireError(format!("expected bytes, found {other:?}"))),
        }
    }

    pub fn string(self) -> Result<String, WireError> {
        String::from_utf8(self.bytes()?.to_vec())
            .map_err(|_| WireError::new("a string is not UTF-8"))
    }

    pub(crate) fn varint(self) -> Result<u64, WireError> {
        match self {
            Value::Varint(v) => Ok(v),
            other => Err(WireError(format!("expected a varint, found {other:?}"))),
        }
    }

    /// An `int64`/`int32` (two's complement in a varint).
    pub fn int(self) -> Result<i64, WireError> {
        Ok(self.varint()? as i64)
    }
}

/// The fields of one message, in order: `(field number, value)`. Fields a
/// caller does not know are skipped by not matching them.
pub struct Fields<'a> {
    rest: &'a [u8],
}

pub fn fields(message: &[u8]) -> Fields<'_> {
    Fields { rest: message }
}

impl<'a> Fields<'a> {
    fn varint(&mut self) -> Result<u64, WireError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = self
                .rest
                .split_first()
                .ok_or_else(|| WireError::new("a varint runs past the end"))?;
            self.rest = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(WireError::new("a varint longer than 10 bytes"))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.rest.len() < n {
            return Err(WireError::new("a field runs past the end"));
        }
        let (taken, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(taken)
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Value<'a>), WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let field = (|| {
            let key = self.varint()?;
            let number =
                u32::try_from(key >> 3).map_err(|_| WireError::new("a field number too large"))?;
            let value = match key & 7 {
                0 => Value::Varint(self.varint()?),
                1 => Value::Fixed64(u64::from_le_bytes(
                    self.take(8)?.try_into().expect("8 bytes"),
                )),
                2 => {
                    let len = usize::try_from(self.varint()?)
                        .map_err(|_| WireError::new("a length too large"))?;
                    Value::Bytes(self.take(len)?)
                }
                5 => Value::Fixed32(u32::from_le_bytes(
                    self.take(4)?.try_into().expect("4 bytes"),
                )),
                other => return Err(WireError(format!("wire type {other} is not supported"))),
            };
            Ok((number, value))
        })();
        if field.is_err() {
            // Nothing after a malformed field can be read.
            self.rest = &[];
        }
        Some(field)
    }
}

/// A `map<string, string>` entry (key 1, value 2).
/// Borrowed, so a reader that keeps a few keys allocates nothing for the
/// others (a tenant's labels cost no memory).
pub fn map_entry(entry: &[u8]) -> Result<(Value<'_>, Value<'_>), WireError> {
    let (mut key, mut value) = (Value::Bytes(&[]), Value::Bytes(&[]));
    for field in fields(entry) {
        match field? {
            (1, v) => key = v,
            (2, v) => value = v,
            _ => {}
        }
    }
    Ok((key, value))
}

/// A `meta.v1.Time` (seconds 1, nanos 2), to the second: its JSON form
/// carries whole seconds, and a view reads the same time from either.
pub fn time(message: &[u8]) -> Result<Time, WireError> {
    let mut seconds = 0i64;
    for field in fields(message) {
        if let (1, v) = field? {
            seconds = v.int()?;
        }
    }
    k8s_openapi::jiff::Timestamp::new(seconds, 0)
        .map(Time)
        .map_err(|e| WireError(format!("a time out of range: {e}")))
}

/// An enveloped object: its kind and its own bytes. The envelope is
/// `k8s\0` and a `runtime.Unknown` (typeMeta 1 {apiVersion 1, kind 2},
/// raw 2).
fn unwrap(enveloped: &[u8]) -> Result<(String, &[u8]), WireError> {
    let unknown = enveloped
        .strip_prefix(MAGIC)
        .ok_or_else(|| WireError::new("an object without the k8s envelope"))?;
    let (mut kind, mut raw) = (String::new(), &[][..]);
    for field in fields(unknown) {
        match field? {
            (1, type_meta) => {
                for field in fields(type_meta.bytes()?) {
                    if let (2, v) = field? {
                        kind = v.string()?;
                    }
                }
            }
            (2, v) => raw = v.bytes()?,
            _ => {}
        }
    }
    Ok((kind, raw))
}

/// A `meta.v1.Status` (status 2, message 3, reason 4, code 6).
fn status(raw: &[u8]) -> Result<Status, WireError> {
    let mut status = Status::default();
    for field in fields(raw) {
        match field? {
            (2, v) => {
                status.status = Some(if v.string()? == "Success" {
                    StatusSummary::Success
                } else {
                    StatusSummary::Failure
                });
            }
            (3, v) => status.message = v.string()?,
            (4, v) => status.reason = v.string()?,
            (6, v) => status.code = u16::try_from(v.int()?).unwrap_or_default(),
            _ => {}
        }
    }
    Ok(status)
}

/// A bookmark's object: only `metadata.resourceVersion` and
/// `metadata.annotations` (`metadata` is field 1 of every object).
fn bookmark(raw: &[u8]) -> Result<Bookmark, WireError> {
    let mut meta = BookmarkMeta {
        resource_version: String::new(),
        annotations: BTreeMap::new(),
    };
    for field in fields(raw) {
        if let (1, metadata) = field? {
            for field in fields(metadata.bytes()?) {
                match field? {
                    (6, v) => meta.resource_version = v.string()?,
                    (12, v) => {
                        let (key, value) = map_entry(v.bytes()?)?;
                        meta.annotations.insert(key.string()?, value.string()?);
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(Bookmark {
        types: TypeMeta::default(),
        metadata: meta,
    })
}

/// One frame of a watch stream: a `meta.v1.WatchEvent` (type 1, object 2
/// as a `runtime.RawExtension` whose raw 1 is the enveloped object).
pub fn watch_event<K: FromProtobuf>(frame: &[u8]) -> Result<WatchEvent<K>, WireError> {
    let (mut kind, mut object) = (String::new(), &[][..]);
    for field in fields(frame) {
        match field? {
            (1, v) => kind = v.string()?,
            (2, extension) => {
                for field in fields(extension.bytes()?) {
                    if let (1, v) = field? {
                        object = v.bytes()?;
                    }
                }
            }
            _ => {}
        }
    }
    let (object_kind, raw) = unwrap(object)?;
    Ok(match kind.as_str() {
        "ADDED" => WatchEvent::Added(K::from_protobuf(raw)?),
        "MODIFIED" => WatchEvent::Modified(K::from_protobuf(raw)?),
        "DELETED" => WatchEvent::Deleted(K::from_protobuf(raw)?),
        "BOOKMARK" => WatchEvent::Bookmark(bookmark(raw)?),
        "ERROR" if object_kind == "Status" => WatchEvent::Error(Box::new(status(raw)?)),
        other => {
            return Err(WireError(format!(
                "a watch event of type {other:?} ({object_kind})"
            )));
        }
    })
}

/// Splits a byte stream into length-delimited frames (a 4-byte big-endian
/// length, then that many bytes).
#[derive(Debug, Default)]
pub struct Frames {
    buffer: BytesMut,
}

impl Frames {
    pub fn push(&mut self, chunk: &[u8]) {
        self.buffer.extend_from_slice(chunk);
    }

    /// The next whole frame, if one is in.
    pub fn next_frame(&mut self) -> Result<Option<Bytes>, WireError> {
        let Some(header) = self.buffer.get(..4) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes(header.try_into().expect("4 bytes")) as usize;
        if len > MAX_FRAME {
            return Err(WireError(format!("a frame of {len} bytes")));
        }
        if self.buffer.len() < 4 + len {
            return Ok(None);
        }
        self.buffer.advance(4);
        Ok(Some(self.buffer.split_to(len).freeze()))
    }

    /// Whether no bytes are left over (none of a frame not yet whole).
    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }
}

/// A watch's events, whichever encoding they came in.
pub(crate) type EventStream<K> =
    futures::stream::BoxStream<'static, Result<WatchEvent<K>, kube::Error>>;

/// Whether an answer's content type is protobuf.
pub fn is_protobuf(response: &http::Response<kube::client::Body>) -> bool {
    response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(MEDIA_TYPE))
}

/// An error answer (any status but 2xx) as the API error it carries, in
/// either encoding.
pub(crate) async fn error_answer(response: http::Response<kube::client::Body>) -> kube::Error {
    let code = response.status().as_u16();
    let protobuf = is_protobuf(&response);
    let body = match response.into_body().collect_bytes().await {
        Ok(body) => body,
        Err(e) => return e,
    };
    let decoded = if protobuf {
        unwrap(&body).ok().and_then(|(_, raw)| status(raw).ok())
    } else {
        serde_json::from_slice::<Status>(&body).ok()
    };
    let mut status = decoded.unwrap_or_else(|| Status {
        message: String::from_utf8_lossy(&body).into_owned(),
        ..Status::default()
    });
    if status.code == 0 {
        status.code = code;
    }
    kube::Error::Api(Box::new(status))
}

/// The events of a protobuf watch answer, decoded as they arrive.
pub fn events<K: FromProtobuf + Send + 'static>(body: kube::client::Body) -> EventStream<K> {
    let invalid = |e: WireError| {
        kube::Error::ReadEvents(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    };
    futures::stream::unfold(Some((body, Frames::default())), move |state| async move {
        let (mut body, mut frames) = state?;
        loop {
            match frames.next_frame() {
                Ok(Some(frame)) => {
                    let event = watch_event::<K>(&frame).map_err(invalid);
                    // After a frame that does not decode, the stream cannot
                    // be trusted: end it after the error.
                    let next = event.is_ok().then_some((body, frames));
                    return Some((event, next));
                }
                Ok(None) => {}
                Err(e) => return Some((Err(invalid(e)), None)),
            }
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        frames.push(data);
                    }
                }
                Some(Err(e)) => return Some((Err(e), None)),
                None if frames.is_empty() => return None,
                // A connection cut mid-frame is a transport fault, not a
                // decoding one: reported as an unexpected end, so that the
                // watch is simply opened again, still in protobuf.
                None => {
                    return Some((
                        Err(kube::Error::ReadEvents(std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            WireError::new("the stream ended inside a frame"),
                        ))),
                        None,
                    ));
                }
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests;
