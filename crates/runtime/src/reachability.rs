//! Whether the API server answers at all, so that work needing it waits
//! through an outage instead of failing item by item.
//!
//! A request that never got an answer (connection refused, TLS failure,
//! connection lost) says nothing about the object it was for. Workers
//! report such failures here; from the first one on, they hold until a
//! probe gets an answer again, and the outage is logged once, with its
//! length when it ends, instead of once per item.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{info, warn};

/// First pause between probes of an unreachable API server.
const PROBE_MIN: Duration = Duration::from_millis(250);
/// Longest pause between probes: a returning API server is noticed this
/// late at most.
const PROBE_MAX: Duration = Duration::from_secs(2);

/// The API server's reachability as this process sees it.
pub struct Reachability {
    /// `true` while reachable.
    up: watch::Sender<bool>,
    down_since: Mutex<Option<Instant>>,
}

impl Default for Reachability {
    fn default() -> Self {
        Self::new()
    }
}

impl Reachability {
    pub fn new() -> Self {
        Reachability {
            up: watch::Sender::new(true),
            down_since: Mutex::new(None),
        }
    }

    pub(crate) fn is_reachable(&self) -> bool {
        *self.up.borrow()
    }

    /// A request got no answer. Returns whether this starts an outage.
    pub(crate) fn report_unreachable(&self, error: &dyn std::fmt::Display) -> bool {
        let mut since = self.down_since.lock().unwrap();
        if since.is_some() {
            return false;
        }
        *since = Some(Instant::now());
        self.up.send_replace(false);
        warn!(error = %error, "API server unreachable: holding work until it answers again");
        true
    }

    /// An answer came back: the outage, if any, is over.
    pub(crate) fn report_answer(&self) {
        let Some(since) = self.down_since.lock().unwrap().take() else {
            return;
        };
        self.up.send_replace(true);
        info!(
            outage_secs = since.elapsed().as_secs_f64(),
            "API server reachable again: resuming work"
        );
    }

    /// Resolves at once while reachable, else when reachable again.
    pub async fn wait_reachable(&self) {
        let mut rx = self.up.subscribe();
        let _ = rx.wait_for(|up| *up).await;
    }

    /// Probes the API server (`GET /version`, which every authenticated
    /// client may read) whenever it is reported unreachable, with a short
    /// growing pause, until it answers. Runs until the process ends.
    pub async fn probe(&self, client: kube::Client) {
        let mut rx = self.up.subscribe();
        loop {
            if rx.wait_for(|up| !*up).await.is_err() {
                return;
            }
            let mut pause = PROBE_MIN;
            while !self.is_reachable() {
                tokio::time::sleep(pause).await;
                match client.apiserver_version().await {
                    Ok(_) => self.report_answer(),
                    Err(kube::Error::Api(_)) => self.report_answer(),
                    Err(_) => pause = (pause * 2).min(PROBE_MAX),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_outage_is_reported_once_and_waited_out() {
        let r = std::sync::Arc::new(Reachability::new());
        r.wait_reachable().await;
        assert!(r.report_unreachable(&"refused"));
        assert!(
            !r.report_unreachable(&"refused again"),
            "one outage, one report"
        );
        let waiter = tokio::spawn({
            let r = r.clone();
            async move { r.wait_reachable().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "work holds while unreachable");
        r.report_answer();
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("work resumes when the API server answers")
            .unwrap();
        assert!(r.is_reachable());
    }
}
