//! The controllers, one room each, none importing another. Each door is a
//! `build(&Shared, Settings)`: it subscribes to the shared watches it
//! observes and returns what the runtime runs.

pub mod allocator;
pub mod devicetaint;
pub mod headroom;
pub mod poolstatus;
pub mod resourceclaim;
#[cfg(test)]
mod test_support;
