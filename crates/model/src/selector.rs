//! Label selectors in their string form (`kubectl get -l`), matched here
//! instead of by the API server: one node watch serves every controller,
//! and each selects its own nodes from it.

use std::collections::BTreeMap;

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed label selector; all requirements must hold. The empty
/// selector matches everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector(Vec<Requirement>);

impl LabelSelector {
    /// Parses the string form: requirements separated by commas, each
    /// `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k` or `!k`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for part in split_top_level(text)? {
            let part = part.trim();
            if part.is_empty() {
                if text.trim().is_empty() {
                    continue;
                }
                return Err(format!("{text:?}: an empty requirement"));
            }
            requirements.push(requirement(part).map_err(|why| format!("{part:?}: {why}"))?);
        }
        Ok(LabelSelector(requirements))
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        })
    }
}

/// Splits at commas outside parentheses.
fn split_top_level(text: &str) -> Result<Vec<&str>, String> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(format!("{text:?}: unbalanced parentheses"));
        }
    }
    if depth != 0 {
        return Err(format!("{text:?}: unbalanced parentheses"));
    }
    parts.push(&text[start..]);
    Ok(parts)
}

fn requirement(part: &str) -> Result<Requirement, String> {
    if let Some(key) = part.strip_prefix('!') {
        return Ok(Requirement::DoesNotExist(key_of(key)?));
    }
    for (op, make) in [
        (
            "!=",
            Requirement::NotEquals as fn(String, String) -> Requirement,
        ),
        ("==", Requirement::Equals),
        ("=", Requirement::Equals),
    ] {
        if let Some((k, v)) = part.split_once(op) {
            return Ok(make(key_of(k)?, value_of(v)?));
        }
    }
    if let Some(open) = part.find('(') {
        let (head, list) = part.split_at(open);
        let mut words = head.split_whitespace();
        let (Some(key), Some(op), None) = (words.next(), words.next(), words.next()) else {
            return Err("expected `key in (...)` or `key notin (...)`".into());
        };
        let list = list
            .strip_prefix('(')
            .and_then(|l| l.strip_suffix(')'))
            .ok_or("the value list must end with `)`")?;
        let values = list
            .split(',')
            .map(value_of)
            .collect::<Result<Vec<_>, _>>()?;
        return match op {
            "in" => Ok(Requirement::In(key_of(key)?, values)),
            "notin" => Ok(Requirement::NotIn(key_of(key)?, values)),
            other => Err(format!("unknown operator {other:?}")),
        };
    }
    Ok(Requirement::Exists(key_of(part)?))
}

fn key_of(key: &str) -> Result<String, String> {
    let key = key.trim();
    let ok = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if ok {
        Ok(key.to_string())
    } else {
        Err(format!("{key:?} is not a label key"))
    }
}

fn value_of(value: &str) -> Result<String, String> {
    let value = value.trim();
    let ok = value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(value.to_string())
    } else {
        Err(format!("{value:?} is not a label value"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn matching() {
        let node = labels(&[("pool", "gpu"), ("zone", "a"), ("pre-scheduled", "true")]);
        let rows = [
            ("", true),
            ("pool=gpu", true),
            ("pool==gpu", true),
            ("pool=cpu", false),
            ("pool!=cpu", true),
            ("missing!=x", true),
            ("zone in (a, b)", true),
            ("zone in (b,c)", false),
            ("zone notin (b,c)", true),
            ("missing notin (b)", true),
            ("pre-scheduled", true),
            ("!pre-scheduled", false),
            ("!missing", true),
            ("pool=gpu,zone in (a),!missing", true),
            ("pool=gpu, zone=b", false),
            ("example.com/x", false),
        ];
        for (text, want) in rows {
            let selector = LabelSelector::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(selector.matches(&node), want, "{text}");
        }
    }

    #[test]
    fn refusals_name_the_part() {
        for text in [
            "pool=gpu,",
            "zone in (a",
            "zone within (a)",
            "a b",
            "pool=a b",
        ] {
            assert!(LabelSelector::parse(text).is_err(), "{text}");
        }
    }
}
