//! redhat-cop's proactive-node-scaling-operator (the seed operator): its
//! `NodeScalingWatermark` (`redhatcop.redhat.io/v1alpha1`) served unchanged,
//! with the seed's own semantics, so that its manifests work here as they
//! are (`--headroom-seed-watermarks`). The seed's rules, pure and
//! table-tested ([`seed`]), and the sync that applies them
//! (`seed_sync.rs`).

pub mod seed;
mod seed_sync;
