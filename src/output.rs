//! Everything fence prints goes through here: data on stdout, diagnostics on stderr, and
//! exactly one JSON object per invocation with `--format json` (DESIGN §4, §9).
//!
//! JSON wire format, shared by every command:
//! - success: `{"ok": true, "op": <subcommand>, …command fields…, "store": <redacted URL>}`
//! - failure: `{"ok": false, "op", "error": <snake_case exit name>, "exit_code", "message",
//!   "hint", …fields of the error (resource, token, holder…)…, "store"}`
//! - both end with `"notices": ["warning: …", …]` when fence warned (what `--format human`
//!   prints on stderr after `fence: `), and have no such field otherwise.

use std::io::{IsTerminal, Write};

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Map, Value};

use crate::cli::{ColorChoice, Format, GlobalArgs};
use crate::error::Error;
use crate::exit::Exit;
use crate::terminal::{terminal_safe, Warnings};

/// What a successful command reports, in each output format.
pub trait Report {
    /// The command's JSON fields (without `ok`, `op` and `store`).
    fn json(&self) -> Map<String, Value>;
    /// Text for people on stdout, ending in a newline (empty: print nothing).
    fn human(&self) -> String;
    /// `export FENCE_…=…` lines for `eval`; `None` where `--format env` does not apply.
    fn env(&self) -> Option<String> {
        None
    }
    /// One JSON object per line; `None` where `--format ndjson` does not apply.
    fn ndjson(&self) -> Option<Vec<Value>> {
        None
    }
    /// Whether [`Self::human`] is a machine format with its own escaping (the Prometheus
    /// exposition): written byte-exact when stdout is not a terminal, so that a value read
    /// back is the stored one; at a terminal its control characters are escaped as usual.
    fn machine_text(&self) -> bool {
        false
    }
}

/// A table for people: on a terminal, as wide as the terminal at most (cells wrap, JSON keeps
/// the full values); piped, each row on one line, so that columns stay stable for `grep`,
/// `cut` and `column` whatever the width of the screen it was run from.
pub fn table() -> comfy_table::Table {
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED);
    if let Some((terminal_size::Width(width), _)) = terminal_size::terminal_size() {
        table
            .set_content_arrangement(comfy_table::ContentArrangement::Dynamic)
            .set_width(width);
    }
    table
}

/// `table` as text: the table itself when it fits the terminal unwrapped, or on a terminal
/// of 100 columns or more with its cells wrapped; on a narrower one (a split pane), where
/// wrapped cells would be a few characters wide (and seven bordered columns cannot shrink
/// below about 40), each row as lines of `column: value`, a blank line between rows, which
/// [`fit`] wraps to any width.
pub fn render(table: &comfy_table::Table) -> String {
    let text = table.to_string();
    if fits(table) || table.width().is_none_or(|width| width >= 100) {
        return text;
    }
    let names: Vec<String> = table
        .header()
        .map(|header| {
            header
                .cell_iter()
                .map(|c| c.content().to_lowercase())
                .collect()
        })
        .unwrap_or_default();
    let rows: Vec<String> = table
        .row_iter()
        .map(|row| {
            names
                .iter()
                .zip(row.cell_iter())
                .map(|(name, cell)| format!("{name}: {}", cell.content()))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect();
    rows.join("\n\n")
}

/// Whether `table` fits its terminal with every cell on one line (always, piped): a table
/// whose cells would wrap into narrow columns can be shown another way.
pub fn fits(table: &comfy_table::Table) -> bool {
    use unicode_width::UnicodeWidthStr;
    let Some(width) = table.width() else {
        return true;
    };
    let mut natural = table.clone();
    natural.set_content_arrangement(comfy_table::ContentArrangement::Disabled);
    natural
        .to_string()
        .lines()
        .all(|line| line.width() <= usize::from(width))
}

/// On a terminal, `text` with its sentences wrapped at spaces to the terminal's width (a
/// word longer than the width is cut); tables, already fitted by [`table`], pass unchanged.
/// Piped, `text` as it is: one line per sentence for scripts.
pub fn fit(text: &str) -> String {
    let Some((terminal_size::Width(width), _)) = terminal_size::terminal_size() else {
        return text.to_owned();
    };
    wrap(text, usize::from(width.max(20)))
}

fn wrap(text: &str, width: usize) -> String {
    use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};
    let mut out = String::with_capacity(text.len());
    for line in text.split('\n') {
        let is_table = line.chars().any(|c| ('\u{2500}'..='\u{257f}').contains(&c));
        if is_table || line.width() <= width {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let indent: String = line.chars().take_while(|c| *c == ' ').collect();
        let mut current = String::new();
        for word in line.split(' ').filter(|w| !w.is_empty()) {
            let mut word = word.to_owned();
            loop {
                let taken = current.width();
                let start = if taken == 0 { indent.len() } else { taken + 1 };
                if start + word.width() <= width {
                    if taken == 0 {
                        current.push_str(&indent);
                    } else {
                        current.push(' ');
                    }
                    current.push_str(&word);
                    break;
                }
                if taken > 0 {
                    out.push_str(&current);
                    out.push('\n');
                    current.clear();
                    continue;
                }
                // One word wider than the line: cut it, at a character boundary that fits.
                let room = width.saturating_sub(indent.len()).max(2);
                let mut used = 0;
                let head: String = word
                    .chars()
                    .take_while(|c| {
                        used += c.width().unwrap_or(0);
                        used <= room
                    })
                    .collect();
                let head = if head.is_empty() {
                    word.chars().take(1).collect()
                } else {
                    head
                };
                out.push_str(&indent);
                out.push_str(&head);
                out.push('\n');
                word = word[head.len()..].to_owned();
                if word.is_empty() {
                    break;
                }
            }
        }
        out.push_str(&current);
        out.push('\n');
    }
    out.pop();
    out
}

/// Keeps these columns of `table` (with its header set) at their content's width when the
/// table has to fit a terminal: a timestamp or a token split over two lines is hard to read.
pub fn keep_whole(table: &mut comfy_table::Table, columns: &[usize]) {
    // On a narrow terminal everything wraps: a whole timestamp alone takes 28 columns.
    if table.width().is_some_and(|width| width < 100) {
        return;
    }
    for &index in columns {
        if let Some(column) = table.column_mut(index) {
            column.set_constraint(comfy_table::ColumnConstraint::ContentWidth);
        }
    }
}

/// `n` and the noun in the number it calls for: "1 resource", "2 resources", "0 resources".
pub fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The JSON fields of a report whose wire format is a `Serialize` struct: the struct's
/// fields, in their declared order (serde_json keeps insertion order).
pub fn fields(report: &impl serde::Serialize) -> Map<String, Value> {
    match serde_json::to_value(report) {
        Ok(Value::Object(map)) => map,
        // Derived structs of strings, numbers, options and lists are always objects.
        other => unreachable!("a report is a JSON object, not {other:?}"),
    }
}

/// A wire struct as one JSON value (an ndjson line, or an object built in parts): derived
/// structs of strings, numbers, options and lists always serialize.
pub fn value(wire: &impl serde::Serialize) -> Value {
    serde_json::to_value(wire).unwrap_or_else(|err| unreachable!("a wire struct serializes: {err}"))
}

/// The output settings, resolved once and passed to every command.
pub struct Output {
    pub format: Format,
    pub quiet: bool,
    color: bool,
}

/// Uploads at least this large get a progress bar (on a terminal).
const UPLOAD_BAR_MIN: usize = 1 << 20;

impl Output {
    /// A progress bar on stderr for an upload of `bytes` to `target`, visible only for people
    /// at a terminal and for uploads of 1 MiB or more; otherwise hidden (counting is free).
    pub fn upload_bar(&self, bytes: usize, target: &str) -> ProgressBar {
        if bytes < UPLOAD_BAR_MIN || !self.shows_progress() {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::new(bytes as u64);
        if let Ok(style) = ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left)",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(format!("writing {target}"));
        bar
    }

    /// Whether progress (spinners, bars) is drawn: only for people at a terminal, not with
    /// `--quiet` or a machine format.
    pub fn shows_progress(&self) -> bool {
        !self.quiet && self.format == Format::Human && std::io::stderr().is_terminal()
    }

    pub fn new(global: &GlobalArgs) -> Output {
        let color = use_color(global.color);
        Output {
            format: global.format,
            quiet: global.quiet,
            color,
        }
    }

    /// Prints a successful result and returns exit 0. A failure to write stdout is left to
    /// the caller's next reader (`fence … | head -0` is not an error); commands for which an
    /// unseen answer matters use [`Self::try_success`].
    pub fn success(&self, op: &str, store: Option<&str>, report: &dyn Report) -> Exit {
        self.try_success(op, store, report).unwrap_or(Exit::Success)
    }

    /// [`Self::success`], failing when the answer could not be written to stdout.
    pub fn try_success(
        &self,
        op: &str,
        store: Option<&str>,
        report: &dyn Report,
    ) -> std::io::Result<Exit> {
        match self.format {
            Format::Json => print_stdout(&answer(true, op, report.json(), store))?,
            Format::Ndjson => match report.ndjson() {
                Some(lines) => {
                    for line in lines {
                        print_stdout(&line.to_string())?;
                    }
                }
                None => {
                    // The resolve step refuses `--format ndjson` for other commands.
                    let err = Error::internal(
                        format!("`--format ndjson` has no output for `{op}`"),
                        "use --format human or json; this is a bug, please report it",
                    );
                    return Ok(self.error(op, store, &err));
                }
            },
            Format::Env => match report.env() {
                Some(lines) => print_stdout(lines.trim_end())?,
                None => {
                    // The resolve step refuses `--format env` for other commands.
                    let err = Error::internal(
                        format!("`--format env` has no output for `{op}`"),
                        "use --format human or json; this is a bug, please report it",
                    );
                    return Ok(self.error(op, store, &err));
                }
            },
            Format::Human => {
                let text = report.human();
                if !self.quiet && !text.is_empty() {
                    if report.machine_text() && !std::io::stdout().is_terminal() {
                        print_stdout(text.trim_end())?;
                    } else {
                        print_stdout(&fit(&terminal_safe(text.trim_end(), true)))?;
                    }
                }
            }
        }
        Ok(Exit::Success)
    }

    /// Prints the JSON answer of a command that decides its own exit status (`run` passes
    /// its command's through, `doctor` fails when a check failed): `{"ok", "op", …fields…,
    /// "store"}`, as [`Self::success`] prints it. A failure to write stdout is ignored, as
    /// there.
    pub fn json_answer(
        &self,
        ok: bool,
        op: &str,
        store: Option<&str>,
        fields: &impl serde::Serialize,
    ) {
        let _ = print_stdout(&answer(ok, op, self::fields(fields), store));
    }

    /// Prints an error once (JSON on stdout, or `fence: error: …` and a hint on stderr) and
    /// returns its exit status.
    pub fn error(&self, op: &str, store: Option<&str>, err: &Error) -> Exit {
        self.error_as(op, store, err, err.exit())
    }

    /// [`Output::error`] for a failure the caller exits from with `exit` instead of the
    /// error's own status (`fence run --busy-exit-code`): what is printed says so.
    pub fn error_as(&self, op: &str, store: Option<&str>, err: &Error, exit: Exit) -> Exit {
        self.error_hinted(op, op, store, err, exit)
    }

    /// [`Self::error_as`], with the hint [`Error::hint_in`] gives for `hint_op` (the JSON's
    /// `op` stays `op`).
    pub fn error_hinted(
        &self,
        op: &str,
        hint_op: &str,
        store: Option<&str>,
        err: &Error,
        exit: Exit,
    ) -> Exit {
        // ndjson: the failure is one more line, the object `--format json` prints.
        if matches!(self.format, Format::Json | Format::Ndjson) {
            let mut object = Map::new();
            object.insert("ok".into(), json!(false));
            object.insert("op".into(), json!(op));
            object.extend(error_fields(hint_op, err, store, exit));
            let _ = print_stdout(&Value::Object(object).to_string());
        } else {
            // Busy is an expected answer (the exit status says it); -q keeps it off stderr,
            // so that cron mails only real failures.
            if !(self.quiet && matches!(err, Error::Busy { .. } | Error::WaitedOut { .. })) {
                self.diagnostic(&err.to_string(), &hint_with_store(hint_op, err, store));
            }
            if self.format == Format::Env {
                let _ = print_stdout(&env_failure(op, err, exit));
            }
        }
        exit
    }

    fn diagnostic(&self, message: &str, hint: &str) {
        let (red, yellow, reset) = if self.color {
            ("\x1b[1;31m", "\x1b[33m", "\x1b[0m")
        } else {
            ("", "", "")
        };
        let message = terminal_safe(message, false);
        let hint = terminal_safe(hint, false);
        let mut stderr = std::io::stderr().lock();
        let _ = writeln!(stderr, "fence: {red}error:{reset} {message}");
        if !hint.is_empty() {
            let _ = writeln!(stderr, "{yellow}hint:{reset} {hint}");
        }
    }
}

/// Where warnings go for the command line `global` and `command`: nowhere with `--quiet`;
/// into the answer with `--format json` (for `run`, whose stderr carries its command's output
/// while it runs, to stderr as they come as well); else to stderr.
pub fn warnings_route(global: &GlobalArgs, command: &crate::cli::Command) -> Warnings {
    match (global.quiet, global.format, command) {
        (true, _, _) => Warnings::Silenced,
        (false, Format::Json, crate::cli::Command::Run(_)) => Warnings::StderrAndKept,
        (false, Format::Json, _) => Warnings::Kept,
        (false, _, _) => Warnings::Stderr,
    }
}

/// One JSON answer, compact: `ok`, `op`, the command's fields, the store, then the notices.
fn answer(ok: bool, op: &str, fields: Map<String, Value>, store: Option<&str>) -> String {
    let mut object = Map::new();
    object.insert("ok".into(), json!(ok));
    object.insert("op".into(), json!(op));
    object.extend(fields);
    if let Some(store) = store {
        object.insert("store".into(), json!(store));
    }
    add_notices(&mut object);
    Value::Object(object).to_string()
}

/// Adds the warnings kept for the JSON answer being printed as its `notices` field (none:
/// no field, so that an answer without warnings keeps its shape).
pub fn add_notices(object: &mut Map<String, Value>) {
    let notices = crate::terminal::warnings_for_answer();
    if !notices.is_empty() {
        object.insert("notices".into(), json!(notices));
    }
}

/// The fields of a failure's JSON object after `ok` and `op`: the error, its exit status,
/// message and hint, the error's own fields, the store, and the warnings ([`add_notices`]).
pub fn error_fields(op: &str, err: &Error, store: Option<&str>, exit: Exit) -> Map<String, Value> {
    let mut object = Map::new();
    object.insert("error".into(), json!(err.name()));
    object.insert("exit_code".into(), json!(exit.code()));
    object.insert("message".into(), json!(err.to_string()));
    object.insert("hint".into(), json!(hint_with_store(op, err, store)));
    object.extend(err.json_fields());
    if let Some(store) = store {
        object.insert("store".into(), json!(store));
    }
    add_notices(&mut object);
    object
}

/// The `--schema` of this invocation when it is not the default, for the commands hints
/// suggest (set once, at start-up).
static HINT_SCHEMA: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Notes a `--schema` other than the default, so that the commands hints suggest name it.
pub fn note_schema(schema: &str) {
    if schema != crate::cli::DEFAULT_SCHEMA {
        let _ = HINT_SCHEMA.set(schema.to_owned());
    }
}

/// The error's hint for `fence OP`, naming the store (unless it is the default one) and a
/// schema other than the default in the commands it suggests, so that they act on the same
/// store as the command that failed.
fn hint_with_store(op: &str, err: &Error, store: Option<&str>) -> String {
    let hint = err.hint_in(op);
    let default = crate::config::default_store_url().ok();
    match store.filter(|store| Some(*store) != default.as_deref()) {
        Some(store) => {
            let mut prefix = format!("`fence --store {}", crate::error::shell_word(store));
            if let Some(schema) = HINT_SCHEMA.get() {
                prefix.push_str(&format!(" --schema {schema}"));
            }
            hint.replace("`fence inspect ", &format!("{prefix} inspect "))
                .replace("`fence log ", &format!("{prefix} log "))
        }
        None => hint,
    }
}

/// What `--format env` prints on stdout when the command failed: comment lines saying why,
/// then a command that fails with fence's exit status. So `eval "$(fence acquire …)"` fails
/// too (and stops a `set -e` script, or its `|| exit $?`) instead of evaluating nothing,
/// which succeeds.
fn env_failure(op: &str, err: &Error, exit: Exit) -> String {
    let code = exit.code();
    format!(
        "# fence {op} failed ({}, exit {code}): {}\n(exit {code})",
        err.name(),
        terminal_safe(&err.to_string(), false)
    )
}

/// Whether to colour diagnostics on stderr.
fn use_color(choice: ColorChoice) -> bool {
    match choice {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => {
            std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
                && std::io::stderr().is_terminal()
        }
    }
}

/// One line of data on stdout, for commands that print their own report; a failure to write
/// it (a full disk, a closed pipe) is ignored, as for every answer but acquire's.
pub fn print_line(text: &str) {
    let _ = print_stdout(text);
}

/// One line of data on stdout, reporting a failure to write it (`fence log --follow` stops
/// when nobody reads any more).
pub fn try_print_line(text: &str) -> std::io::Result<()> {
    print_stdout(text)
}

/// Writes one answer to stdout and flushes it, reporting a failure (a full disk, a closed
/// pipe) instead of panicking; callers decide whether an unseen answer matters.
fn print_stdout(text: &str) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{text}")?;
    stdout.flush()
}

/// Reports a command line the parser refused (see [`crate::cli::refused`]) in the format asked
/// for, and returns its exit status (2).
pub fn parse_error(op: &str, err: &Error, format: Format) -> Exit {
    let out = Output {
        format,
        quiet: false,
        color: use_color(ColorChoice::Auto),
    };
    out.error(op, None, err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences_wrap_at_spaces_and_tables_pass() {
        let text = "last events of `a-long-name`, most recent first:\n┌──┐ a table line longer than ten\nshort";
        assert_eq!(
            wrap(text, 20),
            "last events of\n`a-long-name`, most\nrecent first:\n┌──┐ a table line longer than ten\nshort"
        );
        assert_eq!(wrap("  abcdefghij klm", 6), "  abcd\n  efgh\n  ij\n  klm");
        assert!(wrap(&"x".repeat(50), 20)
            .lines()
            .all(|l| l.chars().count() <= 20));
        // Wide characters take two columns each.
        let wide = wrap("资源资源资源资源资源资源 ok", 10);
        assert!(
            wide.lines()
                .all(|l| unicode_width::UnicodeWidthStr::width(l) <= 10),
            "{wide}"
        );
    }
}
