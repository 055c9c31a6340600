//! Review 18: what a careless user types and what a hostile name or store content does to the
//! scripts and terminals that read fence's output (escaping, secrets, look-alike names).

use crate::common;

use std::path::Path;

use common::{Backend, Out, Store};

/// Runs `fence ARGS` in a pty of `cols` columns (made by `script`); returns what it printed.
fn on_a_terminal(store: &Store, cols: u16, args: &str) -> String {
    let line = format!(
        "stty rows 50 cols {cols}; exec '{}' --store '{}' {args}",
        common::fence_bin().to_string_lossy(),
        store.url
    );
    let out = common::clean_command("script", store.home.path())
        .args(["-qec", &line, "/dev/null"])
        .output()
        .expect("script(1) runs");
    String::from_utf8_lossy(&out.stdout).replace('\r', "")
}

/// What a hostile owner's second half reads as: an event line of fence's own, a release by
/// `mallory` that never happened.
const FORGED: &str = "2099-01-01T00:00:00.000Z  job  released  mallory  token 1";

/// Lines of `text` that begin with the forged event (at the left margin, as fence's own
/// event lines do).
fn forged_lines(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.starts_with("2099-01-01"))
        .collect()
}

/// Replaces every `"owner":"<owner>"` in the file at `path` with `"owner":<json>`.
fn replace_owner(path: &Path, owner: &str, json: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    let from = format!("\"owner\":\"{owner}\"");
    assert!(text.contains(&from), "{path:?} names {owner}: {text}");
    std::fs::write(path, text.replace(&from, &format!("\"owner\":{json}"))).unwrap();
}

// ---------------------------------------------------------------------------------------------
// 1. `fence log` prints a newline held in the store raw.
// ---------------------------------------------------------------------------------------------

/// FINDING: `fence log` (human) shows the owner, kind, detail and resource of an event as
/// stored, newlines included. DESIGN §4/§10: everything from a store is escaped before it
/// reaches a terminal, so that it cannot "forge a line of fence's own output"
/// (src/terminal.rs); `fence inspect` escapes the same owner (`o1\n…`, `inspect::cell`), and
/// `log --follow` too. Review 16's fix for a program name (`RunNote::describe`) escaped only
/// the run note. Here an owner written into the directory store's log (anyone who can write
/// the store's files can; on PostgreSQL any writer of `events`): piped, its row spans two
/// lines; on an 80-column terminal (the narrow layout) its second half is an unindented line
/// that reads as a release by `mallory`. The fix belongs in `Entry::line`/`Entry::narrow` and
/// `Timeline::human` (src/cmd/log.rs): each field through `terminal_safe(…, false)` (as
/// inspect's `cell`), and the held-past-TTL warning's owner likewise.
#[test]
fn log_escapes_a_newline_in_a_stored_owner() {
    let store = Store::new(Backend::File);
    store
        .fence()
        .args(["acquire", "job", "--owner", "o1", "--ttl", "10m"])
        .run()
        .expect(0);
    let hostile = serde_json::to_string(&format!("o1\n{FORGED}")).unwrap();
    replace_owner(&store.dir().join("events/job.jsonl"), "o1", &hostile);
    // JSON keeps the stored owner whole: the record is read as it is.
    let ndjson = store
        .fence()
        .args(["log", "job", "--format", "ndjson"])
        .run()
        .expect(0)
        .stdout;
    assert!(
        ndjson.contains(&hostile[1..hostile.len() - 1]),
        "the stored owner is read: {ndjson}"
    );
    // inspect, for comparison, shows it escaped on one line.
    let inspect = store
        .fence()
        .args(["inspect", "job", "--history", "5"])
        .run()
        .expect(0)
        .stdout;
    assert!(inspect.contains("o1\\n2099-01-01"), "{inspect}");
    let mut wrong = Vec::new();
    // Piped: one line per row, the newline shown as `\n`.
    let piped = store.fence().args(["log", "job"]).run().expect(0).stdout;
    if !piped.contains("o1\\n2099-01-01") {
        wrong.push(format!(
            "piped, the stored newline is printed raw (inspect shows `o1\\n…`):\n{piped}"
        ));
    }
    // On a narrow terminal: no line of its own made by the owner.
    let shown = on_a_terminal(&store, 80, "log job");
    assert!(shown.contains("acquired"), "{shown}");
    if !forged_lines(&shown).is_empty() {
        wrong.push(format!(
            "on an 80-column terminal, the stored owner makes an event line of its own:\n{shown}"
        ));
    }
    assert!(wrong.is_empty(), "`fence log`:\n{}", wrong.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// 2. `fence inspect --target` prints a newline held in an object's metadata raw.
// ---------------------------------------------------------------------------------------------

/// FINDING: `fence inspect R --target file:///…` shows the object's `fence-owner` (and
/// `fence-resource`) metadata as stored: its table's BY cell is not passed through
/// `inspect::cell` as the lease table's OWNER is, so a newline in it (the sidecar
/// `.<name>.fence.json` is a plain JSON file; on PostgreSQL targets the guards' `updated_by`,
/// which any writer sets through `begin_write(r, t, owner)`) spans two lines piped, and on an
/// 80-column terminal (`by: …` lines) prints a line of its own that reads as an event. `fence
/// log --target` shows the same owner raw (finding 1). The fix belongs in `Inspected::human`
/// (src/cmd/inspect.rs): the object's and the guards' cells through `cell`.
#[test]
fn inspect_target_escapes_a_newline_in_an_objects_stored_owner() {
    let store = Store::new(Backend::File);
    let dir = tempfile::tempdir().unwrap();
    let target = format!("file://{}/out.txt", dir.path().display());
    let lease = store
        .fence()
        .acquire("job", &["--owner", "w1", "--ttl", "10m"]);
    let body = store.home.path().join("body");
    std::fs::write(&body, b"hello").unwrap();
    store
        .fence()
        .args([
            "write",
            "job",
            "--owner",
            "w1",
            "--token",
            &lease.token.to_string(),
        ])
        .args(["--target", &target, "--from"])
        .args([&body])
        .run()
        .expect(0);
    let sidecar = dir.path().join(".out.txt.fence.json");
    let text = std::fs::read_to_string(&sidecar).unwrap();
    let hostile = serde_json::to_string(&format!("w1\n{FORGED}")).unwrap();
    assert!(text.contains("\"fence-owner\":\"w1\""), "{text}");
    std::fs::write(
        &sidecar,
        text.replace(
            "\"fence-owner\":\"w1\"",
            &format!("\"fence-owner\":{hostile}"),
        ),
    )
    .unwrap();
    let json = store
        .fence()
        .args(["inspect", "job", "--target", &target, "--format", "json"])
        .run()
        .expect(0)
        .json();
    assert_eq!(
        json["targets"][0]["updated_by"].as_str(),
        Some(format!("w1\n{FORGED}").as_str()),
        "the stored owner is read: {json}"
    );
    let piped = store
        .fence()
        .args(["inspect", "job", "--target", &target])
        .run()
        .expect(0)
        .stdout;
    let mut wrong = Vec::new();
    if !piped.contains("w1\\n2099-01-01") {
        wrong.push(format!(
            "piped, the object's stored newline is printed raw:\n{piped}"
        ));
    }
    let shown = on_a_terminal(&store, 80, &format!("inspect job --target '{target}'"));
    assert!(shown.contains("stored token: 1"), "{shown}");
    if !forged_lines(&shown).is_empty() {
        wrong.push(format!(
            "on an 80-column terminal, the object's owner makes a line of its own:\n{shown}"
        ));
    }
    assert!(
        wrong.is_empty(),
        "`fence inspect --target`:\n{}",
        wrong.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// 3. A password in a store value that is not a URL fence reads.
// ---------------------------------------------------------------------------------------------

const SECRET: &str = "hunter2";

/// Notes `what` in `leaks` when `out` printed the password.
fn note_secret(leaks: &mut Vec<String>, out: &Out, what: &str) {
    if out.stdout.contains(SECRET) || out.stderr.contains(SECRET) {
        leaks.push(format!("{what}: {out:?}"));
    }
}

/// FINDING: DESIGN §10, "Secrets are never printed". A careless user writes the store as
/// psql takes it, a libpq keyword/value string (`host=db password=… dbname=app`), or drops a
/// slash of the URL (`postgresql:/app:…@db/app`): fence refuses it (exit 2, right) and echoes
/// it whole, password included, on stderr (cron mails it) and in the JSON `message`. So does
/// `--target`, and `AWS_ENDPOINT_URL` without a scheme (`admin:…@host:9000`). `redact_url`
/// (src/url.rs) leaves any value without `://` as it is but for `?`/`&` parameters; the
/// refusals in src/config.rs ("is not a store URL"), the target's, and `check_endpoint`
/// (src/object/mod.rs) print what it returns. The fix belongs in `redact_url` (a value
/// without `://`: drop `password=…` words and user info before an `@`), or in those messages
/// (not echoing an unparsed value).
#[test]
fn a_password_in_a_value_that_is_not_a_url_is_never_printed() {
    let store = Store::new(Backend::File);
    let home = store.home.path();
    let mut leaks = Vec::new();
    let values = [
        format!("host=127.0.0.1 port=1 password={SECRET} dbname=app"),
        format!("user=app password='{SECRET}' host=db"),
        format!("postgresql:/app:{SECRET}@127.0.0.1:1/app"),
        format!("postgres//app:{SECRET}@127.0.0.1:1/app"),
    ];
    for value in &values {
        for format in ["human", "json"] {
            let out = common::Fence::bare(home)
                .args(["--store", value, "--format", format, "inspect"])
                .run()
                .expect(2);
            note_secret(&mut leaks, &out, &format!("--store {value:?} ({format})"));
            let out = common::Fence::bare(home)
                .env("FENCE_STORE", value)
                .args(["--format", format, "inspect"])
                .run()
                .expect(2);
            note_secret(
                &mut leaks,
                &out,
                &format!("FENCE_STORE={value:?} ({format})"),
            );
        }
        let out = store
            .fence()
            .args(["inspect", "job", "--target", value])
            .run()
            .expect(2);
        note_secret(&mut leaks, &out, &format!("--target {value:?}"));
    }
    let out = common::Fence::bare(home)
        .env("AWS_ENDPOINT_URL", format!("admin:{SECRET}@127.0.0.1:9000"))
        .args(["--store", "s3://bucket/prefix", "inspect"])
        .run()
        .expect(2);
    note_secret(&mut leaks, &out, "AWS_ENDPOINT_URL without a scheme");
    assert!(
        leaks.is_empty(),
        "the password is printed:\n{}",
        leaks.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Names that differ by a character the terminal draws as nothing.
// ---------------------------------------------------------------------------------------------

/// FINDING: names are compared byte for byte (DESIGN §1) and may hold any character but
/// controls, so `deploy` and `deploy` + U+034F are two resources. `terminal_safe` escapes
/// "characters a terminal draws as nothing … two names that differ only by one would look the
/// same" (src/terminal.rs `is_invisible`), but its list misses most of Unicode's
/// Default_Ignorable_Code_Point set: the combining grapheme joiner U+034F, the Khmer inherent
/// vowels U+17B4/5, the Mongolian variation selectors U+180B–D, U+2065, the deprecated format
/// controls U+206A–F, the variation selectors U+FE00–F and U+E0100–E01EF, the shorthand format
/// controls U+1BCA0–3 and the musical format controls U+1D173–A. Each is printed raw, so
/// `fence inspect` shows two rows named `deploy`, and a busy message names a holder that reads
/// as another. The fix belongs in `is_invisible` (src/terminal.rs): the whole
/// Default_Ignorable_Code_Point property.
#[test]
fn names_that_differ_by_an_invisible_character_are_told_apart() {
    let store = Store::new(Backend::File);
    let invisible = [
        '\u{34f}',
        '\u{17b4}',
        '\u{180b}',
        '\u{2065}',
        '\u{206a}',
        '\u{fe00}',
        '\u{fe0f}',
        '\u{1bca0}',
        '\u{1d173}',
        '\u{e0100}',
    ];
    store
        .fence()
        .args(["acquire", "deploy", "--owner", "ops", "--ttl", "10m"])
        .run()
        .expect(0);
    let mut shown_raw = Vec::new();
    for c in invisible {
        let name = format!("deploy{c}");
        let out = store
            .fence()
            .args([
                "acquire",
                &name,
                "--owner",
                &format!("ops{c}"),
                "--ttl",
                "10m",
            ])
            .run()
            .expect(0);
        if out.stdout.contains(c) {
            shown_raw.push(format!("U+{:04X} (acquire)", c as u32));
        }
        // Busy: the holder's name, in a diagnostic.
        let out = store
            .fence()
            .args(["acquire", &name, "--owner", "someone"])
            .run()
            .expect(3);
        if out.stderr.contains(c) {
            shown_raw.push(format!("U+{:04X} (busy)", c as u32));
        }
    }
    let inspect = store.fence().args(["inspect"]).run().expect(0).stdout;
    for c in invisible {
        if inspect.contains(c) {
            shown_raw.push(format!("U+{:04X} (inspect)", c as u32));
        }
    }
    assert!(
        shown_raw.is_empty(),
        "printed raw, so `deploy` and `deploy`+it look the same: {shown_raw:?}\n{inspect}"
    );
}

// ---------------------------------------------------------------------------------------------
// 5. A hint's command for a resource whose name starts with `-`.
// ---------------------------------------------------------------------------------------------

/// FINDING: a resource may be named `-x` (`fence acquire -- -x`: names are any 1–200 bytes
/// without controls, DESIGN §1), and every hint that suggests a command names it through
/// `shell_word`, which quotes shell metacharacters but leaves a leading `-`: busy says
/// "`fence inspect -x` shows the holder", a token never issued "`fence inspect -x` shows the
/// current lease". Run as written, that command is a usage error (exit 2, "unexpected
/// argument '-x'"), not the inspection the hint promises. The fix belongs where hints name a
/// resource (src/error.rs `hint`, `hint_in`; src/coordinator/mod.rs): `--` before a name
/// that starts with `-` (or always).
#[test]
fn a_hint_for_a_resource_named_like_an_option_runs_as_written() {
    let store = Store::new(Backend::File);
    store
        .fence()
        .args(["acquire", "--owner", "a", "--ttl", "10m", "--", "-x"])
        .run()
        .expect(0);
    let mut wrong = Vec::new();
    for (args, code) in [
        (vec!["acquire", "--owner", "b", "--", "-x"], 3),
        (vec!["renew", "--owner", "a", "--token", "5", "--", "-x"], 6),
    ] {
        let out = store.fence().args(&args).run().expect(code);
        let hint = out
            .stderr
            .lines()
            .find_map(|l| l.strip_prefix("hint: "))
            .unwrap_or_else(|| panic!("a hint: {out:?}"));
        let command = hint
            .split('`')
            .find(|part| part.starts_with("fence ") && part.contains(" inspect "))
            .unwrap_or_else(|| panic!("the hint names an inspect command: {hint}"));
        // The hint's command, as a person pastes it into sh.
        let ran = common::clean_command("sh", store.home.path())
            .args([
                "-c",
                &format!("fence() {{ \"$FENCE_BIN\" \"$@\"; }}; {command}"),
            ])
            .env("FENCE_BIN", common::fence_bin())
            .output()
            .expect("sh runs");
        let ran = Out::from(ran);
        if ran.code != 0 || !ran.stdout.contains("held") {
            wrong.push(format!("`{command}` (from `fence {}`): {ran:?}", args[0]));
        }
    }
    assert!(
        wrong.is_empty(),
        "a hint's command does not run as written:\n{}",
        wrong.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// 6. The eval idiom with a mistyped format value.
// ---------------------------------------------------------------------------------------------

/// FINDING: DESIGN §10, "Fail closed: no documented idiom runs the guarded step when fence
/// failed". `--format env` failures print `(exit N)` so that `eval` fails, and a parse error
/// does so too when the command line says `--format env` exactly (`cli::refused`). A value
/// typed as `Env` or `ENV` is refused (exit 2, right), but as a human-format failure: stdout is
/// empty, `eval ""` succeeds, and the README's idiom `eval "$(fence acquire … --format env)"
/// && echo "working under token $FENCE_TOKEN"` goes on, unguarded, with no lease. The fix
/// belongs in `cli::refused` (src/cli.rs): a `--format` value it cannot read (or one equal to
/// `env` but for case) gets the env failure on stdout, a comment and `(exit 2)`, which is
/// harmless to a person and stops `eval`.
#[test]
fn a_mistyped_env_format_does_not_let_eval_go_on() {
    let store = Store::new(Backend::File);
    let mut wrong = Vec::new();
    // Any value fence cannot read, a typo's too, not only another case of `env`.
    for value in ["Env", "ENV", "evn"] {
        let guarded = store.home.path().join(format!("guarded-{value}"));
        let script = format!(
            "eval \"$(\"$FENCE_BIN\" --store \"$STORE\" acquire job --ttl 5m --format {value})\" && touch '{}'",
            guarded.display()
        );
        let out = Out::from(
            common::clean_command("sh", store.home.path())
                .args(["-c", &script])
                .env("FENCE_BIN", common::fence_bin())
                .env("STORE", &store.url)
                .output()
                .expect("sh runs"),
        );
        if guarded.exists() || out.code != 2 {
            wrong.push(format!(
                "--format {value}: the guarded step ran (exit {}): {out:?}",
                out.code
            ));
        }
    }
    assert_eq!(store.lease("job"), None, "nothing was acquired");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
