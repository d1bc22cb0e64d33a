//! The cluster-autoscaler's `CapacityBuffer` (`autoscaling.x-k8s.io`) with
//! our provisioning strategy, `dra-claim-controller.io/placeholder-pods`
//! (`--headroom-capacity-buffers`): the count, the placeholders'
//! Deployment and the status, as the autoscaler's buffer controller has
//! them ([`buffer`], pure and table-tested), where a buffer's pod shape
//! comes from ([`buffer_sources`]) and the watches that follow it
//! (`source_watches.rs`), and the sync (`buffer_sync.rs`).

pub mod buffer;
pub(crate) mod buffer_sources;
mod buffer_sync;
mod source_watches;
