//! `fence write`: a write that the target accepts only with a current fencing token.

use std::io::Read;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::cli::WriteArgs;
use crate::cmd::Context;
use crate::coordinator::{Attempt, EventKind};
use crate::error::Error;
use crate::fenced::object::{Expect, IdEntry, ObjectOutcome, Sequencer};
use crate::fenced::postgres::{LedgerEntry, RowOutcome, RowWrite, StatementResult, TxOutcome};
use crate::fenced::target::{Body, FencedTarget, Form, Outcome as Done, WriteRequest};
use crate::fenced::{self, sql_check, TargetSpec};
use crate::output::{self, Output, Report};
use crate::signals::Interrupts;

pub struct Written {
    resource: String,
    token: i64,
    target: String,
    outcome: Outcome,
}

enum Outcome {
    Transaction {
        write_id: Option<String>,
        outcome: TxOutcome,
    },
    Row {
        table: String,
        outcome: RowOutcome,
    },
    Object {
        write_id: Option<String>,
        outcome: ObjectOutcome,
    },
}

pub async fn run(args: WriteArgs, ctx: &Context, out: &Output) -> Result<Written, Error> {
    if let Some(leased) = args
        .token_from_env_for
        .as_deref()
        .filter(|leased| *leased != args.resource)
    {
        return Err(Error::usage(
            format!(
                "the token in FENCE_TOKEN ({}) is the lease of `{leased}` (FENCE_RESOURCE), not of `{}`: it does not guard a write to `{}`",
                args.token, args.resource, args.resource
            ),
            format!(
                "acquire `{}` and write with its token (--token), or write `{leased}` (leave out RESOURCE)",
                args.resource
            ),
        ));
    }
    let spec = TargetSpec::resolve(&args.target)?;
    let owner = args.owner.clone().unwrap_or_default();
    let expect = Expect {
        if_match: args.if_match.clone(),
        if_generation_match: args.if_generation_match,
    };
    let form = if args.from.is_some() {
        Form::Bytes(&expect)
    } else if args.table.is_some() {
        Form::Row
    } else {
        Form::Transaction
    };
    // Read and check everything before connecting: bad input never reaches the target.
    spec.check_form(form)?;
    let request = |body| WriteRequest {
        resource: &args.resource,
        token: args.token,
        owner: &owner,
        write_id: args.id.as_deref(),
        timeout: args.timeout,
        body,
    };
    let (target, written) = match (&args.from, &args.table) {
        (Some(from), _) => {
            let bytes = read_bytes(from)?;
            let target = fenced::target::open(&spec, &ctx.schema).await?;
            // The coordinator, to confirm right before the put that the token is still the
            // newest (see `FencedTarget::needs_sequencer`); none reachable: unchecked, with
            // a warning that says why (a store that could not even be opened went unsaid:
            // review 15).
            let store = match &ctx.history {
                _ if !target.needs_sequencer() => None,
                Some(store) => Some(match crate::coordinator::open(store, &ctx.schema).await {
                    Ok(opened) => match opened.require_existing().await {
                        Ok(()) => Ok(opened),
                        Err(err) => Err(err.to_string()),
                    },
                    Err(err) => Err(err.to_string()),
                }),
                None => Some(Err(
                    "no store to ask: --store or FENCE_STORE is not a store URL fence reads".into(),
                )),
            };
            let sequencer = match &store {
                None => Sequencer::NotNeeded,
                Some(Ok(store)) => Sequencer::Store(store.as_ref()),
                Some(Err(why)) => Sequencer::Unreachable(why),
            };
            let bar = out.upload_bar(bytes.len(), &spec.display);
            let written = target
                .write(request(Body::Bytes {
                    bytes,
                    expect: &expect,
                    sequencer,
                    bar: &bar,
                }))
                .await;
            // Done: the bar stays, showing what was really sent; failed or replayed: the
            // error or the replay says it all.
            match &written {
                Ok(Done::Object(ObjectOutcome::Written(_))) => bar.abandon(),
                _ => bar.finish_and_clear(),
            }
            (target, written)
        }
        (None, Some(table)) => {
            let write = RowWrite {
                table: table.clone(),
                key: assignments("--key", &args.keys)?,
                set: assignments("--set", &args.sets)?,
                token_column: args.token_column.clone(),
                upsert: args.upsert,
            };
            if write.key.is_empty() {
                return Err(Error::usage(
                    "the row form needs at least one --key COL=VALUE",
                    "name the row to write, e.g. --key id=42",
                ));
            }
            if args.id.is_some() {
                return Err(Error::usage(
                    "--id works with the transaction form (--sql, --file) and objects, not the row form",
                    "write the row with --sql (an UPDATE … WHERE …) to give it an id",
                ));
            }
            crate::fenced::quote_table(table)?;
            // As for a transaction: a stop signal cancels the statement on the server
            // instead of leaving it to commit once its row's lock comes free (review 14).
            let mut interrupts = Interrupts::install()?;
            let target = connect(&spec, &ctx.schema, &mut interrupts).await?;
            let written = target
                .write(request(Body::Row {
                    write: &write,
                    interrupts: &mut interrupts,
                }))
                .await;
            (target, written)
        }
        (None, None) => {
            let sql = read_sql(&args)?;
            // Caught from before the connection on: a stop signal cancels the transaction on
            // the server instead of leaving it to run to its COMMIT.
            let mut interrupts = Interrupts::install()?;
            let target = connect(&spec, &ctx.schema, &mut interrupts).await?;
            let written = target
                .write(request(Body::Transaction {
                    sql: &sql,
                    interrupts: &mut interrupts,
                }))
                .await;
            (target, written)
        }
    };
    record_refusal(
        ctx,
        target.as_ref(),
        &args.resource,
        &owner,
        args.token,
        &written,
    )
    .await;
    // A target's refusal says which target: its hint must not claim a grant the store made.
    let written = written.map_err(|err| match err {
        Error::Stale {
            resource,
            token,
            highest_token,
            target: None,
        } => Error::Stale {
            resource,
            token,
            highest_token,
            target: Some(spec.display.clone()),
        },
        other => other,
    });
    let write_id = args.id.clone();
    let outcome = match written? {
        Done::Transaction(outcome) => Outcome::Transaction { write_id, outcome },
        Done::Row(outcome) => Outcome::Row {
            table: args.table.clone().unwrap_or_default(),
            outcome,
        },
        Done::Object(outcome) => Outcome::Object { write_id, outcome },
    };
    Ok(Written {
        resource: args.resource,
        token: args.token,
        target: spec.display,
        outcome,
    })
}

/// Records a stale write's refusal, by a target that keeps no refusals itself (an object:
/// only an accepted write changes it), in the coordinator's history, where `fence log` shows
/// it (`write_rejected`, coalesced per owner and minute like other refused attempts). Best
/// effort: only in a store that exists already (one this write never creates), on the
/// directory store and PostgreSQL; a failure is a warning and the refusal (exit 4) stands
/// either way.
async fn record_refusal(
    ctx: &Context,
    target: &dyn FencedTarget,
    resource: &str,
    owner: &str,
    token: i64,
    written: &Result<Done, Error>,
) {
    let (Err(Error::Stale { highest_token, .. }), Some(spec), false) =
        (written, &ctx.history, target.records_refusals())
    else {
        return;
    };
    let attempt = Attempt {
        resource: resource.to_owned(),
        owner: owner.to_owned(),
        kind: EventKind::WriteRejected,
        token,
        detail: format!(
            "`{}` refused token {token}: it has accepted token {highest_token}",
            target.display()
        ),
    };
    let recorded = async {
        let store = crate::coordinator::open(spec, &ctx.schema).await?;
        if store.require_existing().await.is_err() {
            // No coordinator here (only object targets are used): nothing to record in.
            return Ok(());
        }
        store.record_attempt(&attempt).await
    }
    .await;
    if let Err(err) = recorded {
        crate::coordinator::unrecorded(&attempt, &err.to_string());
    }
}

/// A write id's ledger entry, as `fence write` (replayed) and `fence inspect --id` show it:
/// when, with which token and by whom it was applied, and for an object the version it made.
#[derive(Serialize)]
pub struct AppliedJson<'a> {
    at: String,
    token: i64,
    owner: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<&'a str>,
}

impl<'a> AppliedJson<'a> {
    pub fn new(
        at_ms: i64,
        token: i64,
        owner: Option<&'a str>,
        version: Option<&'a str>,
    ) -> AppliedJson<'a> {
        AppliedJson {
            at: crate::time::rfc3339(at_ms),
            token,
            owner,
            version,
        }
    }

    fn of_ledger(entry: &'a LedgerEntry) -> AppliedJson<'a> {
        Self::new(
            entry.applied_at_ms,
            entry.token,
            entry.owner.as_deref(),
            None,
        )
    }

    fn of_object(entry: &'a IdEntry) -> AppliedJson<'a> {
        Self::new(
            entry.applied_at_ms,
            entry.token,
            entry.owner.as_deref(),
            Some(&entry.version),
        )
    }
}

/// The JSON answer after `ok` and `op`: the write, then its form's own keys (`form` first).
#[derive(Serialize)]
struct WrittenJson<'a> {
    resource: &'a str,
    token: i64,
    target: &'a str,
    #[serde(flatten)]
    form: FormJson<'a>,
}

#[derive(Serialize)]
#[serde(tag = "form", rename_all = "snake_case")]
enum FormJson<'a> {
    /// `applied` only for a replayed id, whose `statements` are then empty.
    Transaction {
        write_id: Option<&'a str>,
        replayed: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        applied: Option<AppliedJson<'a>>,
        statements: &'a [StatementResult],
    },
    Row {
        table: &'a str,
        /// `applied` or `inserted`.
        status: &'static str,
    },
    /// Written: `version` and `previous_version` (null for a new object); replayed:
    /// `applied`, and 0 bytes.
    Object {
        write_id: Option<&'a str>,
        replayed: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        version: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        previous_version: Option<Option<&'a str>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        applied: Option<AppliedJson<'a>>,
        bytes: usize,
    },
}

/// "at T with token N by `O`": when and by whom an id was applied.
pub fn applied_when(at_ms: i64, token: i64, owner: Option<&str>) -> String {
    format!(
        "at {} with token {token}{}",
        crate::time::rfc3339(at_ms),
        owner.map(|o| format!(" by `{o}`")).unwrap_or_default()
    )
}

/// Opens the target; a stop signal meanwhile ends the write before anything was sent.
async fn connect(
    spec: &TargetSpec,
    schema: &str,
    interrupts: &mut Interrupts,
) -> Result<Box<dyn FencedTarget>, Error> {
    tokio::select! {
        target = fenced::target::open(spec, schema) => target,
        (_, name) = interrupts.next() => Err(Error::unavailable(
            format!("interrupted by {name} while connecting to `{}`", spec.display),
            "nothing was sent, so nothing was applied; it is safe to retry",
        )),
    }
}

/// The object's new bytes, from a file or standard input.
fn read_bytes(from: &std::path::Path) -> Result<Vec<u8>, Error> {
    if from.as_os_str() == "-" {
        let mut bytes = Vec::new();
        std::io::stdin().read_to_end(&mut bytes).map_err(|err| {
            Error::usage(
                format!("cannot read the object's bytes from standard input: {err}"),
                "pipe the bytes into `fence write … --from -`",
            )
        })?;
        return Ok(bytes);
    }
    std::fs::read(from).map_err(|err| {
        Error::usage(
            format!("cannot read `{}`: {err}", from.display()),
            "check the path given to --from",
        )
    })
}

fn read_sql(args: &WriteArgs) -> Result<String, Error> {
    let sql = match (&args.sql, &args.file) {
        (Some(sql), _) => sql.clone(),
        (None, Some(path)) if path.as_os_str() == "-" => {
            let mut sql = String::new();
            std::io::stdin().read_to_string(&mut sql).map_err(|err| {
                Error::usage(
                    format!("cannot read SQL from standard input: {err}"),
                    "pipe UTF-8 SQL into `fence write … --file -`",
                )
            })?;
            sql
        }
        (None, Some(path)) => std::fs::read_to_string(path).map_err(|err| {
            Error::usage(
                format!("cannot read SQL from `{}`: {err}", path.display()),
                "check the path given to --file",
            )
        })?,
        (None, None) => unreachable!("clap requires --sql, --file, --table or --from"),
    };
    if sql.trim().is_empty() {
        return Err(Error::usage(
            "the SQL to run is empty",
            "give the statements with --sql, or a non-empty --file",
        ));
    }
    // Nothing that could leave fence's transaction (or swallow its closing statements) is
    // ever sent; end_write is the second line of defence (see target/postgres.rs).
    sql_check::check(&sql).map_err(|refusal| Error::usage(refusal.to_string(), refusal.hint))?;
    Ok(sql)
}

/// Parses `COL=VALUE` pairs into a JSON object of strings (PostgreSQL converts them to the
/// columns' types).
fn assignments(flag: &str, pairs: &[String]) -> Result<Map<String, Value>, Error> {
    let mut map = Map::new();
    for pair in pairs {
        let Some((column, value)) = pair.split_once('=').filter(|(c, _)| !c.is_empty()) else {
            return Err(Error::usage(
                format!("`{pair}` is not COL=VALUE"),
                format!("write {flag} column=value (the value may be empty)"),
            ));
        };
        if map.insert(column.to_owned(), Value::from(value)).is_some() {
            return Err(Error::usage(
                format!("column `{column}` is given twice in {flag}"),
                "give each column once",
            ));
        }
    }
    Ok(map)
}

impl Report for Written {
    fn json(&self) -> Map<String, Value> {
        let form = match &self.outcome {
            Outcome::Transaction { write_id, outcome } => match outcome {
                TxOutcome::Applied(statements) => FormJson::Transaction {
                    write_id: write_id.as_deref(),
                    replayed: false,
                    applied: None,
                    statements,
                },
                TxOutcome::Replayed(entry) => FormJson::Transaction {
                    write_id: write_id.as_deref(),
                    replayed: true,
                    applied: Some(AppliedJson::of_ledger(entry)),
                    statements: &[],
                },
            },
            Outcome::Row { table, outcome } => FormJson::Row {
                table,
                status: match outcome {
                    RowOutcome::Applied => "applied",
                    RowOutcome::Inserted => "inserted",
                },
            },
            Outcome::Object { write_id, outcome } => match outcome {
                ObjectOutcome::Written(written) => FormJson::Object {
                    write_id: write_id.as_deref(),
                    replayed: false,
                    version: Some(&written.version),
                    previous_version: Some(written.previous.as_deref()),
                    applied: None,
                    bytes: written.bytes,
                },
                ObjectOutcome::Replayed(entry) => FormJson::Object {
                    write_id: write_id.as_deref(),
                    replayed: true,
                    version: None,
                    previous_version: None,
                    applied: Some(AppliedJson::of_object(entry)),
                    bytes: 0,
                },
            },
        };
        output::fields(&WrittenJson {
            resource: &self.resource,
            token: self.token,
            target: &self.target,
            form,
        })
    }

    fn human(&self) -> String {
        match &self.outcome {
            Outcome::Object {
                outcome: ObjectOutcome::Written(written),
                ..
            } => format!(
                "wrote {} bytes to `{}` with token {} for `{}` (version {})\n",
                written.bytes, self.target, self.token, self.resource, written.version
            ),
            Outcome::Object {
                write_id,
                outcome: ObjectOutcome::Replayed(entry),
            } => format!(
                "write `{}` to `{}` was already applied {} (version {}): nothing was written now\n",
                write_id.as_deref().unwrap_or_default(),
                self.target,
                applied_when(entry.applied_at_ms, entry.token, entry.owner.as_deref()),
                entry.version
            ),
            Outcome::Row { table, outcome } => format!(
                "{} a row of {table} with token {} for `{}`\n",
                match outcome {
                    RowOutcome::Applied => "updated",
                    RowOutcome::Inserted => "inserted",
                },
                self.token,
                self.resource
            ),
            Outcome::Transaction {
                write_id: Some(id),
                outcome: TxOutcome::Replayed(entry),
            } => format!(
                "write `{id}` of `{}` was already applied {}: nothing was run now\n",
                self.resource,
                applied_when(entry.applied_at_ms, entry.token, entry.owner.as_deref()),
            ),
            Outcome::Transaction {
                outcome: TxOutcome::Replayed(_),
                ..
            } => String::new(),
            Outcome::Transaction {
                outcome: TxOutcome::Applied(statements),
                ..
            } => {
                let mut text = String::new();
                for s in statements {
                    if s.columns.is_empty() {
                        continue;
                    }
                    let mut table = output::table();
                    table.set_header(s.columns.clone());
                    for row in &s.rows {
                        table.add_row(
                            row.iter()
                                .map(|v| v.clone().unwrap_or_else(|| "NULL".into())),
                        );
                    }
                    text.push_str(&format!("{table}\n"));
                }
                let counts: Vec<String> = statements
                    .iter()
                    .map(|s| s.rows_affected.to_string())
                    .collect();
                text.push_str(&format!(
                    "committed with token {} for `{}` (rows per statement: {})\n",
                    self.token,
                    self.resource,
                    counts.join(", ")
                ));
                text
            }
        }
    }
}
