//! The work queue's tests: semantics, backoff arithmetic, metrics. Most run
//! on tokio's paused clock: delays and "nothing arrives within" waits pass
//! in virtual time, so the suite neither sleeps nor depends on the machine's
//! speed.

use super::default_rate_limiters::{RateLimiter, TokenBucket};
use super::shared::lock;
use super::*;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus::Registry;
use prometheus::proto::MetricFamily;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::time::timeout;

const SHORT: Duration = Duration::from_millis(50);
const LONG: Duration = Duration::from_secs(5);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A queue without token bucket, so delays are exactly the backoff.
fn queue(name: &str, registry: Option<&Registry>) -> WorkQueue<String> {
    let limiter = RateLimiter::new(ms(5), Duration::from_secs(1000), None);
    WorkQueue::try_with_rate_limiter(name, registry, limiter).unwrap()
}

/// `get`, but failing the test instead of hanging.
async fn get_soon(q: &WorkQueue<String>) -> Option<String> {
    timeout(LONG, q.get()).await.expect("get timed out")
}

/// Whether `get` yields nothing within a short while.
async fn nothing_soon(q: &WorkQueue<String>) -> bool {
    timeout(SHORT, q.get()).await.is_err()
}

fn family<'a>(families: &'a [MetricFamily], name: &str) -> &'a MetricFamily {
    families
        .iter()
        .find(|f| f.name() == name)
        .unwrap_or_else(|| panic!("metric {name} missing"))
}

/// The sample of `metric` labelled `name=queue`.
fn sample<'a>(
    families: &'a [MetricFamily],
    metric: &str,
    queue: &str,
) -> &'a prometheus::proto::Metric {
    family(families, metric)
        .get_metric()
        .iter()
        .find(|m| {
            let labels = m.get_label();
            labels.len() == 1 && labels[0].name() == "name" && labels[0].value() == queue
        })
        .unwrap_or_else(|| panic!("{metric}{{name={queue:?}}} missing"))
}

#[tokio::test(start_paused = true)]
async fn adding_a_key_repeatedly_queues_it_once() {
    let registry = Registry::new();
    let q = queue("dedup", Some(&registry));
    for _ in 0..3 {
        q.add("a".to_owned());
    }
    assert_eq!(q.len(), 1);
    let families = registry.gather();
    assert_eq!(
        sample(&families, "workqueue_depth", "dedup")
            .get_gauge()
            .get_value(),
        1.0
    );
    assert_eq!(get_soon(&q).await.as_deref(), Some("a"));
    assert!(nothing_soon(&q).await);
}

#[tokio::test(start_paused = true)]
async fn a_key_in_processing_is_not_handed_to_a_second_worker() {
    let q = queue("exclusive", None);
    q.add("a".to_owned());
    assert_eq!(get_soon(&q).await.as_deref(), Some("a"));
    q.add("a".to_owned());
    // Dirty but not ready while the first worker still has it.
    assert_eq!(q.len(), 0);
    assert!(nothing_soon(&q).await);
}

#[tokio::test(start_paused = true)]
async fn adds_during_processing_requeue_once_after_done() {
    let q = queue("requeue", None);
    q.add("a".to_owned());
    let key = get_soon(&q).await.unwrap();
    q.add("a".to_owned());
    q.add("a".to_owned());
    q.done(&key);
    assert_eq!(q.len(), 1);
    let again = get_soon(&q).await.unwrap();
    assert_eq!(again, "a");
    q.done(&again);
    assert!(nothing_soon(&q).await);
    // Done without a new add: nothing comes back.
    assert_eq!(q.len(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_requeue_on_done_wakes_a_waiting_worker() {
    let q = queue("requeue_wake", None);
    q.add("a".to_owned());
    let key = get_soon(&q).await.unwrap();
    let other_worker = tokio::spawn({
        let q = q.clone();
        async move { q.get().await }
    });
    q.add("a".to_owned());
    tokio::time::sleep(SHORT).await;
    assert!(!other_worker.is_finished());
    q.done(&key);
    let got = timeout(LONG, other_worker).await.unwrap().unwrap();
    assert_eq!(got.as_deref(), Some("a"));
}

#[tokio::test(start_paused = true)]
async fn done_for_an_unknown_key_is_ignored() {
    let q = queue("unknown", None);
    q.done(&"ghost".to_owned());
    q.add("a".to_owned());
    assert_eq!(get_soon(&q).await.as_deref(), Some("a"));
}

#[tokio::test(start_paused = true)]
async fn a_waiting_getter_is_woken_by_add() {
    let q = queue("wake", None);
    let getter = tokio::spawn({
        let q = q.clone();
        async move { q.get().await }
    });
    tokio::time::sleep(SHORT).await;
    q.add("a".to_owned());
    let got = timeout(LONG, getter).await.unwrap().unwrap();
    assert_eq!(got.as_deref(), Some("a"));
}

// The crate's tokio has no `test-util`, so these use real, short delays
// with generous margins instead of a paused clock.
#[tokio::test(start_paused = true)]
async fn add_after_delivers_after_the_delay() {
    let q = queue("after", None);
    q.add_after("now".to_owned(), Duration::ZERO);
    assert_eq!(q.len(), 1);
    assert_eq!(get_soon(&q).await.as_deref(), Some("now"));

    let start = tokio::time::Instant::now();
    q.add_after("later".to_owned(), ms(200));
    tokio::time::sleep(ms(50)).await;
    assert_eq!(q.len(), 0);
    assert_eq!(get_soon(&q).await.as_deref(), Some("later"));
    assert!(start.elapsed() >= ms(200), "{:?}", start.elapsed());
}

#[tokio::test(start_paused = true)]
async fn add_after_keeps_the_earliest_time_per_key() {
    let q = queue("earliest", None);
    let waiting = |q: &WorkQueue<String>| lock(&q.inner.state).waiting.by_key.len();

    q.add_after("a".to_owned(), Duration::from_secs(3600));
    q.add_after("a".to_owned(), ms(20));
    assert_eq!(waiting(&q), 1);
    assert_eq!(get_soon(&q).await.as_deref(), Some("a"));
    // The hour-long entry was replaced, not kept alongside.
    assert_eq!(waiting(&q), 0);

    q.add_after("b".to_owned(), ms(20));
    q.add_after("b".to_owned(), Duration::from_secs(3600));
    assert_eq!(get_soon(&q).await.as_deref(), Some("b"));
    assert_eq!(waiting(&q), 0);
}

#[tokio::test(start_paused = true)]
async fn add_after_orders_keys_by_ready_time() {
    let q = queue("order", None);
    q.add_after("second".to_owned(), ms(120));
    q.add_after("first".to_owned(), ms(40));
    assert_eq!(get_soon(&q).await.as_deref(), Some("first"));
    assert_eq!(get_soon(&q).await.as_deref(), Some("second"));
}

#[test]
fn delays_still_fire_after_the_runtime_that_started_the_timer_is_gone() {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let q = queue("two_runtimes", None);
    runtime().block_on(async { q.add_after("a".to_owned(), Duration::from_secs(3600)) });
    runtime().block_on(async {
        q.add_after("b".to_owned(), ms(20));
        assert_eq!(get_soon(&q).await.as_deref(), Some("b"));
    });
}

#[tokio::test(start_paused = true)]
async fn add_rate_limited_backs_off_and_forget_resets() {
    let registry = Registry::new();
    let q = queue("retry", Some(&registry));
    let key = "a".to_owned();
    for expected in 1..=3 {
        q.add_rate_limited(key.clone());
        assert_eq!(q.num_requeues(&key), expected);
        let got = get_soon(&q).await.unwrap();
        q.done(&got);
    }
    // 5 ms, 10 ms, 20 ms went by; the next one would be 40 ms.
    assert_eq!(lock(&q.inner.limiter).when(&key), ms(40));
    q.forget(&key);
    assert_eq!(q.num_requeues(&key), 0);
    assert_eq!(lock(&q.inner.limiter).when(&key), ms(5));

    let families = registry.gather();
    let retries = sample(&families, "workqueue_retries_total", "retry");
    assert_eq!(retries.get_counter().get_value(), 3.0);
}

#[test]
fn backoff_doubles_per_failure_from_5ms() {
    let mut limiter = RateLimiter::new(ms(5), Duration::from_secs(1000), None);
    let now = Instant::now();
    let delays: Vec<_> = (0..5).map(|_| limiter.when_at(&"a", now)).collect();
    assert_eq!(delays, [ms(5), ms(10), ms(20), ms(40), ms(80)]);
    assert_eq!(limiter.num_requeues(&"a"), 5);
    // Keys back off independently.
    assert_eq!(limiter.when_at(&"b", now), ms(5));
    limiter.forget(&"a");
    assert_eq!(limiter.num_requeues(&"a"), 0);
    assert_eq!(limiter.when_at(&"a", now), ms(5));
}

#[test]
fn backoff_is_capped_and_never_overflows() {
    let cap = Duration::from_secs(1000);
    let mut limiter = RateLimiter::new(ms(5), cap, None);
    let now = Instant::now();
    let delays: Vec<_> = (0..300).map(|_| limiter.when_at(&"a", now)).collect();
    assert!(delays.windows(2).all(|w| w[0] <= w[1]));
    assert!(delays.iter().all(|d| *d <= cap));
    // 5 ms * 2^18 = 1310.72 s is the first one over the cap.
    assert!(delays[17] < cap);
    assert_eq!(delays[18], cap);
    assert_eq!(delays[299], cap);

    limiter.failures.insert("a", u32::MAX);
    assert_eq!(limiter.when_at(&"a", now), cap);
    assert_eq!(limiter.num_requeues(&"a"), u32::MAX);

    // Base times factor overflowing `Duration` also ends at the cap.
    let mut huge = RateLimiter::new(Duration::MAX, cap, None);
    assert_eq!(huge.when_at(&"a", now), cap);
    assert_eq!(huge.when_at(&"a", now), cap);
}

#[test]
fn token_bucket_reserves_tokens_it_does_not_have_yet() {
    let mut bucket = TokenBucket::new(10, 100);
    let t0 = Instant::now();
    for call in 1..=100 {
        assert_eq!(bucket.reserve_at(t0), Duration::ZERO, "call {call}");
    }
    assert_eq!(bucket.reserve_at(t0), ms(100));
    assert_eq!(bucket.reserve_at(t0), ms(200));
    assert_eq!(bucket.reserve_at(t0), ms(300));
}

#[test]
fn token_bucket_refills_at_its_rate_up_to_the_burst() {
    let mut bucket = TokenBucket::new(10, 100);
    let t0 = Instant::now();
    for _ in 0..100 {
        bucket.reserve_at(t0);
    }
    // One second earns ten tokens.
    let t1 = t0 + Duration::from_secs(1);
    for call in 1..=10 {
        assert_eq!(bucket.reserve_at(t1), Duration::ZERO, "call {call}");
    }
    assert_eq!(bucket.reserve_at(t1), ms(100));

    // A long pause refills no more than the burst.
    let t2 = t1 + Duration::from_secs(3600);
    for _ in 0..100 {
        assert_eq!(bucket.reserve_at(t2), Duration::ZERO);
    }
    assert_eq!(bucket.reserve_at(t2), ms(100));
}

#[test]
fn default_controller_limiter_is_the_max_of_backoff_and_bucket() {
    let mut limiter = RateLimiter::default_controller();
    let now = Instant::now();
    // 100 different keys: the bucket has tokens, the backoff decides.
    for key in 0..100 {
        assert_eq!(limiter.when_at(&key, now), ms(5));
    }
    // The 101st call waits for a token.
    assert_eq!(limiter.when_at(&100, now), ms(100));
    assert_eq!(limiter.when_at(&101, now), ms(200));
    // Later, a key with many failures is dominated by its backoff.
    let later = now + Duration::from_secs(3600);
    for _ in 0..9 {
        limiter.when_at(&7, later);
    }
    assert_eq!(limiter.when_at(&7, later), ms(5 * 1024));
}

#[tokio::test(start_paused = true)]
async fn shut_down_stops_handing_out_work_and_ignores_adds() {
    let q = queue("shutdown", None);
    q.add("a".to_owned());
    q.add("b".to_owned());
    let in_flight = get_soon(&q).await.unwrap();

    q.shut_down();
    assert!(q.is_shutting_down());
    // "b" is still queued, but no new work is taken.
    assert_eq!(get_soon(&q).await, None);
    assert_eq!(q.len(), 1);
    q.add("c".to_owned());
    q.add_after("d".to_owned(), ms(1));
    q.add_rate_limited("e".to_owned());
    assert_eq!(q.len(), 1);
    assert_eq!(q.num_requeues(&"e".to_owned()), 0);

    // wait_idle resolves only once the in-flight key is done.
    assert!(timeout(SHORT, q.wait_idle()).await.is_err());
    let worker = q.clone();
    tokio::spawn(async move {
        tokio::time::sleep(SHORT).await;
        worker.done(&in_flight);
    });
    timeout(LONG, q.wait_idle()).await.expect("never idle");
    assert_eq!(get_soon(&q).await, None);
}

#[tokio::test(start_paused = true)]
async fn shut_down_wakes_waiting_getters() {
    let q = queue("wake_on_shutdown", None);
    let getters: Vec<_> = (0..3)
        .map(|_| {
            let q = q.clone();
            tokio::spawn(async move { q.get().await })
        })
        .collect();
    tokio::time::sleep(SHORT).await;
    q.shut_down();
    for getter in getters {
        assert_eq!(timeout(LONG, getter).await.unwrap().unwrap(), None);
    }
}

#[tokio::test(start_paused = true)]
async fn wait_idle_is_immediate_without_work_in_flight() {
    let q = queue("idle", None);
    q.add("queued-but-not-taken".to_owned());
    timeout(SHORT, q.wait_idle()).await.expect("not idle");
}

#[tokio::test(start_paused = true)]
async fn dropping_the_queue_frees_it_despite_pending_delays() {
    let q = queue("drop", None);
    q.add_after("a".to_owned(), Duration::from_secs(3600));
    let inner = Arc::downgrade(&q.inner);
    tokio::task::yield_now().await;
    drop(q);
    assert!(inner.upgrade().is_none());
}

// Real time: the in-progress gauges read the wall clock.
#[tokio::test]
async fn metrics_follow_client_go() {
    let registry = Registry::new();
    let q = queue("resource_claim", Some(&registry));
    for key in ["a", "b", "a", "c"] {
        q.add(key.to_owned());
    }
    let a = get_soon(&q).await.unwrap();
    let b = get_soon(&q).await.unwrap();
    tokio::time::sleep(SHORT).await;

    let families = registry.gather();
    let value = |metric: &str| sample(&families, metric, "resource_claim");
    assert_eq!(value("workqueue_depth").get_gauge().get_value(), 1.0);
    assert_eq!(value("workqueue_adds_total").get_counter().get_value(), 3.0);
    let queued = value("workqueue_queue_duration_seconds").get_histogram();
    assert_eq!(queued.get_sample_count(), 2);
    let unfinished = value("workqueue_unfinished_work_seconds")
        .get_gauge()
        .get_value();
    let longest = value("workqueue_longest_running_processor_seconds")
        .get_gauge()
        .get_value();
    // Two keys in flight for at least SHORT each.
    assert!(longest >= SHORT.as_secs_f64(), "{longest}");
    assert!(unfinished >= 2.0 * SHORT.as_secs_f64(), "{unfinished}");
    assert!(unfinished >= longest);

    q.done(&a);
    q.done(&b);
    let families = registry.gather();
    let value = |metric: &str| sample(&families, metric, "resource_claim");
    let worked = value("workqueue_work_duration_seconds").get_histogram();
    assert_eq!(worked.get_sample_count(), 2);
    assert!(worked.get_sample_sum() >= 2.0 * SHORT.as_secs_f64());
    assert_eq!(
        value("workqueue_unfinished_work_seconds")
            .get_gauge()
            .get_value(),
        0.0
    );
    assert_eq!(
        value("workqueue_longest_running_processor_seconds")
            .get_gauge()
            .get_value(),
        0.0
    );
    assert_eq!(
        value("workqueue_retries_total").get_counter().get_value(),
        0.0
    );

    // Bucket bounds exactly as kube-controller-manager's workqueues
    // have them, `ExponentialBuckets(10e-9, 10, 10)`: 1e-8 times 10,
    // nine times, computed by repeated multiplication.
    let expected = [
        1e-8,
        1e-7,
        1e-6,
        9.999999999999999e-6,
        9.999999999999999e-5,
        1e-3,
        1e-2,
        1e-1,
        1.0,
        10.0,
    ];
    for metric in [
        "workqueue_queue_duration_seconds",
        "workqueue_work_duration_seconds",
    ] {
        let bounds: Vec<f64> = value(metric)
            .get_histogram()
            .get_bucket()
            .iter()
            .map(|b| b.upper_bound())
            .collect();
        assert_eq!(bounds, expected, "{metric}");
    }

    assert_eq!(
        family(&families, "workqueue_depth").help(),
        "[BETA] Current depth of workqueue"
    );
    assert_eq!(
        family(&families, "workqueue_unfinished_work_seconds").help(),
        "[BETA] How many seconds of work has done that is in progress and hasn't been observed \
         by work_duration. Large values indicate stuck threads. One can deduce the number \
         of stuck threads by observing the rate at which this increases."
    );
    assert_eq!(
        family(&families, "workqueue_longest_running_processor_seconds").help(),
        "[BETA] How many seconds has the longest running processor for workqueue been running."
    );
    let names: HashSet<_> = families.iter().map(|f| f.name()).collect();
    let expected_names: HashSet<_> = [
        "workqueue_depth",
        "workqueue_adds_total",
        "workqueue_queue_duration_seconds",
        "workqueue_work_duration_seconds",
        "workqueue_unfinished_work_seconds",
        "workqueue_longest_running_processor_seconds",
        "workqueue_retries_total",
    ]
    .into();
    assert_eq!(names, expected_names);
}

#[tokio::test(start_paused = true)]
async fn queues_share_a_registry_by_name() {
    let registry = Registry::new();
    let claims = queue("resource_claim", Some(&registry));
    let pods = queue("pod", Some(&registry));
    claims.add("a".to_owned());
    claims.add("b".to_owned());
    pods.add("x".to_owned());

    let families = registry.gather();
    let depth = |queue: &str| {
        sample(&families, "workqueue_depth", queue)
            .get_gauge()
            .get_value()
    };
    assert_eq!(depth("resource_claim"), 2.0);
    assert_eq!(depth("pod"), 1.0);

    // The same name twice is refused, not merged or panicking.
    let duplicate = WorkQueue::<String>::try_new("pod", Some(&registry));
    assert!(matches!(duplicate, Err(prometheus::Error::AlreadyReg)));
    // The infallible constructor still yields a working queue.
    let unregistered = WorkQueue::<String>::new("pod", Some(&registry));
    unregistered.add("y".to_owned());
    assert_eq!(get_soon(&unregistered).await.as_deref(), Some("y"));
    let families = registry.gather();
    assert_eq!(
        sample(&families, "workqueue_depth", "pod")
            .get_gauge()
            .get_value(),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_workers_never_share_a_key_and_miss_no_add() {
    const KEYS: usize = 200;
    const WORKERS: usize = 8;
    const ADDERS: usize = 16;
    const ROUNDS: usize = 20;

    let q: WorkQueue<usize> =
        WorkQueue::with_rate_limiter("concurrent", None, RateLimiter::new(ms(1), ms(10), None));
    // Per key: how many adds were issued, and the highest such count a
    // worker saw when it started processing the key. A key is covered
    // once some processing started after its last add.
    let issued: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let covered: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let active = Arc::new(Mutex::new(HashSet::new()));
    let overlap = Arc::new(AtomicBool::new(false));

    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (q, issued, covered) = (q.clone(), issued.clone(), covered.clone());
            let (active, overlap) = (active.clone(), overlap.clone());
            tokio::spawn(async move {
                while let Some(key) = q.get().await {
                    if !lock(&active).insert(key) {
                        overlap.store(true, Ordering::SeqCst);
                    }
                    let seen = issued[key].load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    covered[key].fetch_max(seen, Ordering::SeqCst);
                    lock(&active).remove(&key);
                    q.done(&key);
                }
            })
        })
        .collect();

    let adders: Vec<_> = (0..ADDERS)
        .map(|adder| {
            let (q, issued) = (q.clone(), issued.clone());
            tokio::spawn(async move {
                for round in 0..ROUNDS {
                    for i in 0..KEYS {
                        // Each adder walks the keys in its own order.
                        let key = (i * 7 + adder * 13 + round) % KEYS;
                        issued[key].fetch_add(1, Ordering::SeqCst);
                        q.add(key);
                        if i % 16 == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                }
            })
        })
        .collect();
    for adder in adders {
        adder.await.unwrap();
    }

    let all_covered =
        || (0..KEYS).all(|k| covered[k].load(Ordering::SeqCst) == issued[k].load(Ordering::SeqCst));
    timeout(Duration::from_secs(20), async {
        while !all_covered() {
            tokio::time::sleep(ms(10)).await;
        }
    })
    .await
    .expect("some key was not processed after its last add");

    q.shut_down();
    for worker in workers {
        timeout(LONG, worker).await.unwrap().unwrap();
    }
    assert!(!overlap.load(Ordering::SeqCst), "two workers had one key");
    assert_eq!(
        issued.iter().map(|n| n.load(Ordering::SeqCst)).sum::<u64>(),
        (ADDERS * ROUNDS * KEYS) as u64
    );
}
