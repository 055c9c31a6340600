//! What `cargo run --example gen-docs` writes and `tests/suite/cli/generated.rs` compares: the shell
//! completions in `completions/`, the man pages in `man/` and the README's exit-code table, all
//! generated from the clap definition in `src/cli.rs` and the exit table in `src/exit.rs`.
//! The generator lives here, once; the example writes, the test only compares.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use clap_complete::Shell;
use clap_mangen::roff::{bold, italic, line_break, roman, Roff};
use clap_mangen::Man;
use fence::cli::Cli;
use fence::exit::Exit;

/// The directories the generator owns: everything in them must be generated.
pub const DIRS: [&str; 2] = ["completions", "man"];

/// The README's markers around its exit-code table.
pub const README_START: &str =
    "<!-- exit-codes: generated from src/exit.rs by `cargo run --example gen-docs` -->\n";
pub const README_END: &str = "<!-- exit-codes end -->";

/// Where each shell looks for a completion script named after the binary.
const SHELLS: [(Shell, &str); 5] = [
    (Shell::Bash, "completions/fence.bash"),
    (Shell::Zsh, "completions/_fence"),
    (Shell::Fish, "completions/fence.fish"),
    (Shell::PowerShell, "completions/_fence.ps1"),
    (Shell::Elvish, "completions/fence.elv"),
];

/// The ENVIRONMENT section of fence(1). Variables clap reads for an option are listed here too;
/// `tests/suite/cli/generated.rs` keeps the two in step.
pub const ENVIRONMENT: [(&str, &str); 34] = [
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
         enclosing fence run set). fence run sets it in its command's environment (run-TOKEN-RANDOM \
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
        "User when the URL names none. Default: the operating-system user (USER, else LOGNAME, \
         else the password database).",
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
    (
        "AWS_REGION",
        "S3 region (default us-east-1); AWS_DEFAULT_REGION when it is unset.",
    ),
    (
        "AWS_ENDPOINT_URL",
        "An S3-compatible server to use instead of AWS (path-style requests); AWS_ENDPOINT_URL_S3 comes first, AWS_ENDPOINT is the same as this (two that disagree are refused).",
    ),
    (
        "AWS_ALLOW_HTTP",
        "Whether S3 requests may go in plain HTTP (default: when the endpoint is http://).",
    ),
    (
        "AWS_PROXY_URL",
        "An HTTP proxy for S3 requests, with AWS_PROXY_CA_CERTIFICATE (PEM text) and AWS_PROXY_EXCLUDES; also AWS_USER_AGENT, AWS_ALLOW_INVALID_CERTIFICATES, AWS_HTTP1_ONLY, AWS_HTTP2_ONLY, AWS_CONNECT_TIMEOUT, as object_store reads them.",
    ),
    (
        "HTTPS_PROXY",
        "A forward proxy for S3 (without AWS_PROXY_URL) and GCS requests to https:// endpoints, read as curl reads it (upper case first); HTTP_PROXY for http:// endpoints, ALL_PROXY for both, NO_PROXY for hosts reached directly; none at all when REQUEST_METHOD is set (CGI). A store is proven again through each new proxy setting.",
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

/// Every generated file, by path relative to the crate root.
pub fn generate() -> BTreeMap<PathBuf, Vec<u8>> {
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
    files.insert(
        PathBuf::from(format!("man/{name}.1")),
        ascii_roff(once_preamble(page)),
    );

    for sub in cmd.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        add_man_pages(sub, false, source, files);
    }
}

/// The page in ASCII: `man` under the C locale (cron's, a container's) cannot show "…" and
/// warns about every one; groff's named characters have ASCII renderings on every device.
fn ascii_roff(page: Vec<u8>) -> Vec<u8> {
    let page = String::from_utf8(page).expect("roff output is UTF-8");
    let mut out = String::with_capacity(page.len());
    for c in page.chars() {
        match c {
            '…' => out.push_str("..."),
            '—' => out.push_str("\\(em"),
            '–' => out.push_str("\\(en"),
            '→' => out.push_str("\\(->"),
            '≥' => out.push_str("\\(>="),
            '≤' => out.push_str("\\(<="),
            c if c.is_ascii() => out.push(c),
            c => panic!("no ASCII form for {c:?} in a man page: add one to ascii_roff"),
        }
    }
    out.into_bytes()
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
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
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

/// The checked-in files under [`DIRS`] that the generator no longer makes, relative to `root`.
pub fn stale(root: &Path, generated: &BTreeMap<PathBuf, Vec<u8>>) -> Vec<PathBuf> {
    DIRS.iter()
        .flat_map(|dir| files_under(&root.join(dir)))
        .filter_map(|path| {
            let rel = path
                .strip_prefix(root)
                .expect("listed under root")
                .to_owned();
            (!generated.contains_key(&rel)).then_some(rel)
        })
        .collect()
}

/// The README with its exit-code table rendered from `src/exit.rs` (the man pages and `--help`
/// render the same table), or why the README cannot take it.
pub fn readme_with_exit_table(readme: &str) -> Result<String, &'static str> {
    let (head, rest) = readme
        .split_once(README_START)
        .ok_or("README does not mark its exit-code table")?;
    let (_, tail) = rest
        .split_once(README_END)
        .ok_or("README does not end its exit-code table")?;
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
        "| other | — | `fence run` passes on its command's status (128+N if it died of signal N), also when the lease was lost only after the command had finished (a warning says so); 124 when `--max-time` stopped it |"
    );
    Ok(format!("{head}{README_START}{table}{README_END}{tail}"))
}
