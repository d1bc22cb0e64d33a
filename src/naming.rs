//! Claim-name resolution, generateName truncation and ownership, from the
//! model crate: see [`dra_model::naming`].

pub use dra_model::naming::*;
