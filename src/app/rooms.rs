//! One shape for every controller the process runs, so that `app::run`
//! leads, stops and drains them all alike, whichever are on: a room is
//! started once its caches are warm and this replica leads, and stopped by
//! shutting its queue and awaiting its requests in flight.

use std::sync::Arc;

use futures::future::BoxFuture;

use crate::controllers::allocator::Controller as Allocator;
use crate::controllers::devicetaint::Controller as DeviceTaintEviction;
use crate::controllers::headroom::Controller as Headroom;
use crate::controllers::poolstatus::PoolStatusRequests;
use crate::controllers::resourceclaim::Controller as ClaimController;

/// What `app::run` does with each controller.
pub(crate) trait Room: Send + Sync {
    /// Acts as leader from now on: queues what its caches hold.
    fn start_leading(&self);
    /// Its workers, until its queue shuts down.
    fn run_workers(&self) -> BoxFuture<'static, ()>;
    /// No new work: its queue shuts down (work taken finishes).
    fn shut_queue(&self);
    /// Resolves once its requests in flight have an answer.
    fn shut_down(&self) -> BoxFuture<'_, ()>;
}

/// The claim controller with its number of workers
/// (`--concurrent-resourceclaim-syncs`).
pub(crate) struct Claims {
    pub controller: Arc<ClaimController>,
    pub workers: usize,
}

impl Room for Claims {
    fn start_leading(&self) {
        self.controller.start_leading();
    }
    fn run_workers(&self) -> BoxFuture<'static, ()> {
        Box::pin(self.controller.clone().run_workers(self.workers))
    }
    fn shut_queue(&self) {
        self.controller.queue().shut_down();
    }
    fn shut_down(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.controller.shut_down())
    }
}

impl Room for Arc<Allocator> {
    fn start_leading(&self) {
        Allocator::start_leading(self);
    }
    fn run_workers(&self) -> BoxFuture<'static, ()> {
        Box::pin(self.clone().run_worker())
    }
    fn shut_queue(&self) {
        self.queue().shut_down();
    }
    fn shut_down(&self) -> BoxFuture<'_, ()> {
        Box::pin(Allocator::shut_down(self))
    }
}

impl Room for Arc<Headroom> {
    fn start_leading(&self) {
        Headroom::start_leading(self);
    }
    fn run_workers(&self) -> BoxFuture<'static, ()> {
        Box::pin(self.clone().run_worker())
    }
    fn shut_queue(&self) {
        self.queue().shut_down();
    }
    fn shut_down(&self) -> BoxFuture<'_, ()> {
        Box::pin(Headroom::shut_down(self))
    }
}

impl Room for Arc<DeviceTaintEviction> {
    fn start_leading(&self) {
        DeviceTaintEviction::start_leading(self);
    }
    fn run_workers(&self) -> BoxFuture<'static, ()> {
        Box::pin(self.clone().run_workers())
    }
    fn shut_queue(&self) {
        self.queue().shut_down();
    }
    fn shut_down(&self) -> BoxFuture<'_, ()> {
        Box::pin(DeviceTaintEviction::shut_down(self))
    }
}

impl Room for Arc<PoolStatusRequests> {
    fn start_leading(&self) {
        PoolStatusRequests::start_leading(self);
    }
    fn run_workers(&self) -> BoxFuture<'static, ()> {
        Box::pin(self.clone().run_worker())
    }
    fn shut_queue(&self) {
        self.queue().shut_down();
    }
    fn shut_down(&self) -> BoxFuture<'_, ()> {
        Box::pin(PoolStatusRequests::shut_down(self))
    }
}
