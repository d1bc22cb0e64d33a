//! Helpers shared by the controllers' unit tests.

use serde_json::Value;

/// Deep-merges `b` into `a` (objects merge key by key, anything else replaces),
/// so a test row states only what differs from a base object.
pub(crate) fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}
