//! fence's Prometheus text read back through a real parser: the Python client's
//! (`prometheus_client`, from the metrics venv `tests/run` prepares).

use std::io::Write as _;
use std::process::{Command, Stdio};

use serde_json::Value;

/// One sample: its name, its labels (sorted pairs), its value.
pub type Sample = (String, Vec<(String, String)>, f64);

/// Every sample of `text`, as prometheus_client's parser reads it; panics when the parser
/// refuses the text, or when a `_total` sample is not of a counter.
pub fn samples(text: &str) -> Vec<Sample> {
    let script = "import json, sys\n\
        from prometheus_client.parser import text_string_to_metric_families\n\
        out = []\n\
        for family in text_string_to_metric_families(sys.stdin.read()):\n\
        \x20   for s in family.samples:\n\
        \x20       out.append([s.name, sorted(s.labels.items()), s.value, family.type])\n\
        print(json.dumps(out))\n";
    let mut child = Command::new(super::env_or_panic("FENCE_TEST_PROM_PYTHON"))
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the parser refused:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let parsed: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    parsed
        .into_iter()
        .map(|s| {
            let name = s[0].as_str().unwrap().to_owned();
            if name.ends_with("_total") {
                assert_eq!(s[3], "counter", "{name}");
            }
            let labels = s[1]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    (
                        p[0].as_str().unwrap().to_owned(),
                        p[1].as_str().unwrap().to_owned(),
                    )
                })
                .collect();
            (name, labels, s[2].as_f64().unwrap())
        })
        .collect()
}
