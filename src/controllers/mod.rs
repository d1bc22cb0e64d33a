pub mod resourceclaim;
