//! Text for a terminal: fence prints names, owners and messages that came from stores,
//! targets and databases, so everything it shows passes through [`terminal_safe`]. A leaf
//! module: the lower layers (coordinators, targets, connections) warn through it without
//! depending on the printer, which decides once where warnings go ([`route_warnings`]) and
//! puts those kept for a JSON answer into it ([`warnings_for_answer`]).

use std::io::Write;
use std::sync::{Mutex, PoisonError};

/// Where [`warn`] sends a warning, set once by `fence::main` from the global options and
/// the command (`output::warnings_route`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Warnings {
    /// `fence: <text>` on stderr at once: people's and streaming output (human, env,
    /// ndjson), and the default (the reaper, a command line that did not parse).
    Stderr,
    /// Dropped: `--quiet`.
    Silenced,
    /// Kept for the one JSON answer (`--format json`), which carries them in its `notices`
    /// array; once it is printed, later ones go to stderr.
    Kept,
    /// On stderr at once and kept for the answer: `fence run --format json`, whose stderr
    /// carries its command's output and which may run for hours (a warning about a command
    /// that is still running cannot wait for the end).
    StderrAndKept,
}

/// At most this many warnings wait for an answer; the rest are counted.
const KEPT_MAX: usize = 100;

/// The process's warnings: where they go, and those kept for the answer. A mutex, not a
/// thread-local: the runtime's worker threads warn too.
struct Sink {
    route: Warnings,
    kept: Vec<String>,
    left_out: usize,
}

impl Sink {
    const fn new() -> Sink {
        Sink {
            route: Warnings::Stderr,
            kept: Vec::new(),
            left_out: 0,
        }
    }

    fn warn(&mut self, text: &str) {
        if matches!(self.route, Warnings::Stderr | Warnings::StderrAndKept) {
            let mut stderr = std::io::stderr().lock();
            let _ = writeln!(stderr, "fence: {}", terminal_safe(text, false));
        }
        if matches!(self.route, Warnings::Kept | Warnings::StderrAndKept) {
            if self.kept.len() < KEPT_MAX {
                self.kept.push(text.to_owned());
            } else {
                self.left_out += 1;
            }
        }
    }

    /// The kept warnings, for the answer being printed; later ones go to stderr.
    fn take(&mut self) -> Vec<String> {
        if !matches!(self.route, Warnings::Kept | Warnings::StderrAndKept) {
            return Vec::new();
        }
        self.route = Warnings::Stderr;
        let mut kept = std::mem::take(&mut self.kept);
        match std::mem::take(&mut self.left_out) {
            0 => {}
            1 => kept.push("warning: 1 more warning was left out".to_owned()),
            n => kept.push(format!("warning: {n} more warnings were left out")),
        }
        kept
    }
}

static SINK: Mutex<Sink> = Mutex::new(Sink::new());

fn sink() -> std::sync::MutexGuard<'static, Sink> {
    SINK.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A warning, one line whatever it quotes: `fence: <text>` on stderr, nothing with
/// `--quiet`, or kept for the JSON answer ([`Warnings`]).
pub fn warn(text: &str) {
    sink().warn(text);
}

/// Sets where warnings go from now on (`fence::main`, once, before any command runs).
pub fn route_warnings(route: Warnings) {
    sink().route = route;
}

/// The warnings kept for the JSON answer about to be printed (none unless they are kept);
/// warnings after it go to stderr, since nothing carries them any more.
pub fn warnings_for_answer() -> Vec<String> {
    sink().take()
}

/// Writes to stderr the warnings no answer took (none was printed) and that are not there
/// yet, so that none is lost; later ones go there too.
pub fn flush_warnings() {
    let mut sink = sink();
    let echoed = sink.route == Warnings::StderrAndKept;
    let kept = sink.take();
    if !echoed {
        for text in kept {
            sink.warn(&text);
        }
    }
}

/// `text` with every control character escaped (`\u{1b}`, `\r`…), so that what came from a
/// store, a target or the caller's database (owners, details, names, query results) cannot
/// move the cursor, retitle or recolour the terminal, or forge a line of fence's own output.
/// Newlines and tabs stay when `lines` (tables and multi-line reports), never in one-line
/// diagnostics.
pub fn terminal_safe(text: &str, lines: bool) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| {
        c.is_control() && !(lines && (c == '\n' || c == '\t'))
            || is_bidi_control(c)
            || is_invisible(c)
    };
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut safe = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            safe.extend(c.escape_default());
        } else {
            safe.push(c);
        }
    }
    std::borrow::Cow::Owned(safe)
}

/// Unicode's bidirectional controls, which reorder what a terminal shows (Trojan Source).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' | '\u{061c}')
}

/// Characters a terminal draws as nothing: Unicode's Default_Ignorable_Code_Point (zero-width
/// spaces and joiners, fillers, variation selectors, tags…; review 18 found ten of them
/// missing), and the line and paragraph separators: two names that differ only by one
/// would look the same.
fn is_invisible(c: char) -> bool {
    matches!(c, '\u{ad}' | '\u{34f}' | '\u{61c}' | '\u{115f}' | '\u{1160}'
        | '\u{17b4}' | '\u{17b5}' | '\u{180b}'..='\u{180f}' | '\u{200b}'..='\u{200f}'
        | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{206f}' | '\u{3164}'
        | '\u{fe00}'..='\u{fe0f}' | '\u{feff}' | '\u{ffa0}' | '\u{fff0}'..='\u{fff8}'
        | '\u{1bca0}'..='\u{1bca3}' | '\u{1d173}'..='\u{1d17a}' | '\u{e0000}'..='\u{e0fff}')
}

#[cfg(test)]
mod tests {
    use super::{terminal_safe, Sink, Warnings, KEPT_MAX};

    #[test]
    fn kept_warnings_go_to_one_answer_and_are_counted_past_the_limit() {
        let mut sink = Sink::new();
        assert!(
            sink.take().is_empty(),
            "nothing is kept on the stderr route"
        );
        sink.route = Warnings::Silenced;
        sink.warn("dropped");
        assert!(sink.take().is_empty() && sink.kept.is_empty());
        sink.route = Warnings::Kept;
        for n in 0..KEPT_MAX + 2 {
            sink.warn(&format!("warning: {n}"));
        }
        let kept = sink.take();
        assert_eq!(kept.len(), KEPT_MAX + 1);
        assert_eq!(kept[0], "warning: 0");
        assert_eq!(kept[KEPT_MAX], "warning: 2 more warnings were left out");
        assert_eq!(sink.route, Warnings::Stderr, "after the answer: stderr");
        assert!(sink.take().is_empty());
        sink.route = Warnings::StderrAndKept;
        sink.warn("warning: echoed");
        assert_eq!(sink.take(), ["warning: echoed"]);
    }

    #[test]
    fn control_characters_never_reach_the_terminal() {
        assert_eq!(terminal_safe("plain owner", false), "plain owner");
        assert_eq!(
            terminal_safe("a\u{1b}]0;pwned\u{7}b", false),
            "a\\u{1b}]0;pwned\\u{7}b"
        );
        assert_eq!(terminal_safe("x\u{9b}31m", true), "x\\u{9b}31m");
        assert_eq!(terminal_safe("row 1\nrow 2\r", true), "row 1\nrow 2\\r");
        assert_eq!(terminal_safe("one\nline", false), "one\\nline");
        assert_eq!(terminal_safe("evil\u{202e}txt", true), "evil\\u{202e}txt");
        assert_eq!(terminal_safe("deploy\u{200b}", false), "deploy\\u{200b}");
    }
}
