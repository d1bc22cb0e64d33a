pub mod allocator;
pub mod resourceclaim;
