//! The controllers, one room each. `app.rs` hands each the caches and event
//! streams it needs; none imports another.

pub mod allocator;
pub mod devicetaint;
pub mod headroom;
pub mod poolstatus;
pub mod resourceclaim;
#[cfg(test)]
mod test_support;
