//! `fence protect` on the tables where the rows live (DESIGN §3, issue 15): a table and every
//! partition and inheritance child below it, recursively, since PostgreSQL does not clone
//! statement-level triggers to partitions. Partitions and children added later are covered by
//! an event trigger, which only a superuser may create; otherwise fence says what it cannot
//! cover. The per-table work is done by `protect_table` / `unprotect_table` in `guard.sql`,
//! so that the event trigger and this command share one definition of "protected".

use tokio_postgres::types::Type;

use crate::error::Error;
use crate::fenced::postgres::PgTarget;
use crate::fenced::quote_table;
use crate::pg;
use crate::pg::sqlstate::Fence;

/// DDL that can add a partition or an inheritance child to a table.
const NEW_TABLE_TAGS: &str =
    "'CREATE TABLE', 'ALTER TABLE', 'CREATE FOREIGN TABLE', 'ALTER FOREIGN TABLE'";

/// One table `protect` acted on.
#[derive(Debug)]
pub struct Covered {
    /// As PostgreSQL names it (schema-qualified, quoted where needed).
    pub table: String,
    pub kind: &'static str,
    /// The resource that protected it before, if any.
    pub had_resource: Option<String>,
}

/// What `protect` did.
#[derive(Debug)]
pub struct Coverage {
    pub table: String,
    pub covered: Vec<Covered>,
    /// Whether tables added below a protected one later are protected as they are added.
    pub covers_later_tables: bool,
    pub warnings: Vec<String>,
}

/// How one table of a tree is protected, for `inspect --table`.
#[derive(Debug)]
pub struct TableProtection {
    pub table: String,
    pub parent: Option<String>,
    pub kind: &'static str,
    pub depth: i32,
    /// The resource its trigger names; `None`: not protected by fence.
    pub resource: Option<String>,
    /// `always`, `origin`, `replica` or `disabled`; `None` when a trigger is missing.
    pub enabled: Option<String>,
}

impl TableProtection {
    /// Fully protected: both triggers there and firing whatever `session_replication_role` is.
    pub fn protected(&self) -> bool {
        self.resource.is_some() && self.enabled.as_deref() == Some("always")
    }
}

/// A table's tree, and whether tables added to it later will be protected.
#[derive(Debug)]
pub struct TreeProtection {
    pub tables: Vec<TableProtection>,
    pub covers_later_tables: bool,
}

fn kind_name(relkind: i8) -> &'static str {
    match relkind as u8 {
        b'r' => "table",
        b'p' => "partitioned table",
        b'f' => "foreign table",
        b'v' => "view",
        b'm' => "materialized view",
        b'S' => "sequence",
        b'c' => "composite type",
        b'i' | b'I' => "index",
        b't' => "TOAST table",
        _ => "relation",
    }
}

impl PgTarget {
    /// Installs (or with `remove`, removes) fence's triggers on `table` and everything below it.
    pub async fn protect(
        &self,
        table: &str,
        resource: &str,
        remove: bool,
    ) -> Result<Coverage, Error> {
        let resolved = self.resolve_table(table).await?;
        if remove {
            self.refuse_partial_removal(&resolved).await?;
        }
        let what = format!("protect {resolved}");
        let sql = if remove {
            "SELECT table_name, table_kind, had_resource FROM __SCHEMA__.unprotect_table($1::regclass)"
        } else {
            "SELECT table_name, table_kind, had_resource FROM __SCHEMA__.protect_table($1::regclass, $2)"
        };
        let rows = self
            .session()
            .call(
                &what,
                true,
                sql,
                &[(&resolved, Type::TEXT), (&resource, Type::TEXT)],
            )
            .await
            .map_err(protect_error)?;
        let covered: Vec<Covered> = rows
            .iter()
            .map(|r| Covered {
                table: r.get(0),
                kind: kind_name(r.get(1)),
                had_resource: r.get(2),
            })
            .collect();
        if remove {
            return Ok(Coverage {
                table: resolved,
                covered,
                covers_later_tables: false,
                warnings: Vec::new(),
            });
        }
        let covers_later_tables = self.cover_later_tables().await?;
        let mut warnings = changed_resources(&covered, resource);
        if !covers_later_tables && may_get_children(&covered) {
            warnings.push(format!(
                "partitions and inheritance children added to {resolved} later are not protected: run `fence protect` again after adding them, or run it once as a superuser so that fence protects them as they are added"
            ));
        }
        warnings.extend(self.owner_warning().await?);
        Ok(Coverage {
            table: resolved,
            covered,
            covers_later_tables,
            warnings,
        })
    }

    /// The protection of `table` and of every partition and child below it.
    pub async fn protection(&self, table: &str) -> Result<TreeProtection, Error> {
        let resolved = self.resolve_table(table).await?;
        let rows = self
            .session()
            .call(
                &format!("read how {resolved} is protected"),
                false,
                "SELECT (SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c \
                           JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = t.rel), \
                        (SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c \
                           JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = t.parent), \
                        t.kind, t.depth, s.resource, s.enabled \
                 FROM __SCHEMA__.protect_tree($1::regclass) t, __SCHEMA__.protect_state(t.rel) s \
                 ORDER BY t.depth, 1",
                &[(&resolved, Type::TEXT)],
            )
            .await?;
        let tables = rows
            .iter()
            .map(|r| TableProtection {
                table: r.get(0),
                parent: r.get(1),
                kind: kind_name(r.get(2)),
                depth: r.get(3),
                resource: r.get(4),
                enabled: r.get(5),
            })
            .collect();
        Ok(TreeProtection {
            tables,
            covers_later_tables: self.event_trigger().await?.enabled,
        })
    }

    /// The table's name as PostgreSQL prints it; a usage error unless it is a table (views,
    /// foreign tables and the like cannot be protected: their rows live elsewhere).
    async fn resolve_table(&self, table: &str) -> Result<String, Error> {
        let quoted = quote_table(table)?;
        let rows = self
            .session()
            .call(
                &format!("look up {quoted}"),
                false,
                "SELECT format('%I.%I', n.nspname, c.relname), c.relkind FROM pg_class c \
                 JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)",
                &[(&quoted, Type::TEXT)],
            )
            .await?;
        let Some(row) = rows.first() else {
            return Err(Error::usage(
                format!("there is no table {quoted} in `{}`", self.session().display),
                "name an existing table (SCHEMA.TABLE if it is not on the search_path)",
            ));
        };
        let name: String = row.get(0);
        let relkind: i8 = row.get(1);
        match relkind as u8 {
            b'r' | b'p' => Ok(name),
            _ => Err(Error::usage(
                format!(
                    "{name} is a {}, not a table: fence protects the tables where rows are stored",
                    kind_name(relkind)
                ),
                "protect the tables it reads from or writes to instead",
            )),
        }
    }

    /// Removing the triggers from a partition or child of a protected table would open a
    /// hole in its protection: a usage error naming the table to unprotect instead.
    async fn refuse_partial_removal(&self, table: &str) -> Result<(), Error> {
        let rows = self
            .session()
            .call(
                &format!("look for a protected table above {table}"),
                false,
                "SELECT format('%I.%I', n.nspname, c.relname), __SCHEMA__.protect_inherited(i.inhparent) \
                 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhparent \
                 JOIN pg_namespace n ON n.oid = c.relnamespace WHERE i.inhrelid = $1::regclass",
                &[(&table, Type::TEXT)],
            )
            .await?;
        let Some(row) = rows
            .iter()
            .find(|r| r.get::<_, Option<String>>(1).is_some())
        else {
            return Ok(());
        };
        let parent: String = row.get(0);
        let resource: String = row.get(1);
        Err(Error::usage(
            format!("{table} is below {parent}, which is protected by `{resource}`: removing its triggers alone would leave a hole in that protection"),
            format!("remove the protection from the top of the tree instead: fence protect --table {parent} --remove …"),
        ))
    }

    /// Makes sure the event trigger that protects tables added later exists, when this user
    /// may create it (superusers only). Returns whether it is in place.
    async fn cover_later_tables(&self) -> Result<bool, Error> {
        let state = self.event_trigger().await?;
        if state.enabled || !state.superuser {
            return Ok(state.enabled);
        }
        let schema = &self.session().schema;
        // Event trigger names are per database: one per fence schema.
        let name: String = format!("{schema}_protect_new_tables")
            .chars()
            .take(63)
            .collect();
        let script = format!(
            "BEGIN; DROP EVENT TRIGGER IF EXISTS {name}; \
             CREATE EVENT TRIGGER {name} ON ddl_command_end WHEN TAG IN ({NEW_TABLE_TAGS}) \
               EXECUTE FUNCTION {schema}.protect_new_tables(); \
             ALTER EVENT TRIGGER {name} ENABLE ALWAYS; COMMIT;"
        );
        self.run_script("protect tables added later", &script)
            .await?;
        Ok(true)
    }

    /// Whether this schema's event trigger is there and enabled, and whether this user is a
    /// superuser (who alone may create one).
    async fn event_trigger(&self) -> Result<EventTrigger, Error> {
        let rows = self
            .session()
            .call(
                "look for fence's event trigger",
                false,
                "SELECT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user), \
                 EXISTS (SELECT 1 FROM pg_event_trigger e \
                          WHERE e.evtfoid = to_regprocedure('__SCHEMA__.protect_new_tables()') \
                            AND e.evtenabled = 'A')",
                &[],
            )
            .await?;
        Ok(rows.first().map_or(
            EventTrigger {
                superuser: false,
                enabled: false,
            },
            |r| EventTrigger {
                superuser: r.get::<_, Option<bool>>(0).unwrap_or(false),
                enabled: r.get(1),
            },
        ))
    }

    /// A warning when fence's schema is owned by a role that is neither a superuser nor this
    /// user (membership does not count: superusers are members of every role): its owner can
    /// write `bindings` and so bypass every protected table.
    async fn owner_warning(&self) -> Result<Option<String>, Error> {
        let rows = self
            .session()
            .call(
                "read who owns fence's schema",
                false,
                "SELECT n.nspowner::regrole::text FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner \
                 WHERE n.nspname = $1 AND NOT r.rolsuper AND r.rolname <> current_user",
                &[(&self.session().schema, Type::TEXT)],
            )
            .await?;
        Ok(rows.first().map(|r| {
            let owner: String = r.get(0);
            format!(
                "fence's schema `{}` is owned by {owner}, who can write its `bindings` table and so bypass protection: have an admin own it (`ALTER SCHEMA {} OWNER TO …` and the same for its tables and functions), and never let an application connect as {owner}",
                self.session().schema,
                self.session().schema
            )
        }))
    }

    /// Runs a multi-statement script, rolling back if it fails.
    pub(crate) async fn run_script(&self, what: &str, script: &str) -> Result<(), Error> {
        let session = self.session();
        let result = pg::answer_within_timeout(session.client.batch_execute(script))
            .await
            .map_err(|_| pg::lost(&session.display, what, "no answer in time", true))?;
        if let Err(err) = result {
            session.rollback().await;
            return Err(session.request_error(&err, what, true));
        }
        Ok(())
    }
}

struct EventTrigger {
    superuser: bool,
    enabled: bool,
}

/// Whether rows could later live below these tables: a partitioned table, or a table that
/// already has children (any table can gain inheritance children, but warning on every plain
/// table would drown the warnings that matter).
fn may_get_children(covered: &[Covered]) -> bool {
    covered.len() > 1 || covered.iter().any(|c| c.kind == "partitioned table")
}

/// Warnings for tables that were protected by another resource before.
fn changed_resources(covered: &[Covered], resource: &str) -> Vec<String> {
    covered
        .iter()
        .filter_map(|c| {
            let had = c.had_resource.as_deref()?;
            (had != resource).then(|| {
                format!(
                    "{} was protected by `{had}`; it is now protected by `{resource}`",
                    c.table
                )
            })
        })
        .collect()
}

/// A foreign table below the protected one is a usage error: fence cannot protect it.
fn protect_error(err: Error) -> Error {
    match err.sqlstate().and_then(Fence::of) {
        Some(Fence::ForeignTable) => Error::usage(
            err.to_string(),
            "detach it from the protected table, or protect the remote table in its own database",
        ),
        _ => err,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covered(table: &str, had: Option<&str>) -> Covered {
        Covered {
            table: table.into(),
            kind: "table",
            had_resource: had.map(str::to_owned),
        }
    }

    #[test]
    fn a_change_of_resource_is_a_warning() {
        let tables = [
            covered("s.a", None),
            covered("s.b", Some("r")),
            covered("s.c", Some("old")),
        ];
        assert_eq!(
            changed_resources(&tables, "r"),
            ["s.c was protected by `old`; it is now protected by `r`"]
        );
    }

    #[test]
    fn relation_kinds_are_named() {
        assert_eq!(kind_name(b'p' as i8), "partitioned table");
        assert_eq!(kind_name(b'v' as i8), "view");
        assert_eq!(kind_name(b'f' as i8), "foreign table");
    }
}
