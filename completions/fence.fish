# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_fence_global_optspecs
    string join \n store= schema= format= q/quiet color= h/help V/version
end

function __fish_fence_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_fence_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_fence_using_subcommand
    set -l cmd (__fish_fence_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c fence -n "__fish_fence_needs_command" -l store -d 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)' -r
complete -c fence -n "__fish_fence_needs_command" -l schema -d 'The PostgreSQL schema that holds fence\'s own tables' -r
complete -c fence -n "__fish_fence_needs_command" -l format -d 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object\'s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come' -r -f -a "human\t'Sentences and tables for people'
json\t'Exactly one JSON object on stdout, on success and on failure; warnings in its `notices` array'
env\t'Shell-quoted `export FENCE_…=…` lines (acquire only)'
ndjson\t'One JSON object per line, one line per event (log only), for `jq` and log shippers'"
complete -c fence -n "__fish_fence_needs_command" -l color -d 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)' -r -f -a "auto\t'Colour when stderr is a terminal and `NO_COLOR` is unset'
always\t'Always colour'
never\t'Never colour'"
complete -c fence -n "__fish_fence_needs_command" -s q -l quiet -d 'Print nothing on success, and no warnings; errors are still reported on stderr'
complete -c fence -n "__fish_fence_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c fence -n "__fish_fence_needs_command" -s V -l version -d 'Print version'
complete -c fence -n "__fish_fence_needs_command" -f -a "acquire" -d 'Take a lease on RESOURCE and print its fencing token'
complete -c fence -n "__fish_fence_needs_command" -f -a "run" -d 'Run a command while holding a lease, and stop it if the lease is lost.'
complete -c fence -n "__fish_fence_needs_command" -f -a "renew" -d 'Extend a lease you hold'
complete -c fence -n "__fish_fence_needs_command" -f -a "release" -d 'Give a lease up so that another owner can take it at once'
complete -c fence -n "__fish_fence_needs_command" -f -a "inspect" -d 'Show who holds what, with which token, and what happened lately'
complete -c fence -n "__fish_fence_needs_command" -f -a "log" -d 'One ordered timeline of leases and fenced writes: who held what when, and what was refused'
complete -c fence -n "__fish_fence_needs_command" -f -a "metrics" -d 'Print the store\'s (and targets\') state and history as Prometheus metrics'
complete -c fence -n "__fish_fence_needs_command" -f -a "write" -d 'Write to a protected PostgreSQL database or an object with your fencing token.'
complete -c fence -n "__fish_fence_needs_command" -f -a "protect" -d 'Make every write to a table go through the fence.'
complete -c fence -n "__fish_fence_needs_command" -f -a "grant" -d 'Give a role exactly what a fenced writer (or a reader) needs in a target database.'
complete -c fence -n "__fish_fence_needs_command" -f -a "init" -d 'Create or migrate fence\'s own tables in the store, or in a target (safe to run again).'
complete -c fence -n "__fish_fence_needs_command" -f -a "doctor" -d 'Check the store and targets for set-ups that weaken fence\'s guarantees'
complete -c fence -n "__fish_fence_needs_command" -f -a "bench" -d 'Measure the store as your jobs would use it, before choosing a TTL.'
complete -c fence -n "__fish_fence_needs_command" -f -a "prune" -d 'Delete old lease history (PostgreSQL); never the token counters'
complete -c fence -n "__fish_fence_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c fence -n "__fish_fence_using_subcommand acquire" -l owner -d 'Who holds the lease. Default: `<hostname>/<pid>/<8 hex>`, reported in the output' -r
complete -c fence -n "__fish_fence_using_subcommand acquire" -l ttl -d 'How long the lease lasts unless renewed (100ms to 24h), by the coordinator\'s clock' -r
complete -c fence -n "__fish_fence_using_subcommand acquire" -l wait -d 'When busy, wait until granted, at most DURATION (forever without one); then exit 3. On PostgreSQL waiters queue in arrival order and a release wakes the first' -r
complete -c fence -n "__fish_fence_using_subcommand acquire" -l above -d 'Recovery, not for routine use: grant a token above N as well as above every token this store issued for RESOURCE' -r
complete -c fence -n "__fish_fence_using_subcommand acquire" -l store -d 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)' -r
complete -c fence -n "__fish_fence_using_subcommand acquire" -l schema -d 'The PostgreSQL schema that holds fence\'s own tables' -r
complete -c fence -n "__fish_fence_using_subcommand acquire" -l format -d 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object\'s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come' -r -f -a "human\t'Sentences and tables for people'
json\t'Exactly one JSON object on stdout, on success and on failure; warnings in its `notices` array'
env\t'Shell-quoted `export FENCE_…=…` lines (acquire only)'
ndjson\t'One JSON object per line, one line per event (log only), for `jq` and log shippers'"
complete -c fence -n "__fish_fence_using_subcommand acquire" -l color -d 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)' -r -f -a "auto\t'Colour when stderr is a terminal and `NO_COLOR` is unset'
always\t'Always colour'
never\t'Never colour'"
complete -c fence -n "__fish_fence_using_subcommand acquire" -s q -l quiet -d 'Print nothing on success, and no warnings; errors are still reported on stderr'
complete -c fence -n "__fish_fence_using_subcommand acquire" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c fence -n "__fish_fence_using_subcommand run" -l owner -d 'Names who runs it: the lease\'s owner is `ID/<pid>/<8 hex>`, unique to this run, so a second `fence run` with the same ID (a fixed FENCE_OWNER in a crontab) is busy and never shares the lease. Default: `<hostname>/<pid>/<8 hex>`' -r
complete -c fence -n "__fish_fence_using_subcommand run" -l busy-exit-code -d 'Exit with CODE instead of 3 when the lease is busy (as flock\'s -E): `0` for a cron job whose overlap with its previous run is not an error. COMMAND still never starts' -r
complete -c fence -n "__fish_fence_using_subcommand run" -l id -d 'A run id, e.g. `nightly-2026-12-04` (1 to 64 of A-Z a-z 0-9 . _ - : @ +); default: FENCE_RUN_ID, unless an enclosing `fence run` set it. The command gets it as FENCE_RUN_ID (without one: `run-<token>-<8 random hex>`, unique to this run); derive write ids from it: `--id "$FENCE_RUN_ID-publish"`. Once the command exits 0 on its own (not interrupted, nothing of it left running), the run is recorded as completed in the store (as resource `RESOURCE#done:KEY`); a later run with the same id, once it holds the lease, starts nothing and exits 0 (or --done-exit-code), saying when and by whom it was completed; with other arguments, it starts nothing and exits 6 (`"reason": "id_reused"`: one id, two different commands)' -r
complete -c fence -n "__fish_fence_using_subcommand run" -l done-exit-code -d 'Exit with CODE instead of 0 when the run id was already completed (COMMAND never starts), to tell "already done" apart from "done now"' -r
complete -c fence -n "__fish_fence_using_subcommand run" -l ttl -d 'The lease length; fence renews about every third of it' -r
complete -c fence -n "__fish_fence_using_subcommand run" -l wait -d 'When busy, wait until granted, at most DURATION (forever without one); then exit 3. On PostgreSQL waiters queue in arrival order and a release wakes the first' -r
complete -c fence -n "__fish_fence_using_subcommand run" -l kill-after -d 'After SIGTERM to what COMMAND left running, wait this long before SIGKILL (at most 7 days). A command whose lease cannot be proven gets SIGTERM this long before the bound (at most TTL/5) and SIGKILL at the bound: never later' -r
complete -c fence -n "__fish_fence_using_subcommand run" -l max-time -d 'Stop COMMAND once it has run this long, as a hung job must not hold the lease forever: SIGTERM to everything it started, SIGKILL after --kill-after, then the lease is released (the next run need not wait for it to expire) and fence exits 124, as timeout(1) does (`"stopped": "max_time"` in the JSON answer, reason `max_time` in --metrics-file)' -r
complete -c fence -n "__fish_fence_using_subcommand run" -l metrics-file -d 'When the run ends, write its outcome to PATH in the Prometheus text format, atomically (a temporary file renamed over it), for node_exporter\'s textfile collector: start, end, duration, time waited for the lease, token, exit status and reason (`ok`, `command_failed`, `already_done` when the run id was completed before, `busy`, `lease_lost`, …). Name it `*.prom` in the collector\'s directory' -r -F
complete -c fence -n "__fish_fence_using_subcommand run" -l store -d 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)' -r
complete -c fence -n "__fish_fence_using_subcommand run" -l schema -d 'The PostgreSQL schema that holds fence\'s own tables' -r
complete -c fence -n "__fish_fence_using_subcommand run" -l format -d 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object\'s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come' -r -f -a "human\t'Sentences and tables for people'
json\t'Exactly one JSON object on stdout, on success and on failure; warnings in its `notices` array'
env\t'Shell-quoted `export FENCE_…=…` lines (acquire only)'
ndjson\t'One JSON object per line, one line per event (log only), for `jq` and log shippers'"
complete -c fence -n "__fish_fence_using_subcommand run" -l color -d 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)' -r -f -a "auto\t'Colour when stderr is a terminal and `NO_COLOR` is unset'
always\t'Always colour'
never\t'Never colour'"
complete -c fence -n "__fish_fence_using_subcommand run" -s q -l quiet -d 'Print nothing on success, and no warnings; errors are still reported on stderr'
complete -c fence -n "__fish_fence_using_subcommand run" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c fence -n "__fish_fence_using_subcommand renew" -l owner -d 'The owner that acquired the lease' -r
complete -c fence -n "__fish_fence_using_subcommand renew" -l token -d 'The fencing token the lease was granted with' -r
complete -c fence -n "__fish_fence_using_subcommand renew" -l ttl -d 'The new lease length from now (100ms to 24h). Default: the TTL it was acquired with' -r
complete -c fence -n "__fish_fence_using_subcommand renew" -l store -d 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)' -r
complete -c fence -n "__fish_fence_using_subcommand renew" -l schema -d 'The PostgreSQL schema that holds fence\'s own tables' -r
complete -c fence -n "__fish_fence_using_subcommand renew" -l format -d 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object\'s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come' -r -f -a "human\t'Sentences and tables for people'
json\t'Exactly one JSON object on stdout, on success and on failure; warnings in its `notices` array'
env\t'Shell-quoted `export FENCE_…=…` lines (acquire only)'
ndjson\t'One JSON object per line, one line per event (log only), for `jq` and log shippers'"
complete -c fence -n "__fish_fence_using_subcommand renew" -l color -d 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)' -r -f -a "auto\t'Colour when stderr is a terminal and `NO_COLOR` is unset'
always\t'Always colour'
never\t'Never colour'"
complete -c fence -n "__fish_fence_using_subcommand renew" -s q -l quiet -d 'Print nothing on success, and no warnings; errors are still reported on stderr'
complete -c fence -n "__fish_fence_using_subcommand renew" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c fence -n "__fish_fence_using_subcommand release" -l owner -d 'The owner that acquired the lease' -r
complete -c fence -n "__fish_fence_using_subcommand release" -l token -d 'The fencing token the lease was granted with' -r
complete -c fence -n "__fish_fence_using_subcommand release" -l store -d 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)' -r
complete -c fence -n "__fish_fence_using_subcommand release" -l schema -d 'The PostgreSQL schema that holds fence\'s own tables' -r
complete -c fence -n "__fish_fence_using_subcommand release" -l format -d 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object\'s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come' -r -f -a "human\t'Sentences and tables for people'
json\t'Exactly one JSON object on stdout, on success and on failure; warnings in its `notices` array'
env\t'Shell-quoted `export FENCE_…=…` lines (acquire only)'
ndjson\t'One JSON object per line, one line per event (log only), for `jq` and log shippers'"
complete -c fence -n "__fish_fence_using_subcommand release" -l color -d 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)' -r -f -a "auto\t'Colour when stderr is a terminal and `NO_COLOR` is unset'
always\t'Always colour'
never\t'Never colour'"
complete -c fence -n "__fish_fence_using_subcommand release" -s q -l quiet -d 'Print nothing on success, and no warnings; errors are still reported on stderr'
complete -c fence -n "__fish_fence_using_subcommand release" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c fence -n "__fish_fence_using_subcommand inspect" -l state -d 'Only resources in this state' -r -f -a "held\t''
expired\t''
free\t''"
complete -c fence -n "__fish_fence_using_subcommand inspect" -l limit -d 'At most N resources, N ≥ 1 (ordered by name); JSON\'s `next_after` names the cursor for the next page. Pages list the store, so not with named resources' -r
complete -c fence -n "__fish_fence_using_subcommand inspect" -l after -d 'Only resources named after RESOURCE (byte order): the next page after `--limit`' -r
complete -c fence -n "__fish_fence_using_subcommand inspect" -l history -d 'How many recent events to show per resource. Default: 5 with named resources, 0 without' -r
complete -c fence -n "__fish_fence_using_subcommand inspect" -l target -d 'Also show the highest token this target has accepted for each resource: a PostgreSQL database written with `fence write`, or an object (`s3://`, `gs://`, `file://`) with its version and stored token' -r
complete -c fence -n "__fish_fence_using_subcommand inspect" -l table -d 'With --target (a PostgreSQL database): show instead whether TABLE and each partition and inheritance child below it is protected, for which resource, and whether fence\'s triggers are enabled (`always`: they fire whatever `session_replication_role` is)' -r
complete -c fence -n "__fish_fence_using_subcommand inspect" -l id -d 'With --target and one RESOURCE: write id KEY\'s entry in the target\'s ledger — when, with which token and by whom it was applied (objects: the version it made) — or that it is not there (never applied; on an object, maybe older than its last 8 ids). Exit 0 either way; JSON\'s `applied` says which' -r
complete -c fence -n "__fish_fence_using_subcommand inspect" -l store -d 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)' -r
complete -c fence -n "__fish_fence_using_subcommand inspect" -l schema -d 'The PostgreSQL schema that holds fence\'s own tables' -r
complete -c fence -n "__fish_fence_using_subcommand inspect" -l format -d 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object\'s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come' -r -f -a "human\t'Sentences and tables for people'
json\t'Exactly one JSON object on stdout, on success and on failure; warnings in its `notices` array'
env\t'Shell-quoted `export FENCE_…=…` lines (acquire only)'
ndjson\t'One JSON object per line, one line per event (log only), for `jq` and log shippers'"
complete -c fence -n "__fish_fence_using_subcommand inspect" -l color -d 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)' -r -f -a "auto\t'Colour when stderr is a terminal and `NO_COLOR` is unset'
always\t'Always colour'
never\t'Never colour'"
complete -c fence -n "__fish_fence_using_subcommand inspect" -s q -l quiet -d 'Print nothing on success, and no warnings; errors are still reported on stderr'
complete -c fence -n "__fish_fence_using_subcommand inspect" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c fence -n "__fish_fence_using_subcommand log" -l resource -d 'A resource, or a glob of them (`*` any run of characters, `?` one; `\\*`, `\\?`, `\\\\` the character itself); repeat for several. Default: every resource' -r
complete -c fence -n "__fish_fence_using_subcommand log" -l target -d 'Also show the fenced writes this PostgreSQL database accepted and refused, or the writes this object accepted (its current version and the ids it keeps); repeat for several. An object\'s refusals are in the store\'s history (`write_rejected`)' -r
complete -c fence -n "__fish_fence_using_subcommand log" -l since -d 'Only events at or after TIME: RFC 3339 with Z or an offset such as +02:00, a date and time without one (local time, as TZ says), or a span back from now such as `2h`' -r
complete -c fence -n "__fish_fence_using_subcommand log" -l until -d 'Only events before TIME (as --since)' -r
complete -c fence -n "__fish_fence_using_subcommand log" -l owner -d 'Only events of this owner, or of owners matching a glob (`fence run` owners are `ID/<pid>/<8 hex>`: `--owner \'ID/*\'`; `\\*`, `\\?`, `\\\\` the character itself)' -r
complete -c fence -n "__fish_fence_using_subcommand log" -l token -d 'Only events with this fencing token' -r
complete -c fence -n "__fish_fence_using_subcommand log" -l kind -d 'Only events of this kind (repeat for several)' -r -f -a "acquired\t''
reacquired\t''
taken_over\t''
renewed\t''
released\t''
expired\t''
renew_rejected\t''
release_rejected\t''
busy\t''
conflict\t''
write_accepted\t''
write_rejected\t''
pruned\t''
run_started\t''
run_finished\t''
run_stopped\t''"
complete -c fence -n "__fish_fence_using_subcommand log" -l limit -d 'At most N events from each source, the most recent (N ≥ 1); JSON says `truncated`' -r
complete -c fence -n "__fish_fence_using_subcommand log" -l store -d 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)' -r
complete -c fence -n "__fish_fence_using_subcommand log" -l schema -d 'The PostgreSQL schema that holds fence\'s own tables' -r
complete -c fence -n "__fish_fence_using_subcommand log" -l format -d 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object\'s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come' -r -f -a "human\t'Sentences and tables for people'
json\t'Exactly one JSON object on stdout, on success and on failure; warnings in its `notices` array'
env\t'Shell-quoted `export FENCE_…=…` lines (acquire only)'
ndjson\t'One JSON object per line, one line per event (log only), for `jq` and log shippers'"
complete -c fence -n "__fish_fence_using_subcommand log" -l color -d 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)' -r -f -a "auto\t'Colour when stderr is a terminal and `NO_COLOR` is unset'
always\t'Always colour'
never\t'Never colour'"
complete -c fence -n "__fish_fence_using_subcommand log" -s f -l follow -d 'After the events so far, print each new one as it happens, one per line (human or ndjson), until SIGINT or SIGTERM; rides out a store or target that restarts. Polls: PostgreSQL every 50ms, other stores every 200ms; an expiry shows 2s after it'
complete -c fence -n "__fish_fence_using_subcommand log" -s q -l quiet -d 'Print nothing on success, and no warnings; errors are still reported on stderr'
complete -c fence -n "__fish_fence_using_subcommand log" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c fence -n "__fish_fence_using_subcommand metrics" -l resource -d 'A resource, or a glob of them (`*` any run of characters, `?` one; `\\*`, `\\?`, `\\\\` the character itself); repeat for several. Default: every resource' -r
complete -c fence -n "__fish_fence_using_subcommand metrics" -l target -d 'Also count the fenced writes this PostgreSQL database accepted and refused (repeat)' -r
complete -c fence -n "__fish_fence_using_subcommand metrics" -l store -d 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)' -r
complete -c fence -n "__fish_fence_using_subcommand metrics" -l schema -d 'The PostgreSQL schema that holds fence\'s own tables' -r
complete -c fence -n "__fish_fence_using_subcommand metrics" -l format -d 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object\'s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come' -r -f -a "human\t'Sentences and tables for people'
json\t'Exactly one JSON object on stdout, on success and on failure; warnings in its `notices` array'
env\t'Shell-quoted `export FENCE_…=…` lines (acquire only)'
ndjson\t'One JSON object per line, one line per event (log only), for `jq` and log shippers'"
complete -c fence -n "__fish_fence_using_subcommand metrics" -l color -d 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)' -r -f -a "auto\t'Colour when stderr is a terminal and `NO_COLOR` is unset'
always\t'Always colour'
never\t'Never colour'"
complete -c fence -n "__fish_fence_using_subcommand metrics" -s q -l quiet -d 'Print nothing on success, and no warnings; errors are still reported on stderr'
complete -c fence -n "__fish_fence_using_subcommand metrics" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c fence -n "__fish_fence_using_subcommand write" -l token -d 'Your fencing token for RESOURCE' -r
complete -c fence -n "__fish_fence_using_subcommand write" -l owner -d 'Recorded with the write as who made it' -r
complete -c fence -n "__fish_fence_using_subcommand write" -l target -d 'Where to write: `postgres://user@host/db` (libpq rules, as --store), or an object: `s3://bucket/key`, `gs://bucket/key`, `file:///dir/name`' -r
complete -c fence -n "__fish_fence_using_subcommand write" -l from -d 'Object form: the bytes to store (`-`: standard input). From 1 MiB up, a progress bar on a terminal shows the bytes sent (not with -q or --format json)' -r -F
complete -c fence -n "__fish_fence_using_subcommand write" -l if-match -d 'Object form: write only if the object\'s ETag is ETAG (S3)' -r
complete -c fence -n "__fish_fence_using_subcommand write" -l if-generation-match -d 'Object form: write only if the object\'s generation is N (GCS, file://); 0: only if the object does not exist (on S3 too)' -r
complete -c fence -n "__fish_fence_using_subcommand write" -l sql -d 'SQL to run in the fenced transaction (one or more statements)' -r
complete -c fence -n "__fish_fence_using_subcommand write" -l file -d 'Read the SQL from a file (`-`: standard input)' -r -F
complete -c fence -n "__fish_fence_using_subcommand write" -l id -d 'A write id (idempotency key), e.g. `publish-2026-12-04`: 1 to 64 of A-Z a-z 0-9 . _ - : @ +. Recorded with the effect, atomically (transaction form: in the same transaction; objects: in the object\'s metadata, by the same conditional put), with a digest of the SQL or bytes. A write whose id was already applied — by anyone, with any token — writes nothing: the same SQL or bytes exit 0 (`"replayed": true`); other SQL or bytes exit 6 (`"reason": "id_reused"`: one id, two different writes). After exit 8, run the same command again: it says whether the first one landed. Under `fence run --id`, derive one per write from `$FENCE_RUN_ID`. Objects remember their last 8 ids; PostgreSQL keeps them until deleted' -r
complete -c fence -n "__fish_fence_using_subcommand write" -l timeout -d 'Transaction and row forms: the longest the fenced transaction (or the row\'s update) may take (100ms to 24h). The server cancels it then, and it can never commit later, even if fence is gone; fence exits 7 (nothing applied). SIGINT, SIGTERM and SIGHUP cancel it the same way. A `file://` object: the longest its lock file is waited for (exit 7, nothing written)' -r
complete -c fence -n "__fish_fence_using_subcommand write" -l table -d 'Row form: the table to write (`TABLE` or `SCHEMA.TABLE`, as named in the database)' -r
complete -c fence -n "__fish_fence_using_subcommand write" -l key -d 'Row form: a key column and its value; repeat for composite keys' -r
complete -c fence -n "__fish_fence_using_subcommand write" -l set -d 'Row form: a column to set and its value; repeat for more' -r
complete -c fence -n "__fish_fence_using_subcommand write" -l token-column -d 'Row form: the column holding each row\'s token' -r
complete -c fence -n "__fish_fence_using_subcommand write" -l store -d 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)' -r
complete -c fence -n "__fish_fence_using_subcommand write" -l schema -d 'The PostgreSQL schema that holds fence\'s own tables' -r
complete -c fence -n "__fish_fence_using_subcommand write" -l format -d 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object\'s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come' -r -f -a "human\t'Sentences and tables for people'
json\t'Exactly one JSON object on stdout, on success and on failure; warnings in its `notices` array'
env\t'Shell-quoted `export FENCE_…=…` lines (acquire only)'
ndjson\t'One JSON object per line, one line per event (log only), for `jq` and log shippers'"
complete -c fence -n "__fish_fence_using_subcommand write" -l color -d 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)' -r -f -a "auto\t'Colour when stderr is a terminal and `NO_COLOR` is unset'
always\t'Always colour'
never\t'Never colour'"
complete -c fence -n "__fish_fence_using_subcommand write" -l upsert -d 'Row form: insert the row (keys, values and token) when no row has the key'
complete -c fence -n "__fish_fence_using_subcommand write" -s q -l quiet -d 'Print nothing on success, and no warnings; errors are still reported on stderr'
complete -c fence -n "__fish_fence_using_subcommand write" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c fence -n "__fish_fence_using_subcommand protect" -l target -d 'The database holding the table' -r
complete -c fence -n "__fish_fence_using_subcommand protect" -l table -d 'The table to protect (`TABLE` or `SCHEMA.TABLE`)' -r
complete -c fence -n "__fish_fence_using_subcommand protect" -l resource -d 'The resource whose tokens guard the table' -r
complete -c fence -n "__fish_fence_using_subcommand protect" -l store -d 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)' -r
complete -c fence -n "__fish_fence_using_subcommand protect" -l schema -d 'The PostgreSQL schema that holds fence\'s own tables' -r
complete -c fence -n "__fish_fence_using_subcommand protect" -l format -d 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object\'s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come' -r -f -a "human\t'Sentences and tables for people'
json\t'Exactly one JSON object on stdout, on success and on failure; warnings in its `notices` array'
env\t'Shell-quoted `export FENCE_…=…` lines (acquire only)'
ndjson\t'One JSON object per line, one line per event (log only), for `jq` and log shippers'"
complete -c fence -n "__fish_fence_using_subcommand protect" -l color -d 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)' -r -f -a "auto\t'Colour when stderr is a terminal and `NO_COLOR` is unset'
always\t'Always colour'
never\t'Never colour'"
complete -c fence -n "__fish_fence_using_subcommand protect" -l remove -d 'Remove the triggers instead, from TABLE and everything below it (refused for a partition or child of a protected table: it would open a hole in that protection)'
complete -c fence -n "__fish_fence_using_subcommand protect" -s q -l quiet -d 'Print nothing on success, and no warnings; errors are still reported on stderr'
complete -c fence -n "__fish_fence_using_subcommand protect" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c fence -n "__fish_fence_using_subcommand grant" -l target -d 'The database whose fence schema to grant access to (connect as its admin)' -r
complete -c fence -n "__fish_fence_using_subcommand grant" -l role -d 'The role to grant to, as named in the database' -r
complete -c fence -n "__fish_fence_using_subcommand grant" -l store -d 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)' -r
complete -c fence -n "__fish_fence_using_subcommand grant" -l schema -d 'The PostgreSQL schema that holds fence\'s own tables' -r
complete -c fence -n "__fish_fence_using_subcommand grant" -l format -d 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object\'s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come' -r -f -a "human\t'Sentences and tables for people'
json\t'Exactly one JSON object on stdout, on success and on failure; warnings in its `notices` array'
env\t'Shell-quoted `export FENCE_…=…` lines (acquire only)'
ndjson\t'One JSON object per line, one line per event (log only), for `jq` and log shippers'"
complete -c fence -n "__fish_fence_using_subcommand grant" -l color -d 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)' -r -f -a "auto\t'Colour when stderr is a terminal and `NO_COLOR` is unset'
always\t'Always colour'
never\t'Never colour'"
complete -c fence -n "__fish_fence_using_subcommand grant" -l reader -d 'Grant read access only (inspect), not the write path'
complete -c fence -n "__fish_fence_using_subcommand grant" -l print -d 'Print the SQL instead of running it'
complete -c fence -n "__fish_fence_using_subcommand grant" -s q -l quiet -d 'Print nothing on success, and no warnings; errors are still reported on stderr'
complete -c fence -n "__fish_fence_using_subcommand grant" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c fence -n "__fish_fence_using_subcommand init" -l target -d 'Prepare fence\'s schema in this PostgreSQL database rather than the store' -r
complete -c fence -n "__fish_fence_using_subcommand init" -l held-waiters -d 'PostgreSQL store: how many `--wait` waiters of one resource may keep their connection while they wait (2–1000, default 8; kept in the store, for every waiter). Those near the head keep theirs when the queue moves fast: up to 8 (or N, if fewer) listen for the release, the others poll on it; the rest reconnect for each poll. Raise it for a hot resource with many waiters: with 64 waiters on one resource, hand-overs ran 5–10 times faster with 64 than with 8 (docs/performance.md), at up to N+2 connections per busy resource, which the role\'s CONNECTION LIMIT must allow (`fence doctor` sizes it with N)' -r
complete -c fence -n "__fish_fence_using_subcommand init" -l store -d 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)' -r
complete -c fence -n "__fish_fence_using_subcommand init" -l schema -d 'The PostgreSQL schema that holds fence\'s own tables' -r
complete -c fence -n "__fish_fence_using_subcommand init" -l format -d 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object\'s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come' -r -f -a "human\t'Sentences and tables for people'
json\t'Exactly one JSON object on stdout, on success and on failure; warnings in its `notices` array'
env\t'Shell-quoted `export FENCE_…=…` lines (acquire only)'
ndjson\t'One JSON object per line, one line per event (log only), for `jq` and log shippers'"
complete -c fence -n "__fish_fence_using_subcommand init" -l color -d 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)' -r -f -a "auto\t'Colour when stderr is a terminal and `NO_COLOR` is unset'
always\t'Always colour'
never\t'Never colour'"
complete -c fence -n "__fish_fence_using_subcommand init" -s q -l quiet -d 'Print nothing on success, and no warnings; errors are still reported on stderr'
complete -c fence -n "__fish_fence_using_subcommand init" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c fence -n "__fish_fence_using_subcommand doctor" -l target -d 'Also check this target database or object (repeat for several)' -r
complete -c fence -n "__fish_fence_using_subcommand doctor" -l held-over -d 'Warn about each lease held longer than DURATION since it was granted (by the store\'s clock; renewals do not restart it): a job that hangs while holding its lease keeps every later run out (`--busy-exit-code 0 -q` cron jobs exit 0 silently)' -r
complete -c fence -n "__fish_fence_using_subcommand doctor" -l store -d 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)' -r
complete -c fence -n "__fish_fence_using_subcommand doctor" -l schema -d 'The PostgreSQL schema that holds fence\'s own tables' -r
complete -c fence -n "__fish_fence_using_subcommand doctor" -l format -d 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object\'s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come' -r -f -a "human\t'Sentences and tables for people'
json\t'Exactly one JSON object on stdout, on success and on failure; warnings in its `notices` array'
env\t'Shell-quoted `export FENCE_…=…` lines (acquire only)'
ndjson\t'One JSON object per line, one line per event (log only), for `jq` and log shippers'"
complete -c fence -n "__fish_fence_using_subcommand doctor" -l color -d 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)' -r -f -a "auto\t'Colour when stderr is a terminal and `NO_COLOR` is unset'
always\t'Always colour'
never\t'Never colour'"
complete -c fence -n "__fish_fence_using_subcommand doctor" -s q -l quiet -d 'Print nothing on success, and no warnings; errors are still reported on stderr'
complete -c fence -n "__fish_fence_using_subcommand doctor" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c fence -n "__fish_fence_using_subcommand bench" -l workers -d 'Concurrent workers, each with its own connection' -r
complete -c fence -n "__fish_fence_using_subcommand bench" -l resources -d 'Resources to spread over (`spread` mode)' -r
complete -c fence -n "__fish_fence_using_subcommand bench" -l duration -d 'How long to run' -r
complete -c fence -n "__fish_fence_using_subcommand bench" -l mode -d 'What to measure' -r -f -a "contend\t'Every worker on one resource, blocking until granted'
spread\t'Workers on many resources, refused when busy'
handoff\t'Like contend, holding each lease for --hold'"
complete -c fence -n "__fish_fence_using_subcommand bench" -l ttl -d 'The lease length the workers ask for' -r
complete -c fence -n "__fish_fence_using_subcommand bench" -l hold -d 'How long each holder keeps the lease (`handoff` mode; default 1ms)' -r
complete -c fence -n "__fish_fence_using_subcommand bench" -l write-target -d 'Also make one fenced write (an empty fenced transaction) per critical section to this PostgreSQL database, in the bench\'s scratch schema' -r
complete -c fence -n "__fish_fence_using_subcommand bench" -l held-waiters -d 'PostgreSQL: the scratch schema\'s `held_waiters` (see `fence init --held-waiters`), to measure what a setting would do before giving it to the store. Default: the default (8)' -r
complete -c fence -n "__fish_fence_using_subcommand bench" -l store -d 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)' -r
complete -c fence -n "__fish_fence_using_subcommand bench" -l schema -d 'The PostgreSQL schema that holds fence\'s own tables' -r
complete -c fence -n "__fish_fence_using_subcommand bench" -l format -d 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object\'s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come' -r -f -a "human\t'Sentences and tables for people'
json\t'Exactly one JSON object on stdout, on success and on failure; warnings in its `notices` array'
env\t'Shell-quoted `export FENCE_…=…` lines (acquire only)'
ndjson\t'One JSON object per line, one line per event (log only), for `jq` and log shippers'"
complete -c fence -n "__fish_fence_using_subcommand bench" -l color -d 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)' -r -f -a "auto\t'Colour when stderr is a terminal and `NO_COLOR` is unset'
always\t'Always colour'
never\t'Never colour'"
complete -c fence -n "__fish_fence_using_subcommand bench" -l renew -d 'Renew once in every critical section'
complete -c fence -n "__fish_fence_using_subcommand bench" -l prefill -d 'Before timing, create all K resources as free leases (`spread` mode, PostgreSQL), so that every acquire finds its row in a table of K: how acquire scales with the number of resources (compare `--resources 100` with `--resources 1000000`)'
complete -c fence -n "__fish_fence_using_subcommand bench" -s q -l quiet -d 'Print nothing on success, and no warnings; errors are still reported on stderr'
complete -c fence -n "__fish_fence_using_subcommand bench" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c fence -n "__fish_fence_using_subcommand prune" -l older-than -d 'Delete events older than this (e.g. 12h, 30d, 8w), by the server\'s clock' -r
complete -c fence -n "__fish_fence_using_subcommand prune" -l keep -d 'Keep at least the last N events of each resource, however old' -r
complete -c fence -n "__fish_fence_using_subcommand prune" -l store -d 'The coordinator: `postgres://user@host/db`, `s3://bucket/prefix`, `gs://bucket/prefix`, or `file:///dir` for the local directory store. Default: `file://$XDG_STATE_HOME/fence` (or `$HOME/.local/state/fence`)' -r
complete -c fence -n "__fish_fence_using_subcommand prune" -l schema -d 'The PostgreSQL schema that holds fence\'s own tables' -r
complete -c fence -n "__fish_fence_using_subcommand prune" -l format -d 'Output format: `human` tables and sentences, one `json` object, `env` lines for `eval` (acquire only), or `ndjson`, one JSON object per event (log only). With `json`, warnings are not printed on stderr but carried in the object\'s `notices` array of strings (absent when there is none); `run` prints them on stderr too, as they come' -r -f -a "human\t'Sentences and tables for people'
json\t'Exactly one JSON object on stdout, on success and on failure; warnings in its `notices` array'
env\t'Shell-quoted `export FENCE_…=…` lines (acquire only)'
ndjson\t'One JSON object per line, one line per event (log only), for `jq` and log shippers'"
complete -c fence -n "__fish_fence_using_subcommand prune" -l color -d 'When to colour diagnostics (`NO_COLOR` is honoured with `auto`)' -r -f -a "auto\t'Colour when stderr is a terminal and `NO_COLOR` is unset'
always\t'Always colour'
never\t'Never colour'"
complete -c fence -n "__fish_fence_using_subcommand prune" -s q -l quiet -d 'Print nothing on success, and no warnings; errors are still reported on stderr'
complete -c fence -n "__fish_fence_using_subcommand prune" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c fence -n "__fish_fence_using_subcommand help; and not __fish_seen_subcommand_from acquire run renew release inspect log metrics write protect grant init doctor bench prune help" -f -a "acquire" -d 'Take a lease on RESOURCE and print its fencing token'
complete -c fence -n "__fish_fence_using_subcommand help; and not __fish_seen_subcommand_from acquire run renew release inspect log metrics write protect grant init doctor bench prune help" -f -a "run" -d 'Run a command while holding a lease, and stop it if the lease is lost.'
complete -c fence -n "__fish_fence_using_subcommand help; and not __fish_seen_subcommand_from acquire run renew release inspect log metrics write protect grant init doctor bench prune help" -f -a "renew" -d 'Extend a lease you hold'
complete -c fence -n "__fish_fence_using_subcommand help; and not __fish_seen_subcommand_from acquire run renew release inspect log metrics write protect grant init doctor bench prune help" -f -a "release" -d 'Give a lease up so that another owner can take it at once'
complete -c fence -n "__fish_fence_using_subcommand help; and not __fish_seen_subcommand_from acquire run renew release inspect log metrics write protect grant init doctor bench prune help" -f -a "inspect" -d 'Show who holds what, with which token, and what happened lately'
complete -c fence -n "__fish_fence_using_subcommand help; and not __fish_seen_subcommand_from acquire run renew release inspect log metrics write protect grant init doctor bench prune help" -f -a "log" -d 'One ordered timeline of leases and fenced writes: who held what when, and what was refused'
complete -c fence -n "__fish_fence_using_subcommand help; and not __fish_seen_subcommand_from acquire run renew release inspect log metrics write protect grant init doctor bench prune help" -f -a "metrics" -d 'Print the store\'s (and targets\') state and history as Prometheus metrics'
complete -c fence -n "__fish_fence_using_subcommand help; and not __fish_seen_subcommand_from acquire run renew release inspect log metrics write protect grant init doctor bench prune help" -f -a "write" -d 'Write to a protected PostgreSQL database or an object with your fencing token.'
complete -c fence -n "__fish_fence_using_subcommand help; and not __fish_seen_subcommand_from acquire run renew release inspect log metrics write protect grant init doctor bench prune help" -f -a "protect" -d 'Make every write to a table go through the fence.'
complete -c fence -n "__fish_fence_using_subcommand help; and not __fish_seen_subcommand_from acquire run renew release inspect log metrics write protect grant init doctor bench prune help" -f -a "grant" -d 'Give a role exactly what a fenced writer (or a reader) needs in a target database.'
complete -c fence -n "__fish_fence_using_subcommand help; and not __fish_seen_subcommand_from acquire run renew release inspect log metrics write protect grant init doctor bench prune help" -f -a "init" -d 'Create or migrate fence\'s own tables in the store, or in a target (safe to run again).'
complete -c fence -n "__fish_fence_using_subcommand help; and not __fish_seen_subcommand_from acquire run renew release inspect log metrics write protect grant init doctor bench prune help" -f -a "doctor" -d 'Check the store and targets for set-ups that weaken fence\'s guarantees'
complete -c fence -n "__fish_fence_using_subcommand help; and not __fish_seen_subcommand_from acquire run renew release inspect log metrics write protect grant init doctor bench prune help" -f -a "bench" -d 'Measure the store as your jobs would use it, before choosing a TTL.'
complete -c fence -n "__fish_fence_using_subcommand help; and not __fish_seen_subcommand_from acquire run renew release inspect log metrics write protect grant init doctor bench prune help" -f -a "prune" -d 'Delete old lease history (PostgreSQL); never the token counters'
complete -c fence -n "__fish_fence_using_subcommand help; and not __fish_seen_subcommand_from acquire run renew release inspect log metrics write protect grant init doctor bench prune help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
