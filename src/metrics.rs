//! The Prometheus text exposition format (version 0.0.4), for `fence metrics` and
//! `fence run --metrics-file`: families with `# HELP` and `# TYPE`, samples with escaped
//! label values. Names follow Prometheus conventions: `fence_` first, `_total` for counters,
//! base units (`_seconds`).

use std::fmt::Write as _;

/// A metric family and its samples.
pub struct Family {
    name: &'static str,
    help: &'static str,
    /// `counter` or `gauge`.
    kind: &'static str,
    samples: Vec<(Vec<(&'static str, String)>, f64)>,
}

impl Family {
    pub fn counter(name: &'static str, help: &'static str) -> Family {
        Family {
            name,
            help,
            kind: "counter",
            samples: Vec::new(),
        }
    }

    pub fn gauge(name: &'static str, help: &'static str) -> Family {
        Family {
            name,
            help,
            kind: "gauge",
            samples: Vec::new(),
        }
    }

    pub fn add(&mut self, labels: &[(&'static str, &str)], value: f64) {
        self.samples.push((
            labels.iter().map(|(k, v)| (*k, (*v).to_owned())).collect(),
            value,
        ));
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn samples(&self) -> &[(Vec<(&'static str, String)>, f64)] {
        &self.samples
    }
}

/// The families as exposition text; families without samples are left out.
pub fn render(families: &[Family]) -> String {
    let mut text = String::new();
    for family in families.iter().filter(|f| !f.samples.is_empty()) {
        let _ = writeln!(text, "# HELP {} {}", family.name, family.help);
        let _ = writeln!(text, "# TYPE {} {}", family.name, family.kind);
        for (labels, value) in &family.samples {
            text.push_str(family.name);
            if !labels.is_empty() {
                let labels: Vec<String> = labels
                    .iter()
                    .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                    .collect();
                let _ = write!(text, "{{{}}}", labels.join(","));
            }
            let _ = writeln!(text, " {}", number(*value));
        }
    }
    text
}

/// A label value with `\`, `"` and newlines escaped, as the format requires.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Integers without a fraction, others as Rust prints them (both are valid Go floats).
fn number(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{}", value as i64)
    } else {
        format!("{value}")
    }
}

/// Seconds since the epoch of milliseconds since the epoch.
pub fn seconds(ms: i64) -> f64 {
    ms as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::{render, Family};

    #[test]
    fn exposition() {
        let mut f = Family::counter("fence_x_total", "Xs.");
        f.add(&[("resource", "a\"b\\c\nd")], 3.0);
        let empty = Family::gauge("fence_none", "Nothing.");
        assert_eq!(
            render(&[f, empty]),
            "# HELP fence_x_total Xs.\n# TYPE fence_x_total counter\nfence_x_total{resource=\"a\\\"b\\\\c\\nd\"} 3\n"
        );
    }
}
