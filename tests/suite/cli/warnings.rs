//! Issue 34: every warning goes through the printer. For people (and `env`, `ndjson`) a
//! warning is a `fence: …` line on stderr, as always; `-q` drops it (errors are still
//! reported); `--format json` carries it in the answer's `notices` array, success or failure,
//! and leaves stderr empty. Real warnings, real stores, the real binary.

use crate::common;

use std::fs;
use std::os::unix::fs::PermissionsExt;

use common::{env_or_panic, Lease, Out, Store};
use serde_json::Value;

/// The `notices` of a JSON answer (none: an empty list; the field is then absent, never
/// empty).
fn notices(answer: &Value) -> Vec<String> {
    match answer.get("notices") {
        None => Vec::new(),
        Some(list) => {
            let list: Vec<String> = list
                .as_array()
                .unwrap_or_else(|| panic!("notices is an array: {answer}"))
                .iter()
                .map(|n| n.as_str().expect("a notice is a string").to_owned())
                .collect();
            assert!(!list.is_empty(), "an empty notices field: {answer}");
            list
        }
    }
}

/// The lines of stderr that are a warning containing `what`.
fn warning_lines<'a>(out: &'a Out, what: &str) -> Vec<&'a str> {
    out.stderr.lines().filter(|l| l.contains(what)).collect()
}

const RESTORED: &str = "restored from an older copy";

/// A successful acquire that warns: the lease record of `r` is put back to a copy older than
/// the tokens issued since (a backup restored), so the grant warns and continues above them.
/// Returns the answer, after releasing the lease.
fn acquire_over_an_old_record(store: &Store, old: &[u8], owner: &str, extra: &[&str]) -> Out {
    fs::write(store.dir().join("leases/r.json"), old).unwrap();
    let out = store
        .fence()
        .args(["acquire", "r", "--owner", owner])
        .args(extra)
        .run()
        .expect(0);
    let (holder, token, held) = store.lease("r").expect("a lease record");
    assert!(held && holder == owner, "{out:?}");
    store.fence().release(&Lease {
        resource: "r".into(),
        owner: owner.into(),
        token,
    });
    out
}

#[test]
fn a_warning_on_success_goes_to_stderr_nowhere_with_quiet_or_into_the_json_answer() {
    let store = Store::file();
    let grant = |owner: &str| {
        let lease = store.fence().acquire("r", &["--owner", owner]);
        store.fence().release(&lease);
    };
    grant("a");
    let old = fs::read(store.dir().join("leases/r.json")).unwrap();
    grant("b");
    grant("c");
    let record = store.dir().join("leases/r.json");

    // People: the warning on stderr as it always was, the answer on stdout.
    let human = acquire_over_an_old_record(&store, &old, "h", &[]);
    let expected = format!(
        "fence: warning: the lease record `{}` holds token 1, but token 3 was issued before: it was {RESTORED}",
        record.display()
    );
    assert_eq!(human.stderr.lines().count(), 1, "{human:?}");
    assert!(human.stderr.starts_with(&expected), "{human:?}");
    assert!(
        human.stdout.starts_with("acquired `r` with token 4 as `h`"),
        "{human:?}"
    );

    // -q: nothing at all, the same exit status (0), and the lease was granted all the same.
    let quiet = acquire_over_an_old_record(&store, &old, "q", &["-q"]);
    assert_eq!((quiet.stdout.as_str(), quiet.stderr.as_str()), ("", ""));
    assert_eq!(store.lease("r").unwrap().1, 5);

    // JSON: one object on stdout carrying the same text, nothing on stderr.
    let json = acquire_over_an_old_record(&store, &old, "j", &["--format", "json"]);
    assert_eq!(json.stderr, "", "{json:?}");
    let answer = json.json();
    assert_eq!(
        (answer["ok"].clone(), answer["token"].clone()),
        (true.into(), 6.into())
    );
    let said = notices(&answer);
    assert_eq!(said.len(), 1, "{answer}");
    assert!(
        said[0].starts_with(&expected["fence: ".len()..].replace("token 3", "token 5")),
        "{answer}"
    );
    assert_eq!(
        answer
            .as_object()
            .unwrap()
            .keys()
            .next_back()
            .map(String::as_str),
        Some("notices"),
        "the notices close the answer: {answer}"
    );

    // JSON and -q: the answer without them.
    let both = acquire_over_an_old_record(&store, &old, "k", &["--format", "json", "-q"]);
    assert_eq!(both.stderr, "", "{both:?}");
    assert_eq!(notices(&both.json()), Vec::<String>::new());

    // No warning: no field, the answer as it always was.
    let plain = store
        .fence()
        .args(["acquire", "r", "--owner", "p", "--format", "json"])
        .run()
        .expect(0);
    assert_eq!(plain.stderr, "", "{plain:?}");
    assert!(plain.json().get("notices").is_none(), "{plain:?}");
}

#[test]
fn a_warning_before_a_failure_joins_the_json_error_object() {
    let store = Store::file();
    store.fence().acquire("r", &["--owner", "a", "--ttl", "1h"]);
    let record = store.dir().join("attempts/r.json");
    let busy = |extra: &[&str]| {
        fs::create_dir_all(record.parent().unwrap()).unwrap();
        fs::write(&record, b"{not json").unwrap();
        let out = store
            .fence()
            .args(["acquire", "r", "--owner", "b"])
            .args(extra)
            .run()
            .expect(3);
        assert!(
            fs::read(&record).unwrap() != b"{not json",
            "the damaged record was moved aside: {out:?}"
        );
        out
    };
    let human = busy(&[]);
    let warned = warning_lines(&human, "moved aside");
    assert_eq!(warned.len(), 1, "{human:?}");
    assert!(
        warned[0].starts_with(&format!(
            "fence: warning: the record of refused attempts `{}` was",
            record.display()
        )),
        "{human:?}"
    );
    assert!(
        human.stderr.contains("fence: error: `r` is held by `a`"),
        "{human:?}"
    );

    // -q keeps busy off stderr, and the warning with it.
    let quiet = busy(&["-q"]);
    assert_eq!((quiet.stdout.as_str(), quiet.stderr.as_str()), ("", ""));

    let json = busy(&["--format", "json"]);
    assert_eq!(json.stderr, "", "{json:?}");
    let answer = json.json();
    assert_eq!(answer["error"], "busy", "{answer}");
    let said = notices(&answer);
    assert_eq!(said.len(), 1, "{answer}");
    // The same text but for the name it was moved to (a new one each time).
    let before_the_move = |text: &str| text.split("; it was moved").next().unwrap().to_owned();
    assert_eq!(
        before_the_move(&format!("fence: {}", said[0])),
        before_the_move(warned[0]),
        "{answer}"
    );
    assert!(said[0].contains("moved aside"), "{answer}");
}

/// A `~/.pgpass` others can read is ignored with a warning (as libpq does), from the
/// connection code; the connection then fails for want of a password, exit 2.
#[test]
fn quiet_drops_a_connection_warning_but_not_the_error() {
    let store = Store::postgres();
    let pgpass = store.home.path().join(".pgpass");
    fs::write(
        &pgpass,
        format!(
            "{}:{}:*:{}:{}\n",
            env_or_panic("FENCE_TEST_PG_HOST"),
            env_or_panic("FENCE_TEST_PG_PORT"),
            env_or_panic("FENCE_TEST_PG_USER"),
            env_or_panic("FENCE_TEST_PG_PASSWORD")
        ),
    )
    .unwrap();
    fs::set_permissions(&pgpass, fs::Permissions::from_mode(0o644)).unwrap();
    let url = format!(
        "postgres://{}@{}:{}/{}?sslmode=disable",
        env_or_panic("FENCE_TEST_PG_USER"),
        env_or_panic("FENCE_TEST_PG_HOST"),
        env_or_panic("FENCE_TEST_PG_PORT"),
        env_or_panic("FENCE_TEST_PG_DB")
    );
    const WORLD: &str = "has group or world access";
    let expected = format!(
        "fence: warning: password file `{}` {WORLD}",
        pgpass.display()
    );
    let inspect = |extra: &[&str]| {
        store
            .fence_at(&url)
            .args(["inspect"])
            .args(extra)
            .run()
            .expect(2)
    };

    let human = inspect(&[]);
    let warned = warning_lines(&human, WORLD);
    assert!(!warned.is_empty(), "{human:?}");
    assert!(warned.iter().all(|l| l.starts_with(&expected)), "{human:?}");
    assert!(human.stderr.contains("asks for a password"), "{human:?}");

    // -q: the error, and only the error.
    let quiet = inspect(&["-q"]);
    assert_eq!(quiet.stdout, "", "{quiet:?}");
    assert!(
        !quiet.stderr.contains(WORLD),
        "-q printed a warning: {quiet:?}"
    );
    assert!(quiet.stderr.starts_with("fence: error: "), "{quiet:?}");
    assert!(quiet.stderr.contains("asks for a password"), "{quiet:?}");

    let json = inspect(&["--format", "json"]);
    assert_eq!(json.stderr, "", "{json:?}");
    let answer = json.json();
    assert_eq!(answer["ok"], false, "{answer}");
    let said = notices(&answer);
    assert!(!said.is_empty(), "{answer}");
    assert!(
        said.iter()
            .all(|n| format!("fence: {n}").starts_with(&expected)),
        "{answer}"
    );

    // ndjson streams: the warning goes to stderr, the failure is a line on stdout.
    let ndjson = store
        .fence_at(&url)
        .args(["log", "--format", "ndjson"])
        .run()
        .expect(2);
    assert!(!warning_lines(&ndjson, WORLD).is_empty(), "{ndjson:?}");
    let line: Value = serde_json::from_str(ndjson.stdout.trim()).unwrap();
    assert_eq!(line["ok"], false, "{line}");
    assert!(line.get("notices").is_none(), "{line}");
}

/// `fence run --format json`: its stderr carries its command's output and it may run for
/// hours, so a warning goes to stderr as it comes, and into the answer too. One that comes
/// after the answer was printed (the metrics file, written last) is not lost: stderr.
#[test]
fn run_warns_on_stderr_as_it_goes_and_after_its_answer() {
    let store = Store::file();
    let lease = store.fence().acquire("r", &["--owner", "a"]);
    store.fence().release(&lease);
    let old = fs::read(store.dir().join("leases/r.json")).unwrap();
    let lease = store.fence().acquire("r", &["--owner", "b"]);
    store.fence().release(&lease);
    let metrics = store.home.path().join("no-such-dir/run.prom");
    const METRICS: &str = "warning: cannot write the run's metrics to";
    let run = |extra: &[&str]| {
        fs::write(store.dir().join("leases/r.json"), &old).unwrap();
        store
            .fence()
            .args(["run", "r", "--metrics-file"])
            .args([&metrics])
            .args(extra)
            .args(["--", "echo", "from-the-command"])
            .run()
            .expect(0)
    };

    let json = run(&["--format", "json"]);
    let answer = json.json();
    let said = notices(&answer);
    assert_eq!(said.len(), 1, "{answer}");
    assert!(said[0].contains(RESTORED), "{answer}");
    let lines: Vec<&str> = json.stderr.lines().collect();
    assert_eq!(
        lines[..2],
        [&*format!("fence: {}", said[0]), "from-the-command"],
        "{json:?}"
    );
    assert!(
        lines[2].starts_with(&format!("fence: {METRICS}")),
        "{json:?}"
    );
    assert_eq!(lines.len(), 3, "{json:?}");

    let human = run(&[]);
    assert_eq!(human.stdout, "from-the-command\n", "{human:?}");
    assert_eq!(warning_lines(&human, RESTORED).len(), 1, "{human:?}");
    assert_eq!(warning_lines(&human, METRICS).len(), 1, "{human:?}");

    let quiet = run(&["-q"]);
    assert_eq!(quiet.stdout, "from-the-command\n", "{quiet:?}");
    assert_eq!(quiet.stderr, "", "{quiet:?}");
}
