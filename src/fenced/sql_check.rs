//! Refuses, before anything is sent, SQL that could leave fence's fenced transaction (issue 15).
//!
//! `fence write --sql/--file` sends the caller's SQL between `begin_write` and
//! `end_write`/`COMMIT` in one simple-query message. A `COMMIT`, `ROLLBACK`, `PREPARE
//! TRANSACTION` or `COPY ... FROM STDIN` in it, or an open quote or comment that swallows fence's
//! trailing statements, would let writes escape the token check. This is one of two layers; the
//! other is how the guard and the SQL are sent, so that one layer missing something is not enough.
//!
//! The SQL is read the way PostgreSQL's lexer reads it (`src/backend/parser/scan.l`): comments
//! that nest, the string kinds and how each one ends, quote continuation across newlines, dollar
//! quoting. Each `;`-separated statement is then classified by its leading keywords. Decisions:
//! - The server lexes the whole message before running any of it, so a `SET LOCAL
//!   standard_conforming_strings` in the same message does not change how `'...'` is read. The
//!   SQL is therefore checked under both readings of a backslash in `'...'` and refused if either
//!   refuses: the verdict then holds whatever the server's setting.
//! - Where the statement boundaries need more than a lexer (`BEGIN ATOMIC` bodies) or where
//!   PostgreSQL versions lex differently (a number run into a name or a `$`), the SQL is refused.
//! - Everything else passes. PostgreSQL itself refuses `COMMIT` inside `DO` or a procedure called
//!   inside a transaction block, and a statement that fails aborts fence's transaction.
//! - A backslash outside strings and comments is a syntax error for the server; it is reported
//!   as the psql meta-command it almost certainly is.
//! - `SET`/`RESET` of `fence.*` is refused as a courtesy, not as a guarantee: `set_config` and
//!   dynamic SQL reach the same settings, which is why the guard does not trust them (guard.sql).

use std::fmt;

/// Why the caller's SQL may not run inside fence's transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqlRefusal {
    /// 1-based index of the offending statement, counting only non-empty statements; 0 when the
    /// SQL has no statement at all.
    pub statement: usize,
    /// The statement's first characters as written, safe for a terminal: whitespace collapsed,
    /// control characters escaped, at most [`EXCERPT_CHARS`] characters.
    pub excerpt: String,
    /// What was found, e.g. `COMMIT AND CHAIN` or `an unterminated dollar-quoted string`.
    pub what: String,
    /// What to do instead.
    pub hint: &'static str,
}

/// The length of [`SqlRefusal::excerpt`], in characters of the SQL.
pub const EXCERPT_CHARS: usize = 60;

impl fmt::Display for SqlRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.statement == 0 {
            write!(f, "refusing the SQL: {}", self.what)
        } else {
            write!(
                f,
                "refusing statement {} (`{}`): {}",
                self.statement, self.excerpt, self.what
            )
        }
    }
}

/// Decides whether `sql` may run between fence's `begin_write` and its `end_write`/`COMMIT`.
pub fn check(sql: &str) -> Result<(), SqlRefusal> {
    check_reading(sql, Backslashes::Literal)?;
    check_reading(sql, Backslashes::Escape).map_err(|refusal| SqlRefusal {
        what: format!(
            "{}, when the server reads backslashes in '...' as escapes (standard_conforming_strings off)",
            refusal.what
        ),
        hint: HINT_BACKSLASH,
        ..refusal
    })
}

const HINT_TRANSACTION: &str =
    "fence runs your SQL inside its own transaction and commits it only while your token is \
     current; remove the transaction control (SAVEPOINT and ROLLBACK TO SAVEPOINT work inside it)";
const HINT_END: &str =
    "fence runs your SQL inside its own transaction; remove END, or if it closes a `BEGIN \
     ATOMIC` function body, write the body dollar-quoted (`AS $$ ... $$`) or create the function \
     outside `fence write`";
const HINT_ATOMIC: &str =
    "fence cannot tell where a `BEGIN ATOMIC` body ends; write the body dollar-quoted \
     (`AS $$ ... $$`) or create the function outside `fence write`";
const HINT_TWO_PHASE: &str =
    "two-phase commit would take the write out of fence's transaction; run it outside `fence write`";
const HINT_CHARACTERISTICS: &str =
    "fence sets its transactions' characteristics itself; run this outside `fence write`";
const HINT_FENCE_SETTING: &str =
    "fence sets these to bind your token to its transaction (and to watch for a vanished client); leave them to fence";
const HINT_DBLINK: &str =
    "dblink writes in a session of its own that commits at once, outside the fenced transaction; write through this connection";
const HINT_RESET_ALL: &str =
    "it would also reset the `fence.*` settings that bind your token to fence's transaction; \
     reset the settings you changed by name";
const HINT_DISCARD: &str =
    "it would also discard state fence's transaction relies on; run it outside `fence write`";
const HINT_COPY: &str =
    "fence cannot stream COPY data; use INSERT ... VALUES, or COPY from or to a file on the \
     database server";
const HINT_META: &str =
    "psql meta-commands are not SQL and fence sends your text to the server as is; write it as \
     SQL (for `\\copy`: INSERT ... VALUES, or COPY from a file on the database server)";
const HINT_UNTERMINATED: &str =
    "close it: fence appends its own statements after your SQL, and an open quote or comment \
     would swallow them";
const HINT_RUN_TOGETHER: &str =
    "put a space between them: PostgreSQL versions disagree on where such a token ends";
const HINT_NUL: &str = "remove it: PostgreSQL reads the query text only up to the first NUL byte";
const HINT_EMPTY: &str = "pass the SQL to run with `--sql` or `--file`";
const HINT_BACKSLASH: &str =
    "a backslash right before a quote reads differently depending on the server's \
     standard_conforming_strings; write such strings as E'...' with each backslash doubled \
     (E'C:\\\\')";

/// Checks `sql` under one reading of `'...'`; the first refusal in statement order wins.
fn check_reading(sql: &str, backslashes: Backslashes) -> Result<(), SqlRefusal> {
    let (statements, unlexable) = split(sql, backslashes);
    for (index, statement) in statements.iter().enumerate() {
        if let Some((what, hint)) = classify(&statement.tokens) {
            return Err(SqlRefusal {
                statement: index + 1,
                excerpt: excerpt(statement.text),
                what,
                hint,
            });
        }
    }
    if let Some(refusal) = unlexable {
        return Err(refusal);
    }
    if statements.is_empty() {
        return Err(SqlRefusal {
            statement: 0,
            excerpt: String::new(),
            what: "it has no statement, only whitespace, comments or semicolons".into(),
            hint: HINT_EMPTY,
        });
    }
    Ok(())
}

/// What a statement's leading keywords make it, if it may not run inside fence's transaction.
fn classify(tokens: &[Token]) -> Option<(String, &'static str)> {
    if let Some(name) = tokens.iter().find_map(|t| match t {
        Token::Meta(name) => Some(name),
        _ => None,
    }) {
        return Some((format!("a psql meta-command (`\\{name}`)"), HINT_META));
    }
    // dblink runs its statement in a second session that commits on its own, outside the
    // fenced transaction (and after fence may have reported "nothing applied").
    if let Some(name) = tokens.windows(2).find_map(|w| match w {
        [Token::Word(name), Token::Punct(b'(')] if name.starts_with("dblink") => Some(name),
        _ => None,
    }) {
        return Some((format!("a call of `{}`", excerpt(name)), HINT_DBLINK));
    }
    let words: Vec<Option<&str>> = tokens.iter().map(Token::keyword).collect();
    if words
        .windows(2)
        .any(|w| w == [Some("begin"), Some("atomic")])
    {
        let what = "a SQL-standard function body (`BEGIN ATOMIC ... END`)";
        return Some((what.into(), HINT_ATOMIC));
    }
    let second = words.get(1).copied().flatten();
    match words[0]? {
        first @ ("commit" | "rollback") if second == Some("prepared") => {
            Some((format!("{} PREPARED", first.to_uppercase()), HINT_TWO_PHASE))
        }
        "prepare" if second == Some("transaction") => {
            Some(("PREPARE TRANSACTION".into(), HINT_TWO_PHASE))
        }
        "rollback" if rolls_back_to_savepoint(&words[1..]) => None,
        first @ ("begin" | "start" | "commit" | "end" | "abort" | "rollback") => {
            let spelled: Vec<String> = std::iter::once(first)
                .chain(words[1..].iter().map_while(|w| {
                    w.filter(|w| matches!(*w, "work" | "transaction" | "and" | "no" | "chain"))
                }))
                .map(str::to_uppercase)
                .collect();
            let hint = if first == "end" {
                HINT_END
            } else {
                HINT_TRANSACTION
            };
            Some((spelled.join(" "), hint))
        }
        "set" => set(tokens),
        "reset" if second == Some("all") => Some(("RESET ALL".into(), HINT_RESET_ALL)),
        "reset" => {
            fence_setting(&tokens[1..]).map(|name| (format!("RESET of {name}"), HINT_FENCE_SETTING))
        }
        "discard" => Some(("DISCARD".into(), HINT_DISCARD)),
        "copy" => copy(tokens),
        _ => None,
    }
}

/// `ROLLBACK [WORK | TRANSACTION] TO ...`: undoes part of the transaction and stays inside it.
fn rolls_back_to_savepoint(after_rollback: &[Option<&str>]) -> bool {
    let mut words = after_rollback.iter().copied();
    let next = match words.next().flatten() {
        Some("work" | "transaction") => words.next().flatten(),
        other => other,
    };
    next == Some("to")
}

/// `SET [SESSION | LOCAL] name ...`: refused for fence's own settings and for
/// `SET SESSION CHARACTERISTICS`.
fn set(tokens: &[Token]) -> Option<(String, &'static str)> {
    let mut rest = &tokens[1..];
    match rest.first().and_then(Token::keyword) {
        Some("session") if rest.get(1).and_then(Token::keyword) == Some("characteristics") => {
            return Some(("SET SESSION CHARACTERISTICS".into(), HINT_CHARACTERISTICS));
        }
        Some("session" | "local") => rest = &rest[1..],
        _ => {}
    }
    fence_setting(rest).map(|name| (format!("SET of {name}"), HINT_FENCE_SETTING))
}

/// The setting named at the start of `tokens` (`a.b`, `"a".b`, `"a.b"`, ...), if it is or could
/// be one of fence's. Setting names are case-insensitive, quoted or not; the escapes of
/// `U&"..."` are not decoded, so such a name could be anything.
fn fence_setting(tokens: &[Token]) -> Option<String> {
    if tokens.first() == Some(&Token::UnicodeQuoted) {
        return Some("a setting named with `U&\"...\"`, which could be one of fence's".into());
    }
    let mut parts = Vec::new();
    let mut rest = tokens;
    while let Some(part) = rest.first().and_then(Token::name) {
        parts.push(part.to_ascii_lowercase());
        match rest.get(1) {
            Some(Token::Punct(b'.')) => rest = &rest[2..],
            _ => break,
        }
    }
    let name = parts.join(".");
    // client_connection_check_interval is the server's watch on a vanished client, which
    // begin_write sets so that a killed `fence write` cannot commit later.
    (name == "fence" || name.starts_with("fence.") || name == "client_connection_check_interval")
        .then(|| format!("fence's setting `{}`", excerpt(&name)))
}

/// `COPY ... FROM STDIN` and `COPY ... TO STDOUT`, which need a data stream fence does not send.
fn copy(tokens: &[Token]) -> Option<(String, &'static str)> {
    let mut depth = 0i32;
    for token in tokens {
        match token {
            Token::Punct(b'(') => depth += 1,
            Token::Punct(b')') => depth -= 1,
            Token::Word(w) if depth == 0 && w == "stdin" => {
                return Some(("COPY ... FROM STDIN".into(), HINT_COPY));
            }
            Token::Word(w) if depth == 0 && w == "stdout" => {
                return Some(("COPY ... TO STDOUT".into(), HINT_COPY));
            }
            _ => {}
        }
    }
    None
}

/// The statement's first [`EXCERPT_CHARS`] characters, whitespace collapsed, anything a terminal
/// could act on escaped.
fn excerpt(text: &str) -> String {
    let mut collapsed = String::new();
    for word in text.split_whitespace() {
        if !collapsed.is_empty() {
            collapsed.push(' ');
        }
        collapsed.push_str(word);
    }
    let mut out = String::new();
    for (n, c) in collapsed.chars().enumerate() {
        if n == EXCERPT_CHARS {
            out.push_str("...");
            break;
        }
        let invisible = matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}'
            | '\u{2066}'..='\u{2069}' | '\u{feff}');
        if c.is_control() || invisible {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// How the server reads a backslash in `'...'`: `standard_conforming_strings` on or off.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Backslashes {
    Literal,
    Escape,
}

/// How a string literal ends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Quote {
    /// `'...'` (standard), `N'...'`, `U&'...'`: `''` is a quote.
    Doubling,
    /// `E'...'`: `''` is a quote and a backslash escapes the next byte.
    Escaping,
    /// `B'...'`, `X'...'`: the first `'` ends it.
    Bits,
}

#[derive(Debug, PartialEq, Eq)]
enum Token {
    /// An unquoted identifier or keyword, ASCII-lowercased as PostgreSQL does.
    Word(String),
    /// A quoted identifier's content.
    Quoted(String),
    /// A `U&"..."` identifier, whose escapes are not decoded.
    UnicodeQuoted,
    /// A string, number or parameter.
    Literal,
    /// A backslash and the name after it.
    Meta(String),
    Punct(u8),
}

impl Token {
    fn keyword(&self) -> Option<&str> {
        match self {
            Token::Word(w) => Some(w),
            _ => None,
        }
    }

    fn name(&self) -> Option<&str> {
        match self {
            Token::Word(w) | Token::Quoted(w) => Some(w),
            _ => None,
        }
    }
}

struct Statement<'a> {
    text: &'a str,
    tokens: Vec<Token>,
}

/// Splits `sql` into its non-empty statements, and the refusal for what could not be lexed (an
/// unterminated construct, a NUL byte, ...), which is always in the statement after them.
fn split(sql: &str, backslashes: Backslashes) -> (Vec<Statement<'_>>, Option<SqlRefusal>) {
    let mut lexer = Lexer::new(sql, backslashes);
    let mut statements = Vec::new();
    let mut tokens = Vec::new();
    let mut start = 0;
    loop {
        let end = lexer.pos;
        let next = lexer.next();
        if matches!(next, Ok(None) | Ok(Some(Token::Punct(b';')))) && !tokens.is_empty() {
            let text = &sql[start..end];
            statements.push(Statement {
                text,
                tokens: std::mem::take(&mut tokens),
            });
        }
        match next {
            Ok(None) => return (statements, None),
            Ok(Some(Token::Punct(b';'))) => start = lexer.pos,
            Ok(Some(token)) => tokens.push(token),
            Err((what, hint)) => {
                let refusal = SqlRefusal {
                    statement: statements.len() + 1,
                    excerpt: excerpt(&sql[start..]),
                    what,
                    hint,
                };
                return (statements, Some(refusal));
            }
        }
    }
}

type Unlexable = (String, &'static str);

/// PostgreSQL's lexer, reduced to what decides where statements end and what they start with.
struct Lexer<'a> {
    sql: &'a str,
    /// The SQL up to its first NUL byte: all the server would read.
    bytes: &'a [u8],
    truncated: bool,
    pos: usize,
    backslashes: Backslashes,
}

impl<'a> Lexer<'a> {
    fn new(sql: &'a str, backslashes: Backslashes) -> Lexer<'a> {
        let end = sql.find('\0').unwrap_or(sql.len());
        Lexer {
            sql,
            bytes: &sql.as_bytes()[..end],
            truncated: end < sql.len(),
            pos: 0,
            backslashes,
        }
    }

    fn peek(&self, ahead: usize) -> Option<u8> {
        self.bytes.get(self.pos + ahead).copied()
    }

    fn eat(&mut self, keep: impl Fn(u8) -> bool) {
        self.pos = skip(self.bytes, self.pos, keep);
    }

    /// The input ended inside `what`.
    fn unterminated(&self, what: &str) -> Unlexable {
        if self.truncated {
            ("a NUL byte".into(), HINT_NUL)
        } else {
            (format!("an unterminated {what}"), HINT_UNTERMINATED)
        }
    }

    /// The next token, skipping whitespace and comments; `;` comes as `Punct(b';')`.
    fn next(&mut self) -> Result<Option<Token>, Unlexable> {
        loop {
            let Some(c) = self.peek(0) else {
                return if self.truncated {
                    Err(self.unterminated(""))
                } else {
                    Ok(None)
                };
            };
            match c {
                // \v is whitespace from PostgreSQL 16 on, a syntax error before.
                b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c => self.pos += 1,
                b'-' if self.peek(1) == Some(b'-') => {
                    // Unterminated at the end is fine: fence appends a newline.
                    self.eat(|c| c != b'\n' && c != b'\r');
                }
                b'/' if self.peek(1) == Some(b'*') => self.block_comment()?,
                _ => return self.token(c).map(Some),
            }
        }
    }

    fn token(&mut self, c: u8) -> Result<Token, Unlexable> {
        match c {
            b'\'' => {
                self.pos += 1;
                self.string(self.plain())?;
                Ok(Token::Literal)
            }
            b'"' => {
                self.pos += 1;
                self.quoted_identifier().map(Token::Quoted)
            }
            b'$' => self.dollar(),
            b'\\' => {
                self.pos += 1;
                let start = self.pos;
                self.eat(|c| c.is_ascii_graphic() && c != b'\\');
                let shown = self.pos.min(start + 20);
                Ok(Token::Meta(self.sql[start..shown].to_owned()))
            }
            b'0'..=b'9' => {
                self.number();
                self.not_run_together()
            }
            c if is_ident_start(c) => self.word(c),
            _ => {
                self.pos += 1;
                Ok(Token::Punct(c))
            }
        }
    }

    /// How `'...'` and `N'...'` end under this reading.
    fn plain(&self) -> Quote {
        match self.backslashes {
            Backslashes::Literal => Quote::Doubling,
            Backslashes::Escape => Quote::Escaping,
        }
    }

    /// `/* ... */`, which nests.
    fn block_comment(&mut self) -> Result<(), Unlexable> {
        self.pos += 2;
        let mut depth = 0usize;
        loop {
            match (self.peek(0), self.peek(1)) {
                (None, _) => return Err(self.unterminated("/* comment")),
                (Some(b'/'), Some(b'*')) => {
                    depth += 1;
                    self.pos += 2;
                }
                (Some(b'*'), Some(b'/')) => {
                    self.pos += 2;
                    if depth == 0 {
                        return Ok(());
                    }
                    depth -= 1;
                }
                _ => self.pos += 1,
            }
        }
    }

    /// A string literal's body, from after its opening quote, with any continuation: a quote
    /// that follows the closing one after whitespace holding a newline (and `--` comments)
    /// continues the same literal, of the same kind.
    fn string(&mut self, quote: Quote) -> Result<(), Unlexable> {
        loop {
            match self.peek(0) {
                None => return Err(self.unterminated("quoted string")),
                Some(b'\\') if quote == Quote::Escaping => self.pos += 2,
                Some(b'\'') => {
                    self.pos += 1;
                    if quote != Quote::Bits && self.peek(0) == Some(b'\'') {
                        self.pos += 1;
                    } else if let Some(resume) = self.continuation() {
                        self.pos = resume;
                    } else {
                        return Ok(());
                    }
                }
                Some(_) => self.pos += 1,
            }
        }
    }

    /// Where a string continues after a closing quote at `pos - 1`, if it does.
    fn continuation(&self) -> Option<usize> {
        let mut at = self.pos;
        let mut newline = false;
        while let Some(&c) = self.bytes.get(at) {
            match c {
                b' ' | b'\t' | 0x0b | 0x0c => at += 1,
                b'\n' | b'\r' => {
                    newline = true;
                    at += 1;
                }
                b'-' if self.bytes.get(at + 1) == Some(&b'-') => {
                    at = skip(self.bytes, at, |c| c != b'\n' && c != b'\r');
                }
                _ => break,
            }
        }
        (newline && self.bytes.get(at) == Some(&b'\'')).then_some(at + 1)
    }

    /// `"..."` or `U&"..."` from after its opening quote; `""` is a quote.
    fn quoted_identifier(&mut self) -> Result<String, Unlexable> {
        let start = self.pos;
        loop {
            match self.peek(0) {
                None => return Err(self.unterminated("quoted identifier")),
                Some(b'"') if self.peek(1) == Some(b'"') => self.pos += 2,
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(self.sql[start..self.pos - 1].replace("\"\"", "\""));
                }
                Some(_) => self.pos += 1,
            }
        }
    }

    /// `$n` (a parameter), `$tag$...$tag$` (a dollar-quoted string), or a lone `$`.
    fn dollar(&mut self) -> Result<Token, Unlexable> {
        if self.peek(1).is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
            self.digits();
            return self.not_run_together();
        }
        let mut end = self.pos + 1;
        if self.bytes.get(end).is_some_and(|&c| is_ident_start(c)) {
            end = skip(self.bytes, end, |c| is_ident_cont(c) && c != b'$');
        }
        if self.bytes.get(end) != Some(&b'$') {
            self.pos += 1;
            return Ok(Token::Punct(b'$'));
        }
        let tag = &self.bytes[self.pos..=end];
        let body = end + 1;
        match self.bytes[body..].windows(tag.len()).position(|w| w == tag) {
            Some(at) => {
                self.pos = body + at + tag.len();
                Ok(Token::Literal)
            }
            None => {
                self.pos = self.bytes.len();
                Err(self.unterminated("dollar-quoted string"))
            }
        }
    }

    /// A numeric literal as PostgreSQL 16 reads it (`0x1F`, `1_000`, `1.5e-3`); what follows is
    /// checked by [`Lexer::not_run_together`].
    fn number(&mut self) {
        let radix = self.peek(0) == Some(b'0')
            && matches!(self.peek(1), Some(b'x' | b'X' | b'o' | b'O' | b'b' | b'B'))
            && self
                .peek(2)
                .is_some_and(|c| c.is_ascii_hexdigit() || c == b'_');
        if radix {
            self.pos += 2;
            self.eat(|c| c.is_ascii_hexdigit() || c == b'_');
            return;
        }
        self.digits();
        if self.peek(0) == Some(b'.') && self.peek(1) != Some(b'.') {
            self.pos += 1;
            self.digits();
        }
        if matches!(self.peek(0), Some(b'e' | b'E')) {
            let sign = usize::from(matches!(self.peek(1), Some(b'+' | b'-')));
            if self.peek(1 + sign).is_some_and(|c| c.is_ascii_digit()) {
                self.pos += 1 + sign;
                self.digits();
            }
        }
    }

    fn digits(&mut self) {
        self.eat(|c| c.is_ascii_digit() || c == b'_');
    }

    /// A number or parameter directly followed by a name character or `$` is an error from
    /// PostgreSQL 15 on but two tokens before, so quoting after it would depend on the version.
    fn not_run_together(&self) -> Result<Token, Unlexable> {
        match self.peek(0) {
            Some(c) if is_ident_cont(c) => Err((
                "a number or parameter directly followed by a name or `$`".into(),
                HINT_RUN_TOGETHER,
            )),
            _ => Ok(Token::Literal),
        }
    }

    /// An identifier or keyword, or a string with a prefix: `E'`, `B'`, `X'`, `N'`, `U&'`, `U&"`.
    fn word(&mut self, c: u8) -> Result<Token, Unlexable> {
        let prefixed = match (c.to_ascii_lowercase(), self.peek(1), self.peek(2)) {
            (b'e', Some(b'\''), _) => Some((2, Quote::Escaping)),
            (b'b' | b'x', Some(b'\''), _) => Some((2, Quote::Bits)),
            (b'n', Some(b'\''), _) => Some((2, self.plain())),
            (b'u', Some(b'&'), Some(b'\'')) => Some((3, Quote::Doubling)),
            (b'u', Some(b'&'), Some(b'"')) => {
                self.pos += 3;
                return self.quoted_identifier().map(|_| Token::UnicodeQuoted);
            }
            _ => None,
        };
        if let Some((skip, quote)) = prefixed {
            self.pos += skip;
            self.string(quote)?;
            return Ok(Token::Literal);
        }
        let start = self.pos;
        self.eat(is_ident_cont);
        Ok(Token::Word(self.sql[start..self.pos].to_ascii_lowercase()))
    }
}

/// The first position from `at` on whose byte is not one to `keep`.
fn skip(bytes: &[u8], at: usize, keep: impl Fn(u8) -> bool) -> usize {
    at + bytes[at..].iter().take_while(|&&c| keep(c)).count()
}

/// scan.l's `ident_start`: any byte of a non-ASCII character counts as a letter.
fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c >= 0x80
}

/// scan.l's `ident_cont`.
fn is_ident_cont(c: u8) -> bool {
    is_ident_start(c) || c.is_ascii_digit() || c == b'$'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn passes(sql: &str) {
        if let Err(refusal) = check(sql) {
            panic!("{sql:?} was refused: {refusal}");
        }
    }

    #[track_caller]
    fn refused(sql: &str, statement: usize, what: &str) -> SqlRefusal {
        let refusal = check(sql).expect_err(sql);
        assert_eq!(
            (refusal.statement, refusal.what.as_str()),
            (statement, what),
            "{sql:?}: {refusal}"
        );
        refusal
    }

    const STANDARD_ONLY: &str =
        ", when the server reads backslashes in '...' as escapes (standard_conforming_strings off)";

    #[test]
    fn transaction_control_is_refused_in_every_spelling() {
        for (sql, what) in [
            ("COMMIT", "COMMIT"),
            ("commit", "COMMIT"),
            ("CoMmIt WoRk", "COMMIT WORK"),
            ("commit transaction", "COMMIT TRANSACTION"),
            ("COMMIT AND CHAIN", "COMMIT AND CHAIN"),
            ("COMMIT/*x*/AND/**/CHAIN", "COMMIT AND CHAIN"),
            ("commit\n-- why\nand no\tchain", "COMMIT AND NO CHAIN"),
            (
                "COMMIT /* a /* nested */ comment */ AND CHAIN",
                "COMMIT AND CHAIN",
            ),
            ("END", "END"),
            ("end transaction", "END TRANSACTION"),
            ("abort", "ABORT"),
            ("ABORT WORK AND CHAIN", "ABORT WORK AND CHAIN"),
            ("ROLLBACK", "ROLLBACK"),
            ("rollback work", "ROLLBACK WORK"),
            ("ROLLBACK AND CHAIN", "ROLLBACK AND CHAIN"),
            (
                "rollback transaction and no chain",
                "ROLLBACK TRANSACTION AND NO CHAIN",
            ),
            ("BEGIN", "BEGIN"),
            ("begin isolation level serializable", "BEGIN"),
            ("BEGIN TRANSACTION READ WRITE", "BEGIN TRANSACTION"),
            ("start transaction", "START TRANSACTION"),
            ("START TRANSACTION READ ONLY", "START TRANSACTION"),
            ("-- first a comment\nCOMMIT", "COMMIT"),
            ("/* c */COMMIT", "COMMIT"),
        ] {
            let refusal = refused(&format!("INSERT INTO t VALUES (1);\n{sql};"), 2, what);
            let hint = if what.starts_with("END") {
                HINT_END
            } else {
                HINT_TRANSACTION
            };
            assert_eq!(refusal.hint, hint, "{sql:?}");
        }
    }

    #[test]
    fn savepoints_pass() {
        passes(
            "SAVEPOINT a; INSERT INTO t VALUES (1); ROLLBACK TO SAVEPOINT a; RELEASE SAVEPOINT a",
        );
        passes("savepoint a; rollback to a; release a");
        passes("ROLLBACK WORK TO SAVEPOINT a");
        passes("rollback transaction to a");
        passes("ROLLBACK/**/TO/**/a");
        passes("ROLLBACK\n-- partial undo\nTO a");
        refused("ROLLBACK \"to\" a", 1, "ROLLBACK");
    }

    #[test]
    fn two_phase_commit_is_refused_and_prepare_passes() {
        refused("prepare transaction 'x'", 1, "PREPARE TRANSACTION");
        refused("PREPARE/**/TRANSACTION 'x'", 1, "PREPARE TRANSACTION");
        refused("SELECT 1; commit prepared 'x'", 2, "COMMIT PREPARED");
        refused("ROLLBACK PREPARED 'x'", 1, "ROLLBACK PREPARED");
        let refusal = refused("PREPARE TRANSACTION 'x'", 1, "PREPARE TRANSACTION");
        assert_eq!(refusal.hint, HINT_TWO_PHASE);
        passes("PREPARE p (int) AS INSERT INTO t VALUES ($1); EXECUTE p(1); DEALLOCATE p");
        passes("PREPARE \"transaction\" AS SELECT 1");
    }

    #[test]
    fn keywords_inside_strings_identifiers_and_comments_pass() {
        passes("SELECT 'COMMIT'");
        passes("SELECT 'a;COMMIT;b'");
        passes("SELECT 'it''s; COMMIT; --'");
        passes("SELECT \"a;COMMIT\" FROM t");
        passes("SELECT \"a\"\";COMMIT\" FROM t");
        passes("SELECT U&\"a;COMMIT\" FROM t");
        passes("SELECT U&'d\\0061t\\+000061; COMMIT'");
        passes("SELECT u&'x;COMMIT' UESCAPE '!'");
        passes("SELECT N'x;COMMIT'");
        passes("SELECT X'1F;COMMIT', B'01;COMMIT'");
        passes("SELECT E'x;COMMIT'");
        passes("SELECT $$; COMMIT; $$");
        passes("SELECT $a$; COMMIT; $a$");
        passes("SELECT $a$ x $b$; COMMIT; $b$ y $a$");
        passes("SELECT $ab$ $a$; COMMIT; $ab$");
        passes("SELECT $a$ $ab$; COMMIT; $a$");
        passes("SELECT $a$ $A$; COMMIT; $a$");
        passes("SELECT $_1$ ;COMMIT; $_1$");
        passes("SELECT $é$ ;COMMIT; $é$");
        passes("SELECT 1 -- ;COMMIT");
        passes("SELECT 1; -- ;COMMIT\nSELECT 2");
        passes("SELECT 1 /* ;COMMIT; */");
        passes("/* /* */ COMMIT; */ SELECT 1");
        passes("/* a /* b /* c */ ; COMMIT; */ ; ROLLBACK */ SELECT 1");
        passes("SELECT 1 +/* ; COMMIT; */ 2");
        passes("SELECT 1 */* ; COMMIT; */ 2");
        passes("SELECT 1 /*/ ; COMMIT; */");
        passes("SELECT commit, rollback, \"end\" FROM begin");
        passes("commit_log");
    }

    #[test]
    fn keywords_outside_strings_are_found() {
        refused("SELECT 'a'; COMMIT", 2, "COMMIT");
        refused("SELECT \"a\";COMMIT", 2, "COMMIT");
        refused("SELECT $a$ x $a$; COMMIT; $a$ y $a$", 2, "COMMIT");
        refused("/* */ COMMIT; /* */", 1, "COMMIT");
        refused("/* /* */ */ COMMIT", 1, "COMMIT");
        refused("SELECT 1 **/* x */; COMMIT", 2, "COMMIT");
        refused("SELECT 2 *-- ;\n; COMMIT", 2, "COMMIT");
        refused("SELECT X'1F'; COMMIT", 2, "COMMIT");
        refused("SELECT U&'\\'; COMMIT; --'", 2, "COMMIT");
        refused(
            "SELECT 'x' /* the quote below starts a new string */ 'y'; COMMIT",
            2,
            "COMMIT",
        );
    }

    #[test]
    fn a_dollar_inside_a_name_or_after_a_digit_is_not_a_quote() {
        // `a$b$` is one identifier, so what follows is not quoted.
        refused("SELECT a$b$; COMMIT; $b$", 2, "COMMIT");
        refused("SELECT é$a$; COMMIT; $a$", 2, "COMMIT");
        passes("SELECT a$b$ FROM t; SELECT $b$; COMMIT; $b$");
        // `$1` is a parameter.
        refused("PREPARE p AS SELECT $1; COMMIT", 2, "COMMIT");
        passes("PREPARE p AS SELECT $1, $2::int, $a$$1$a$");
        // A lone `$` quotes nothing.
        refused("SELECT $ 1; COMMIT", 2, "COMMIT");
        refused("SELECT $-1; COMMIT", 2, "COMMIT");
    }

    #[test]
    fn numbers_pass_unless_run_into_a_name() {
        passes("SELECT 1, 1.5, .5, 1e5, 1.5e-3, 2E+10, 1., 0x1F, 0o17, 0b101, 1_000, 1..2");
        let run_together = "a number or parameter directly followed by a name or `$`";
        refused("SELECT 1$a$; COMMIT; $a$", 1, run_together);
        refused("SELECT $1$a$; COMMIT; $a$", 1, run_together);
        refused("SELECT 1e'x'", 1, run_together);
        refused("SELECT 1; SELECT 0b'1'", 2, run_together);
        refused("SELECT 1abc", 1, run_together);
        refused("SELECT $1_0$a$ $a$", 1, run_together);
    }

    #[test]
    fn backslashes_in_strings_follow_the_string_kind() {
        // E'...': `\'` is a quote inside the string, which goes on to the last quote.
        passes("SELECT E'\\';COMMIT;--'");
        passes("SELECT e'\\\\\\';COMMIT;--'");
        // E'...': `\\` is a backslash, so the next quote ends the string.
        refused("SELECT E'\\\\'; COMMIT", 2, "COMMIT");
        // '...' with standard_conforming_strings on: a backslash is a character, so the string
        // is `\` and `COMMIT` is a statement.
        refused("SELECT '\\';COMMIT;--'", 2, "COMMIT");
        // With it off, `'\';COMMIT;--'` would be one string: the text is refused either way.
        refused("SELECT 'x\\';COMMIT;--'", 2, "COMMIT");
        passes("SELECT 'C:\\dir\\file', E'C:\\\\'");
    }

    #[test]
    fn a_string_that_ends_differently_without_standard_strings_is_refused() {
        // Standard strings: `'C:\'` then `, 'b'`. Without: one string, then an open one.
        let refusal = refused(
            "SELECT 'C:\\', 'b'",
            1,
            &format!("an unterminated quoted string{STANDARD_ONLY}"),
        );
        assert_eq!(refusal.hint, HINT_BACKSLASH);
        // Standard strings: `'\'` then `''` hides nothing. Without: `COMMIT` is a statement.
        refused(
            "SELECT '\\'' ; COMMIT; --'",
            2,
            &format!("COMMIT{STANDARD_ONLY}"),
        );
        refused(
            "SELECT N'\\'' ; COMMIT; --'",
            2,
            &format!("COMMIT{STANDARD_ONLY}"),
        );
        // E'...' reads the same either way.
        refused("SELECT E'\\'' ; COMMIT; --'", 2, "COMMIT");
    }

    #[test]
    fn a_string_continued_on_the_next_line_keeps_its_kind() {
        // The continuation is still an E string, so `\'` is a quote and the next `'` ends it.
        refused("SELECT E'x'\n'\\'' ; COMMIT; --'", 2, "COMMIT");
        refused(
            "SELECT E'x'  -- comment\n  \r\n'\\'' ; COMMIT; --'",
            2,
            "COMMIT",
        );
        // Without a newline between them, the second literal is a new standard string.
        refused(
            "SELECT E'x' /*\n*/ '\\'' ; COMMIT; --'",
            2,
            &format!("COMMIT{STANDARD_ONLY}"),
        );
        refused(
            "SELECT E'x' '\\'' ; COMMIT; --'",
            2,
            &format!("COMMIT{STANDARD_ONLY}"),
        );
        // A bit string's continuation ends at its first quote: `''` is a new, empty string.
        passes("SELECT B'1'\n'0'; SELECT 1");
        refused("SELECT X'1'\n'F'''; COMMIT; --'", 2, "COMMIT");
        passes("SELECT 'a'\n'b''; COMMIT; --'");
    }

    #[test]
    fn fence_settings_are_refused() {
        for sql in [
            "set local fence.token = 9",
            "SET fence.token TO 9",
            "SET SESSION fence.resource = 'x'",
            "SET \"fence\".token = 9",
            "SET \"fence.token\" = 9",
            "SET \"FENCE\".Token = 9",
            "set FENCE . txid = 1",
            "SET /* c */ LOCAL /* c */ fence.txid = 1",
            "SET \"fence.\" = 1",
        ] {
            let refusal = check(sql).expect_err(sql);
            assert_eq!(refusal.statement, 1, "{sql:?}");
            assert!(
                refusal.what.starts_with("SET of fence's setting `fence."),
                "{sql:?}: {refusal}"
            );
            assert_eq!(refusal.hint, HINT_FENCE_SETTING);
        }
        refused(
            "SELECT 1; reset fence.token",
            2,
            "RESET of fence's setting `fence.token`",
        );
        refused(
            "RESET \"fence.txid\"",
            1,
            "RESET of fence's setting `fence.txid`",
        );
        let unicode = "a setting named with `U&\"...\"`, which could be one of fence's";
        refused(
            "SET U&\"\\0066ence\".token = 9",
            1,
            &format!("SET of {unicode}"),
        );
        refused(
            "RESET u&\"!0066ence.token\" UESCAPE '!'",
            1,
            &format!("RESET of {unicode}"),
        );
        passes("SET app.U&\"\\0066ence\" = 1");
        refused("RESET ALL", 1, "RESET ALL");
        refused("reset all", 1, "RESET ALL");
        refused("DISCARD ALL", 1, "DISCARD");
        refused("discard temp", 1, "DISCARD");
        refused(
            "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
            1,
            "SET SESSION CHARACTERISTICS",
        );
        passes("SET LOCAL search_path = app; SET statement_timeout = 0; RESET search_path");
        passes("SET fencex.y = 1; SET myfence.token = 1; SET app.fence = 1");
        assert!(check("SET LOCAL client_connection_check_interval = 0").is_err());
        assert!(check("select dblink_exec('host=x', 'insert into t values (1)')").is_err());
        assert!(check("SELECT * FROM dblink ('c', 'select 1') AS t(x int)").is_err());
        passes("SELECT 'dblink_exec(' AS text, dblink_note FROM t");
        passes("SET SESSION AUTHORIZATION DEFAULT; RESET SESSION AUTHORIZATION");
        passes("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; SET CONSTRAINTS ALL DEFERRED");
    }

    #[test]
    fn copy_with_a_data_stream_is_refused() {
        refused("copy t from stdin", 1, "COPY ... FROM STDIN");
        refused(
            "COPY t (a, b) FROM STDIN WITH (FORMAT csv)",
            1,
            "COPY ... FROM STDIN",
        );
        refused(
            "SELECT 1; COPY (SELECT 1) TO STDOUT",
            2,
            "COPY ... TO STDOUT",
        );
        let refusal = refused("copy t to stdout", 1, "COPY ... TO STDOUT");
        assert_eq!(refusal.hint, HINT_COPY);
        passes("COPY t FROM '/srv/data.csv' WITH (FORMAT csv)");
        passes("COPY (SELECT stdin FROM t) TO '/srv/out.csv'");
        passes("COPY t FROM 'stdin'");
    }

    #[test]
    fn psql_meta_commands_are_refused() {
        let refusal = refused("\\copy t from 'x.csv'", 1, "a psql meta-command (`\\copy`)");
        assert_eq!(refusal.hint, HINT_META);
        refused(
            "SELECT 1;\n\\set x 1\nSELECT 2",
            2,
            "a psql meta-command (`\\set`)",
        );
        refused("SELECT 1 \\gset", 1, "a psql meta-command (`\\gset`)");
        refused("\\i file.sql", 1, "a psql meta-command (`\\i`)");
        passes("SELECT '\\copy', $$\\i$$; -- \\i file.sql\nSELECT 1 /* \\set */");
    }

    #[test]
    fn begin_atomic_bodies_are_refused() {
        let refusal = refused(
            "CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; END",
            1,
            "a SQL-standard function body (`BEGIN ATOMIC ... END`)",
        );
        assert_eq!(refusal.hint, HINT_ATOMIC);
        refused(
            "SELECT 1; CREATE PROCEDURE p() BEGIN /* c */ ATOMIC INSERT INTO t VALUES (1); END",
            2,
            "a SQL-standard function body (`BEGIN ATOMIC ... END`)",
        );
        passes("CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$ SELECT 1; $$");
        passes(
            "CREATE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS $body$\n\
             BEGIN\n  INSERT INTO log VALUES (1);\n  COMMIT;\n  RETURN NEW;\nEND\n$body$",
        );
    }

    #[test]
    fn other_statements_pass() {
        passes("DO $$ BEGIN COMMIT; END $$");
        passes("DO LANGUAGE plpgsql 'BEGIN ROLLBACK; END'");
        passes("CALL p()");
        passes("CREATE TABLE t (a int); ALTER TABLE t ADD b text; DROP TABLE t");
        passes("WITH x AS (SELECT 1) SELECT * FROM x; EXPLAIN ANALYZE SELECT 1");
        passes("(SELECT 1) UNION (SELECT 2)");
        passes("INSERT INTO t SELECT * FROM u RETURNING *;");
        passes("SELECT set_config('search_path', 'app', true)");
        passes("SELECT CASE WHEN true THEN 1 END; LOCK t; NOTIFY c");
        passes("CREATE RULE r AS ON INSERT TO t DO ALSO (NOTIFY a; DELETE FROM u)");
        passes("\u{feff}SELECT 1");
    }

    #[test]
    fn unterminated_constructs_are_refused() {
        for (sql, statement, what) in [
            ("SELECT '", 1, "an unterminated quoted string"),
            ("SELECT 'abc''", 1, "an unterminated quoted string"),
            ("SELECT E'abc\\'", 1, "an unterminated quoted string"),
            ("SELECT E'abc\\", 1, "an unterminated quoted string"),
            ("SELECT B'01", 1, "an unterminated quoted string"),
            ("SELECT U&'x", 1, "an unterminated quoted string"),
            ("SELECT \"abc", 1, "an unterminated quoted identifier"),
            ("SELECT \"a\"\"", 1, "an unterminated quoted identifier"),
            ("SELECT U&\"abc", 1, "an unterminated quoted identifier"),
            ("SELECT $$abc", 1, "an unterminated dollar-quoted string"),
            (
                "SELECT $a$abc$b$",
                1,
                "an unterminated dollar-quoted string",
            ),
            (
                "SELECT $a$abc$A$",
                1,
                "an unterminated dollar-quoted string",
            ),
            (
                "SELECT 1; SELECT $x$",
                2,
                "an unterminated dollar-quoted string",
            ),
            ("/* x", 1, "an unterminated /* comment"),
            ("SELECT 1; /* /* */", 2, "an unterminated /* comment"),
            ("SELECT 1 /* x *", 1, "an unterminated /* comment"),
        ] {
            let refusal = refused(sql, statement, what);
            assert_eq!(refusal.hint, HINT_UNTERMINATED);
        }
        // An earlier statement's refusal is reported first.
        refused("COMMIT; SELECT '", 1, "COMMIT");
    }

    #[test]
    fn sql_without_a_statement_is_refused() {
        for sql in [
            "",
            "   \n",
            ";",
            " ; ;\n;",
            "-- only a comment",
            "/* c */ ; /* d */",
        ] {
            let refusal = refused(
                sql,
                0,
                "it has no statement, only whitespace, comments or semicolons",
            );
            assert_eq!(
                refusal.to_string(),
                format!("refusing the SQL: {}", refusal.what)
            );
        }
    }

    #[test]
    fn nul_bytes_are_refused() {
        refused("SELECT 1\0; COMMIT", 1, "a NUL byte");
        refused("SELECT 1;\0", 2, "a NUL byte");
        refused("SELECT 1; SELECT '\0'", 2, "a NUL byte");
        refused("SELECT 1 /* \0 */", 1, "a NUL byte");
        refused("SELECT 1 -- \0", 1, "a NUL byte");
        let refusal = refused("SELECT $$\0$$", 1, "a NUL byte");
        assert_eq!(refusal.hint, HINT_NUL);
    }

    #[test]
    fn statements_are_counted_without_empty_ones() {
        refused("SELECT 1; ; /* */ ; SELECT 2;;; COMMIT", 3, "COMMIT");
        refused(";;SELECT 1;\n\n-- c\n;ROLLBACK", 2, "ROLLBACK");
    }

    #[test]
    fn excerpts_are_short_and_safe_for_a_terminal() {
        let refusal = refused(
            "SELECT 1;\n  COMMIT\t\tAND\n\n CHAIN  ;",
            2,
            "COMMIT AND CHAIN",
        );
        assert_eq!(refusal.excerpt, "COMMIT AND CHAIN");
        assert_eq!(
            refusal.to_string(),
            "refusing statement 2 (`COMMIT AND CHAIN`): COMMIT AND CHAIN"
        );
        let sql = "/* \u{1b}]0;owned\u{7} \u{9b}31m \u{202e} */ COMMIT";
        let refusal = refused(sql, 1, "COMMIT");
        assert_eq!(
            refusal.excerpt,
            "/* \\u{1b}]0;owned\\u{7} \\u{9b}31m \\u{202e} */ COMMIT"
        );
        let long = format!("/* {} */ COMMIT", "é".repeat(100));
        let refusal = refused(&long, 1, "COMMIT");
        assert_eq!(
            refusal.excerpt,
            format!("/* {}...", "é".repeat(EXCERPT_CHARS - 3))
        );
        let refusal = refused(
            "SET \"fence.\u{1b}[2J\" = 1",
            1,
            "SET of fence's setting `fence.\\u{1b}[2j`",
        );
        assert!(!refusal.to_string().contains('\u{1b}'));
    }

    /// A tiny deterministic generator, so that the property tests need no dependency.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }

        fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
            from[self.below(from.len())]
        }
    }

    const SAFE: &[&str] = &[
        "SELECT 1",
        "INSERT INTO t VALUES ('a''b;COMMIT')",
        "SELECT E'\\';COMMIT;--'",
        "SELECT $x$;COMMIT;$x$",
        "SELECT $$ $x$ ; ROLLBACK; $$",
        "SELECT \"x;COMMIT\" FROM t",
        "/* /* ;COMMIT */ ; */ SELECT 2",
        "SELECT 1 -- ;COMMIT\n",
        "SAVEPOINT s",
        "ROLLBACK TO SAVEPOINT s",
        "RELEASE s",
        "DO $do$ BEGIN COMMIT; END $do$",
        "UPDATE t SET a = a$b$ WHERE c = $1",
        "SELECT 'x'\n-- c\n'y;COMMIT'",
        "COPY t FROM '/srv/x.csv'",
        "SET LOCAL lock_timeout = '1s'",
    ];
    const GAPS: &[&str] = &[
        "",
        " ",
        "\n",
        "\t",
        "/**/",
        " /* a /* b */ ; */ ",
        "-- ;c\n",
    ];

    #[test]
    fn property_safe_statements_pass_and_a_trailing_commit_is_found() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..2000 {
            let count = 1 + rng.below(6);
            let mut sql = String::new();
            for _ in 0..count {
                sql.push_str(rng.pick(GAPS));
                sql.push_str(rng.pick(SAFE));
                sql.push_str(rng.pick(GAPS));
                sql.push_str(rng.pick(&[";", ";;", ";\n"]));
            }
            passes(&sql);
            let commit = format!("{sql}{}COMMIT{}", rng.pick(GAPS), rng.pick(GAPS));
            refused(&commit, count + 1, "COMMIT");
            // The way fence appends its own statements: after a newline.
            let unterminated = format!("{sql}\n{}", rng.pick(&["'", "\"", "$q$", "/*", "E'\\'"]));
            check(&unterminated).expect_err(&unterminated);
        }
    }

    #[test]
    fn property_transaction_control_is_found_whatever_the_case_and_gaps() {
        let forms: &[&[&str]] = &[
            &["COMMIT"],
            &["COMMIT", "WORK", "AND", "NO", "CHAIN"],
            &["ROLLBACK", "AND", "CHAIN"],
            &["END", "TRANSACTION"],
            &["ABORT"],
            &["START", "TRANSACTION"],
            &["BEGIN", "WORK"],
        ];
        let gaps = [
            " ",
            "\n",
            "\t",
            "/**/",
            " /* a /* b */ ; */ ",
            "--;c\n",
            "\r\n",
        ];
        let mut rng = Rng(42);
        for _ in 0..2000 {
            let form = forms[rng.below(forms.len())];
            let mut sql = String::from("SELECT 1;");
            sql.push_str(rng.pick(&gaps));
            for (i, word) in form.iter().enumerate() {
                if i > 0 {
                    sql.push_str(rng.pick(&gaps));
                }
                sql.extend(word.chars().map(|c| match rng.below(2) {
                    0 => c.to_ascii_lowercase(),
                    _ => c,
                }));
            }
            refused(&sql, 2, &form.join(" "));
        }
    }
}
