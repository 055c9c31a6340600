//! Text for a terminal: fence prints names, owners and messages that came from stores,
//! targets and databases, so everything it shows passes through [`terminal_safe`]. A leaf
//! module: the lower layers (coordinators, targets, connections) warn through it without
//! depending on the printer.

use std::io::Write;

/// A warning on stderr, `fence: ` and one line, whatever it quotes.
pub fn warn(text: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "fence: {}", terminal_safe(text, false));
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

/// Characters a terminal draws as nothing (zero-width spaces and joiners, fillers, tags):
/// two names that differ only by one would look the same.
fn is_invisible(c: char) -> bool {
    matches!(c, '\u{ad}' | '\u{115f}' | '\u{1160}' | '\u{180e}' | '\u{200b}'..='\u{200d}'
        | '\u{2028}' | '\u{2029}' | '\u{2060}'..='\u{2064}' | '\u{3164}' | '\u{feff}'
        | '\u{ffa0}' | '\u{e0000}'..='\u{e007f}')
}

#[cfg(test)]
mod tests {
    use super::terminal_safe;

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
