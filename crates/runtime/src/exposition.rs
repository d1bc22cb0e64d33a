//! The Prometheus text exposition, with numbers in labels spelled as
//! client_golang spells them.
//!
//! Bucket bounds (`le`) and quantiles are label *strings*: a dashboard or
//! alert that selects `le="1e-08"` only matches if we write `1e-08`, as
//! kube-controller-manager does, and not `0.00000001`, as the Rust client
//! does. Everything else of the Rust encoder's output is kept.

use std::sync::{Arc, RwLock};

use prometheus::proto::MetricFamily;
use prometheus::{Encoder, Registry, TextEncoder};

/// A metric family that writes its own text exposition: for one with very
/// many series computed at scrape time, whose records as the client
/// library's objects would cost several times the text itself.
pub trait TextFamily: Send + Sync {
    /// Appends `# HELP`, `# TYPE` and the samples (nothing when it has
    /// none).
    fn write_text(&self, out: &mut String);
}

/// What `/metrics` serves: the registry, then the text families added
/// (also after the server started).
#[derive(Clone, Default)]
pub struct Exposition {
    registry: Registry,
    text: Arc<RwLock<Vec<Arc<dyn TextFamily>>>>,
}

impl From<Registry> for Exposition {
    fn from(registry: Registry) -> Self {
        Exposition {
            registry,
            text: Default::default(),
        }
    }
}

impl Exposition {
    pub fn add_text(&self, family: Arc<dyn TextFamily>) {
        self.text.write().unwrap().push(family);
    }

    /// The whole exposition.
    pub fn encode(&self) -> prometheus::Result<String> {
        let mut out = encode(&self.registry.gather())?;
        for family in self.text.read().unwrap().iter() {
            family.write_text(&mut out);
        }
        Ok(out)
    }
}

/// A label value as the text format writes it (`\`, `"` and newlines
/// escaped).
pub fn escape_label_value(value: &str, out: &mut String) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Labels whose values are numbers written by the client library.
const NUMERIC_LABELS: [&str; 2] = ["le", "quantile"];

/// Encodes `families` in the text format, with Go's float spelling.
pub fn encode(families: &[MetricFamily]) -> prometheus::Result<String> {
    let text = TextEncoder::new().encode_to_string(families)?;
    Ok(text
        .lines()
        .map(respell_line)
        .fold(String::with_capacity(text.len()), |mut out, line| {
            out.push_str(&line);
            out.push('\n');
            out
        }))
}

/// The content type of [`encode`]'s output.
pub fn content_type() -> String {
    TextEncoder::new().format_type().to_string()
}

fn respell_line(line: &str) -> String {
    if line.starts_with('#') {
        return line.to_string();
    }
    let mut out = line.to_string();
    for label in NUMERIC_LABELS {
        let needle = format!("{label}=\"");
        // Label names are preceded by `{` or `,` in a sample line.
        let Some(start) = [format!("{{{needle}"), format!(",{needle}")]
            .iter()
            .find_map(|n| out.find(n.as_str()).map(|i| i + n.len()))
        else {
            continue;
        };
        let Some(len) = out[start..].find('"') else {
            continue;
        };
        if let Ok(value) = out[start..start + len].parse::<f64>() {
            out.replace_range(start..start + len, &go_float(value));
        }
    }
    out
}

/// `strconv.FormatFloat(v, 'g', -1, 64)` as client_golang uses it: the
/// shortest digits that read back as `v`, in exponent form (at least two
/// exponent digits) below 1e-4 and from 1e21 on.
pub(crate) fn go_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    let scientific = format!("{v:e}");
    let (mantissa, exponent) = scientific
        .split_once('e')
        .expect("`{:e}` always writes an exponent");
    let exponent: i32 = exponent.parse().expect("`{:e}` exponent is an integer");
    if v != 0.0 && !(-4..21).contains(&exponent) {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exponent.abs())
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_as_go_writes_them() {
        let cases = [
            (1e-8, "1e-08"),
            (9.999999999999999e-6, "9.999999999999999e-06"),
            (0.0001, "0.0001"),
            (0.001, "0.001"),
            (0.25, "0.25"),
            (1.0, "1"),
            (10.0, "10"),
            (0.0, "0"),
            (1e20, "100000000000000000000"),
            (1e21, "1e+21"),
            (f64::INFINITY, "+Inf"),
            (-2.5e-7, "-2.5e-07"),
        ];
        for (value, want) in cases {
            assert_eq!(go_float(value), want, "{value:e}");
        }
    }

    /// The workqueue histograms, byte for byte in the bucket lines, as
    /// kube-controller-manager exposes them for its `resource_claim` queue.
    #[test]
    fn workqueue_buckets_match_kube_controller_manager() {
        let registry = prometheus::Registry::new();
        let _queue = crate::workqueue::WorkQueue::<String>::new("resource_claim", Some(&registry));
        let text = encode(&registry.gather()).unwrap();
        let fixture = include_str!("testdata/workqueue_buckets.txt");
        for metric in ["queue_duration_seconds", "work_duration_seconds"] {
            let ours: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with(&format!("workqueue_{metric}_bucket")))
                .collect();
            let want: Vec<String> = fixture
                .lines()
                .map(|l| l.replace("METRIC", metric))
                .collect();
            assert_eq!(ours, want, "{metric}");
        }
    }

    #[test]
    fn text_families_follow_the_registry_escaped() {
        struct Two;
        impl TextFamily for Two {
            fn write_text(&self, out: &mut String) {
                out.push_str("# TYPE two gauge\ntwo{v=\"");
                escape_label_value("a\"b\\c\nd", out);
                out.push_str("\"} 2\n");
            }
        }
        let exposition = Exposition::from(Registry::new());
        exposition.add_text(Arc::new(Two));
        assert_eq!(
            exposition.encode().unwrap(),
            "# TYPE two gauge\ntwo{v=\"a\\\"b\\\\c\\nd\"} 2\n"
        );
    }

    #[test]
    fn other_lines_are_untouched() {
        let line = r#"rest_client_requests_total{code="200",host="x",method="GET"} 3"#;
        assert_eq!(respell_line(line), line);
        assert_eq!(
            respell_line("# HELP x le=\"0.00000001\""),
            "# HELP x le=\"0.00000001\""
        );
        assert_eq!(
            respell_line(r#"x_bucket{a="1",le="0.00000001"} 0"#),
            r#"x_bucket{a="1",le="1e-08"} 0"#
        );
    }
}
