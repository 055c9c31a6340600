//! The shell completions in `completions/` and the man pages in `man/` are generated from the
//! clap definition in `src/cli.rs` and the exit-code table in `src/exit.rs`, and checked in so
//! that packagers can ship them without building anything.
//!
//! Checked-in generated files drift silently: someone adds a flag, and the completions and man
//! pages keep describing the old command line. This test regenerates every file in memory and
//! fails if a checked-in file differs, is missing, or is no longer generated. After a deliberate
//! change to the command line, run `BLESS=1 cargo test --test generated` to rewrite them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use clap_complete::Shell;
use clap_mangen::roff::{bold, italic, line_break, roman, Roff};
use clap_mangen::Man;
use fence::cli::Cli;
use fence::exit::Exit;

/// The directories this test owns: everything in them must be generated.
const DIRS: [&str; 2] = ["completions", "man"];

/// Where each shell looks for a completion script named after the binary.
const SHELLS: [(Shell, &str); 5] = [
    (Shell::Bash, "completions/fence.bash"),
    (Shell::Zsh, "completions/_fence"),
    (Shell::Fish, "completions/fence.fish"),
    (Shell::PowerShell, "completions/_fence.ps1"),
    (Shell::Elvish, "completions/fence.elv"),
];

/// The ENVIRONMENT section of fence(1). Variables clap reads for an option are listed here too,
/// and [`environment_lists_every_env_option`] keeps the two in step.
const ENVIRONMENT: [(&str, &str); 31] = [
    (
        "FENCE_STORE",
        "The coordinator, as --store: postgres://user@host/db, s3://bucket/prefix, \
         gs://bucket/prefix or file:///dir.",
    ),
    (
        "FENCE_LEASE_EXPIRES_AT",
        "Exported by fence acquire --format env: when the lease expires, by the coordinator's \
         clock (RFC 3339 UTC). Informational; fence does not read it.",
    ),
    (
        "FENCE_SCHEMA",
        "The PostgreSQL schema that holds fence's own tables, as --schema (default fence).",
    ),
    (
        "FENCE_RESOURCE",
        "The resource renew and release act on when RESOURCE is not given; exported by \
         fence acquire --format env.",
    ),
    (
        "FENCE_OWNER",
        "The lease owner, as --owner; exported by fence acquire --format env.",
    ),
    (
        "FENCE_TOKEN",
        "The fencing token renew and release present, as --token; exported by \
         fence acquire --format env.",
    ),
    (
        "FENCE_RUN_ID",
        "The run id, as fence run --id (ignored when it is the FENCE_RUN_PARENT_ID an \
         enclosing fence run set). fence run sets it in its command's environment (run-TOKEN \
         without an id). fence write does not read it: derive write ids from it \
         (--id \"$FENCE_RUN_ID-publish\").",
    ),
    (
        "FENCE_RUN_PARENT_ID",
        "Set by fence run in its command's environment, to the same value as FENCE_RUN_ID, so \
         that a fence run inside the command does not take the enclosing run's id as its own.",
    ),
    (
        "NO_COLOR",
        "When set and not empty, --color auto does not colour diagnostics.",
    ),
    (
        "XDG_STATE_HOME",
        "With no store given, the default store is file://$XDG_STATE_HOME/fence (or \
         $HOME/.local/state/fence when it is unset or empty).",
    ),
    (
        "PGHOST",
        "Host name, or socket directory if it starts with /, when the URL names none; several \
         separated by commas. Default: /var/run/postgresql if it exists, else localhost.",
    ),
    ("PGPORT", "Port when the URL names none."),
    (
        "PGUSER",
        "User when the URL names none. Default: the operating-system user.",
    ),
    (
        "PGPASSWORD",
        "Password when neither the URL nor the service carries one.",
    ),
    (
        "PGPASSFILE",
        "The password file (default ~/.pgpass), read as libpq does when no other password is \
         given: host:port:database:user:password lines, ignored unless only its owner can read it.",
    ),
    (
        "PGSERVICE",
        "A connection service (as service= in the URL) whose settings fill what the URL leaves out.",
    ),
    (
        "PGSERVICEFILE",
        "The per-user service file (default ~/.pg_service.conf).",
    ),
    (
        "PGSYSCONFDIR",
        "Directory of the system service file pg_service.conf (default /etc/postgresql-common).",
    ),
    (
        "AWS_ACCESS_KEY_ID",
        "S3 credentials, with AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN.",
    ),
    ("AWS_SECRET_ACCESS_KEY", "S3 secret key."),
    ("AWS_SESSION_TOKEN", "S3 session token, for temporary credentials."),
    ("AWS_REGION", "S3 region (default us-east-1)."),
    (
        "AWS_ENDPOINT_URL",
        "An S3-compatible server to use instead of AWS (path-style requests).",
    ),
    (
        "GOOGLE_OAUTH_ACCESS_TOKEN",
        "A GCS bearer token (e.g. from gcloud auth print-access-token).",
    ),
    (
        "GOOGLE_APPLICATION_CREDENTIALS",
        "A GCS service-account JSON key file, exchanged for access tokens at its token_uri.",
    ),
    (
        "FENCE_GCS_ENDPOINT",
        "A GCS-compatible server to use instead of Google's (JSON API).",
    ),
    (
        "STORAGE_EMULATOR_HOST",
        "As FENCE_GCS_ENDPOINT, when that is unset.",
    ),
    ("PGDATABASE", "Database when the URL names none."),
    (
        "PGSSLMODE",
        "TLS mode when the URL has no sslmode: disable, prefer (the default), require, \
         verify-ca or verify-full. Unix sockets never use TLS.",
    ),
    (
        "PGSSLROOTCERT",
        "CA certificate for verify-ca and verify-full when the URL has no sslrootcert. \
         Default: ~/.postgresql/root.crt.",
    ),
    (
        "PGCONNECT_TIMEOUT",
        "Seconds to wait for the server to accept a connection when the URL has no \
         connect_timeout. Default: 10.",
    ),
];

#[test]
fn cli_definition_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn environment_lists_every_env_option() {
    fn collect(cmd: &clap::Command, out: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            if let Some(env) = arg.get_env() {
                out.push(env.to_string_lossy().into_owned());
            }
        }
        for sub in cmd.get_subcommands() {
            collect(sub, out);
        }
    }
    let mut envs = Vec::new();
    collect(&Cli::command(), &mut envs);
    let missing: Vec<_> = envs
        .iter()
        .filter(|env| !ENVIRONMENT.iter().any(|(name, _)| name == env))
        .collect();
    assert!(
        missing.is_empty(),
        "options read {missing:?} from the environment, but ENVIRONMENT in tests/generated.rs \
         does not describe them for fence(1)"
    );
}

#[test]
fn generated_files_are_up_to_date() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let generated = generate();
    let bless = std::env::var_os("BLESS").is_some_and(|v| !v.is_empty() && v != "0");

    let stale: Vec<PathBuf> = DIRS
        .iter()
        .flat_map(|dir| files_under(&root.join(dir)))
        .filter_map(|path| {
            let rel = path
                .strip_prefix(root)
                .expect("listed under root")
                .to_owned();
            (!generated.contains_key(&rel)).then_some(rel)
        })
        .collect();

    if bless {
        for (rel, contents) in &generated {
            let path = root.join(rel);
            if std::fs::read(&path).ok().as_ref() != Some(contents) {
                std::fs::create_dir_all(path.parent().expect("files live in a directory"))
                    .unwrap_or_else(|err| panic!("creating the directory of {rel:?}: {err}"));
                std::fs::write(&path, contents)
                    .unwrap_or_else(|err| panic!("writing {rel:?}: {err}"));
            }
        }
        for rel in &stale {
            std::fs::remove_file(root.join(rel))
                .unwrap_or_else(|err| panic!("removing stale {rel:?}: {err}"));
        }
        return;
    }

    let mut problems = String::new();
    for (rel, contents) in &generated {
        match std::fs::read(root.join(rel)) {
            Ok(on_disk) if &on_disk == contents => {}
            Ok(on_disk) => {
                let (line, want, have) = first_difference(contents, &on_disk);
                let _ = writeln!(
                    problems,
                    "  {}: differs from line {line}\n      generated: {want:?}\n      checked in: {have:?}",
                    rel.display()
                );
            }
            Err(_) => {
                let _ = writeln!(problems, "  {}: missing", rel.display());
            }
        }
    }
    for rel in &stale {
        let _ = writeln!(
            problems,
            "  {}: stale, not generated by this test",
            rel.display()
        );
    }
    assert!(
        problems.is_empty(),
        "checked-in files differ from what src/cli.rs, src/exit.rs and tests/generated.rs generate:\n{problems}\
         run `BLESS=1 cargo test --test generated` to regenerate"
    );
}

/// The README's exit-code table, between its markers, rendered from `src/exit.rs` like the
/// man pages and `--help`, so the three cannot drift.
#[test]
fn readme_exit_codes_come_from_the_exit_table() {
    const START: &str = "<!-- exit-codes: generated from src/exit.rs by tests/generated.rs -->\n";
    const END: &str = "<!-- exit-codes end -->";
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let (head, rest) = readme
        .split_once(START)
        .expect("README marks the exit-code table");
    let (current, tail) = rest
        .split_once(END)
        .expect("README ends the exit-code table");
    let mut table = String::from("| code | `error` | meaning |\n|---|---|---|\n");
    for exit in Exit::ALL {
        let names: Vec<String> = exit
            .names()
            .iter()
            .map(|n| {
                if *n == "-" {
                    "—".to_owned()
                } else {
                    format!("`{n}`")
                }
            })
            .collect();
        let _ = writeln!(
            table,
            "| {} | {} | {} |",
            exit.code(),
            names.join(", "),
            exit.meaning()
        );
    }
    let _ = writeln!(
        table,
        "| other | — | `fence run` passes on its command's status (128+N if it died of signal N) |"
    );
    if current == table {
        return;
    }
    if std::env::var_os("BLESS").is_some_and(|v| !v.is_empty() && v != "0") {
        std::fs::write(&path, format!("{head}{START}{table}{END}{tail}")).unwrap();
        return;
    }
    panic!("README's exit-code table differs from src/exit.rs; run `BLESS=1 cargo test --test generated`:\n{table}");
}

/// Every generated file, by path relative to the crate root.
fn generate() -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();

    for (shell, path) in SHELLS {
        let mut buf = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "fence", &mut buf);
        files.insert(PathBuf::from(path), buf);
    }

    // Built once so that every subcommand knows its `bin_name` (`fence acquire`, for the
    // SYNOPSIS) and `display_name` (`fence-acquire`, for the NAME and the file name), and has
    // the global options. `fence help` needs no page of its own.
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let source = format!("fence {}", cmd.get_version().unwrap_or_default());
    add_man_pages(&cmd, true, &source, &mut files);
    files
}

/// Adds the page for `cmd` and, recursively, for each of its visible subcommands.
fn add_man_pages(
    cmd: &clap::Command,
    top: bool,
    source: &str,
    files: &mut BTreeMap<PathBuf, Vec<u8>>,
) {
    let name = cmd.get_display_name().unwrap_or(cmd.get_name()).to_owned();
    let man = Man::new(cmd.clone())
        .title(name.to_uppercase())
        .source(source);
    let mut page = Vec::new();
    let out = &mut page;
    let io = |result: std::io::Result<()>| result.expect("writing to a Vec cannot fail");
    io(man.render_title(out));
    io(man.render_name_section(out));
    io(man.render_synopsis_section(out));
    io(man.render_description_section(out));
    if cmd.get_arguments().any(|arg| !arg.is_hide_set()) {
        io(man.render_options_section(out));
    }
    if cmd.get_subcommands().any(|sub| !sub.is_hide_set()) {
        io(man.render_subcommands_section(out));
    }
    // The top command's after-help is the plain-text exit table and environment list of
    // `--help`; ENVIRONMENT and EXIT STATUS below say the same in proper roff.
    if !top && (cmd.get_after_long_help().is_some() || cmd.get_after_help().is_some()) {
        io(man.render_extra_section(out));
    }
    let mut roff = Roff::new();
    if top {
        environment_section(&mut roff);
    }
    exit_status_section(&mut roff);
    if !top {
        roff.control("SH", ["SEE ALSO"]);
        roff.text([bold("fence"), roman("(1)")]);
    }
    io(roff.to_writer(out));
    if cmd.get_version().is_some() {
        io(man.render_version_section(out));
    }
    files.insert(PathBuf::from(format!("man/{name}.1")), once_preamble(page));

    for sub in cmd.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        add_man_pages(sub, false, source, files);
    }
}

/// Each `render_*` call and `Roff::to_writer` starts with the same two-line preamble (which
/// defines how apostrophes print); a page needs it once, at the top.
fn once_preamble(page: Vec<u8>) -> Vec<u8> {
    let preamble = Roff::new().render();
    let page = String::from_utf8(page).expect("roff output is UTF-8");
    let body = page
        .strip_prefix(&preamble)
        .expect("a page starts with the preamble");
    format!("{preamble}{}", body.replace(&preamble, "")).into_bytes()
}

fn environment_section(roff: &mut Roff) {
    roff.control("SH", ["ENVIRONMENT"]);
    roff.text([roman(
        "Command-line options take precedence over the variables they stand for. The PG \
         variables apply to postgres:// stores only, for whatever the URL leaves out, as in libpq.",
    )]);
    for (name, meaning) in ENVIRONMENT {
        roff.control("TP", []);
        roff.text([bold(name)]);
        roff.text([line_break(), roman(meaning)]);
    }
}

fn exit_status_section(roff: &mut Roff) {
    roff.control("SH", ["EXIT STATUS"]);
    roff.text([
        roman("Each status has a name; with "),
        bold("--format json"),
        roman(" it is the "),
        bold("error"),
        roman(" field of the output."),
    ]);
    for exit in Exit::ALL {
        roff.control("TP", []);
        roff.text([
            bold(exit.code().to_string()),
            roman(" "),
            italic(exit.name().unwrap_or("success")),
        ]);
        roff.text([line_break(), roman(exit.meaning())]);
    }
}

/// The regular files under `dir`, recursively; none if it does not exist.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.expect("reading a directory entry").path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// The 1-based number of the first line where `want` and `have` differ, and both lines there.
fn first_difference(want: &[u8], have: &[u8]) -> (usize, String, String) {
    let want = String::from_utf8_lossy(want);
    let have = String::from_utf8_lossy(have);
    let mut want_lines = want.lines();
    let mut have_lines = have.lines();
    let mut number = 1;
    loop {
        match (want_lines.next(), have_lines.next()) {
            (Some(w), Some(h)) if w == h => number += 1,
            (w, h) => {
                let show = |line: Option<&str>| line.unwrap_or("<end of file>").to_owned();
                return (number, show(w), show(h));
            }
        }
    }
}
