//! The Kubernetes CEL libraries a selector may call besides CEL's own and
//! the string extension: `quantity()` and `semver()` with their methods,
//! and the list functions `isSorted()`, `sum()`, `min()`, `max()`, in the
//! context `base_context` makes once per thread.

use std::cmp::Ordering;
use std::sync::Arc;

use cel::extractors::This;
use cel::objects::Opaque;
use cel::{Context, ExecutionError, Value};

use super::ENV;
use crate::allocate::quantity::Quantity;
use crate::allocate::semver::Version;

#[derive(Debug, PartialEq, Eq)]
struct QuantityValue(Quantity);
impl Opaque for QuantityValue {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Quantity"
    }
}

#[derive(Debug, PartialEq, Eq)]
pub(super) struct SemverValue(pub(super) Version);
impl Opaque for SemverValue {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Semver"
    }
}

pub(super) fn quantity_value(q: Quantity) -> Value {
    Value::Opaque(Arc::new(QuantityValue(q)))
}

fn as_quantity(v: &Value) -> Option<Quantity> {
    match v {
        Value::Opaque(o) => o.downcast_ref::<QuantityValue>().map(|q| q.0),
        _ => None,
    }
}

fn as_version(v: &Value) -> Option<&Version> {
    match v {
        Value::Opaque(o) => o.downcast_ref::<SemverValue>().map(|s| &s.0),
        _ => None,
    }
}

type Outcome = Result<Value, ExecutionError>;

fn type_error(function: &str, what: &str) -> ExecutionError {
    ExecutionError::function_error(function, format!("expects {what}"))
}

/// Compares two quantities or two versions.
fn ordering(function: &str, a: &Value, b: &Value) -> Result<Ordering, ExecutionError> {
    if let (Some(a), Some(b)) = (as_quantity(a), as_quantity(b)) {
        return Ok(a.cmp(&b));
    }
    if let (Some(a), Some(b)) = (as_version(a), as_version(b)) {
        return Ok(a.cmp(b));
    }
    Err(type_error(function, "two quantities or two semvers"))
}

pub(super) fn base_context() -> Context<'static, 'static> {
    let mut ctx = Context::with_env(ENV.clone());
    let add = |ctx: &mut Context<'static, 'static>, r: Result<(), cel::DeclarationError>| {
        r.expect("DRA functions do not overlap the standard library");
        let _ = ctx;
    };
    let r = ctx.add_function("quantity", |s: Arc<String>| -> Outcome {
        Quantity::parse(&s)
            .map(quantity_value)
            .map_err(|e| ExecutionError::function_error("quantity", e))
    });
    add(&mut ctx, r);
    let r = ctx.add_function("isQuantity", |s: Arc<String>| Quantity::parse(&s).is_ok());
    add(&mut ctx, r);
    let r = ctx.add_function("semver", |s: Arc<String>| -> Outcome {
        Version::parse(&s)
            .map(|v| Value::Opaque(Arc::new(SemverValue(v))))
            .map_err(|e| ExecutionError::function_error("semver", e))
    });
    add(&mut ctx, r);
    let r = ctx.add_function("isSemver", |s: Arc<String>| Version::parse(&s).is_ok());
    add(&mut ctx, r);
    let r = ctx.add_function("compareTo", |This(a): This<Value>, b: Value| -> Outcome {
        Ok(Value::Int(ordering("compareTo", &a, &b)? as i64))
    });
    add(&mut ctx, r);
    let r = ctx.add_function(
        "isGreaterThan",
        |This(a): This<Value>, b: Value| -> Outcome {
            Ok(Value::Bool(
                ordering("isGreaterThan", &a, &b)? == Ordering::Greater,
            ))
        },
    );
    add(&mut ctx, r);
    let r = ctx.add_function("isLessThan", |This(a): This<Value>, b: Value| -> Outcome {
        Ok(Value::Bool(
            ordering("isLessThan", &a, &b)? == Ordering::Less,
        ))
    });
    add(&mut ctx, r);
    let r = ctx.add_function("add", |This(a): This<Value>, b: Value| -> Outcome {
        quantity_arith("add", &a, &b, Quantity::checked_add)
    });
    add(&mut ctx, r);
    let r = ctx.add_function("sub", |This(a): This<Value>, b: Value| -> Outcome {
        quantity_arith("sub", &a, &b, Quantity::checked_sub)
    });
    add(&mut ctx, r);
    let r = ctx.add_function("asInteger", |This(a): This<Value>| -> Outcome {
        let q = as_quantity(&a).ok_or_else(|| type_error("asInteger", "a quantity"))?;
        q.as_integer().map(Value::Int).ok_or_else(|| {
            ExecutionError::function_error(
                "asInteger",
                "quantity is not an integer or overflows int",
            )
        })
    });
    add(&mut ctx, r);
    let r = ctx.add_function("isInteger", |This(a): This<Value>| -> Outcome {
        let q = as_quantity(&a).ok_or_else(|| type_error("isInteger", "a quantity"))?;
        Ok(Value::Bool(q.as_integer().is_some()))
    });
    add(&mut ctx, r);
    let r = ctx.add_function("asApproximateFloat", |This(a): This<Value>| -> Outcome {
        let q = as_quantity(&a).ok_or_else(|| type_error("asApproximateFloat", "a quantity"))?;
        Ok(Value::Float(q.as_approximate_float()))
    });
    add(&mut ctx, r);
    let r = ctx.add_function("sign", |This(a): This<Value>| -> Outcome {
        let q = as_quantity(&a).ok_or_else(|| type_error("sign", "a quantity"))?;
        Ok(Value::Int(q.sign()))
    });
    add(&mut ctx, r);
    for (name, part) in [
        ("major", (|v: &Version| v.major) as fn(&Version) -> u64),
        ("minor", |v: &Version| v.minor),
        ("patch", |v: &Version| v.patch),
    ] {
        let r = ctx.add_function(name, move |This(a): This<Value>| -> Outcome {
            let v = as_version(&a).ok_or_else(|| type_error(name, "a semver"))?;
            Ok(Value::Int(part(v) as i64))
        });
        add(&mut ctx, r);
    }
    let r = ctx.add_function("isSorted", |This(list): This<Value>| -> Outcome {
        let Value::List(items) = list else {
            return Err(type_error("isSorted", "a list"));
        };
        let mut sorted = true;
        for pair in items.windows(2) {
            sorted &= compare_values("isSorted", &pair[0], &pair[1])? != Ordering::Greater;
        }
        Ok(Value::Bool(sorted))
    });
    add(&mut ctx, r);
    let r = ctx.add_function("sum", |This(list): This<Value>| -> Outcome {
        let Value::List(items) = list else {
            return Err(type_error("sum", "a list"));
        };
        match items.first() {
            None => Ok(Value::Int(0)),
            Some(Value::Float(_)) => items
                .iter()
                .map(|v| match v {
                    Value::Float(f) => Ok(*f),
                    _ => Err(type_error("sum", "a list of one numeric type")),
                })
                .sum::<Result<f64, _>>()
                .map(Value::Float),
            Some(_) => items
                .iter()
                .try_fold(0i64, |acc, v| match v {
                    Value::Int(i) => acc
                        .checked_add(*i)
                        .ok_or_else(|| ExecutionError::function_error("sum", "overflow")),
                    _ => Err(type_error("sum", "a list of one numeric type")),
                })
                .map(Value::Int),
        }
    });
    add(&mut ctx, r);
    for (name, want) in [("min", Ordering::Less), ("max", Ordering::Greater)] {
        let r = ctx.add_function(name, move |This(list): This<Value>| -> Outcome {
            let Value::List(items) = list else {
                return Err(type_error(name, "a list"));
            };
            let mut best: Option<&Value> = None;
            for item in items.iter() {
                let better = match best {
                    None => true,
                    Some(b) => compare_values(name, item, b)? == want,
                };
                if better {
                    best = Some(item);
                }
            }
            best.cloned()
                .ok_or_else(|| ExecutionError::function_error(name, "list is empty"))
        });
        add(&mut ctx, r);
    }
    ctx
}

/// Orders two values of one comparable type (numbers, strings, quantities,
/// versions).
fn compare_values(function: &str, a: &Value, b: &Value) -> Result<Ordering, ExecutionError> {
    Ok(match (a, b) {
        (Value::Int(a), Value::Int(b)) => a.cmp(b),
        (Value::UInt(a), Value::UInt(b)) => a.cmp(b),
        (Value::String(a), Value::String(b)) => a.cmp(b),
        (Value::Float(a), Value::Float(b)) => a.partial_cmp(b).unwrap_or(Ordering::Equal),
        (a, b) => ordering(function, a, b)?,
    })
}

fn quantity_arith(
    function: &str,
    a: &Value,
    b: &Value,
    op: fn(Quantity, Quantity) -> Option<Quantity>,
) -> Outcome {
    let a = as_quantity(a).ok_or_else(|| type_error(function, "quantities"))?;
    let b = match b {
        Value::Int(i) => Quantity::from_units(*i),
        other => as_quantity(other).ok_or_else(|| type_error(function, "a quantity or an int"))?,
    };
    op(a, b)
        .map(quantity_value)
        .ok_or_else(|| ExecutionError::function_error(function, "overflow"))
}
