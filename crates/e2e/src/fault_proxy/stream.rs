//! The faults of one forwarded watch stream: lag, a cut, a truncation
//! inside a chunk, a stall.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};

use super::{BoxError, FaultCounts, ProxyBody};

/// What happens to one forwarded watch stream.
pub(super) struct StreamFaults {
    /// Ended with an error then.
    pub(super) cut_after: Option<Duration>,
    /// From then on, the next chunk is passed on half, then the body ends.
    pub(super) truncate_after: Option<Duration>,
    /// Silent from then on, connection kept open.
    pub(super) stall_after: Option<Duration>,
    /// Silent from the next bump of the proxy's stall epoch on.
    pub(super) stall_epoch: tokio::sync::watch::Receiver<u64>,
    /// Every event delivered this much later than it arrived.
    pub(super) lag: Duration,
    pub(super) counts: Arc<FaultCounts>,
}

/// A forwarded watch stream: each event delivered `lag` after the API
/// server sent it; with `cut_after`, the stream ended with an error then,
/// so the client sees it break off mid-message as when a connection dies;
/// with a stall, nothing more is delivered and nothing ends it.
pub(super) fn watch_body(body: Incoming, faults: StreamFaults) -> ProxyBody {
    type Item = (Instant, Result<Frame<Bytes>, hyper::Error>);
    // A reader stamps frames as they arrive, so the lag is a constant
    // latency, not one that adds up over a burst of events.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Item>();
    tokio::spawn(async move {
        let mut body = body;
        loop {
            let frame = tokio::select! {
                f = body.frame() => f,
                _ = tx.closed() => return,
            };
            let Some(frame) = frame else { return };
            let end = frame.is_err();
            if tx.send((Instant::now(), frame)).is_err() || end {
                return;
            }
        }
    });
    // No fault: a deadline that never comes within a test.
    let never = Duration::from_secs(24 * 3600);
    let StreamFaults {
        cut_after,
        truncate_after,
        stall_after,
        mut stall_epoch,
        lag,
        counts,
    } = faults;
    stall_epoch.mark_unchanged();
    let cut = Box::pin(tokio::time::sleep(cut_after.unwrap_or(never)));
    let truncate_at = Instant::now() + truncate_after.unwrap_or(never);
    let stall = Box::pin(tokio::time::sleep(stall_after.unwrap_or(never)));
    let stream = futures::stream::unfold(Some((rx, cut, stall, stall_epoch)), move |state| {
        let counts = counts.clone();
        async move {
            let (mut rx, mut cut, mut stall, mut epoch) = state?;
            let stalled = tokio::select! {
                item = rx.recv() => match item? {
                    (at, Ok(f)) => {
                        tokio::time::sleep_until((at + lag).into()).await;
                        if Instant::now() >= truncate_at
                            && let Some(data) = f.data_ref().filter(|d| d.len() >= 2)
                        {
                            // Half a chunk, then a clean end of the body.
                            counts.truncated.fetch_add(1, Ordering::Relaxed);
                            let half = data.slice(..data.len() / 2);
                            return Some((Ok::<Frame<Bytes>, BoxError>(Frame::data(half)), None));
                        }
                        return Some((Ok::<Frame<Bytes>, BoxError>(f), Some((rx, cut, stall, epoch))));
                    }
                    (_, Err(e)) => return Some((Err(e.into()), None)),
                },
                _ = &mut cut => {
                    counts.cut.fetch_add(1, Ordering::Relaxed);
                    return Some((Err("watch cut by the e2e fault proxy".into()), None));
                }
                _ = &mut stall => true,
                changed = epoch.changed() => changed.is_ok(),
            };
            if stalled {
                counts.stall.fetch_add(1, Ordering::Relaxed);
            }
            // Silent for good: the connection stays open until the
            // client gives up on it.
            drop(rx);
            std::future::pending::<()>().await;
            None
        }
    });
    BodyExt::boxed(StreamBody::new(stream))
}
