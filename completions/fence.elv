
use builtin;
use str;

set edit:completion:arg-completer[fence] = {|@words|
    fn spaces {|n|
        builtin:repeat $n ' ' | str:join ''
    }
    fn cand {|text desc|
        edit:complex-candidate $text &display=$text' '(spaces (- 14 (wcswidth $text)))$desc
    }
    var command = 'fence'
    for word $words[1..-1] {
        if (str:has-prefix $word '-') {
            break
        }
        set command = $command';'$word
    }
    var completions = [
        &'fence'= {
            cand --store 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)'
            cand --schema 'The PostgreSQL schema that holds fence''s own tables'
            cand --format 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come'
            cand --color 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)'
            cand -q 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand --quiet 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
            cand acquire 'Take a lease on RESOURCE and print its fencing token'
            cand run 'Run a command while holding a lease, and stop it if the lease is lost.'
            cand renew 'Extend a lease you hold'
            cand release 'Give a lease up so that another owner can take it at once'
            cand inspect 'Show who holds what, with which token, and what happened lately'
            cand log 'One ordered timeline of leases and fenced writes: who held what when, and what was refused'
            cand metrics 'Print the store''s (and targets'') state and history as Prometheus metrics'
            cand write 'Write to a protected PostgreSQL database or an object with your fencing token.'
            cand protect 'Make every write to a table go through the fence.'
            cand grant 'Give a role exactly what a fenced writer (or a reader) needs in a target database.'
            cand init 'Create or migrate fence''s own tables in the store, or in a target (safe to run again).'
            cand doctor 'Check the store and targets for set-ups that weaken fence''s guarantees'
            cand bench 'Measure the store as your jobs would use it, before choosing a TTL.'
            cand prune 'Delete old lease history (PostgreSQL); never the token counters'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'fence;acquire'= {
            cand --owner 'Who holds the lease. Default: `<hostname>/<pid>/<8 hex>`, reported in the output'
            cand --ttl 'How long the lease lasts unless renewed (100ms to 24h), by the coordinator''s clock'
            cand --wait 'When busy, wait until granted, at most DURATION (forever without one); then exit 3. On PostgreSQL waiters queue in arrival order and a release wakes the first'
            cand --above 'Recovery, not for routine use: grant a token above N as well as above every token this store issued for RESOURCE'
            cand --store 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)'
            cand --schema 'The PostgreSQL schema that holds fence''s own tables'
            cand --format 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come'
            cand --color 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)'
            cand -q 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand --quiet 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
        }
        &'fence;run'= {
            cand --owner 'Names who runs it: the lease''s owner is `ID/<pid>/<8 hex>`, unique to this run, so a second `fence run` with the same ID (a fixed FENCE_OWNER in a crontab) is busy and never shares the lease. Default: `<hostname>/<pid>/<8 hex>`'
            cand --busy-exit-code 'Exit with CODE instead of 3 when the lease is busy (as flock''s -E): `0` for a cron job whose overlap with its previous run is not an error. COMMAND still never starts'
            cand --id 'A run id, e.g. `nightly-2026-12-04` (1 to 64 of A-Z a-z 0-9 . _ - : @ +); default: FENCE_RUN_ID, unless an enclosing `fence run` set it. The command gets it as FENCE_RUN_ID (without one: `run-<token>-<8 random hex>`, unique to this run); derive write ids from it: `--id "$FENCE_RUN_ID-publish"`. Once the command exits 0 on its own (not interrupted, nothing of it left running), the run is recorded as completed in the store (as resource `RESOURCE#done:KEY`); a later run with the same id, once it holds the lease, starts nothing and exits 0 (or --done-exit-code), saying when and by whom it was completed; with other arguments, it starts nothing and exits 6 (`"reason": "id_reused"`: one id, two different commands)'
            cand --done-exit-code 'Exit with CODE instead of 0 when the run id was already completed (COMMAND never starts), to tell "already done" apart from "done now"'
            cand --ttl 'The lease length; fence renews about every third of it'
            cand --wait 'When busy, wait until granted, at most DURATION (forever without one); then exit 3. On PostgreSQL waiters queue in arrival order and a release wakes the first'
            cand --kill-after 'After SIGTERM to what COMMAND left running, wait this long before SIGKILL (at most 7 days). A command whose lease cannot be proven gets SIGTERM this long before the bound (at most TTL/5) and SIGKILL at the bound: never later'
            cand --max-time 'Stop COMMAND once it has run this long, as a hung job must not hold the lease forever: SIGTERM to everything it started, SIGKILL after --kill-after, then the lease is released (the next run need not wait for it to expire) and fence exits 124, as timeout(1) does (`"stopped": "max_time"` in the JSON answer, reason `max_time` in --metrics-file)'
            cand --metrics-file 'When the run ends, write its outcome to PATH in the Prometheus text format, atomically (a temporary file renamed over it), for node_exporter''s textfile collector: start, end, duration, time waited for the lease, token, exit status and reason (`ok`, `command_failed`, `already_done` when the run id was completed before, `busy`, `lease_lost`, …). Name it `*.prom` in the collector''s directory'
            cand --store 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)'
            cand --schema 'The PostgreSQL schema that holds fence''s own tables'
            cand --format 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come'
            cand --color 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)'
            cand -q 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand --quiet 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
        }
        &'fence;renew'= {
            cand --owner 'The owner that acquired the lease'
            cand --token 'The fencing token the lease was granted with'
            cand --ttl 'The new lease length from now (100ms to 24h). Default: the TTL it was acquired with'
            cand --store 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)'
            cand --schema 'The PostgreSQL schema that holds fence''s own tables'
            cand --format 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come'
            cand --color 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)'
            cand -q 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand --quiet 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
        }
        &'fence;release'= {
            cand --owner 'The owner that acquired the lease'
            cand --token 'The fencing token the lease was granted with'
            cand --store 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)'
            cand --schema 'The PostgreSQL schema that holds fence''s own tables'
            cand --format 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come'
            cand --color 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)'
            cand -q 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand --quiet 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
        }
        &'fence;inspect'= {
            cand --state 'Only resources in this state'
            cand --limit 'At most N resources, N ≥ 1 (ordered by name); JSON''s `next_after` names the cursor for the next page. Pages list the store, so not with named resources'
            cand --after 'Only resources named after RESOURCE (byte order): the next page after `--limit`'
            cand --history 'How many recent events to show per resource. Default: 5 with named resources, 0 without'
            cand --target 'Also show the highest token this target has accepted for each resource: a PostgreSQL database written with `fence write`, or an object (`s3://`, `gs://`, `file://`) with its version and stored token'
            cand --table 'With --target (a PostgreSQL database): show instead whether TABLE and each partition and inheritance child below it is protected, for which resource, and whether fence''s triggers are enabled (`always`: they fire whatever `session_replication_role` is)'
            cand --id 'With --target and one RESOURCE: write id KEY''s entry in the target''s ledger — when, with which token and by whom it was applied (objects: the version it made) — or that it is not there (never applied; on an object, maybe older than its last 8 ids). Exit 0 either way; JSON''s `applied` says which'
            cand --store 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)'
            cand --schema 'The PostgreSQL schema that holds fence''s own tables'
            cand --format 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come'
            cand --color 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)'
            cand -q 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand --quiet 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
        }
        &'fence;log'= {
            cand --resource 'A resource, or a glob of them (`*` any run of characters, `?` one; `\*`, `\?`, `\\` the character itself); repeat for several. Default: every resource'
            cand --target 'Also show the fenced writes this PostgreSQL database accepted and refused, or the writes this object accepted (its current version and the ids it keeps); repeat for several. An object''s refusals are in the store''s history (`write_rejected`)'
            cand --since 'Only events at or after TIME: RFC 3339 with Z or an offset such as +02:00, a date and time without one (local time, as TZ says), or a span back from now such as `2h`'
            cand --until 'Only events before TIME (as --since)'
            cand --owner 'Only events of this owner, or of owners matching a glob (`fence run` owners are `ID/<pid>/<8 hex>`: `--owner ''ID/*''`; `\*`, `\?`, `\\` the character itself)'
            cand --token 'Only events with this fencing token'
            cand --kind 'Only events of this kind (repeat for several)'
            cand --limit 'At most N events from each source, the most recent (N ≥ 1); JSON says `truncated`'
            cand --store 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)'
            cand --schema 'The PostgreSQL schema that holds fence''s own tables'
            cand --format 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come'
            cand --color 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)'
            cand -f 'After the events so far, print each new one as it happens, one per line (human or ndjson), until SIGINT or SIGTERM; rides out a store or target that restarts. Polls: PostgreSQL every 50ms, other stores every 200ms; an expiry shows 2s after it'
            cand --follow 'After the events so far, print each new one as it happens, one per line (human or ndjson), until SIGINT or SIGTERM; rides out a store or target that restarts. Polls: PostgreSQL every 50ms, other stores every 200ms; an expiry shows 2s after it'
            cand -q 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand --quiet 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
        }
        &'fence;metrics'= {
            cand --resource 'A resource, or a glob of them (`*` any run of characters, `?` one; `\*`, `\?`, `\\` the character itself); repeat for several. Default: every resource'
            cand --target 'Also count the fenced writes this PostgreSQL database accepted and refused (repeat)'
            cand --store 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)'
            cand --schema 'The PostgreSQL schema that holds fence''s own tables'
            cand --format 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come'
            cand --color 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)'
            cand -q 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand --quiet 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
        }
        &'fence;write'= {
            cand --token 'Your fencing token for RESOURCE'
            cand --owner 'Recorded with the write as who made it'
            cand --target 'Where to write: `postgres://user@host/db` (libpq rules, as --store), or an object: `s3://bucket/key`, `gs://bucket/key`, `file:///dir/name`'
            cand --from 'Object form: the bytes to store (`-`: standard input). From 1 MiB up, a progress bar on a terminal shows the bytes sent (not with -q or --format json)'
            cand --if-match 'Object form: write only if the object''s ETag is ETAG (S3)'
            cand --if-generation-match 'Object form: write only if the object''s generation is N (GCS, file://); 0: only if the object does not exist (on S3 too)'
            cand --sql 'SQL to run in the fenced transaction (one or more statements)'
            cand --file 'Read the SQL from a file (`-`: standard input)'
            cand --id 'A write id (idempotency key), e.g. `publish-2026-12-04`: 1 to 64 of A-Z a-z 0-9 . _ - : @ +. Recorded with the effect, atomically (transaction form: in the same transaction; objects: in the object''s metadata, by the same conditional put), with a digest of the SQL or bytes. A write whose id was already applied — by anyone, with any token — writes nothing: the same SQL or bytes exit 0 (`"replayed": true`); other SQL or bytes exit 6 (`"reason": "id_reused"`: one id, two different writes). After exit 8, run the same command again: it says whether the first one landed. Under `fence run --id`, derive one per write from `$FENCE_RUN_ID`. Objects remember their last 8 ids; PostgreSQL keeps them until deleted'
            cand --timeout 'Transaction and row forms: the longest the fenced transaction (or the row''s update) may take (100ms to 24h). The server cancels it then, and it can never commit later, even if fence is gone; fence exits 7 (nothing applied). SIGINT, SIGTERM and SIGHUP cancel it the same way. A `file://` object: the longest its lock file is waited for (exit 7, nothing written)'
            cand --table 'Row form: the table to write (`TABLE` or `SCHEMA.TABLE`, as named in the database)'
            cand --key 'Row form: a key column and its value; repeat for composite keys'
            cand --set 'Row form: a column to set and its value; repeat for more'
            cand --token-column 'Row form: the column holding each row''s token'
            cand --store 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)'
            cand --schema 'The PostgreSQL schema that holds fence''s own tables'
            cand --format 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come'
            cand --color 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)'
            cand --upsert 'Row form: insert the row (keys, values and token) when no row has the key'
            cand -q 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand --quiet 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
        }
        &'fence;protect'= {
            cand --target 'The database holding the table'
            cand --table 'The table to protect (`TABLE` or `SCHEMA.TABLE`)'
            cand --resource 'The resource whose tokens guard the table'
            cand --store 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)'
            cand --schema 'The PostgreSQL schema that holds fence''s own tables'
            cand --format 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come'
            cand --color 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)'
            cand --remove 'Remove the triggers instead, from TABLE and everything below it (refused for a partition or child of a protected table: it would open a hole in that protection)'
            cand -q 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand --quiet 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
        }
        &'fence;grant'= {
            cand --target 'The database whose fence schema to grant access to (connect as its admin)'
            cand --role 'The role to grant to, as named in the database'
            cand --store 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)'
            cand --schema 'The PostgreSQL schema that holds fence''s own tables'
            cand --format 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come'
            cand --color 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)'
            cand --reader 'Grant read access only (inspect), not the write path'
            cand --print 'Print the SQL instead of running it'
            cand -q 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand --quiet 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
        }
        &'fence;init'= {
            cand --target 'Prepare fence''s schema in this PostgreSQL database rather than the store'
            cand --held-waiters 'PostgreSQL store: how many `--wait` waiters of one resource may keep their connection while they wait (2–1000, default 8; kept in the store, for every waiter). Those near the head keep theirs when the queue moves fast: up to 8 (or N, if fewer) listen for the release, the others poll on it; the rest reconnect for each poll. Raise it for a hot resource with many waiters: with 64 waiters on one resource, hand-overs ran 5–10 times faster with 64 than with 8 (docs/performance.md), at up to N+2 connections per busy resource, which the role''s CONNECTION LIMIT must allow (`fence doctor` sizes it with N)'
            cand --store 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)'
            cand --schema 'The PostgreSQL schema that holds fence''s own tables'
            cand --format 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come'
            cand --color 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)'
            cand -q 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand --quiet 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
        }
        &'fence;doctor'= {
            cand --target 'Also check this target database or object (repeat for several)'
            cand --held-over 'Warn about each lease held longer than DURATION since it was granted (by the store''s clock; renewals do not restart it): a job that hangs while holding its lease keeps every later run out (`--busy-exit-code 0 -q` cron jobs exit 0 silently)'
            cand --store 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)'
            cand --schema 'The PostgreSQL schema that holds fence''s own tables'
            cand --format 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come'
            cand --color 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)'
            cand -q 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand --quiet 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
        }
        &'fence;bench'= {
            cand --workers 'Concurrent workers, each with its own connection'
            cand --resources 'Resources to spread over (`spread` mode)'
            cand --duration 'How long to run'
            cand --mode 'What to measure'
            cand --ttl 'The lease length the workers ask for'
            cand --hold 'How long each holder keeps the lease (`handoff` mode; default 1ms)'
            cand --write-target 'Also make one fenced write (an empty fenced transaction) per critical section to this PostgreSQL database, in the bench''s scratch schema'
            cand --held-waiters 'PostgreSQL: the scratch schema''s `held_waiters` (see `fence init --held-waiters`), to measure what a setting would do before giving it to the store. Default: the default (8)'
            cand --store 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)'
            cand --schema 'The PostgreSQL schema that holds fence''s own tables'
            cand --format 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come'
            cand --color 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)'
            cand --renew 'Renew once in every critical section'
            cand --prefill 'Before timing, create all K resources as free leases (`spread` mode, PostgreSQL), so that every acquire finds its row in a table of K: how acquire scales with the number of resources (compare `--resources 100` with `--resources 1000000`)'
            cand -q 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand --quiet 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
        }
        &'fence;prune'= {
            cand --older-than 'Delete events older than this (e.g. 12h, 30d, 8w), by the server''s clock'
            cand --keep 'Keep at least the last N events of each resource, however old'
            cand --store 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)'
            cand --schema 'The PostgreSQL schema that holds fence''s own tables'
            cand --format 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come'
            cand --color 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)'
            cand -q 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand --quiet 'Print nothing on success, and no warnings; errors are still reported on stderr'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
        }
        &'fence;help'= {
            cand acquire 'Take a lease on RESOURCE and print its fencing token'
            cand run 'Run a command while holding a lease, and stop it if the lease is lost.'
            cand renew 'Extend a lease you hold'
            cand release 'Give a lease up so that another owner can take it at once'
            cand inspect 'Show who holds what, with which token, and what happened lately'
            cand log 'One ordered timeline of leases and fenced writes: who held what when, and what was refused'
            cand metrics 'Print the store''s (and targets'') state and history as Prometheus metrics'
            cand write 'Write to a protected PostgreSQL database or an object with your fencing token.'
            cand protect 'Make every write to a table go through the fence.'
            cand grant 'Give a role exactly what a fenced writer (or a reader) needs in a target database.'
            cand init 'Create or migrate fence''s own tables in the store, or in a target (safe to run again).'
            cand doctor 'Check the store and targets for set-ups that weaken fence''s guarantees'
            cand bench 'Measure the store as your jobs would use it, before choosing a TTL.'
            cand prune 'Delete old lease history (PostgreSQL); never the token counters'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'fence;help;acquire'= {
        }
        &'fence;help;run'= {
        }
        &'fence;help;renew'= {
        }
        &'fence;help;release'= {
        }
        &'fence;help;inspect'= {
        }
        &'fence;help;log'= {
        }
        &'fence;help;metrics'= {
        }
        &'fence;help;write'= {
        }
        &'fence;help;protect'= {
        }
        &'fence;help;grant'= {
        }
        &'fence;help;init'= {
        }
        &'fence;help;doctor'= {
        }
        &'fence;help;bench'= {
        }
        &'fence;help;prune'= {
        }
        &'fence;help;help'= {
        }
    ]
    $completions[$command]
}
