//! CEL device selectors, in the Kubernetes DRA environment: the variable
//! `device` (`driver`, `attributes[domain][name]`, `capacity[domain][name]`
//! as quantities, `allowMultipleAllocations`), the standard library, the
//! string extensions, `quantity()` and `semver()` with their methods,
//! the list functions `isSorted()`, `sum()`, `min()`, `max()`, and
//! `cel.bind()`.
//!
//! An expression that names a function outside that set is refused when it
//! is compiled, never evaluated: a selector we cannot evaluate as the API
//! server documents it must not pick devices.
//!
//! The Kubernetes libraries (`quantity()`, `semver()`, the list functions)
//! are in `selector/library.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, LazyLock};

use cel::common::ast::{ComprehensionExpr, Expr, ListExpr, LiteralValue, operators};
use cel::objects::{Key, Map};
use cel::parser::Macro;
use cel::{Context, Env, ExecutionError, Program, Value};

use super::quantity::Quantity;
use super::semver::Version;
use library::{SemverValue, base_context, quantity_value};

mod library;

/// A device as selectors see it.
#[derive(Clone, Debug, Default)]
pub struct DeviceFacts {
    pub driver: String,
    /// domain → name → value; names without a domain belong to the driver's.
    pub attributes: BTreeMap<String, BTreeMap<String, AttributeValue>>,
    pub capacity: BTreeMap<String, BTreeMap<String, Quantity>>,
}

#[derive(Clone, Debug)]
pub enum AttributeValue {
    Bool(bool),
    Int(i64),
    String(String),
    /// Parsed for selectors; `matchAttribute` compares the text as written,
    /// as kube-scheduler does ("1.0.0+a" and "1.0.0+b" differ).
    Version(Version, String),
}

impl PartialEq for AttributeValue {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (AttributeValue::Bool(a), AttributeValue::Bool(b)) => a == b,
            (AttributeValue::Int(a), AttributeValue::Int(b)) => a == b,
            (AttributeValue::String(a), AttributeValue::String(b)) => a == b,
            (AttributeValue::Version(_, a), AttributeValue::Version(_, b)) => a == b,
            _ => false,
        }
    }
}

/// A compiled selector, with the string literals it uses (the candidate
/// attribute domains: a domain a device lacks reads as an empty map).
pub struct Selector {
    program: Program,
    literals: BTreeSet<String>,
}

/// Functions and operators a selector may use. Everything here is either
/// CEL's standard library, the string extension, or defined below.
const SUPPORTED: &[&str] = &[
    // operators
    operators::CONDITIONAL,
    operators::LOGICAL_AND,
    operators::LOGICAL_OR,
    operators::LOGICAL_NOT,
    operators::SUBSTRACT,
    operators::ADD,
    operators::MULTIPLY,
    operators::DIVIDE,
    operators::MODULO,
    operators::EQUALS,
    operators::NOT_EQUALS,
    operators::GREATER_EQUALS,
    operators::LESS_EQUALS,
    operators::GREATER,
    operators::LESS,
    operators::NEGATE,
    operators::INDEX,
    operators::NOT_STRICTLY_FALSE,
    operators::IN,
    // standard functions
    "size",
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "int",
    "uint",
    "double",
    "string",
    "bool",
    "dyn",
    // string extension
    "charAt",
    "indexOf",
    "lastIndexOf",
    "lowerAscii",
    "upperAscii",
    "replace",
    "split",
    "substring",
    "trim",
    "join",
    // Kubernetes quantity and semver libraries, list library (part)
    "quantity",
    "isQuantity",
    "semver",
    "isSemver",
    "compareTo",
    "isGreaterThan",
    "isLessThan",
    "add",
    "sub",
    "asInteger",
    "asApproximateFloat",
    "isInteger",
    "sign",
    "major",
    "minor",
    "patch",
    "isSorted",
    "sum",
    "min",
    "max",
];

thread_local! {
    /// The DRA functions, registered once per thread (a context is not
    /// shared between threads); each evaluation binds `device` in a child
    /// scope of it.
    static FUNCTIONS: Context<'static, 'static> = base_context();
}

static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| {
    let mut env = Env::stdlib();
    env.add_extension(cel::extensions::strings)
        .expect("the string extension declares no conflicting overloads");
    env.add_macro(Macro::receiver("bind", 3, bind_macro))
        .expect("bind is declared once");
    Arc::new(env)
});

/// Why a selector cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SelectorError {
    /// Does not parse.
    Compile(String),
    /// Names functions this allocator does not implement.
    Unsupported(Vec<String>),
}

impl std::fmt::Display for SelectorError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SelectorError::Compile(msg) => write!(f, "CEL compile error: {msg}"),
            SelectorError::Unsupported(names) => write!(
                f,
                "uses {} this allocator does not support: {}",
                if names.len() == 1 {
                    "a function"
                } else {
                    "functions"
                },
                names.join(", ")
            ),
        }
    }
}

/// The deepest nesting of parentheses, brackets and braces a selector may
/// have: where kube-apiserver's CEL parser stops (250). Deeper ones are
/// refused before parsing, so the parser's recursion stays within the
/// allocation thread's stack.
pub(crate) const MAX_NESTING: usize = 250;

/// The deepest nesting of `(`, `[` and `{` outside string literals.
fn nesting_depth(expression: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let mut quote = None;
    let mut escaped = false;
    for c in expression.chars() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                }
            }
            None => match c {
                '"' | '\'' => quote = Some(c),
                '(' | '[' | '{' => {
                    depth += 1;
                    deepest = deepest.max(depth);
                }
                ')' | ']' | '}' => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
    }
    deepest
}

impl Selector {
    pub fn compile(expression: &str) -> Result<Self, SelectorError> {
        let depth = nesting_depth(expression);
        if depth > MAX_NESTING {
            return Err(SelectorError::Compile(format!(
                "nested {depth} levels deep; at most {MAX_NESTING} are accepted"
            )));
        }
        let program = ENV
            .compile(expression)
            .map_err(|e| SelectorError::Compile(e.to_string().trim().to_string()))?;
        let mut unsupported: BTreeSet<String> = program
            .references()
            .functions()
            .into_iter()
            .filter(|f| !SUPPORTED.contains(f))
            .map(str::to_string)
            .collect();
        namespaced_calls(program.expression(), &mut unsupported);
        if !unsupported.is_empty() {
            return Err(SelectorError::Unsupported(
                unsupported.into_iter().collect(),
            ));
        }
        Ok(Selector {
            program,
            literals: string_literals(expression),
        })
    }

    /// Whether `device` is selected; an evaluation error (a missing
    /// attribute, a type mismatch) is the error text.
    pub fn matches(&self, device: &DeviceFacts) -> Result<bool, String> {
        FUNCTIONS.with(|functions| {
            let mut ctx = functions.new_inner_scope();
            ctx.add_variable_from_value("device", device_value(device, &self.literals));
            self.evaluate(&ctx)
        })
    }

    fn evaluate(&self, ctx: &Context) -> Result<bool, String> {
        match self.program.execute(ctx) {
            Ok(Value::Bool(selected)) => Ok(selected),
            Ok(other) => Err(format!(
                "expression must evaluate to bool, got {:?}",
                other.type_of()
            )),
            Err(err) => Err(describe(&err)),
        }
    }
}

fn describe(err: &ExecutionError) -> String {
    match err {
        ExecutionError::NoSuchKey(key) => format!("no such key: {key}"),
        other => other.to_string(),
    }
}

/// `cel.bind(name, init, expr)`: `expr` with `name` bound to `init`, as a
/// comprehension over nothing whose accumulator is the binding.
fn bind_macro(
    helper: &mut cel::parser::MacroExprHelper<'_>,
    target: &mut Option<cel::IdedExpr>,
    args: &mut Vec<cel::IdedExpr>,
) -> Result<Option<cel::IdedExpr>, cel::ParseError> {
    if !matches!(target.as_ref().map(|t| &t.expr), Some(Expr::Ident(ns)) if ns == "cel") {
        return Ok(None);
    }
    let Expr::Ident(name) = &args[0].expr else {
        let id = args[0].id;
        return Err(helper.new_error(id, "cel.bind() variable name must be a simple identifier"));
    };
    let name = name.clone();
    target.take();
    let result = args.pop().expect("three arguments");
    let init = args.pop().expect("three arguments");
    let iter_range = helper.next_expr(Expr::List(ListExpr::new(Vec::new())));
    let loop_cond = helper.next_expr(Expr::Literal(LiteralValue::Boolean(false.into())));
    let loop_step = helper.next_expr(Expr::Ident(name.clone()));
    Ok(Some(helper.next_expr(Expr::Comprehension(Box::new(
        ComprehensionExpr {
            iter_range,
            iter_var: "#unused".to_string(),
            iter_var2: None,
            accu_var: name,
            accu_init: init,
            loop_cond,
            loop_step,
            result,
        },
    )))))
}

/// Library namespaces of CEL extensions this allocator does not load.
const FOREIGN_NAMESPACES: &[&str] = &[
    "sets", "strings", "lists", "math", "base64", "optional", "cel",
];

/// Calls like `sets.contains(..)`: parsed as a method on an unknown
/// variable, they would otherwise fail only at run time, with a vaguer text.
fn namespaced_calls(expr: &cel::IdedExpr, found: &mut BTreeSet<String>) {
    use cel::common::ast::EntryExpr;
    match &expr.expr {
        Expr::Call(call) => {
            if let Some(target) = &call.target {
                if let Expr::Ident(ns) = &target.expr
                    && FOREIGN_NAMESPACES.contains(&ns.as_str())
                {
                    found.insert(format!("{ns}.{}", call.func_name));
                }
                namespaced_calls(target, found);
            }
            call.args.iter().for_each(|a| namespaced_calls(a, found));
        }
        Expr::Comprehension(c) => {
            for e in [
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ] {
                namespaced_calls(e, found);
            }
        }
        Expr::List(list) => list
            .elements
            .iter()
            .for_each(|e| namespaced_calls(e, found)),
        Expr::Map(map) => {
            for entry in &map.entries {
                if let EntryExpr::MapEntry(m) = &entry.expr {
                    namespaced_calls(&m.key, found);
                    namespaced_calls(&m.value, found);
                }
            }
        }
        Expr::Struct(s) => {
            for entry in &s.entries {
                if let EntryExpr::StructField(f) = &entry.expr {
                    namespaced_calls(&f.value, found);
                }
            }
        }
        Expr::Select(select) => namespaced_calls(&select.operand, found),
        _ => {}
    }
}

/// Every quoted string in the expression: attribute domains a selector may
/// index with are among them.
fn string_literals(expression: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut chars = expression.char_indices();
    while let Some((start, c)) = chars.next() {
        if c != '"' && c != '\'' {
            continue;
        }
        let mut end = None;
        let mut escaped = false;
        for (i, d) in chars.by_ref() {
            if escaped {
                escaped = false;
            } else if d == '\\' {
                escaped = true;
            } else if d == c {
                end = Some(i);
                break;
            }
        }
        if let Some(end) = end {
            found.insert(expression[start + 1..end].to_string());
        }
    }
    found
}

fn device_value(device: &DeviceFacts, literals: &BTreeSet<String>) -> Value {
    let mut attributes: HashMap<Key, Value> = HashMap::new();
    let mut capacity: HashMap<Key, Value> = HashMap::new();
    for (domain, values) in &device.attributes {
        let map: HashMap<Key, Value> = values
            .iter()
            .map(|(name, v)| (Key::from(name.as_str()), attribute_value(v)))
            .collect();
        attributes.insert(Key::from(domain.as_str()), Value::Map(Map::from(map)));
    }
    for (domain, values) in &device.capacity {
        let map: HashMap<Key, Value> = values
            .iter()
            .map(|(name, q)| (Key::from(name.as_str()), quantity_value(*q)))
            .collect();
        capacity.insert(Key::from(domain.as_str()), Value::Map(Map::from(map)));
    }
    // A domain the device does not have reads as empty, so that
    // `has(device.attributes["other.example.com"].x)` is false, not an error.
    for literal in literals {
        for map in [&mut attributes, &mut capacity] {
            map.entry(Key::from(literal.as_str()))
                .or_insert_with(|| Value::Map(Map::from(HashMap::<Key, Value>::new())));
        }
    }
    let mut fields: HashMap<Key, Value> = HashMap::new();
    fields.insert(Key::from("driver"), Value::from(device.driver.as_str()));
    fields.insert(Key::from("attributes"), Value::Map(Map::from(attributes)));
    fields.insert(Key::from("capacity"), Value::Map(Map::from(capacity)));
    fields.insert(Key::from("allowMultipleAllocations"), Value::Bool(false));
    Value::Map(Map::from(fields))
}

fn attribute_value(v: &AttributeValue) -> Value {
    match v {
        AttributeValue::Bool(b) => Value::Bool(*b),
        AttributeValue::Int(i) => Value::Int(*i),
        AttributeValue::String(s) => Value::from(s.as_str()),
        AttributeValue::Version(v, _) => Value::Opaque(Arc::new(SemverValue(v.clone()))),
    }
}
