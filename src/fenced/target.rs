//! A fenced target behind one trait, so that `write`, `inspect`, `inspect --id` and `log` call
//! a target without matching on its kind. A new kind implements [`FencedTarget`] in a module of
//! its own and is registered in [`open`] and [`TargetSpec::resolve`] (DESIGN §13, "What a new
//! target touches").

use async_trait::async_trait;
use indicatif::ProgressBar;

use crate::coordinator::{LogQuery, Logged};
use crate::error::Error;
use crate::fenced::object::{Expect, ObjectOutcome, ObjectTarget, ObjectView, Sequencer};
use crate::fenced::postgres::{GuardView, PgTarget, RowOutcome, RowWrite, TxOutcome};
use crate::fenced::TargetSpec;
use crate::signals::Interrupts;

/// How a write gives its effect: what `fence write` was given.
#[derive(Clone, Copy, Debug)]
pub enum Form<'a> {
    /// `--sql` or `--file`: statements run in one fenced transaction.
    Transaction,
    /// `--table`, `--key`, `--set`: one conditional row update (or insert).
    Row,
    /// `--from`: an object's new bytes, with `--if-match` or `--if-generation-match`.
    Bytes(&'a Expect),
}

/// A write's effect, in its form.
pub enum Body<'a> {
    Transaction {
        sql: &'a str,
        /// Caught from before the connection on: a stop signal cancels the transaction on
        /// the server instead of leaving it to run to its COMMIT.
        interrupts: &'a mut Interrupts,
    },
    Row {
        write: &'a RowWrite,
        /// Caught from before the connection on, as for a transaction.
        interrupts: &'a mut Interrupts,
    },
    Bytes {
        bytes: Vec<u8>,
        /// `--if-match`, `--if-generation-match`.
        expect: &'a Expect,
        /// The coordinator, asked right before the put when the target needs it (see
        /// [`FencedTarget::needs_sequencer`]).
        sequencer: Sequencer<'a>,
        /// Counts the bytes sent.
        bar: &'a ProgressBar,
    },
}

/// One fenced write: the token that guards it and its effect.
pub struct WriteRequest<'a> {
    pub resource: &'a str,
    pub token: i64,
    pub owner: &'a str,
    /// `--id`: applied at most once per resource, whoever writes it.
    pub write_id: Option<&'a str>,
    /// The target gives up (and cancels what it can) after this long.
    pub timeout: std::time::Duration,
    pub body: Body<'a>,
}

/// What a write did, in its form.
pub enum Outcome {
    Transaction(TxOutcome),
    Row(RowOutcome),
    Object(ObjectOutcome),
}

/// What a target holds, as `inspect --target` shows it.
pub enum TargetView {
    /// A database's guard rows, one per resource.
    Guards(Vec<GuardView>),
    /// An object's version and stored token.
    Object(ObjectView),
}

/// A write id's entry in a target's ledger: when, with which token and by whom it was applied,
/// and for an object the version it made.
pub struct Applied {
    pub at_ms: i64,
    pub token: i64,
    pub owner: Option<String>,
    pub version: Option<String>,
}

/// Where a fenced write becomes durable and the token is enforced (I2, I6).
#[async_trait(?Send)]
pub trait FencedTarget {
    /// The target as shown to people (no password).
    fn display(&self) -> &str;

    /// Fails (exit 2) when fence's records are not in the target: a read-only question about
    /// a typo (`--schema`) must not be answered "nothing was written there". Targets whose
    /// records live in the written object itself accept.
    async fn require_existing(&self) -> Result<(), Error> {
        Ok(())
    }

    /// Whether a write must ask the coordinator for the newest token right before it lands
    /// (a target that cannot tell two versions with the same bytes apart: S3's ETags).
    fn needs_sequencer(&self) -> bool {
        false
    }

    /// Whether the target records the writes it refuses itself; otherwise `fence write`
    /// records a refusal in the coordinator's history.
    fn records_refusals(&self) -> bool;

    /// Applies `write` if its token is the newest the target has seen for the resource.
    async fn write(&self, write: WriteRequest<'_>) -> Result<Outcome, Error>;

    /// What the target holds for `resources` (every one when empty).
    async fn view(&self, resources: &[String]) -> Result<TargetView, Error>;

    /// The highest token the target accepted for each of `resources` (every one when empty).
    async fn highest_tokens(&self, resources: &[String]) -> Result<Vec<(String, i64)>, Error> {
        Ok(match self.view(resources).await? {
            TargetView::Guards(guards) => guards
                .into_iter()
                .filter_map(|g| Some((g.resource, g.highest_token?)))
                .collect(),
            TargetView::Object(object) => object
                .resource
                .zip(object.token)
                .filter(|(r, _)| resources.is_empty() || resources.contains(r))
                .into_iter()
                .collect(),
        })
    }

    /// How many write ids the target remembers, when it forgets older ones (an object keeps
    /// the last few in its metadata); `None`: every id, until pruned.
    fn remembers_ids(&self) -> Option<usize> {
        None
    }

    /// Write id `id`'s entry for `resource`, if it was applied.
    async fn applied(&self, resource: &str, id: &str) -> Result<Option<Applied>, Error>;

    /// The writes the target accepted and refused for the resources of `query`, within its
    /// window, oldest first, at most `query.limit` of the most recent.
    async fn log(&self, query: &LogQuery<'_>) -> Result<Vec<Logged>, Error>;
}

/// Opens the target `spec` names (connecting, for a database).
pub async fn open(spec: &TargetSpec, schema: &str) -> Result<Box<dyn FencedTarget>, Error> {
    match &spec.object {
        None => Ok(Box::new(PgTarget::connect(spec, schema).await?)),
        Some(url) => Ok(Box::new(ObjectTarget::new(url.clone(), &spec.display))),
    }
}

impl TargetSpec {
    /// Fails (a usage error) when this kind of target is not written in `form`, or not with
    /// its flags: checked before anything is read or sent.
    pub fn check_form(&self, form: Form<'_>) -> Result<(), Error> {
        match (&self.object, form) {
            (Some(url), Form::Bytes(expect)) => crate::fenced::object::check_flags(url, expect),
            (None, Form::Transaction | Form::Row) => Ok(()),
            (object, _) => Err(wrong_form(&self.display, object.is_some())),
        }
    }
}

/// The usage error for a write whose form the target does not take (an `object` target
/// takes bytes only, a database anything but bytes).
pub fn wrong_form(display: &str, object: bool) -> Error {
    if object {
        Error::usage(
            format!("an object target (`{display}`) is written with --from FILE"),
            "give the bytes with --from FILE, or --from - for standard input; --sql, --file and --table are for PostgreSQL",
        )
    } else {
        Error::usage(
            format!("--from writes objects, but `{display}` is a database"),
            "use --sql, --file or --table with a PostgreSQL target, or an s3://, gs:// or file:// target",
        )
    }
}
