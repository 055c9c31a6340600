//! What `fence log` asks a coordinator for: the events of some resources (names or globs)
//! within a time window, and the shape they come back in.

use crate::coordinator::{Event, ResourceView};
use crate::error::{ConflictKind, Error};

/// Refused attempts are coalesced per resource, owner, kind and this long a window (a
/// count, and the first and last time), so that a busy loop cannot grow the history.
pub const ATTEMPT_WINDOW_MS: i64 = 60_000;

/// A refused attempt, as the history records it: `busy` (an acquire of a lease another
/// owner holds) or `conflict` (a renew or release of a lease the caller does not hold).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    pub resource: String,
    pub owner: String,
    /// `busy` or `conflict`.
    pub kind: &'static str,
    /// Busy: the holder's token; conflict: the token presented.
    pub token: i64,
    pub detail: String,
}

impl Attempt {
    /// The attempt `op` by `owner` that `err` refused, when it is one the history records
    /// (stale, lost and other refusals are events of their own, or not the store's).
    pub fn of(op: &str, owner: &str, err: &Error) -> Option<Attempt> {
        let (resource, kind, token, detail) = match err {
            Error::Busy { resource, holder }
            | Error::WaitedOut {
                resource, holder, ..
            } => (
                resource,
                "busy",
                holder.token,
                format!("held by `{}` (token {})", holder.owner, holder.token),
            ),
            Error::Conflict {
                resource,
                token,
                kind,
            } => {
                let why = match kind {
                    ConflictKind::NoLease => "no lease was ever granted".to_owned(),
                    ConflictKind::NeverIssued { highest_token } => {
                        format!("token never issued (highest {highest_token})")
                    }
                    ConflictKind::WrongOwner { holder } => {
                        format!("the lease is held by `{holder}`")
                    }
                    _ => return None,
                };
                (resource, "conflict", *token, format!("{op} refused: {why}"))
            }
            _ => return None,
        };
        Some(Attempt {
            resource: resource.clone(),
            owner: owner.to_owned(),
            kind,
            token,
            detail,
        })
    }
}

/// A resource name or a glob of them: `*` any run of characters, `?` one character.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pattern(String);

impl Pattern {
    pub fn new(text: &str) -> Pattern {
        Pattern(text.to_owned())
    }

    /// The one name the pattern matches, when it has no wildcard.
    pub fn exact(&self) -> Option<&str> {
        (!self.0.contains(['*', '?'])).then_some(self.0.as_str())
    }

    /// Whether `name` matches: `*` any run of characters, `?` one. Linear in the product of
    /// the two lengths (the usual greedy match that backtracks only to the last `*`): a
    /// recursive match took exponential time on patterns such as `*a*a*a*a*a*b`.
    pub fn matches(&self, name: &str) -> bool {
        let pattern: Vec<char> = self.0.chars().collect();
        let name: Vec<char> = name.chars().collect();
        let (mut p, mut n) = (0, 0);
        // After the last `*` seen: where in the pattern, and where in the name it resumed.
        let mut star: Option<(usize, usize)> = None;
        while n < name.len() {
            match pattern.get(p) {
                Some('*') => {
                    star = Some((p + 1, n));
                    p += 1;
                }
                Some(&c) if c == '?' || c == name[n] => {
                    p += 1;
                    n += 1;
                }
                _ => match star {
                    Some((after, resumed)) => {
                        p = after;
                        n = resumed + 1;
                        star = Some((after, resumed + 1));
                    }
                    None => return false,
                },
            }
        }
        pattern[p..].iter().all(|&c| c == '*')
    }

    /// The pattern for SQL `LIKE` (whose escape character is the backslash).
    pub fn like(&self) -> String {
        let mut like = String::with_capacity(self.0.len() + 4);
        for c in self.0.chars() {
            match c {
                '*' => like.push('%'),
                '?' => like.push('_'),
                '%' | '_' | '\\' => {
                    like.push('\\');
                    like.push(c);
                }
                c => like.push(c),
            }
        }
        like
    }
}

/// Which events to read.
#[derive(Clone, Copy, Debug)]
pub struct LogQuery<'a> {
    /// The resources (every one when empty).
    pub patterns: &'a [Pattern],
    /// Only events at or after this instant (milliseconds since the epoch).
    pub since_ms: Option<i64>,
    /// Only events before this instant.
    pub until_ms: Option<i64>,
    /// At most this many, the most recent.
    pub limit: usize,
}

impl LogQuery<'_> {
    /// The names to read when every pattern is one (for indexed lookups); `None`: list.
    pub fn exact_names(&self) -> Option<Vec<String>> {
        if self.patterns.is_empty() {
            return None;
        }
        self.patterns
            .iter()
            .map(|p| p.exact().map(str::to_owned))
            .collect()
    }

    pub fn matches(&self, resource: &str) -> bool {
        self.patterns.is_empty() || self.patterns.iter().any(|p| p.matches(resource))
    }

    pub fn in_window(&self, at_ms: i64) -> bool {
        self.since_ms.is_none_or(|since| at_ms >= since)
            && self.until_ms.is_none_or(|until| at_ms < until)
    }
}

/// One event of one resource, as a log reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logged {
    pub resource: String,
    /// Microseconds since the epoch where the store keeps them (PostgreSQL), else the
    /// millisecond times 1000: what orders the events of several sources.
    pub at_us: i64,
    pub event: Event,
}

/// The oldest-first, most recent `query.limit` events of `views` within the query.
pub fn from_views(views: Vec<ResourceView>, query: &LogQuery<'_>) -> Vec<Logged> {
    let mut logged: Vec<Logged> = views
        .into_iter()
        .filter(|v| query.matches(&v.resource))
        .flat_map(|v| {
            let resource = v.resource;
            // Most recent first in a view: reversed, each resource's events are in order.
            v.events.into_iter().rev().map(move |event| Logged {
                resource: resource.clone(),
                at_us: event.at_ms.saturating_mul(1000),
                event,
            })
        })
        .filter(|l| query.in_window(l.event.at_ms))
        .collect();
    newest(&mut logged, query.limit);
    logged
}

/// Sorts by time (stably: each resource's own order stays) and keeps the `limit` newest.
pub fn newest(logged: &mut Vec<Logged>, limit: usize) {
    logged.sort_by_key(|l| l.at_us);
    if logged.len() > limit {
        logged.drain(..logged.len() - limit);
    }
}

#[cfg(test)]
mod tests {
    use super::Pattern;

    #[test]
    fn globs() {
        let p = Pattern::new("nightly-*");
        assert!(p.matches("nightly-report") && p.matches("nightly-") && !p.matches("daily"));
        assert!(Pattern::new("a?c").matches("abc") && !Pattern::new("a?c").matches("ac"));
        // Against the plain recursive definition, on every pattern and name over a small
        // alphabet (the recursion is exponential only on long inputs).
        fn reference(p: &[char], n: &[char]) -> bool {
            match p.split_first() {
                None => n.is_empty(),
                Some(('*', rest)) => (0..=n.len()).any(|skip| reference(rest, &n[skip..])),
                Some(('?', rest)) => !n.is_empty() && reference(rest, &n[1..]),
                Some((c, rest)) => n.first() == Some(c) && reference(rest, &n[1..]),
            }
        }
        let words = |alphabet: &[char], max: usize| {
            let mut all = vec![String::new()];
            let mut last = vec![String::new()];
            for _ in 0..max {
                last = last
                    .iter()
                    .flat_map(|w| alphabet.iter().map(move |c| format!("{w}{c}")))
                    .collect();
                all.extend(last.iter().cloned());
            }
            all
        };
        for pattern in words(&['a', 'b', '*', '?'], 4) {
            for name in words(&['a', 'b'], 4) {
                let (p, n): (Vec<char>, Vec<char>) =
                    (pattern.chars().collect(), name.chars().collect());
                assert_eq!(
                    Pattern::new(&pattern).matches(&name),
                    reference(&p, &n),
                    "{pattern:?} on {name:?}"
                );
            }
        }
        assert_eq!(Pattern::new("job").exact(), Some("job"));
        assert_eq!(Pattern::new("a_b%*").like(), "a\\_b\\%%");
    }
}
