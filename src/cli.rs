//! The command line, as clap types only. Each doc comment here is the `--help` text, the man
//! page and the completion hint at once; validation of values lives in [`crate::config`].

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{
    parse_above, parse_instant, parse_name, parse_resource, parse_run_owner, parse_schema,
    parse_token, parse_ttl, parse_wait, parse_write_id, parse_write_timeout, DEFAULT_TTL,
};
use crate::error::Error;
use crate::exit::Exit;
use crate::timeline::EventKind;

/// The PostgreSQL schema fence's tables live in unless `--schema` says otherwise.
pub const DEFAULT_SCHEMA: &str = "fence";

/// Leases with fencing tokens, so a paused former owner can never write after a newer one.
///
/// A coordinator (PostgreSQL, an S3 or GCS bucket, or a local directory) grants a lease on a
/// RESOURCE with a fencing token strictly greater than every token granted before for that
/// resource. Pass the token to whatever you protect; a write that carries an older token is
/// stale and must be refused.
#[derive(Debug, Parser)]
#[command(
    name = "fence",
    version,
    max_term_width = 100,
    after_long_help = after_long_help(),
    help_expected = true,
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,

    #[command(subcommand)]
    pub command: Command,
}

/// Options every subcommand accepts, before or after its name.
#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`,
    /// or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence`
    /// (or `$HOME/.local/state/fence`).
    #[arg(
        long,
        global = true,
        env = "FENCE_STORE",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub store: Option<String>,

    /// The PostgreSQL schema that holds fence's own tables.
    #[arg(
        long,
        global = true,
        env = "FENCE_SCHEMA",
        default_value = DEFAULT_SCHEMA,
        value_name = "NAME",
        value_parser = parse_schema
    )]
    pub schema: String,

    /// Output format: `human` tables and sentences, one `json` object, `env` lines for `eval`
    /// (acquire only), or `ndjson`, one JSON object per event (log only). With `json`,
    /// warnings are not printed on stderr but carried in the object's `notices` array of
    /// strings (absent when there is none); `run` prints them on stderr too, as they come.
    #[arg(long, global = true, value_enum, default_value_t = Format::Human)]
    pub format: Format,

    /// Print nothing on success, and no warnings; errors are still reported on stderr.
    #[arg(short, long, global = true)]
    pub quiet: bool,

    /// When to colour diagnostics (`NO_COLOR` is honoured with `auto`).
    #[arg(long, global = true, value_enum, default_value_t = ColorChoice::Auto, value_name = "WHEN")]
    pub color: ColorChoice,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Sentences and tables for people.
    Human,
    /// Exactly one JSON object on stdout, on success and on failure; warnings in its
    /// `notices` array.
    Json,
    /// Shell-quoted `export FENCE_…=…` lines (acquire only).
    Env,
    /// One JSON object per line, one line per event (log only), for `jq` and log shippers.
    Ndjson,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ColorChoice {
    /// Colour when stderr is a terminal and `NO_COLOR` is unset.
    Auto,
    /// Always colour.
    Always,
    /// Never colour.
    Never,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    Acquire(AcquireArgs),
    Run(RunArgs),
    Renew(RenewArgs),
    Release(ReleaseArgs),
    Inspect(InspectArgs),
    Log(LogArgs),
    Metrics(MetricsArgs),
    Write(Box<WriteArgs>),
    Protect(ProtectArgs),
    Grant(GrantArgs),
    Init(InitArgs),
    Doctor(DoctorArgs),
    Bench(BenchArgs),
    Prune(PruneArgs),
}

impl Command {
    /// The `op` field of the JSON output.
    pub fn op(&self) -> &'static str {
        match self {
            Command::Acquire(_) => "acquire",
            Command::Run(_) => "run",
            Command::Renew(_) => "renew",
            Command::Release(_) => "release",
            Command::Inspect(_) => "inspect",
            Command::Log(_) => "log",
            Command::Metrics(_) => "metrics",
            Command::Write(_) => "write",
            Command::Protect(_) => "protect",
            Command::Grant(_) => "grant",
            Command::Init(_) => "init",
            Command::Doctor(_) => "doctor",
            Command::Bench(_) => "bench",
            Command::Prune(_) => "prune",
        }
    }
}

/// Take a lease on RESOURCE and print its fencing token
///
/// Free or expired: granted with a new token, greater than every token granted before for
/// RESOURCE. Held by the same owner: the same lease and token, with its expiry extended
/// (`reacquired`), so retrying after a lost answer is safe. Held by another owner: exit 3
/// (`busy`), naming the holder, its token and when it expires.
///
/// With --format env a failure prints a comment and `(exit N)`, so that `eval` fails too:
///
/// Examples:
///   fence acquire nightly-report --ttl 5m
///
///   eval "$(fence acquire nightly-report --ttl 5m --format env)" || exit $?
///   step_one
///   fence release
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct AcquireArgs {
    /// The resource to lock: 1–200 bytes, no control characters, no surrounding spaces.
    #[arg(value_parser = parse_resource)]
    pub resource: String,

    /// Who holds the lease. Default: `<hostname>/<pid>/<8 hex>`, reported in the output.
    #[arg(long, env = "FENCE_OWNER", value_name = "ID", value_parser = parse_name)]
    pub owner: Option<String>,

    /// How long the lease lasts unless renewed (100ms to 24h), by the coordinator's clock.
    #[arg(long, default_value = DEFAULT_TTL, value_name = "DURATION", value_parser = parse_ttl)]
    pub ttl: Duration,

    /// When busy, wait until granted, at most DURATION (forever without one); then exit 3.
    /// On PostgreSQL waiters queue in arrival order and a release wakes the first.
    #[arg(
        long,
        value_name = "DURATION",
        num_args = 0..=1,
        default_missing_value = "forever",
        value_parser = parse_wait
    )]
    pub wait: Option<Duration>,

    /// Recovery, not for routine use: grant a token above N as well as above every token
    /// this store issued for RESOURCE.
    ///
    /// For when a target fenced by another store (or by none) accepted a token this store never
    /// issued (a made-up `--token 99`) and now refuses the real holder as stale: `fence inspect
    /// RESOURCE --target URL` names the highest token the target accepted; acquire above it,
    /// then release, and later grants continue above it (docs/postgres-targets.md, "A token
    /// the store never issued"). Tokens never go down, so the jump is for good. Another
    /// owner's live lease: busy (exit 3), as always. The same owner's live lease with a token
    /// not above N: exit 2 (release it first). Never waits (not with --wait).
    #[arg(long, value_name = "N", conflicts_with = "wait", value_parser = parse_above)]
    pub above: Option<i64>,
}

/// Run a command while holding a lease, and stop it if the lease is lost.
///
/// Acquires RESOURCE, starts COMMAND in its own process group with FENCE_STORE,
/// FENCE_SCHEMA, FENCE_RESOURCE, FENCE_OWNER and FENCE_TOKEN set, and renews the lease about
/// every TTL/3. Nothing COMMAND starts runs once another owner can hold the lease: every
/// process it forks (also after setsid or a double fork) stays a descendant of fence, in a
/// cgroup of the run's own where fence may make one (`fence doctor` says), and is
/// stopped by the bound = when the last renewal was sent + TTL - min(TTL/10, 1s), by this
/// machine's clock (a suspend counts). A renewal not proven in time: SIGTERM min(--kill-after,
/// TTL/5) before the bound, SIGKILL at it, and exit 5 (`unreachable`); a lease taken over or
/// expired: SIGKILL at once, exit 5. fence and its supervisor (`fence __reaper`) each enforce
/// the bound, so either may be paused or killed (exit 5, `supervisor_lost`). A process that
/// will not die on SIGKILL (uninterruptible sleep) keeps the lease renewed until it ends; if
/// the lease is lost meanwhile, exit 5 (`unkillable`) once it has ended. Not contained:
/// what another service starts for COMMAND (systemd-run, at), and a COMMAND that stops both.
/// SIGINT, SIGTERM and SIGHUP sent to fence are passed on to the group. When COMMAND ends,
/// what it left running gets SIGTERM, then SIGKILL after --kill-after (never past the bound),
/// while the lease is still renewed, and a note says so; then the lease is released and fence
/// exits with COMMAND's status (128+N if killed by signal N). Busy without --wait: exit 3,
/// COMMAND never started. Each run is on record in the store's history (`fence log
/// RESOURCE`): run_started (pid, host, program, process group), then run_finished (status,
/// duration) or run_stopped (why, the signal, when against the lease's bound).
///
/// Example (a cron job's command; an overlap with the previous run exits 0, silently; a run
/// still going after two hours is stopped, exit 124, so that a hung job does not hold the
/// lease forever):
///   fence run nightly-report --ttl 30s --max-time 2h --busy-exit-code 0 -q -- ./report.sh
///
/// Once a day at most (a run that completed today is skipped, exit 0; COMMAND gets
/// FENCE_RUN_ID for the ids of its writes, e.g. --id "$FENCE_RUN_ID-publish"):
///   fence run nightly-report --id "nightly-$(date -u -I)" --busy-exit-code 0 -q -- ./report.sh
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct RunArgs {
    /// The resource to hold while COMMAND runs.
    #[arg(value_parser = parse_resource)]
    pub resource: String,

    /// Names who runs it: the lease's owner is `ID/<pid>/<8 hex>`, unique to this run, so a
    /// second `fence run` with the same ID (a fixed FENCE_OWNER in a crontab) is busy and
    /// never shares the lease. Default: `<hostname>/<pid>/<8 hex>`.
    #[arg(long, env = "FENCE_OWNER", value_name = "ID", value_parser = parse_run_owner)]
    pub owner: Option<String>,

    /// Exit with CODE instead of 3 when the lease is busy (as flock's -E): `0` for a cron job
    /// whose overlap with its previous run is not an error. COMMAND still never starts.
    #[arg(long, value_name = "CODE")]
    pub busy_exit_code: Option<u8>,

    /// A run id, e.g. `nightly-2026-12-04` (1 to 64 of A-Z a-z 0-9 . _ - : @ +); default:
    /// FENCE_RUN_ID, unless an enclosing `fence run` set it. The command gets it as
    /// FENCE_RUN_ID (without one: `run-<token>-<8 random hex>`, unique to this run); derive
    /// write ids from it: `--id "$FENCE_RUN_ID-publish"`. Once the command exits 0 on its own
    /// (not interrupted, nothing of it left running), the run is recorded as completed in the
    /// store (as resource `RESOURCE#done:KEY`); a later run with the same
    /// id, once it holds the lease, starts nothing and exits 0 (or --done-exit-code), saying
    /// when and by whom it was completed; with other arguments, it starts nothing and exits 6
    /// (`"reason": "id_reused"`: one id, two different commands).
    #[arg(long, value_name = "KEY", value_parser = parse_write_id)]
    pub id: Option<String>,

    /// Exit with CODE instead of 0 when the run id was already completed (COMMAND never
    /// starts), to tell "already done" apart from "done now".
    #[arg(long, value_name = "CODE")]
    pub done_exit_code: Option<u8>,

    /// The lease length; fence renews about every third of it.
    #[arg(long, default_value = DEFAULT_TTL, value_name = "DURATION", value_parser = parse_ttl)]
    pub ttl: Duration,

    /// When busy, wait until granted, at most DURATION (forever without one); then exit 3.
    /// On PostgreSQL waiters queue in arrival order and a release wakes the first.
    #[arg(
        long,
        value_name = "DURATION",
        num_args = 0..=1,
        default_missing_value = "forever",
        value_parser = parse_wait
    )]
    pub wait: Option<Duration>,

    /// After SIGTERM to what COMMAND left running, wait this long before SIGKILL (at most 7
    /// days). A command whose lease cannot be proven gets SIGTERM this long before the bound
    /// (at most TTL/5) and SIGKILL at the bound: never later.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = crate::config::parse_kill_after)]
    pub kill_after: Duration,

    /// Stop COMMAND once it has run this long, as a hung job must not hold the lease forever:
    /// SIGTERM to everything it started, SIGKILL after --kill-after, then the lease is released
    /// (the next run need not wait for it to expire) and fence exits 124, as timeout(1) does
    /// (`"stopped": "max_time"` in the JSON answer, reason `max_time` in --metrics-file).
    #[arg(long, value_name = "DURATION", value_parser = parse_max_time)]
    pub max_time: Option<Duration>,

    /// When the run ends, write its outcome to PATH in the Prometheus text format, atomically
    /// (a temporary file renamed over it), for node_exporter's textfile collector: start, end,
    /// duration, time waited for the lease, token, exit status and reason (`ok`,
    /// `command_failed`, `already_done` when the run id was completed before, `busy`,
    /// `lease_lost`, …). Name it `*.prom` in the collector's directory.
    #[arg(long, value_name = "PATH")]
    pub metrics_file: Option<std::path::PathBuf>,

    /// The command and its arguments (after `--`).
    #[arg(required = true, last = true, value_name = "COMMAND")]
    pub command: Vec<std::ffi::OsString>,
}

/// Which lease a renew or release refers to: from flags, or from the variables
/// `fence acquire --format env` exports.
#[derive(Debug, Args)]
pub struct LeaseArgs {
    /// The resource the lease is on.
    #[arg(env = "FENCE_RESOURCE", value_parser = parse_resource)]
    pub resource: String,

    /// The owner that acquired the lease.
    #[arg(long, env = "FENCE_OWNER", value_name = "ID", value_parser = parse_name)]
    pub owner: String,

    /// The fencing token the lease was granted with.
    #[arg(
        long,
        env = "FENCE_TOKEN",
        value_name = "TOKEN",
        allow_hyphen_values = true,
        value_parser = parse_token
    )]
    pub token: i64,
}

/// Extend a lease you hold
///
/// Succeeds only if the lease still has this owner and token and has not expired. A newer
/// token exists: exit 4 (`stale_fencing_token`). Expired or released with no newer token:
/// exit 5 (`lease_lost`). A late renew never revives an expired lease and never touches a
/// newer owner's lease.
///
/// Example:
///   eval "$(fence acquire job --ttl 1m --format env)" || exit $?
///   step_one
///   fence renew || exit $?
///   step_two
///   fence release
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct RenewArgs {
    #[command(flatten)]
    pub lease: LeaseArgs,

    /// The new lease length from now (100ms to 24h). Default: the TTL it was acquired with.
    #[arg(long, value_name = "DURATION", value_parser = parse_ttl)]
    pub ttl: Option<Duration>,
}

/// Give a lease up so that another owner can take it at once
///
/// Conditional on owner and token; releasing twice succeeds. A newer token exists: exit 4,
/// nothing changed. The record is never deleted: the next lease gets a greater token.
///
/// Example:
///   fence release nightly-report --owner "$FENCE_OWNER" --token "$FENCE_TOKEN"
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct ReleaseArgs {
    #[command(flatten)]
    pub lease: LeaseArgs,
}

/// Show who holds what, with which token, and what happened lately
///
/// For each resource: state (held, expired, free), owner, token, when it was acquired and
/// renewed, and when it expires by the coordinator's clock; then the last events (acquired,
/// reacquired, renewed, released, taken over after expiry, renew/release rejected).
///
/// An answer of more than 1,000 resources from PostgreSQL is printed as it is read, a page at
/// a time: aligned lines instead of a table, and JSON with `ok` last (false, with the error,
/// if a later page cannot be read).
///
/// Examples:
///   fence inspect                     every resource, no events
///   fence inspect nightly-report      one resource and its last 5 events
///   fence inspect nightly-report --history 50 --format json
///   fence inspect nightly-report --target s3://bucket/out.csv --id nightly-2026-12-04-publish
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct InspectArgs {
    /// Resources to show. Default: every resource the store knows.
    #[arg(value_parser = parse_name)]
    pub resources: Vec<String>,

    /// Only resources in this state.
    #[arg(long, value_enum, value_name = "STATE")]
    pub state: Option<StateFilter>,

    /// At most N resources, N ≥ 1 (ordered by name); JSON's `next_after` names the cursor for
    /// the next page. Pages list the store, so not with named resources.
    #[arg(long, value_name = "N", conflicts_with = "resources", value_parser = clap::value_parser!(u64).range(1..))]
    pub limit: Option<u64>,

    /// Only resources named after RESOURCE (byte order): the next page after `--limit`.
    #[arg(
        long,
        value_name = "RESOURCE",
        conflicts_with = "resources",
        allow_hyphen_values = true
    )]
    pub after: Option<String>,

    /// How many recent events to show per resource. Default: 5 with named resources, 0 without.
    #[arg(long, value_name = "N")]
    pub history: Option<usize>,

    /// Also show the highest token this target has accepted for each resource: a PostgreSQL
    /// database written with `fence write`, or an object (`s3://`, `gs://`, `file://`) with
    /// its version and stored token.
    #[arg(long, value_name = "URL")]
    pub target: Option<String>,

    /// With --target (a PostgreSQL database): show instead whether TABLE and each partition
    /// and inheritance child below it is protected, for which resource, and whether fence's
    /// triggers are enabled (`always`: they fire whatever `session_replication_role` is).
    #[arg(long, value_name = "TABLE", requires = "target", conflicts_with_all = ["resources", "history"])]
    pub table: Option<String>,

    /// With --target and one RESOURCE: write id KEY's entry in the target's ledger — when,
    /// with which token and by whom it was applied (objects: the version it made) — or that
    /// it is not there (never applied; on an object, maybe older than its last 8 ids). Exit
    /// 0 either way; JSON's `applied` says which.
    #[arg(
        long,
        value_name = "KEY",
        requires = "target",
        conflicts_with_all = ["table", "history", "state", "limit", "after"],
        value_parser = parse_write_id
    )]
    pub id: Option<String>,
}

/// One ordered timeline of leases and fenced writes: who held what when, and what was refused
///
/// The store's events (acquired with TTL and expiry, renewed, released, taken over — with when
/// the lease it took over had expired — renew/release rejected; each `fence run`'s
/// `run_started`, `run_finished` and `run_stopped`: its command, status, and why and with which
/// signal it was stopped; `busy` and `conflict` for
/// acquisitions refused while another owner held the lease and renewals or releases of a lease
/// the caller did not hold, one line per owner and minute with a count, on the directory store
/// and PostgreSQL) of every resource, or of those --resource names, oldest first; each lease's
/// expiry as an `expired` event where nothing renewed or released it in time; and with
/// --target, each PostgreSQL target's fenced writes (accepted, with the rows they changed, and
/// rejected) or the writes an object accepted, interleaved by time (an object's refusals are
/// recorded in the store by the refused `fence write`). Integrity
/// warnings follow: a token that went down, a target that accepted a token above the highest
/// the store issued, a lease used past its TTL by the store's clock. Times are the store's
/// and the target's clocks. --follow keeps printing events as they happen (until SIGINT).
///
/// Examples:
///   fence log nightly-report --since 2h
///   fence log --resource 'nightly-*' --kind taken_over --kind write_rejected --format json
///   fence log --since 2026-12-04T02:50:00Z --until 2026-12-04T03:10:00Z --format ndjson
///   timeout --preserve-status -s INT 2 fence log --follow --format ndjson
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct LogArgs {
    /// Resources, or globs of them (`*`, `?`), as --resource: `fence log nightly-report`.
    #[arg(value_name = "RESOURCE")]
    pub names: Vec<String>,

    /// A resource, or a glob of them (`*` any run of characters, `?` one; `\*`, `\?`, `\\`
    /// the character itself); repeat for several. Default: every resource.
    #[arg(long = "resource", value_name = "GLOB")]
    pub resources: Vec<String>,

    /// Also show the fenced writes this PostgreSQL database accepted and refused, or the
    /// writes this object accepted (its current version and the ids it keeps); repeat for
    /// several. An object's refusals are in the store's history (`write_rejected`).
    #[arg(long = "target", value_name = "URL")]
    pub targets: Vec<String>,

    /// Only events at or after TIME: RFC 3339 with Z or an offset such as +02:00, a date and
    /// time without one (local time, as TZ says), or a span back from now such as `2h`.
    #[arg(long, value_name = "TIME", value_parser = parse_instant, allow_hyphen_values = true)]
    pub since: Option<i64>,

    /// Only events before TIME (as --since).
    #[arg(long, value_name = "TIME", value_parser = parse_instant, allow_hyphen_values = true)]
    pub until: Option<i64>,

    /// Only events of this owner, or of owners matching a glob (`fence run` owners are
    /// `ID/<pid>/<8 hex>`: `--owner 'ID/*'`; `\*`, `\?`, `\\` the character itself).
    #[arg(long, value_name = "GLOB", value_parser = parse_name)]
    pub owner: Option<String>,

    /// Only events with this fencing token.
    #[arg(long, value_name = "TOKEN", value_parser = parse_token)]
    pub token: Option<i64>,

    /// Only events of this kind (repeat for several).
    #[arg(long = "kind", value_name = "KIND", value_parser = event_kind())]
    pub kinds: Vec<EventKind>,

    /// At most N events from each source, the most recent (N ≥ 1); JSON says `truncated`.
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pub limit: u64,

    /// After the events so far, print each new one as it happens, one per line (human or
    /// ndjson), until SIGINT or SIGTERM; rides out a store or target that restarts. Polls:
    /// PostgreSQL every 50ms, other stores every 200ms; an expiry shows 2s after it.
    #[arg(long, short = 'f', conflicts_with = "until")]
    pub follow: bool,
}

/// Print the store's (and targets') state and history as Prometheus metrics
///
/// The Prometheus text format on stdout, for a textfile collector or a scrape wrapper: per
/// resource, the grants, takeovers, renewals, releases and refused renewals/releases the
/// history holds (`fence_lease_*_total`), whether it is held, by whom, its token, when its
/// lease expires, and who waits and since when; with --target, per PostgreSQL target and
/// resource, the fenced writes accepted and the stale writes refused. Totals are counted from
/// the history (PostgreSQL: one pass over the events table) and include the events `fence
/// prune` deleted or the directory store's retention cut (each keeps their counts), so they
/// never go down.
///
/// Example:
///   fence metrics --resource 'nightly-*' --target postgres://app@db/app
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct MetricsArgs {
    /// A resource, or a glob of them (`*` any run of characters, `?` one; `\*`, `\?`, `\\`
    /// the character itself); repeat for several. Default: every resource.
    #[arg(long = "resource", value_name = "GLOB")]
    pub resources: Vec<String>,

    /// Also count the fenced writes this PostgreSQL database accepted and refused (repeat).
    #[arg(long = "target", value_name = "URL")]
    pub targets: Vec<String>,
}

/// Write to a protected PostgreSQL database or an object with your fencing token.
///
/// Transaction form (--sql, --file): runs the SQL in one READ COMMITTED transaction that
/// first advances the target's guard row for RESOURCE to TOKEN, only if TOKEN is at least
/// the highest token the target has accepted; the transaction sees `fence.resource` and
/// `fence.token` (transaction-local). A newer token has written: rolled back, exit 4,
/// nothing changed. The SQL itself fails: rolled back, exit 1 (`sql_failed`). Sent in one
/// round trip. Writes with the same token are applied one after the other, in commit order.
///
/// Row form (--table, --key, --set): one conditional UPDATE of the row with that key, only
/// if its token column is at most TOKEN (NULL counts as 0), writing TOKEN into it. A newer
/// token is stored: exit 4. No such row: exit 6 (or insert it with --upsert). The key must
/// name one row: a primary key or unique index on --key columns, else exit 2.
///
/// Examples (the token is the one `fence acquire` granted, from FENCE_TOKEN; never type one):
///   eval "$(fence acquire report --format env)" || exit $?
///   fence write report --target postgres://app@db/app --sql "UPDATE totals SET n = n + 1"
///   fence write report --target postgres://app@db/app --file migrate.sql
///   fence write report --target postgres://app@db/app \
///       --table jobs --key id=42 --set state=done --upsert
///
/// Object form (--from; --target s3://bucket/key, gs://bucket/key or file:///dir/name):
/// reads the object's version and its `fence-token` metadata, refuses a newer stored token
/// (exit 4), and writes the bytes conditioned on exactly the version read (create-only when
/// absent), storing `fence-token`, `fence-resource` and `fence-owner` as metadata. Your own
/// --if-match / --if-generation-match not met: exit 6. A concurrent writer that wins the race
/// is read once more: newer token, exit 4; otherwise exit 6. No blind retries. On S3 the
/// version is an ETag, a hash of the bytes: a newer writer storing identical bytes between
/// fence's read and its put goes unnoticed (see docs/object-stores.md, The S3 ETag ABA
/// window); GCS and file:// generations never repeat.
///
///   eval "$(fence acquire report --format env)" || exit $?
///   fence write report --target s3://bucket/reports/today.csv --from today.csv
///   some-command | fence write report --target gs://bucket/out.json --from -
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
#[command(group(clap::ArgGroup::new("form").required(true).args(["sql", "file", "table", "from"])))]
pub struct WriteArgs {
    /// The resource whose token guards the write.
    #[arg(env = "FENCE_RESOURCE", value_parser = parse_resource)]
    pub resource: String,

    /// Your fencing token for RESOURCE.
    #[arg(
        long,
        env = "FENCE_TOKEN",
        value_name = "TOKEN",
        allow_hyphen_values = true,
        value_parser = parse_token
    )]
    pub token: i64,

    /// Whether the token came from FENCE_TOKEN while RESOURCE was given on the command line:
    /// then FENCE_RESOURCE, when set, must name the same resource (filled in after parsing).
    #[arg(skip)]
    pub token_from_env_for: Option<String>,

    /// Recorded with the write as who made it.
    #[arg(long, env = "FENCE_OWNER", value_name = "ID", value_parser = parse_name)]
    pub owner: Option<String>,

    /// Where to write: `postgres://user@host/db` (libpq rules, as --store), or an object:
    /// `s3://bucket/key`, `gs://bucket/key`, `file:///dir/name`.
    #[arg(long, value_name = "URL")]
    pub target: String,

    /// Object form: the bytes to store (`-`: standard input). From 1 MiB up, a progress bar
    /// on a terminal shows the bytes sent (not with -q or --format json).
    #[arg(long, value_name = "FILE")]
    pub from: Option<std::path::PathBuf>,

    /// Object form: write only if the object's ETag is ETAG (S3).
    #[arg(long, value_name = "ETAG", requires = "from")]
    pub if_match: Option<String>,

    /// Object form: write only if the object's generation is N (GCS, file://); 0: only if
    /// the object does not exist (on S3 too).
    #[arg(long, value_name = "N", requires = "from")]
    pub if_generation_match: Option<u64>,

    /// SQL to run in the fenced transaction (one or more statements).
    #[arg(long, value_name = "SQL")]
    pub sql: Option<String>,

    /// Read the SQL from a file (`-`: standard input).
    #[arg(long, value_name = "PATH")]
    pub file: Option<std::path::PathBuf>,

    /// A write id (idempotency key), e.g. `publish-2026-12-04`: 1 to 64 of A-Z a-z 0-9 . _ -
    /// : @ +. Recorded with the effect, atomically (transaction form: in the same transaction;
    /// objects: in the object's metadata, by the same conditional put), with a digest of the
    /// SQL or bytes. A write whose id was already applied — by anyone, with any token — writes
    /// nothing: the same SQL or bytes exit 0 (`"replayed": true`); other SQL or bytes exit 6
    /// (`"reason": "id_reused"`: one id, two different writes). After exit 8, run the same
    /// command again: it says whether the first one landed. Under `fence run --id`, derive
    /// one per write from `$FENCE_RUN_ID`. Objects remember their last 8 ids; PostgreSQL keeps
    /// them until deleted.
    #[arg(long, value_name = "KEY", value_parser = parse_write_id)]
    pub id: Option<String>,

    /// Transaction and row forms: the longest the fenced transaction (or the row's update)
    /// may take (100ms to 24h). The server cancels it then, and it can never commit later,
    /// even if fence is gone; fence exits 7 (nothing applied). SIGINT, SIGTERM and SIGHUP
    /// cancel it the same way. A `file://` object: the longest its lock file is waited for
    /// (exit 7, nothing written).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_write_timeout)]
    pub timeout: std::time::Duration,

    /// Row form: the table to write (`TABLE` or `SCHEMA.TABLE`, as named in the database).
    #[arg(long, value_name = "TABLE")]
    pub table: Option<String>,

    /// Row form: a key column and its value; repeat for composite keys.
    #[arg(long = "key", value_name = "COL=VALUE", requires = "table")]
    pub keys: Vec<String>,

    /// Row form: a column to set and its value; repeat for more.
    #[arg(long = "set", value_name = "COL=VALUE", requires = "table")]
    pub sets: Vec<String>,

    /// Row form: the column holding each row's token.
    #[arg(
        long,
        value_name = "COL",
        default_value = "last_fencing_token",
        requires = "table"
    )]
    pub token_column: String,

    /// Row form: insert the row (keys, values and token) when no row has the key.
    #[arg(long, requires = "table")]
    pub upsert: bool,
}

/// Make every write to a table go through the fence.
///
/// Installs (idempotently) statement-level triggers so that every INSERT, UPDATE, DELETE and
/// TRUNCATE on TABLE must run in a transaction that `fence write` (or
/// `SELECT <schema>.begin_write(resource, token, who)`) has bound to a current token for
/// RESOURCE. Raw psql, an ORM or a forgotten admin script are refused with SQLSTATE LF001
/// (no token), LF002 (stale token) or LF003 (no guard row yet). --remove restores plain access.
///
/// The triggers go on TABLE and on every partition and inheritance child below it, which are
/// listed. Run by a superuser, fence also installs an event trigger that protects partitions
/// and children added later; otherwise run `fence protect` again after adding them. Views
/// and foreign tables cannot be protected (exit 2). Run it as the admin who owns the tables,
/// never as the application's role.
///
/// Example:
///   fence protect --target postgres://admin@db/app --table totals --resource report
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct ProtectArgs {
    /// The database holding the table.
    #[arg(long, value_name = "URL")]
    pub target: String,

    /// The table to protect (`TABLE` or `SCHEMA.TABLE`).
    #[arg(long, value_name = "TABLE")]
    pub table: String,

    /// The resource whose tokens guard the table.
    #[arg(long, value_parser = parse_resource, required_unless_present = "remove")]
    pub resource: Option<String>,

    /// Remove the triggers instead, from TABLE and everything below it (refused for a
    /// partition or child of a protected table: it would open a hole in that protection).
    #[arg(long)]
    pub remove: bool,
}

/// Measure the store as your jobs would use it, before choosing a TTL.
///
/// In-process workers, each with its own connection, loop acquire → (optional fenced write to
/// --write-target) → (optional renew) → release for --duration, and report critical sections
/// per second, refused acquisitions per second, acquire latency, hand-off latency (from one
/// holder's release to the next holder's grant), renewals and stale rejections.
///
/// Modes: `contend` — every worker on one hot resource, waiting as `--wait` does;
/// `spread` — workers on --resources resources picked at random, refused when busy;
/// `handoff` — like contend, with each holder keeping the lease for --hold, to time hand-offs.
///
/// The bench works in a scratch namespace of the store (schema `fence_bench_<pid>_<hex>` on
/// PostgreSQL, a `bench-<pid>-<hex>` directory or prefix elsewhere) and removes it afterwards.
///
/// Example:
///   fence bench --store postgres://app@db/app --workers 16 --duration 10s --mode contend
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct BenchArgs {
    /// Concurrent workers, each with its own connection.
    #[arg(long, default_value_t = 8, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub workers: u32,

    /// Resources to spread over (`spread` mode).
    #[arg(long, default_value_t = 100, value_name = "K", value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub resources: u32,

    /// How long to run.
    #[arg(long, default_value = "5s", value_name = "DURATION", value_parser = parse_ttl)]
    pub duration: Duration,

    /// What to measure.
    #[arg(long, value_enum, default_value_t = BenchMode::Contend)]
    pub mode: BenchMode,

    /// The lease length the workers ask for.
    #[arg(long, default_value = "5s", value_name = "DURATION", value_parser = parse_ttl)]
    pub ttl: Duration,

    /// How long each holder keeps the lease (`handoff` mode; default 1ms).
    #[arg(long, default_value = "1ms", value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub hold: Duration,

    /// Renew once in every critical section.
    #[arg(long)]
    pub renew: bool,

    /// Before timing, create all K resources as free leases (`spread` mode, PostgreSQL), so
    /// that every acquire finds its row in a table of K: how acquire scales with the number
    /// of resources (compare `--resources 100` with `--resources 1000000`).
    #[arg(long)]
    pub prefill: bool,

    /// Also make one fenced write (an empty fenced transaction) per critical section to this
    /// PostgreSQL database, in the bench's scratch schema.
    #[arg(long, value_name = "URL")]
    pub write_target: Option<String>,

    /// PostgreSQL: the scratch schema's `held_waiters` (see `fence init --held-waiters`), to
    /// measure what a setting would do before giving it to the store. Default: the default (8).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i64).range(2..=1000))]
    pub held_waiters: Option<i64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BenchMode {
    /// Every worker on one resource, blocking until granted.
    Contend,
    /// Workers on many resources, refused when busy.
    Spread,
    /// Like contend, holding each lease for --hold.
    Handoff,
}

/// A resource state for `inspect --state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StateFilter {
    Held,
    Expired,
    Free,
}

/// Create or migrate fence's own tables in the store, or in a target (safe to run again).
///
/// Other commands create them on first use when the store allows it; run `fence init` ahead
/// of time when the account fence runs as may not create tables.
///
/// With --target, prepares fence's schema in that PostgreSQL database instead. Run it as the
/// admin: the schema's owner can bypass `fence protect`, so an application's role must never
/// own it. Then `fence grant` gives the application's role what it needs.
///
/// Example:
///   fence init --target postgres://admin@db/app
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct InitArgs {
    /// Prepare fence's schema in this PostgreSQL database rather than the store.
    #[arg(long, value_name = "URL")]
    pub target: Option<String>,

    /// PostgreSQL store: how many `--wait` waiters of one resource may keep their connection
    /// while they wait (2–1000, default 8; kept in the store, for every waiter). Those near
    /// the head keep theirs when the queue moves fast: up to 8 (or N, if fewer) listen for
    /// the release, the others poll on it; the rest reconnect for each poll. Raise it for a hot resource with
    /// many waiters: with 64 waiters on one resource, hand-overs ran 5–10 times faster with
    /// 64 than with 8 (docs/performance.md), at up to N+2 connections per busy resource,
    /// which the role's CONNECTION LIMIT must allow (`fence doctor` sizes it with N).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i64).range(2..=1000), conflicts_with = "target")]
    pub held_waiters: Option<i64>,
}

/// Give a role exactly what a fenced writer (or a reader) needs in a target database.
///
/// A writer gets USAGE on fence's schema, EXECUTE on the functions `fence write` calls
/// (begin_write, note_rejected, write_row, …) and SELECT on the guard rows and write events
/// (for `fence inspect --target`); a reader (--reader) gets USAGE and SELECT only. Nothing
/// granted defeats `fence protect`: no write on fence's tables, no ownership, no TRIGGER. A
/// writer that can already write around `protect` through any role it can become is refused
/// (exit 2, naming how): a superuser or member of one, the owner of fence's objects, of the
/// database, of a protected table, its schema or what it depends on, one with TRIGGER on a
/// protected table or any write on fence's tables. `fence doctor --target` checks the same as
/// the application connects. Grants on the application's own tables are yours to give.
///
/// Examples:
///   fence grant --target postgres://admin@db/app --role app_writer
///   fence grant --target postgres://admin@db/app --role app_reader --reader --print
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct GrantArgs {
    /// The database whose fence schema to grant access to (connect as its admin).
    #[arg(long, value_name = "URL")]
    pub target: String,

    /// The role to grant to, as named in the database.
    #[arg(long, value_name = "ROLE")]
    pub role: String,

    /// Grant read access only (inspect), not the write path.
    #[arg(long)]
    pub reader: bool,

    /// Print the SQL instead of running it.
    #[arg(long)]
    pub print: bool,
}

/// Check the store and targets for set-ups that weaken fence's guarantees
///
/// Reports, without changing anything, each finding as ok, warn or fail, with what it means
/// and how to fix it. This host: what `fence run` can contain (subreapers, /proc, a cgroup of
/// each run's own, tried), and processes of a run that outlived it. PostgreSQL: server version, asynchronous standbys (a failover can lose
/// the last granted tokens), a pooler or proxy in between (LISTEN degrades to polling), who
/// owns fence's schema (an owner can bypass `protect`), write privileges granted to PUBLIC,
/// connection sizing (the role's CONNECTION LIMIT against the server's slots and the 10
/// connections one busy resource can use), the server's clock offset (informational). Directory store: network filesystems (flock is
/// not enough there), permissions, free space. `file://` object targets: their directory
/// (exists, writable, not writable by every user, local filesystem, free space). S3 and GCS:
/// endpoint, credentials, the S3 ETag window. With --held-over, every lease held longer than
/// that (a hung job?) is a warning. Exit 0 when nothing fails, 2 otherwise; --format json for
/// monitoring.
///
/// Examples:
///   fence doctor --store postgres://app@db/app --target postgres://app@db/app
///   fence doctor --held-over 2h --format json
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct DoctorArgs {
    /// Also check this target database or object (repeat for several).
    #[arg(long = "target", value_name = "URL")]
    pub targets: Vec<String>,

    /// Warn about each lease held longer than DURATION since it was granted (by the store's
    /// clock; renewals do not restart it): a job that hangs while holding its lease keeps
    /// every later run out (`--busy-exit-code 0 -q` cron jobs exit 0 silently).
    #[arg(long, value_name = "DURATION", value_parser = parse_held_over)]
    pub held_over: Option<Duration>,
}

/// Parses `doctor --held-over`: a duration above zero.
fn parse_held_over(value: &str) -> Result<Duration, String> {
    match humantime::parse_duration(value) {
        Ok(limit) if limit.is_zero() => Err(
            "every lease is held longer than 0s; write the longest a job should hold it, e.g. 2h"
                .to_owned(),
        ),
        Ok(limit) => Ok(limit),
        Err(err) => Err(format!(
            "`{value}` is not a duration ({err}); write e.g. 30m, 2h"
        )),
    }
}

/// Delete old lease history (PostgreSQL); never the token counters
///
/// Deletes the events `inspect --history` shows that are older than DURATION by the
/// server's clock, of each RESOURCE or of every resource, except the last N events of each
/// resource (--keep). Lease rows are never touched, so each resource's highest token stays:
/// the next grant of a pruned resource still gets a token greater than all before it. The
/// records of completed run ids (`R#done:ID`) keep their events: they tell a retry of the same
/// command from another command reusing the id (`fence run --id`). Also
/// deletes the rows of dead waiters: a `--wait` killed or paused past its promised next poll
/// (a paused one that comes back joins the queue again at the back, as it would anyway).
///
/// Works in batches of 1,000 resources, one short transaction each; safe at any time (leases
/// keep being granted meanwhile) and to repeat. Exit 7: nothing was deleted, retry; exit 8:
/// the connection was lost midway, some batches may be deleted, run it again.
///
/// The directory store needs no pruning: a resource's log past 4 MiB is cut to its last
/// 10,000 events. Object stores are not supported yet (exit 2).
///
/// Examples:
///   fence prune --older-than 30d
///   fence prune --older-than 7d --keep 100 nightly-report
///   fence prune --older-than 90d --format json
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct PruneArgs {
    /// Resources whose history to prune. Default: every resource the store knows.
    #[arg(value_parser = parse_name)]
    pub resources: Vec<String>,

    /// Delete events older than this (e.g. 12h, 30d, 8w), by the server's clock.
    #[arg(long, value_name = "DURATION", value_parser = parse_age)]
    pub older_than: Duration,

    /// Keep at least the last N events of each resource, however old.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub keep: u32,
}

/// The longest `run --max-time`: a year (a longer one would overflow the clock it is kept
/// on, and no job that needs a bound needs that one).
const MAX_MAX_TIME: Duration = Duration::from_secs(366 * 24 * 3600);

/// Parses `run --max-time`: a duration above zero, at most [`MAX_MAX_TIME`].
fn parse_max_time(value: &str) -> Result<Duration, String> {
    match humantime::parse_duration(value) {
        Ok(limit) if limit.is_zero() => {
            Err("a command cannot be given no time to run; write e.g. 30m, 2h".to_owned())
        }
        Ok(limit) if limit > MAX_MAX_TIME => Err(format!(
            "`{value}` is longer than --max-time allows (366 days); leave --max-time out for no bound"
        )),
        Ok(limit) => Ok(limit),
        Err(err) => Err(format!(
            "`{value}` is not a duration ({err}); write e.g. 30m, 2h"
        )),
    }
}

/// Parses `prune --older-than`: any duration, 0s (everything) included.
fn parse_age(value: &str) -> Result<Duration, String> {
    humantime::parse_duration(value)
        .map_err(|err| format!("`{value}` is not a duration ({err}); write e.g. 12h, 30d, 8w"))
}

fn after_long_help() -> String {
    let mut text = String::from("Exit status:\n");
    for exit in Exit::ALL {
        text.push_str(&format!(
            "  {:<2} {:<22} {}\n",
            exit.code(),
            exit.names().join(", "),
            exit.meaning()
        ));
    }
    text.push_str(
        "\nEnvironment: FENCE_STORE, FENCE_SCHEMA, FENCE_RESOURCE, FENCE_OWNER, FENCE_TOKEN,\n\
         FENCE_LEASE_EXPIRES_AT (exported by acquire --format env), NO_COLOR, XDG_STATE_HOME;\n\
         PostgreSQL: PGHOST, PGPORT, PGUSER, PGPASSWORD, PGPASSFILE (~/.pgpass), PGSERVICE,\n\
         PGSERVICEFILE, PGSYSCONFDIR, PGDATABASE, PGSSLMODE, PGSSLROOTCERT, PGCONNECT_TIMEOUT;\n\
         S3: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION,\n\
         AWS_ENDPOINT_URL; GCS: GOOGLE_OAUTH_ACCESS_TOKEN, GOOGLE_APPLICATION_CREDENTIALS,\n\
         FENCE_GCS_ENDPOINT or STORAGE_EMULATOR_HOST.",
    );
    text
}

impl Cli {
    /// Parses the command line, and notes where values came from when that matters: a
    /// `fence write` whose token came from FENCE_TOKEN (left by `eval "$(fence acquire A
    /// --format env)"` or by `fence run A`) but whose resource was typed must not guard a
    /// write to another resource with A's token.
    ///
    /// First with `named_tree`, which builds only the named subcommand's options; a command
    /// line it refuses (help, version, a usage error, no subcommand) is parsed again with the
    /// whole tree, whose answer is the one given.
    pub fn parse_with_sources(args: &[std::ffi::OsString]) -> Result<Cli, clap::Error> {
        use clap::CommandFactory;
        Cli::parse_in(named_tree(), args).or_else(|_| Cli::parse_in(Cli::command(), args))
    }

    fn parse_in(tree: clap::Command, args: &[std::ffi::OsString]) -> Result<Cli, clap::Error> {
        use clap::parser::ValueSource;
        use clap::FromArgMatches;
        let matches = tree.try_get_matches_from(args)?;
        let mut cli = Cli::from_arg_matches(&matches)?;
        if let (Command::Write(write), Some(("write", sub))) =
            (&mut cli.command, matches.subcommand())
        {
            let from_env = |id: &str| sub.value_source(id) == Some(ValueSource::EnvVariable);
            if from_env("token") && !from_env("resource") {
                write.token_from_env_for = std::env::var("FENCE_RESOURCE").ok();
            }
        }
        Ok(cli)
    }
}

/// The command tree a command line is parsed with first: the global options and each
/// subcommand's name, its options built only once it is the one named (clap's `defer`).
/// Building every subcommand's options and help took 0.2 ms of each `fence` start (issue 37:
/// a tenth of `fence run`'s cost above `flock`). It has none of the help texts, `--version`
/// nor the required subcommand: what needs them is refused here and parsed with the whole
/// tree (`Cli::command()`, which `--help`, the man pages and the completions are made from).
fn named_tree() -> clap::Command {
    type Augment = fn(clap::Command) -> clap::Command;
    let subcommands: [(&str, Augment); 14] = [
        ("acquire", AcquireArgs::augment_args),
        ("run", RunArgs::augment_args),
        ("renew", RenewArgs::augment_args),
        ("release", ReleaseArgs::augment_args),
        ("inspect", InspectArgs::augment_args),
        ("log", LogArgs::augment_args),
        ("metrics", MetricsArgs::augment_args),
        ("write", WriteArgs::augment_args),
        ("protect", ProtectArgs::augment_args),
        ("grant", GrantArgs::augment_args),
        ("init", InitArgs::augment_args),
        ("doctor", DoctorArgs::augment_args),
        ("bench", BenchArgs::augment_args),
        ("prune", PruneArgs::augment_args),
    ];
    subcommands.into_iter().fold(
        GlobalArgs::augment_args(clap::Command::new("fence")),
        |tree, (name, augment)| tree.subcommand(clap::Command::new(name).defer(augment)),
    )
}

/// `--kind`: the known event kinds, by name (an unknown one is a usage error listing them).
/// Here, not in the domain type: the domain does not depend on clap.
fn event_kind() -> impl clap::builder::TypedValueParser<Value = EventKind> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(
        crate::timeline::KNOWN_KINDS
            .iter()
            .map(|kind| kind.as_str()),
    )
    .map(|name| EventKind::parse(&name))
}

/// What became of a command line clap refused.
pub enum Refused {
    /// Help or version was asked for, and printed.
    Shown,
    /// No command was given: the help went to stderr, as a usage error (exit 2).
    HelpForMissing,
    /// A usage error, for the subcommand `op` (or `fence`), in the format the command line
    /// asked for.
    Error {
        op: String,
        error: Error,
        format: Format,
    },
}

/// A command-line parse error as fence reports it: one line of cause and one of hint, for the
/// subcommand named. `--format json` anywhere on the command line turns even a parse error into
/// one JSON object (DESIGN §9), since the parser never got far enough to read the flag itself.
pub fn refused(err: &clap::Error, args: &[OsString]) -> Refused {
    use clap::error::ErrorKind;
    if matches!(
        err.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
    ) {
        let _ = err.print();
        return Refused::Shown;
    }
    let command = <Cli as clap::CommandFactory>::command();
    let names: Vec<&str> = command.get_subcommands().map(|c| c.get_name()).collect();
    let op = args
        .iter()
        .skip(1)
        .filter_map(|a| a.to_str())
        .find(|a| names.contains(a));
    // The --format values given, as written. One the parser could not read (`Env`, `evn`)
    // is answered as `env` is: `eval "$(fence acquire R --format Env)" && step` ran the
    // step with no lease when the answer was a human error on stderr and nothing on
    // stdout (review 18). Known names are read whatever their case.
    // fence's own arguments: not the command's after `--` (`fence run R -- tool --format x`).
    let own = args
        .iter()
        .position(|a| a == "--")
        .map_or(args, |end| &args[..end]);
    let given: Vec<String> = own
        .windows(2)
        .filter(|w| w[0] == "--format")
        .filter_map(|w| w[1].to_str())
        .chain(
            own.iter()
                .filter_map(|a| a.to_str()?.strip_prefix("--format=")),
        )
        .map(|value| value.trim().to_ascii_lowercase())
        .collect();
    let wants = |format: &str| given.iter().any(|value| value == format);
    let format = if wants("json") || wants("ndjson") {
        Format::Json
    } else if wants("env") || given.iter().any(|value| value != "human") {
        Format::Env
    } else {
        Format::Human
    };
    if err.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        // `fence` alone: the help as clap lays it out, on stderr, not flattened into one line
        // of error. (With any argument, `--format json` say, clap reports a missing command.)
        let _ = err.print();
        return Refused::HelpForMissing;
    }
    let (mut message, hint) = split_clap_message(&err.render().to_string(), op);
    if let Some(exact) = invalid_value_message(err) {
        message = exact;
    }
    Refused::Error {
        op: op.unwrap_or("fence").to_owned(),
        error: Error::usage(message, hint),
        format,
    }
}

/// For a value our parsers rejected: the message with the value quoted as typed, its control
/// characters escaped (a newline or an escape sequence must not reach the terminal raw).
fn invalid_value_message(err: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if err.kind() != ErrorKind::ValueValidation {
        return None;
    }
    let ContextValue::String(value) = err.get(ContextKind::InvalidValue)? else {
        return None;
    };
    let ContextValue::String(arg) = err.get(ContextKind::InvalidArg)? else {
        return None;
    };
    let cause = std::error::Error::source(err)?.to_string();
    let shown: String = value.chars().flat_map(char::escape_debug).collect();
    Some(format!("invalid value '{shown}' for '{arg}': {cause}"))
}

/// Turns clap's multi-line error into one line of cause and one line of hint.
fn split_clap_message(rendered: &str, op: Option<&str>) -> (String, String) {
    let mut cause = Vec::new();
    let mut usage = None;
    let mut tip = None;
    for line in rendered.lines().map(str::trim) {
        if line.is_empty() || line.starts_with("For more information") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("Usage:") {
            usage = Some(rest.trim().to_owned());
        } else if let Some(rest) = line.strip_prefix("tip:") {
            tip = Some(rest.trim().to_owned());
        } else {
            cause.push(
                line.strip_prefix("error:")
                    .unwrap_or(line)
                    .trim()
                    .to_owned(),
            );
        }
    }
    let message = cause.join(" ");
    let help = match op {
        Some(op) => format!("`fence {op} --help`"),
        None => "`fence --help`".to_owned(),
    };
    let hint = match (tip, usage) {
        (Some(tip), _) => format!("{tip}; see {help}"),
        (None, Some(usage)) => format!("usage: {usage}; see {help}"),
        (None, None) => format!("see {help}"),
    };
    (message, hint)
}

#[cfg(test)]
mod tests {
    /// Every subcommand is in the quick tree, in the whole tree's order: one left out would
    /// still parse (through the whole tree) but pay for building it.
    #[test]
    fn the_quick_tree_names_every_subcommand() {
        use clap::CommandFactory;
        let names = |tree: &clap::Command| -> Vec<String> {
            tree.get_subcommands()
                .map(|sub| sub.get_name().to_owned())
                .collect()
        };
        assert_eq!(names(&super::named_tree()), names(&super::Cli::command()));
    }

    /// A command line parses to the same `Cli` through the quick tree as through the whole
    /// one, and one the whole tree refuses is refused by the quick one too (then parsed again
    /// with the whole tree, whose error is shown): every example of every subcommand's help,
    /// and global options before and after the subcommand's name.
    #[test]
    fn a_command_line_parses_the_same_through_the_quick_tree() {
        use clap::CommandFactory;
        let mut lines: Vec<String> = Vec::new();
        let mut whole = super::Cli::command();
        for sub in whole.get_subcommands_mut() {
            let help = sub.render_long_help().to_string();
            lines.extend(
                help.lines()
                    .map(str::trim)
                    .filter(|line| line.starts_with("fence ") && !line.ends_with('\\'))
                    .filter(|line| !line.contains(['$', '|', '&', '"', '\'', '`', ';', '<', '>']))
                    // "fence inspect R      one resource and …": the command, not its gloss.
                    .map(|line| line.split("  ").next().unwrap_or(line).to_owned()),
            );
        }
        lines.extend(
            [
                "fence --store file:///tmp/x run r -- true",
                "fence run r --store file:///tmp/x --format json -- sh -c true",
                "fence -q acquire r --ttl 5m --owner me --wait 10s",
                "fence renew r --owner me --token 7 --ttl 1m",
                "fence release r --owner me --token 7 -q",
                "fence metrics --format json",
                "fence write r --token 3 --target postgres://app@db/app --file x.sql",
                "fence run r --id nightly --done-exit-code 0 -- true",
                "fence run r",
                "fence run -- true",
                "fence acquire",
                "fence",
                "fence --version",
                "fence run --help",
                "fence help run",
                "fence acquire r --ttl 5 minutes",
                "fence frobnicate r",
                "fence acquire r --color always --format env",
            ]
            .map(str::to_owned),
        );
        // `--since 2h` is an instant read from the clock as it is parsed: numbers of 12 digits
        // or more (milliseconds since 1970) are left out of the comparison.
        let instants = |cli: &super::Cli| -> String {
            let (mut out, mut digits) = (String::new(), String::new());
            for c in format!("{cli:?}").chars().chain(['.']) {
                if c.is_ascii_digit() {
                    digits.push(c);
                    continue;
                }
                out.push_str(if digits.len() >= 12 { "N" } else { &digits });
                digits.clear();
                out.push(c);
            }
            out
        };
        let mut parsed = std::collections::BTreeSet::new();
        for line in &lines {
            let args: Vec<std::ffi::OsString> = line.split(' ').map(Into::into).collect();
            let quick = super::Cli::parse_in(super::named_tree(), &args);
            let full = super::Cli::parse_in(super::Cli::command(), &args);
            match (&quick, &full) {
                (Ok(quick), Ok(full)) => {
                    assert_eq!(instants(quick), instants(full), "{line}");
                    parsed.insert(full.command.op());
                }
                (Err(_), Err(_)) => {}
                _ => panic!(
                    "{line}: quick tree {:?}, whole tree {:?}",
                    quick.is_ok(),
                    full.is_ok()
                ),
            }
        }
        // The quick tree did parse an example of every subcommand.
        assert_eq!(parsed.len(), whole.get_subcommands().count(), "{parsed:?}");
    }

    /// The parser stays at the edge (issue 34): no module but this one (and the docs
    /// generator, an example) names clap, so the domain never depends on it.
    #[test]
    fn only_the_command_line_module_knows_clap() {
        fn rust_files(dir: &std::path::Path, found: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).unwrap().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    rust_files(&path, found);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    found.push(path);
                }
            }
        }
        // Relative to where the test runs (cargo and nextest run it in the package's root):
        // a binary reused from a build in another checkout of the same sources would
        // otherwise look in that checkout.
        let src = std::path::Path::new("src");
        let mut files = Vec::new();
        rust_files(src, &mut files);
        let knowing: Vec<_> = files
            .iter()
            .filter(|f| !f.ends_with("src/cli.rs"))
            .filter(|f| {
                std::fs::read_to_string(f)
                    .unwrap()
                    .lines()
                    .any(|l| !l.trim_start().starts_with("//") && l.contains("clap::"))
            })
            .collect();
        assert!(knowing.is_empty(), "clap outside src/cli.rs: {knowing:?}");
    }

    use clap::Parser;

    use super::*;

    /// `--kind` takes the known kinds by name, and refuses any other, listing them.
    #[test]
    fn kinds_are_the_known_ones() {
        let cli = Cli::try_parse_from(["fence", "log", "--kind", "taken_over", "--kind", "busy"])
            .unwrap();
        let Command::Log(args) = cli.command else {
            panic!("not a log command")
        };
        assert_eq!(args.kinds, [EventKind::TakenOver, EventKind::Busy]);
        let err = Cli::try_parse_from(["fence", "log", "--kind", "teleported"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("teleported") && err.contains("taken_over") && err.contains("expired"),
            "{err}"
        );
    }
}
