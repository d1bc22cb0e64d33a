//! kube-controller-manager's `device-taint-eviction-controller`: pods whose
//! allocated devices carry an untolerated `NoExecute` taint (from their
//! ResourceSlice or a DeviceTaintRule) are deleted once the taint's time is
//! up. This step holds its decision ([`decide`]), a pure function
//! table-tested after upstream's `TestController` cases; the room that
//! watches, paces and writes comes next.

pub mod decide;
#[cfg(test)]
mod decide_tests;
