
using namespace System.Management.Automation
using namespace System.Management.Automation.Language

Register-ArgumentCompleter -Native -CommandName 'fence' -ScriptBlock {
    param($wordToComplete, $commandAst, $cursorPosition)

    $commandElements = $commandAst.CommandElements
    $command = @(
        'fence'
        for ($i = 1; $i -lt $commandElements.Count; $i++) {
            $element = $commandElements[$i]
            if ($element -isnot [StringConstantExpressionAst] -or
                $element.StringConstantType -ne [StringConstantType]::BareWord -or
                $element.Value.StartsWith('-') -or
                $element.Value -eq $wordToComplete) {
                break
        }
        $element.Value
    }) -join ';'

    $completions = @(switch ($command) {
        'fence' {
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)')
            [CompletionResult]::new('--schema', '--schema', [CompletionResultType]::ParameterName, 'The PostgreSQL schema that holds fence''s own tables')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('acquire', 'acquire', [CompletionResultType]::ParameterValue, 'Take a lease on RESOURCE and print its fencing token')
            [CompletionResult]::new('run', 'run', [CompletionResultType]::ParameterValue, 'Run a command while holding a lease, and stop it if the lease is lost.')
            [CompletionResult]::new('renew', 'renew', [CompletionResultType]::ParameterValue, 'Extend a lease you hold')
            [CompletionResult]::new('release', 'release', [CompletionResultType]::ParameterValue, 'Give a lease up so that another owner can take it at once')
            [CompletionResult]::new('inspect', 'inspect', [CompletionResultType]::ParameterValue, 'Show who holds what, with which token, and what happened lately')
            [CompletionResult]::new('log', 'log', [CompletionResultType]::ParameterValue, 'One ordered timeline of leases and fenced writes: who held what when, and what was refused')
            [CompletionResult]::new('metrics', 'metrics', [CompletionResultType]::ParameterValue, 'Print the store''s (and targets'') state and history as Prometheus metrics')
            [CompletionResult]::new('write', 'write', [CompletionResultType]::ParameterValue, 'Write to a protected PostgreSQL database or an object with your fencing token.')
            [CompletionResult]::new('protect', 'protect', [CompletionResultType]::ParameterValue, 'Make every write to a table go through the fence.')
            [CompletionResult]::new('grant', 'grant', [CompletionResultType]::ParameterValue, 'Give a role exactly what a fenced writer (or a reader) needs in a target database.')
            [CompletionResult]::new('init', 'init', [CompletionResultType]::ParameterValue, 'Create or migrate fence''s own tables in the store, or in a target (safe to run again).')
            [CompletionResult]::new('doctor', 'doctor', [CompletionResultType]::ParameterValue, 'Check the store and targets for set-ups that weaken fence''s guarantees')
            [CompletionResult]::new('bench', 'bench', [CompletionResultType]::ParameterValue, 'Measure the store as your jobs would use it, before choosing a TTL.')
            [CompletionResult]::new('prune', 'prune', [CompletionResultType]::ParameterValue, 'Delete old lease history (PostgreSQL); never the token counters')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'fence;acquire' {
            [CompletionResult]::new('--owner', '--owner', [CompletionResultType]::ParameterName, 'Who holds the lease. Default: `<hostname>/<pid>/<8 hex>`, reported in the output')
            [CompletionResult]::new('--ttl', '--ttl', [CompletionResultType]::ParameterName, 'How long the lease lasts unless renewed (100ms to 24h), by the coordinator''s clock')
            [CompletionResult]::new('--wait', '--wait', [CompletionResultType]::ParameterName, 'When busy, wait until granted, at most DURATION (forever without one); then exit 3. On PostgreSQL waiters queue in arrival order and a release wakes the first')
            [CompletionResult]::new('--above', '--above', [CompletionResultType]::ParameterName, 'Recovery, not for routine use: grant a token above N as well as above every token this store issued for RESOURCE')
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)')
            [CompletionResult]::new('--schema', '--schema', [CompletionResultType]::ParameterName, 'The PostgreSQL schema that holds fence''s own tables')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            break
        }
        'fence;run' {
            [CompletionResult]::new('--owner', '--owner', [CompletionResultType]::ParameterName, 'Names who runs it: the lease''s owner is `ID/<pid>/<8 hex>`, unique to this run, so a second `fence run` with the same ID (a fixed FENCE_OWNER in a crontab) is busy and never shares the lease. Default: `<hostname>/<pid>/<8 hex>`')
            [CompletionResult]::new('--busy-exit-code', '--busy-exit-code', [CompletionResultType]::ParameterName, 'Exit with CODE instead of 3 when the lease is busy (as flock''s -E): `0` for a cron job whose overlap with its previous run is not an error. COMMAND still never starts')
            [CompletionResult]::new('--id', '--id', [CompletionResultType]::ParameterName, 'A run id, e.g. `nightly-2026-12-04` (1 to 64 of A-Z a-z 0-9 . _ - : @ +); default: FENCE_RUN_ID, unless an enclosing `fence run` set it. The command gets it as FENCE_RUN_ID (without one: `run-<token>-<8 random hex>`, unique to this run); derive write ids from it: `--id "$FENCE_RUN_ID-publish"`. Once the command exits 0 on its own (not interrupted, nothing of it left running), the run is recorded as completed in the store (as resource `RESOURCE#done:KEY`); a later run with the same id, once it holds the lease, starts nothing and exits 0 (or --done-exit-code), saying when and by whom it was completed; with other arguments, it starts nothing and exits 6 (`"reason": "id_reused"`: one id, two different commands)')
            [CompletionResult]::new('--done-exit-code', '--done-exit-code', [CompletionResultType]::ParameterName, 'Exit with CODE instead of 0 when the run id was already completed (COMMAND never starts), to tell "already done" apart from "done now"')
            [CompletionResult]::new('--ttl', '--ttl', [CompletionResultType]::ParameterName, 'The lease length; fence renews about every third of it')
            [CompletionResult]::new('--wait', '--wait', [CompletionResultType]::ParameterName, 'When busy, wait until granted, at most DURATION (forever without one); then exit 3. On PostgreSQL waiters queue in arrival order and a release wakes the first')
            [CompletionResult]::new('--kill-after', '--kill-after', [CompletionResultType]::ParameterName, 'After SIGTERM to what COMMAND left running, wait this long before SIGKILL (at most 7 days). A command whose lease cannot be proven gets SIGTERM this long before the bound (at most TTL/5) and SIGKILL at the bound: never later')
            [CompletionResult]::new('--max-time', '--max-time', [CompletionResultType]::ParameterName, 'Stop COMMAND once it has run this long, as a hung job must not hold the lease forever: SIGTERM to everything it started, SIGKILL after --kill-after, then the lease is released (the next run need not wait for it to expire) and fence exits 124, as timeout(1) does (`"stopped": "max_time"` in the JSON answer, reason `max_time` in --metrics-file)')
            [CompletionResult]::new('--metrics-file', '--metrics-file', [CompletionResultType]::ParameterName, 'When the run ends, write its outcome to PATH in the Prometheus text format, atomically (a temporary file renamed over it), for node_exporter''s textfile collector: start, end, duration, time waited for the lease, token, exit status and reason (`ok`, `command_failed`, `already_done` when the run id was completed before, `busy`, `lease_lost`, …). Name it `*.prom` in the collector''s directory')
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)')
            [CompletionResult]::new('--schema', '--schema', [CompletionResultType]::ParameterName, 'The PostgreSQL schema that holds fence''s own tables')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            break
        }
        'fence;renew' {
            [CompletionResult]::new('--owner', '--owner', [CompletionResultType]::ParameterName, 'The owner that acquired the lease')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'The fencing token the lease was granted with')
            [CompletionResult]::new('--ttl', '--ttl', [CompletionResultType]::ParameterName, 'The new lease length from now (100ms to 24h). Default: the TTL it was acquired with')
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)')
            [CompletionResult]::new('--schema', '--schema', [CompletionResultType]::ParameterName, 'The PostgreSQL schema that holds fence''s own tables')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            break
        }
        'fence;release' {
            [CompletionResult]::new('--owner', '--owner', [CompletionResultType]::ParameterName, 'The owner that acquired the lease')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'The fencing token the lease was granted with')
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)')
            [CompletionResult]::new('--schema', '--schema', [CompletionResultType]::ParameterName, 'The PostgreSQL schema that holds fence''s own tables')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            break
        }
        'fence;inspect' {
            [CompletionResult]::new('--state', '--state', [CompletionResultType]::ParameterName, 'Only resources in this state')
            [CompletionResult]::new('--limit', '--limit', [CompletionResultType]::ParameterName, 'At most N resources, N ≥ 1 (ordered by name); JSON''s `next_after` names the cursor for the next page. Pages list the store, so not with named resources')
            [CompletionResult]::new('--after', '--after', [CompletionResultType]::ParameterName, 'Only resources named after RESOURCE (byte order): the next page after `--limit`')
            [CompletionResult]::new('--history', '--history', [CompletionResultType]::ParameterName, 'How many recent events to show per resource. Default: 5 with named resources, 0 without')
            [CompletionResult]::new('--target', '--target', [CompletionResultType]::ParameterName, 'Also show the highest token this target has accepted for each resource: a PostgreSQL database written with `fence write`, or an object (`s3://`, `gs://`, `file://`) with its version and stored token')
            [CompletionResult]::new('--table', '--table', [CompletionResultType]::ParameterName, 'With --target (a PostgreSQL database): show instead whether TABLE and each partition and inheritance child below it is protected, for which resource, and whether fence''s triggers are enabled (`always`: they fire whatever `session_replication_role` is)')
            [CompletionResult]::new('--id', '--id', [CompletionResultType]::ParameterName, 'With --target and one RESOURCE: write id KEY''s entry in the target''s ledger — when, with which token and by whom it was applied (objects: the version it made) — or that it is not there (never applied; on an object, maybe older than its last 8 ids). Exit 0 either way; JSON''s `applied` says which')
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)')
            [CompletionResult]::new('--schema', '--schema', [CompletionResultType]::ParameterName, 'The PostgreSQL schema that holds fence''s own tables')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            break
        }
        'fence;log' {
            [CompletionResult]::new('--resource', '--resource', [CompletionResultType]::ParameterName, 'A resource, or a glob of them (`*` any run of characters, `?` one; `\*`, `\?`, `\\` the character itself); repeat for several. Default: every resource')
            [CompletionResult]::new('--target', '--target', [CompletionResultType]::ParameterName, 'Also show the fenced writes this PostgreSQL database accepted and refused, or the writes this object accepted (its current version and the ids it keeps); repeat for several. An object''s refusals are in the store''s history (`write_rejected`)')
            [CompletionResult]::new('--since', '--since', [CompletionResultType]::ParameterName, 'Only events at or after TIME: RFC 3339 with Z or an offset such as +02:00, a date and time without one (local time, as TZ says), or a span back from now such as `2h`')
            [CompletionResult]::new('--until', '--until', [CompletionResultType]::ParameterName, 'Only events before TIME (as --since)')
            [CompletionResult]::new('--owner', '--owner', [CompletionResultType]::ParameterName, 'Only events of this owner, or of owners matching a glob (`fence run` owners are `ID/<pid>/<8 hex>`: `--owner ''ID/*''`; `\*`, `\?`, `\\` the character itself)')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'Only events with this fencing token')
            [CompletionResult]::new('--kind', '--kind', [CompletionResultType]::ParameterName, 'Only events of this kind (repeat for several)')
            [CompletionResult]::new('--limit', '--limit', [CompletionResultType]::ParameterName, 'At most N events from each source, the most recent (N ≥ 1); JSON says `truncated`')
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)')
            [CompletionResult]::new('--schema', '--schema', [CompletionResultType]::ParameterName, 'The PostgreSQL schema that holds fence''s own tables')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)')
            [CompletionResult]::new('-f', '-f', [CompletionResultType]::ParameterName, 'After the events so far, print each new one as it happens, one per line (human or ndjson), until SIGINT or SIGTERM; rides out a store or target that restarts. Polls: PostgreSQL every 50ms, other stores every 200ms; an expiry shows 2s after it')
            [CompletionResult]::new('--follow', '--follow', [CompletionResultType]::ParameterName, 'After the events so far, print each new one as it happens, one per line (human or ndjson), until SIGINT or SIGTERM; rides out a store or target that restarts. Polls: PostgreSQL every 50ms, other stores every 200ms; an expiry shows 2s after it')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            break
        }
        'fence;metrics' {
            [CompletionResult]::new('--resource', '--resource', [CompletionResultType]::ParameterName, 'A resource, or a glob of them (`*` any run of characters, `?` one; `\*`, `\?`, `\\` the character itself); repeat for several. Default: every resource')
            [CompletionResult]::new('--target', '--target', [CompletionResultType]::ParameterName, 'Also count the fenced writes this PostgreSQL database accepted and refused (repeat)')
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)')
            [CompletionResult]::new('--schema', '--schema', [CompletionResultType]::ParameterName, 'The PostgreSQL schema that holds fence''s own tables')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            break
        }
        'fence;write' {
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'Your fencing token for RESOURCE')
            [CompletionResult]::new('--owner', '--owner', [CompletionResultType]::ParameterName, 'Recorded with the write as who made it')
            [CompletionResult]::new('--target', '--target', [CompletionResultType]::ParameterName, 'Where to write: `postgres://user@host/db` (libpq rules, as --store), or an object: `s3://bucket/key`, `gs://bucket/key`, `file:///dir/name`')
            [CompletionResult]::new('--from', '--from', [CompletionResultType]::ParameterName, 'Object form: the bytes to store (`-`: standard input). From 1 MiB up, a progress bar on a terminal shows the bytes sent (not with -q or --format json)')
            [CompletionResult]::new('--if-match', '--if-match', [CompletionResultType]::ParameterName, 'Object form: write only if the object''s ETag is ETAG (S3)')
            [CompletionResult]::new('--if-generation-match', '--if-generation-match', [CompletionResultType]::ParameterName, 'Object form: write only if the object''s generation is N (GCS, file://); 0: only if the object does not exist (on S3 too)')
            [CompletionResult]::new('--sql', '--sql', [CompletionResultType]::ParameterName, 'SQL to run in the fenced transaction (one or more statements)')
            [CompletionResult]::new('--file', '--file', [CompletionResultType]::ParameterName, 'Read the SQL from a file (`-`: standard input)')
            [CompletionResult]::new('--id', '--id', [CompletionResultType]::ParameterName, 'A write id (idempotency key), e.g. `publish-2026-12-04`: 1 to 64 of A-Z a-z 0-9 . _ - : @ +. Recorded with the effect, atomically (transaction form: in the same transaction; objects: in the object''s metadata, by the same conditional put), with a digest of the SQL or bytes. A write whose id was already applied — by anyone, with any token — writes nothing: the same SQL or bytes exit 0 (`"replayed": true`); other SQL or bytes exit 6 (`"reason": "id_reused"`: one id, two different writes). After exit 8, run the same command again: it says whether the first one landed. Under `fence run --id`, derive one per write from `$FENCE_RUN_ID`. Objects remember their last 8 ids; PostgreSQL keeps them until deleted')
            [CompletionResult]::new('--timeout', '--timeout', [CompletionResultType]::ParameterName, 'Transaction and row forms: the longest the fenced transaction (or the row''s update) may take (100ms to 24h). The server cancels it then, and it can never commit later, even if fence is gone; fence exits 7 (nothing applied). SIGINT, SIGTERM and SIGHUP cancel it the same way. A `file://` object: the longest its lock file is waited for (exit 7, nothing written)')
            [CompletionResult]::new('--table', '--table', [CompletionResultType]::ParameterName, 'Row form: the table to write (`TABLE` or `SCHEMA.TABLE`, as named in the database)')
            [CompletionResult]::new('--key', '--key', [CompletionResultType]::ParameterName, 'Row form: a key column and its value; repeat for composite keys')
            [CompletionResult]::new('--set', '--set', [CompletionResultType]::ParameterName, 'Row form: a column to set and its value; repeat for more')
            [CompletionResult]::new('--token-column', '--token-column', [CompletionResultType]::ParameterName, 'Row form: the column holding each row''s token')
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)')
            [CompletionResult]::new('--schema', '--schema', [CompletionResultType]::ParameterName, 'The PostgreSQL schema that holds fence''s own tables')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)')
            [CompletionResult]::new('--upsert', '--upsert', [CompletionResultType]::ParameterName, 'Row form: insert the row (keys, values and token) when no row has the key')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            break
        }
        'fence;protect' {
            [CompletionResult]::new('--target', '--target', [CompletionResultType]::ParameterName, 'The database holding the table')
            [CompletionResult]::new('--table', '--table', [CompletionResultType]::ParameterName, 'The table to protect (`TABLE` or `SCHEMA.TABLE`)')
            [CompletionResult]::new('--resource', '--resource', [CompletionResultType]::ParameterName, 'The resource whose tokens guard the table')
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)')
            [CompletionResult]::new('--schema', '--schema', [CompletionResultType]::ParameterName, 'The PostgreSQL schema that holds fence''s own tables')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)')
            [CompletionResult]::new('--remove', '--remove', [CompletionResultType]::ParameterName, 'Remove the triggers instead, from TABLE and everything below it (refused for a partition or child of a protected table: it would open a hole in that protection)')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            break
        }
        'fence;grant' {
            [CompletionResult]::new('--target', '--target', [CompletionResultType]::ParameterName, 'The database whose fence schema to grant access to (connect as its admin)')
            [CompletionResult]::new('--role', '--role', [CompletionResultType]::ParameterName, 'The role to grant to, as named in the database')
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)')
            [CompletionResult]::new('--schema', '--schema', [CompletionResultType]::ParameterName, 'The PostgreSQL schema that holds fence''s own tables')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)')
            [CompletionResult]::new('--reader', '--reader', [CompletionResultType]::ParameterName, 'Grant read access only (inspect), not the write path')
            [CompletionResult]::new('--print', '--print', [CompletionResultType]::ParameterName, 'Print the SQL instead of running it')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            break
        }
        'fence;init' {
            [CompletionResult]::new('--target', '--target', [CompletionResultType]::ParameterName, 'Prepare fence''s schema in this PostgreSQL database rather than the store')
            [CompletionResult]::new('--held-waiters', '--held-waiters', [CompletionResultType]::ParameterName, 'PostgreSQL store: how many `--wait` waiters of one resource may keep their connection while they wait (2–1000, default 8; kept in the store, for every waiter). Those near the head keep theirs when the queue moves fast: up to 8 (or N, if fewer) listen for the release, the others poll on it; the rest reconnect for each poll. Raise it for a hot resource with many waiters: with 64 waiters on one resource, hand-overs ran 5–10 times faster with 64 than with 8 (docs/performance.md), at up to N+2 connections per busy resource, which the role''s CONNECTION LIMIT must allow (`fence doctor` sizes it with N)')
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)')
            [CompletionResult]::new('--schema', '--schema', [CompletionResultType]::ParameterName, 'The PostgreSQL schema that holds fence''s own tables')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            break
        }
        'fence;doctor' {
            [CompletionResult]::new('--target', '--target', [CompletionResultType]::ParameterName, 'Also check this target database or object (repeat for several)')
            [CompletionResult]::new('--held-over', '--held-over', [CompletionResultType]::ParameterName, 'Warn about each lease held longer than DURATION since it was granted (by the store''s clock; renewals do not restart it): a job that hangs while holding its lease keeps every later run out (`--busy-exit-code 0 -q` cron jobs exit 0 silently)')
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)')
            [CompletionResult]::new('--schema', '--schema', [CompletionResultType]::ParameterName, 'The PostgreSQL schema that holds fence''s own tables')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            break
        }
        'fence;bench' {
            [CompletionResult]::new('--workers', '--workers', [CompletionResultType]::ParameterName, 'Concurrent workers, each with its own connection')
            [CompletionResult]::new('--resources', '--resources', [CompletionResultType]::ParameterName, 'Resources to spread over (`spread` mode)')
            [CompletionResult]::new('--duration', '--duration', [CompletionResultType]::ParameterName, 'How long to run')
            [CompletionResult]::new('--mode', '--mode', [CompletionResultType]::ParameterName, 'What to measure')
            [CompletionResult]::new('--ttl', '--ttl', [CompletionResultType]::ParameterName, 'The lease length the workers ask for')
            [CompletionResult]::new('--hold', '--hold', [CompletionResultType]::ParameterName, 'How long each holder keeps the lease (`handoff` mode; default 1ms)')
            [CompletionResult]::new('--write-target', '--write-target', [CompletionResultType]::ParameterName, 'Also make one fenced write (an empty fenced transaction) per critical section to this PostgreSQL database, in the bench''s scratch schema')
            [CompletionResult]::new('--held-waiters', '--held-waiters', [CompletionResultType]::ParameterName, 'PostgreSQL: the scratch schema''s `held_waiters` (see `fence init --held-waiters`), to measure what a setting would do before giving it to the store. Default: the default (8)')
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)')
            [CompletionResult]::new('--schema', '--schema', [CompletionResultType]::ParameterName, 'The PostgreSQL schema that holds fence''s own tables')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)')
            [CompletionResult]::new('--renew', '--renew', [CompletionResultType]::ParameterName, 'Renew once in every critical section')
            [CompletionResult]::new('--prefill', '--prefill', [CompletionResultType]::ParameterName, 'Before timing, create all K resources as free leases (`spread` mode, PostgreSQL), so that every acquire finds its row in a table of K: how acquire scales with the number of resources (compare `--resources 100` with `--resources 1000000`)')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            break
        }
        'fence;prune' {
            [CompletionResult]::new('--older-than', '--older-than', [CompletionResultType]::ParameterName, 'Delete events older than this (e.g. 12h, 30d, 8w), by the server''s clock')
            [CompletionResult]::new('--keep', '--keep', [CompletionResultType]::ParameterName, 'Keep at least the last N events of each resource, however old')
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)')
            [CompletionResult]::new('--schema', '--schema', [CompletionResultType]::ParameterName, 'The PostgreSQL schema that holds fence''s own tables')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object''s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Print nothing on success, and no warnings; errors are still reported on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            break
        }
        'fence;help' {
            [CompletionResult]::new('acquire', 'acquire', [CompletionResultType]::ParameterValue, 'Take a lease on RESOURCE and print its fencing token')
            [CompletionResult]::new('run', 'run', [CompletionResultType]::ParameterValue, 'Run a command while holding a lease, and stop it if the lease is lost.')
            [CompletionResult]::new('renew', 'renew', [CompletionResultType]::ParameterValue, 'Extend a lease you hold')
            [CompletionResult]::new('release', 'release', [CompletionResultType]::ParameterValue, 'Give a lease up so that another owner can take it at once')
            [CompletionResult]::new('inspect', 'inspect', [CompletionResultType]::ParameterValue, 'Show who holds what, with which token, and what happened lately')
            [CompletionResult]::new('log', 'log', [CompletionResultType]::ParameterValue, 'One ordered timeline of leases and fenced writes: who held what when, and what was refused')
            [CompletionResult]::new('metrics', 'metrics', [CompletionResultType]::ParameterValue, 'Print the store''s (and targets'') state and history as Prometheus metrics')
            [CompletionResult]::new('write', 'write', [CompletionResultType]::ParameterValue, 'Write to a protected PostgreSQL database or an object with your fencing token.')
            [CompletionResult]::new('protect', 'protect', [CompletionResultType]::ParameterValue, 'Make every write to a table go through the fence.')
            [CompletionResult]::new('grant', 'grant', [CompletionResultType]::ParameterValue, 'Give a role exactly what a fenced writer (or a reader) needs in a target database.')
            [CompletionResult]::new('init', 'init', [CompletionResultType]::ParameterValue, 'Create or migrate fence''s own tables in the store, or in a target (safe to run again).')
            [CompletionResult]::new('doctor', 'doctor', [CompletionResultType]::ParameterValue, 'Check the store and targets for set-ups that weaken fence''s guarantees')
            [CompletionResult]::new('bench', 'bench', [CompletionResultType]::ParameterValue, 'Measure the store as your jobs would use it, before choosing a TTL.')
            [CompletionResult]::new('prune', 'prune', [CompletionResultType]::ParameterValue, 'Delete old lease history (PostgreSQL); never the token counters')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'fence;help;acquire' {
            break
        }
        'fence;help;run' {
            break
        }
        'fence;help;renew' {
            break
        }
        'fence;help;release' {
            break
        }
        'fence;help;inspect' {
            break
        }
        'fence;help;log' {
            break
        }
        'fence;help;metrics' {
            break
        }
        'fence;help;write' {
            break
        }
        'fence;help;protect' {
            break
        }
        'fence;help;grant' {
            break
        }
        'fence;help;init' {
            break
        }
        'fence;help;doctor' {
            break
        }
        'fence;help;bench' {
            break
        }
        'fence;help;prune' {
            break
        }
        'fence;help;help' {
            break
        }
    })

    $completions.Where{ $_.CompletionText -like "$wordToComplete*" } |
        Sort-Object -Property ListItemText
}
