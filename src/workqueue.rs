//! client-go's work queue (delaying, rate limited, with its metrics), from
//! the runtime crate: see [`dra_runtime::workqueue`].

pub use dra_runtime::workqueue::*;
