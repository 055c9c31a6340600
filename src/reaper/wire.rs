//! The supervisor's wire protocol, both sides in one place: what `fence run` sends the reaper
//! on its start pipe (the start message, then the lease's later bounds) and what the reaper
//! answers on its report pipe (a newline once the command started, or why it could not; once
//! it ended, a line per thing `fence run` must know). `fence run` encodes with
//! [`start_message`] and [`bound_message`] and decodes with [`Failure::parse`] and
//! [`Report::parse`]; the reaper the other way round.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;

/// The reaper's answer once the command runs: one newline on the report pipe.
pub const STARTED: u8 = b'\n';

/// Said instead of starting the command when the lease's first bound had passed by the time
/// the start message was read (`fence run` paused between its grant and its message).
pub const EXPIRED: &str = "the lease's bound passed before the command could start";

/// Said when the process forked in advance to run the command died before its exec.
pub const LOST: &str = "the command's process was killed before it could run the command";

const LEFTOVERS: &str = "leftovers";
const INTERRUPTED: &str = "interrupted";
const BOUND: &str = "bound";
const ENDED: &str = "ended";
const INSIDE: &str = "inside";
const AT: &str = "at";
const STATUS: &str = "status";

/// The start message: the lease's first bound (8 bytes, CLOCK_BOOTTIME ns, little-endian), the
/// length of what follows (4 bytes), and the command's added environment, `KEY=VALUE` entries
/// each ended by a NUL.
pub fn start_message(bound: u64, env: &[(&str, String)]) -> Vec<u8> {
    let mut payload = Vec::new();
    for (key, value) in env {
        payload.extend_from_slice(key.as_bytes());
        payload.push(b'=');
        payload.extend_from_slice(value.as_bytes());
        payload.push(0);
    }
    let mut message = bound.to_le_bytes().to_vec();
    message.extend_from_slice(&u32::try_from(payload.len()).unwrap_or(0).to_le_bytes());
    message.extend_from_slice(&payload);
    message
}

/// Reads a start message; `None` when the pipe ends first (the command must not start).
pub fn read_start(start: &mut impl Read) -> Option<(u64, Vec<(OsString, OsString)>)> {
    let mut head = [0u8; 12];
    start.read_exact(&mut head).ok()?;
    let (bound, len) = head.split_at(8);
    let bound = u64::from_le_bytes(bound.try_into().ok()?);
    let len = u32::from_le_bytes(len.try_into().ok()?);
    let mut payload = vec![0u8; usize::try_from(len).ok()?];
    start.read_exact(&mut payload).ok()?;
    let env = payload
        .split(|b| *b == 0)
        .filter(|entry| !entry.is_empty())
        .filter_map(|entry| {
            let at = entry.iter().position(|b| *b == b'=')?;
            let (key, value) = (&entry[..at], &entry[at + 1..]);
            Some((
                OsStr::from_bytes(key).to_owned(),
                OsStr::from_bytes(value).to_owned(),
            ))
        })
        .collect();
    Some((bound, env))
}

/// A later bound: 8 bytes, written at once (a pipe never splits a write this small).
pub fn bound_message(bound: u64) -> [u8; 8] {
    bound.to_le_bytes()
}

/// The newest bound in what was read from the start pipe after the start message (whole
/// 8-byte bounds only; `None` when there is none).
pub fn latest_bound(read: &[u8]) -> Option<u64> {
    let whole = read.len() / 8;
    let last = read.get((whole.checked_sub(1)?) * 8..whole * 8)?;
    Some(u64::from_le_bytes(last.try_into().ok()?))
}

/// Why the command could not start, as the reaper says it before closing its end.
#[derive(Debug, PartialEq, Eq)]
pub enum Failure {
    /// The lease's first bound had passed ([`EXPIRED`]).
    Expired,
    /// The process forked in advance to run the command was killed before it could ([`LOST`]).
    Lost,
    /// exec failed: the error number (0 when unknown) and the system's message.
    Exec { errno: i32, message: String },
}

impl Failure {
    pub fn encode(&self) -> String {
        match self {
            Failure::Expired => EXPIRED.to_owned(),
            Failure::Lost => LOST.to_owned(),
            Failure::Exec { errno, message } => format!("E{errno} {message}"),
        }
    }

    pub fn parse(text: &str) -> Failure {
        if text == EXPIRED {
            return Failure::Expired;
        }
        if text == LOST {
            return Failure::Lost;
        }
        text.strip_prefix('E')
            .and_then(|rest| rest.split_once(' '))
            .and_then(|(n, what)| {
                Some(Failure::Exec {
                    errno: n.parse().ok()?,
                    message: what.to_owned(),
                })
            })
            .unwrap_or_else(|| Failure::Exec {
                errno: 0,
                message: text.to_owned(),
            })
    }
}

/// What the reaper reports once the command ended, a line each.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// It had to stop processes the command left running.
    pub leftovers: bool,
    /// It stopped the command at the lease's bound (`fence run` proved none later).
    pub bound: bool,
    /// A stop signal reached the command's group (from `fence run`, or straight from the
    /// terminal, whose Ctrl-C goes to the foreground group only, the command's).
    pub interrupted: Option<i32>,
    /// The command ended before the lease's bound as the reaper last knew it, before the
    /// reaper had to stop it, with nothing left running: when it saw it end (bound clock ns).
    /// So the command finished inside its lease, whatever `fence run` (paused, say) learns of
    /// the lease afterwards.
    pub inside: Option<u64>,
    /// When the reaper saw the command end (bound clock ns), however it ended: for the run's
    /// record (`fence run` itself may have been paused then).
    pub at: Option<u64>,
    /// It ended on its own: its last line. Without it, the reaper was killed.
    pub ended: bool,
    /// The command's wait status (`waitpid`'s raw value), which the reaper passes on as its
    /// own too: `fence run` goes on with it once the run's cgroup is empty, without waiting
    /// for the reaper's own end (see `hold`).
    pub status: Option<i32>,
}

impl Report {
    pub fn encode(&self) -> String {
        let mut text = String::new();
        if self.leftovers {
            text.push_str(LEFTOVERS);
            text.push('\n');
        }
        if self.bound {
            text.push_str(BOUND);
            text.push('\n');
        }
        if let Some(signal) = self.interrupted {
            text.push_str(&format!("{INTERRUPTED} {signal}\n"));
        }
        if let Some(at) = self.inside {
            text.push_str(&format!("{INSIDE} {at}\n"));
        }
        if let Some(at) = self.at {
            text.push_str(&format!("{AT} {at}\n"));
        }
        if let Some(status) = self.status {
            text.push_str(&format!("{STATUS} {status}\n"));
        }
        if self.ended {
            text.push_str(ENDED);
            text.push('\n');
        }
        text
    }

    /// The command's status, from a whole report that carries it.
    pub fn command_status(&self) -> Option<std::process::ExitStatus> {
        use std::os::unix::process::ExitStatusExt;
        self.status
            .filter(|_| self.ended)
            .map(std::process::ExitStatus::from_raw)
    }

    /// Lines it does not know are skipped (a newer reaper's), as is a line cut short.
    ///
    /// Only the reaper's own report counts: the last one, up to its `ended` line and after
    /// any earlier `ended` (the reaper writes its report in one write, once the command and
    /// everything it started are gone). A command running as root can write into the pipe
    /// (through /proc), but what it writes comes before the reaper's report, so it is not
    /// read. `inside` counts only in a whole report that says nothing against it (no bound
    /// enforced, nothing left running); without `ended` (a killed reaper), it never counts.
    pub fn parse(text: &str) -> Report {
        let lines: Vec<&str> = text.lines().collect();
        let end = lines.iter().rposition(|line| *line == ENDED);
        let start = end.map_or(0, |end| {
            lines[..end]
                .iter()
                .rposition(|line| *line == ENDED)
                .map_or(0, |before| before + 1)
        });
        let mut report = Report::default();
        for &line in &lines[start..end.unwrap_or(lines.len())] {
            match line.split_once(' ') {
                None if line == LEFTOVERS => report.leftovers = true,
                None if line == BOUND => report.bound = true,
                Some((INTERRUPTED, signal)) => report.interrupted = signal.parse().ok(),
                Some((INSIDE, at)) => report.inside = at.parse().ok(),
                Some((AT, at)) => report.at = at.parse().ok(),
                Some((STATUS, status)) => report.status = status.parse().ok(),
                _ => {}
            }
        }
        report.ended = end.is_some();
        if !report.ended || report.bound || report.leftovers {
            report.inside = None;
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_message_round_trips() {
        let env = [
            ("FENCE_TOKEN", "42".to_owned()),
            ("FENCE_OWNER", "host=a b\u{e9}".to_owned()),
            ("FENCE_STORE", String::new()),
        ];
        let message = start_message(0x0102_0304_0506_0708, &env);
        let (bound, read) = read_start(&mut &message[..]).unwrap();
        assert_eq!(bound, 0x0102_0304_0506_0708);
        let want: Vec<(OsString, OsString)> = env
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect();
        assert_eq!(read, want);
        // Cut anywhere, it starts nothing.
        for cut in 0..message.len() {
            assert_eq!(read_start(&mut &message[..cut]), None, "cut at {cut}");
        }
    }

    #[test]
    fn the_newest_whole_bound_wins() {
        let mut read = Vec::new();
        assert_eq!(latest_bound(&read), None);
        for bound in [5u64, 7, u64::MAX - 1] {
            read.extend_from_slice(&bound_message(bound));
            assert_eq!(latest_bound(&read), Some(bound));
        }
        read.extend_from_slice(&[1, 2, 3]);
        assert_eq!(latest_bound(&read), Some(u64::MAX - 1));
    }

    #[test]
    fn failures_round_trip() {
        for failure in [
            Failure::Expired,
            Failure::Lost,
            Failure::Exec {
                errno: libc::ENOENT,
                message: "No such file or directory (os error 2)".to_owned(),
            },
        ] {
            assert_eq!(Failure::parse(&failure.encode()), failure);
        }
        assert_eq!(
            Failure::parse("something else"),
            Failure::Exec {
                errno: 0,
                message: "something else".to_owned()
            }
        );
    }

    #[test]
    fn reports_round_trip_and_a_killed_reaper_never_says_ended() {
        let full = Report {
            leftovers: true,
            bound: true,
            interrupted: Some(libc::SIGTERM),
            // Never with `bound` or `leftovers`: see `only_the_reapers_own_report_counts`.
            inside: None,
            at: Some(7),
            ended: true,
            status: Some(0x8b),
        };
        for report in [Report::default(), full.clone()] {
            assert_eq!(Report::parse(&report.encode()), report);
        }
        let text = full.encode();
        let cut = &text[..text.len() - "ended\n".len()];
        assert!(!Report::parse(cut).ended);
        assert!(Report::parse("newer-line\nended\n").ended);
    }

    #[test]
    fn only_the_reapers_own_report_counts() {
        // The reaper's report (nothing left, ended inside) round-trips.
        let inside = Report {
            inside: Some(42),
            ended: true,
            ..Report::default()
        };
        assert_eq!(Report::parse(&inside.encode()), inside);
        // Lines a command wrote into the pipe before the reaper's report are not read.
        let forged = "\ninside 1\nended\nbound\nended\n";
        let report = Report::parse(forged);
        assert!(report.bound && report.inside.is_none(), "{report:?}");
        let forged = "\ninside 1\nleftovers\ninterrupted 15\nended\nended\n";
        assert_eq!(
            Report::parse(forged),
            Report {
                ended: true,
                ..Report::default()
            }
        );
        // A report without `ended` (a killed reaper) never says inside.
        assert_eq!(Report::parse("\ninside 5\n").inside, None);
        // Nor one that contradicts it.
        assert_eq!(Report::parse("bound\ninside 5\nended\n").inside, None);
        assert_eq!(Report::parse("leftovers\ninside 5\nended\n").inside, None);
    }
}
