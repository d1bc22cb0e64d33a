//! Leader hand-over under load: two replicas against one API server while
//! pods with two template entries arrive every 100 ms. Exactly one replica
//! writes; a SIGTERMed leader hands over at once (it abandons work not yet
//! sent and releases the lease, which the standby watches); a SIGKILLed one
//! within lease duration plus retry period; and no claim is ever created
//! twice. The replicas run at the production QPS, below the load.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};

use crate::cluster::{Controller, ControllerOpts};
use crate::ctx::TestCtx;
use crate::k8s::*;
use crate::rawhttp::{metric_sum, metric_value};
use crate::rbac::{LEASE_NAME, SYSTEM_NAMESPACE};
use crate::replica::Replica;

/// On top of the election's own bounds: API round trips, the 100 ms poll,
/// and a busy two-core machine. Not a speed requirement.
const SLACK: Duration = Duration::from_secs(3);
const POD_INTERVAL: Duration = Duration::from_millis(100);
/// kube-controller-manager's default `--kube-api-qps`.
const HANDOVER_QPS: u32 = 20;
const ENTRIES: [(&str, &str); 2] = [("a", "tmpl-a"), ("b", "tmpl-b")];
/// Converging after the load stops: a bound, not a speed test.
const QUIET_TIMEOUT: Duration = Duration::from_secs(180);
const WRITE_METHODS: [&str; 4] = ["POST", "PATCH", "PUT", "DELETE"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_handover_under_load() {
    // The production budget, which the pod load (two claims and a status
    // write every 100 ms) exceeds: the leader always has syncs waiting for
    // tokens when it is stopped.
    let opts = ControllerOpts {
        qps: HANDOVER_QPS,
        burst: 30,
        // kube-controller-manager's defaults, so the figures are the ones
        // an admin gets.
        lease_timing: ["15s", "10s", "2s"],
        ..ControllerOpts::default()
    };
    let Some(mut t) = TestCtx::isolated("leader_handover_under_load", opts, 2).await else {
        return;
    };
    let timing = ElectionTiming::from_log(&t.replica(0).current()).await;
    eprintln!(
        "e2e: election flags of the replicas: lease duration {:?}, retry period {:?}",
        timing.lease, timing.retry
    );
    for (_, template) in ENTRIES {
        t.create_template(template).await;
    }
    let load = PodLoad::start(t.pods());

    // Exactly one leader, and it holds the Lease under its own identity.
    let (leader, standby) = wait_for("one leader and one standby", TIMEOUT, async || {
        roles(&[t.replica(0), t.replica(1)]).await
    })
    .await;
    assert_lease_held_by(&t, &leader).await;
    only_the_leader_writes(&leader, &standby).await;

    // SIGTERM: the leader releases the lease, the standby takes it at its
    // next retry.
    let sigterm = take_over(&leader, &standby, Stop::Term).await;
    eprintln!(
        "e2e: SIGTERM hand-over: new leader after {:.2}s, its first write after {:.2}s",
        sigterm.leading.as_secs_f64(),
        sigterm.first_write.as_secs_f64()
    );
    let status = leader
        .current()
        .proc
        .wait_exit(Duration::from_secs(30))
        .await;
    assert!(
        status.is_some_and(|s| s.success()),
        "SIGTERM must lead to a clean exit, got {status:?}"
    );
    // The standby watches the Lease and takes it as soon as it is
    // released, and the old leader releases it without waiting for work
    // that was not sent yet: well under a retry period.
    assert!(
        sigterm.first_write <= timing.retry + SLACK,
        "SIGTERM hand-over took {sigterm:?}, more than retry period {:?} + {SLACK:?}",
        timing.retry
    );
    assert_lease_held_by(&t, &standby).await;

    // Two replicas again: a fresh standby, caches loaded.
    let third = t
        .isolated_env()
        .start_controller()
        .await
        .expect("start a third replica");
    wait_for(
        "the new replica to be a ready standby",
        TIMEOUT,
        async || {
            let c = third.current();
            let (ready, _) = crate::rawhttp::get(c.health, "/readyz").await?;
            ensure!(ready == 200, "/readyz {ready}");
            ensure!(master_status(&c).await? == 0.0, "leads already");
            Ok(())
        },
    )
    .await;
    only_the_leader_writes(&standby, &third).await;

    // SIGKILL: nothing is released, the standby waits for the lease to expire.
    let sigkill = take_over(&standby, &third, Stop::Kill).await;
    eprintln!(
        "e2e: SIGKILL hand-over: new leader after {:.2}s, its first write after {:.2}s",
        sigkill.leading.as_secs_f64(),
        sigkill.first_write.as_secs_f64()
    );
    assert!(
        sigkill.leading <= timing.lease + timing.retry + SLACK,
        "SIGKILL hand-over took {sigkill:?}, more than lease duration {:?} + retry period {:?} + {SLACK:?}",
        timing.lease,
        timing.retry
    );
    assert_lease_held_by(&t, &third).await;

    // The new leader works under load for a moment, then the load stops.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let attempts = load.stop().await;

    let settled = wait_for(
        "every pod's entries recorded with claims it controls",
        QUIET_TIMEOUT,
        async || outcome(&t).await,
    )
    .await;
    holds_for(
        "no further claims once every entry is recorded",
        Duration::from_secs(3),
        async || {
            let now = outcome(&t).await?;
            ensure!(
                now.claims == settled.claims,
                "{} claims, were {}",
                now.claims,
                settled.claims
            );
            Ok(())
        },
    )
    .await;
    let outcome = settled;
    assert!(
        outcome.duplicates.is_empty(),
        "claims created twice for the same pod entry: {:?}",
        outcome.duplicates
    );
    assert_eq!(
        outcome.claims,
        outcome.pods * ENTRIES.len(),
        "claims that belong to no pod entry: {:?}",
        outcome.stray
    );
    eprintln!(
        "e2e: {} pods created in {attempts} attempts, {} claims",
        outcome.pods, outcome.claims
    );
    println!(
        "HANDOVER: qps={} sigterm_leader={:.2}s sigterm_first_write={:.2}s sigkill_leader={:.2}s \
         sigkill_first_write={:.2}s pods={} duplicates={}",
        HANDOVER_QPS,
        sigterm.leading.as_secs_f64(),
        sigterm.first_write.as_secs_f64(),
        sigkill.leading.as_secs_f64(),
        sigkill.first_write.as_secs_f64(),
        outcome.pods,
        outcome.duplicates.len()
    );
    t.finish();
}

/// The election flags the harness gave the controllers, read back from the
/// controller's own "starting leader election" log line, so the bounds
/// follow the flags.
#[derive(Debug, Clone, Copy)]
struct ElectionTiming {
    lease: Duration,
    retry: Duration,
}

impl ElectionTiming {
    async fn from_log(c: &Controller) -> Self {
        let line = log_line(c, "starting leader election").await;
        let lease = log_field(&line, "lease_duration").and_then(parse_debug_duration);
        let retry = log_field(&line, "retry_period").and_then(parse_debug_duration);
        match (lease, retry) {
            (Some(lease), Some(retry)) => Self { lease, retry },
            _ => panic!("cannot read lease_duration and retry_period from: {line}"),
        }
    }
}

/// The last line of the process's log that contains `needle`, once it is
/// there (/healthz answers a moment before the election starts).
async fn log_line(c: &Controller, needle: &str) -> String {
    wait_for(
        &format!("'{needle}' in {}", c.proc.log.display()),
        Duration::from_secs(10),
        async || {
            let log = std::fs::read_to_string(&c.proc.log)?;
            log.lines()
                .rev()
                .find(|l| l.contains(needle))
                .map(str::to_string)
                .context("not logged yet")
        },
    )
    .await
}

/// The value of `key=value` in a text log line.
fn log_field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let start = line.find(&format!(" {key}="))? + key.len() + 2;
    line[start..]
        .split_whitespace()
        .next()
        .map(|v| v.trim_matches('"'))
}

/// A `Duration` as `{:?}` prints it: `1s`, `1.5s`, `500ms`.
fn parse_debug_duration(s: &str) -> Option<Duration> {
    if let Some(ms) = s.strip_suffix("ms") {
        return ms
            .parse::<f64>()
            .ok()
            .map(|v| Duration::from_secs_f64(v / 1e3));
    }
    s.strip_suffix('s')?
        .parse::<f64>()
        .ok()
        .map(Duration::from_secs_f64)
}

/// The holder identity this process campaigns with (`hostname_uuid`), from
/// its start-up log line.
pub async fn identity(c: &Controller) -> String {
    let line = log_line(c, "starting dra-claim-controller").await;
    log_field(&line, "identity")
        .unwrap_or_else(|| panic!("no identity in: {line}"))
        .to_string()
}

pub async fn master_status(c: &Controller) -> anyhow::Result<f64> {
    let text = c.metrics_text().await?;
    metric_value(
        &text,
        "leader_election_master_status",
        &[&format!("name=\"{LEASE_NAME}\"")],
    )
    .context("no leader_election_master_status on /metrics")
}

/// `(leader, standby)` when exactly one of `replicas` reports leading.
pub async fn roles(replicas: &[Arc<Replica>]) -> anyhow::Result<(Arc<Replica>, Arc<Replica>)> {
    let mut leaders = Vec::new();
    let mut standbys = Vec::new();
    for r in replicas {
        if master_status(&r.current()).await? == 1.0 {
            leaders.push(r.clone());
        } else {
            standbys.push(r.clone());
        }
    }
    ensure!(
        leaders.len() == 1 && standbys.len() == 1,
        "{} leading, {} standing by",
        leaders.len(),
        standbys.len()
    );
    Ok((leaders.remove(0), standbys.remove(0)))
}

pub async fn assert_lease_held_by(t: &TestCtx, leader: &Replica) {
    let want = identity(&leader.current()).await;
    let leases: Api<Lease> = Api::namespaced(t.client.clone(), SYSTEM_NAMESPACE);
    wait_for(
        &format!("the Lease to name the leading replica ({want})"),
        TIMEOUT,
        async || {
            let holder = leases
                .get(LEASE_NAME)
                .await?
                .spec
                .and_then(|s| s.holder_identity)
                .unwrap_or_default();
            ensure!(holder == want, "held by {holder:?}");
            Ok(())
        },
    )
    .await;
}

/// API writes of one process: `rest_client_requests_total` has no path
/// label, so lease writes count too.
fn writes(metrics: &str) -> f64 {
    requests_by_method(metrics, &WRITE_METHODS)
}

/// Claim and pod writes (POST, PATCH, DELETE) of one process; lease
/// renewals are PUTs and do not count.
fn claim_writes(metrics: &str) -> f64 {
    requests_by_method(metrics, &["POST", "PATCH", "DELETE"])
}

/// Sum of `rest_client_requests_total` over the given methods.
fn requests_by_method(metrics: &str, methods: &[&str]) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("rest_client_requests_total{"))
        .filter(|l| {
            methods
                .iter()
                .any(|m| l.contains(&format!("method=\"{m}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// While pods keep arriving, the leader creates claims and the standby
/// sends no write at all: it only reads the Lease while it is held (any
/// writes from the race for the lease at start-up are before the window).
async fn only_the_leader_writes(leader: &Replica, standby: &Replica) {
    let window = Duration::from_secs(3);
    let read = async |r: &Replica| {
        let text = r
            .current()
            .metrics_text()
            .await
            .expect("GET /metrics of a replica");
        (
            writes(&text),
            metric_sum(&text, "resourceclaim_controller_creates_total"),
        )
    };
    let (_, leader_creates) = read(leader).await;
    let (standby_writes, standby_creates) = read(standby).await;
    // The leader works (its creates rise, however soon) ...
    crate::k8s::wait_for(
        "the leader to create claims under load",
        window * 10,
        async || {
            let (_, now) = read(leader).await;
            anyhow::ensure!(
                now > leader_creates,
                "{now} creates, {leader_creates} before"
            );
            Ok(())
        },
    )
    .await;
    // ... while for a whole window the standby writes nothing.
    crate::k8s::holds_for("the standby to send no write", window, async || {
        let (writes_now, creates_now) = read(standby).await;
        anyhow::ensure!(
            writes_now == standby_writes && creates_now == 0.0,
            "the standby sent {} writes and created {creates_now} claims while the other replica led",
            writes_now - standby_writes
        );
        Ok(())
    })
    .await;
    let (standby_writes_after, standby_creates_after) = read(standby).await;
    assert_eq!(
        standby_creates_after, 0.0,
        "the standby created claims (was {standby_creates})"
    );
    assert_eq!(
        standby_writes_after, standby_writes,
        "the standby sent API writes (POST/PATCH/PUT/DELETE) in {window:?} while the other replica led"
    );
}

#[derive(Debug, Clone, Copy)]
enum Stop {
    Term,
    Kill,
}

/// Stops `old` and returns the time until `new` reports leading (polled
/// every 100 ms). When `new` leads, `old` must no longer say it does.
async fn take_over(old: &Replica, new: &Replica, how: Stop) -> Handover {
    let old_process = old.current();
    let new_process = new.current();
    let writes_before = claim_writes(&new_process.metrics_text().await.unwrap_or_default());
    let started = Instant::now();
    match how {
        Stop::Term => old.terminate(),
        Stop::Kill => old.kill(),
    }
    let mut leading = None;
    loop {
        let text = new_process.metrics_text().await.unwrap_or_default();
        if leading.is_none() && matches!(master_status(&new_process).await, Ok(1.0)) {
            leading = Some(started.elapsed());
            if let Ok(still) = master_status(&old_process).await {
                assert_eq!(
                    still, 0.0,
                    "{how:?}: the old leader still reports leading after the hand-over"
                );
            }
        }
        if let Some(leading) = leading
            && claim_writes(&text) > writes_before
        {
            return Handover {
                leading,
                first_write: started.elapsed(),
            };
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{how:?}: no replica took over and wrote within 60s; new replica's log:\n{}",
            new.current().proc.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// How long a hand-over took, from the signal to the old leader.
#[derive(Debug, Clone, Copy)]
struct Handover {
    /// Until the new replica reported leading.
    leading: Duration,
    /// Until the new replica's first claim or pod write.
    first_write: Duration,
}

/// Creates a pod with both template entries every [`POD_INTERVAL`] until stopped.
struct PodLoad {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<anyhow::Result<usize>>,
}

impl PodLoad {
    fn start(pods: Api<Pod>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(POD_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut attempts = 0usize;
            let mut failures = 0usize;
            while !flag.load(Ordering::SeqCst) {
                tick.tick().await;
                attempts += 1;
                let pod = load_pod(&format!("load-{attempts:04}"))?;
                if let Err(e) = pods.create(&PostParams::default(), &pod).await {
                    failures += 1;
                    eprintln!("e2e: creating load pod {attempts} failed: {e}");
                    if failures > 10 {
                        bail!("{failures} pod creations failed, last: {e}");
                    }
                }
            }
            Ok(attempts)
        });
        Self { stop, task }
    }

    /// Stops the load; returns how many creations were attempted.
    async fn stop(self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        self.task
            .await
            .expect("pod load task panicked")
            .expect("pod load")
    }
}

fn load_pod(name: &str) -> anyhow::Result<Pod> {
    let entries: Vec<(&str, Source<'_>)> = ENTRIES
        .iter()
        .map(|(entry, template)| (*entry, Source::Template(template)))
        .collect();
    Ok(serde_json::from_value(pod_manifest(name, &entries, None))?)
}

#[derive(Debug)]
struct Outcome {
    pods: usize,
    claims: usize,
    /// `pod/entry: claim, claim…` for every entry with more than one claim.
    duplicates: Vec<String>,
    /// Claims not controlled by any pod of the namespace.
    stray: Vec<String>,
}

/// `Err` until every entry of every pod is recorded with a claim that
/// exists, is controlled by the pod and carries the entry's annotation.
async fn outcome(t: &TestCtx) -> anyhow::Result<Outcome> {
    let pods = t.pods().list(&ListParams::default()).await?.items;
    let claims = t.all_claims().await?;
    // (pod uid, entry) → claim names.
    let mut by_entry: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut stray = Vec::new();
    for c in &claims {
        let name = c.metadata.name.clone().unwrap_or_default();
        let owner = c
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| o.uid.clone());
        let entry = c
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(POD_CLAIM_NAME_ANNOTATION))
            .cloned();
        match (owner, entry) {
            (Some(uid), Some(entry)) => by_entry.entry((uid, entry)).or_default().push(name),
            _ => stray.push(name),
        }
    }
    let mut not_yet = 0;
    let mut example = String::new();
    let mut duplicates = Vec::new();
    for pod in &pods {
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let statuses = recorded(pod);
        for (entry, _) in ENTRIES {
            let owned = by_entry
                .remove(&(uid(pod), entry.to_string()))
                .unwrap_or_default();
            if owned.len() > 1 {
                duplicates.push(format!("{pod_name}/{entry}: {}", owned.join(", ")));
            }
            let problem = match statuses.get(entry) {
                None | Some(None) => Some("not recorded".to_string()),
                Some(Some(name)) if !owned.contains(name) => Some(format!(
                    "records {name}, which is not a claim of this pod for this entry (its claims: {owned:?})"
                )),
                Some(Some(_)) => None,
            };
            if let Some(p) = problem {
                not_yet += 1;
                if example.is_empty() {
                    example = format!("{pod_name}/{entry}: {p}");
                }
            }
        }
    }
    // Claims of pods that no longer exist, or of entries pods do not have.
    stray.extend(by_entry.into_values().flatten());
    ensure!(
        not_yet == 0,
        "{not_yet} of {} entries not settled, e.g. {example}",
        pods.len() * ENTRIES.len()
    );
    Ok(Outcome {
        pods: pods.len(),
        claims: claims.len(),
        duplicates,
        stray,
    })
}
