//! The controller runtime: what any Kubernetes controller of ours needs,
//! knowing no DRA type (a crate of its own, so the compiler keeps it so). Client and request budget ([`client`]) over a
//! transport where no dead connection holds a request ([`transport`]), watches
//! ([`informer`], in protobuf where a view reads it: [`protobuf`]; one watch
//! shared by several rooms: [`shared`]) feeding indexed stores ([`store`]), errors that decide
//! retries ([`error`]) by one policy for every worker ([`retry`]), Warning events ([`events`]), holding work through
//! an API server outage ([`reachability`]), reads start-up cannot do without,
//! retried instead of fatal ([`startup`]), APIs a room can do without, found
//! by one discovery ([`optional_api`]), Lease election ([`leader`]),
//! and the HTTP endpoints with their exposition ([`http`], [`exposition`]),
//! their certificate ([`tls`]) and who may read them ([`delegated`]); client-go's
//! work queue with its metrics ([`workqueue`]), and the one controller shape
//! every controller runs on ([`controller`]: a reconciler of typed keys, its
//! workers, leader gate, retries, resync and shut-down).

pub mod client;
pub mod controller;
pub mod delegated;
pub mod duration;
pub mod error;
pub mod events;
pub mod exposition;
pub mod http;
pub mod informer;
pub mod leader;
pub mod optional_api;
pub mod priority;
pub mod process;
pub mod protobuf;
pub mod reachability;
pub mod resource;
pub mod retry;
pub mod shared;
pub mod startup;
pub mod store;
pub mod tls;
pub mod transport;
pub mod workqueue;
