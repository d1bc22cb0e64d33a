//! Where solving runs: never on an async worker.

use super::*;

/// Solving never holds an async worker: on a runtime of one worker (the
/// chart's one CPU), a task keeps running while a claim is solved.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn solving_leaves_the_async_worker_to_other_tasks() {
    use std::sync::atomic::{AtomicU32, Ordering};
    let ticks = Arc::new(AtomicU32::new(0));
    let ticker = tokio::spawn({
        let ticks = ticks.clone();
        async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                ticks.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    // Let the ticker start on the one worker.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let before = ticks.load(Ordering::Relaxed);
    // Solved from a task, as the controllers do: on the runtime's worker.
    tokio::spawn(async {
        super::super::on_solver_stack(|| std::thread::sleep(std::time::Duration::from_millis(300)))
            .unwrap()
    })
    .await
    .unwrap();
    let during = ticks.load(Ordering::Relaxed) - before;
    ticker.abort();
    assert!(
        during >= 10,
        "the other task ran {during} times in 300 ms of solving (every 10 ms when free)"
    );
}
