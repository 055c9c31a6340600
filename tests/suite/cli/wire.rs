//! The JSON answers of `inspect` (with `--history`, `--target`, `--id`, `--table`), `log` (json and
//! ndjson, with a target), `write` (the three forms, ids applied and replayed), `run` (run,
//! recorded, skipped), `doctor`, `bench` and `metrics`, pinned by their shape: every key in
//! its order, nesting, `null` against an absent key, integer against float. They are a public
//! contract down to the byte (DESIGN §4, §9): values vary from run to run, their shape does
//! not. Each answer is also checked to be one compact line.

use crate::common;

use std::time::Duration;

use common::Store;
use serde_json::Value;

/// The shape of a JSON value: objects as `{key:shape,…}` in their order, arrays as the
/// distinct shapes of their elements, sorted (`[a|b]`), and scalars as `str`, `int`,
/// `float`, `bool`, `null`.
fn shape(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(_) => "bool".into(),
        Value::Number(n) if n.is_i64() || n.is_u64() => "int".into(),
        Value::Number(_) => "float".into(),
        Value::String(_) => "str".into(),
        Value::Array(items) => {
            let mut shapes: Vec<String> = Vec::new();
            for item in items {
                let s = shape(item);
                if !shapes.contains(&s) {
                    shapes.push(s);
                }
            }
            shapes.sort();
            format!("[{}]", shapes.join("|"))
        }
        Value::Object(map) => {
            let fields: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{k}:{}", shape(v)))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
    }
}

/// The one JSON line on stdout, checked to be compact, as its shape.
#[track_caller]
fn line_shape(line: &str) -> String {
    let value: Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    assert_eq!(
        line,
        serde_json::to_string(&value).unwrap(),
        "one compact line"
    );
    shape(&value)
}

#[track_caller]
fn answer(out: common::Out, code: i32) -> String {
    let out = out.expect(code);
    let text = out.stdout.trim_end();
    assert_eq!(text.lines().count(), 1, "one line: {out:?}");
    line_shape(text)
}

/// The distinct shapes of the lines of an ndjson answer, sorted.
fn lines(out: common::Out) -> Vec<String> {
    let out = out.expect(0);
    let mut shapes: Vec<String> = out.stdout.lines().map(line_shape).collect();
    shapes.sort();
    shapes.dedup();
    shapes
}

fn json(store: &Store, args: &[&str]) -> common::Out {
    store.fence().args(["--format", "json"]).args(args).run()
}

/// One PostgreSQL store whose database is also the target, and a `file://` object target:
/// every kind of event and write, then every answer that shows them.
#[test]
fn answers_keep_their_shape() {
    let store = Store::postgres();
    let schema = store.schema.clone().unwrap();
    let url = store.url.clone();
    common::pg_exec(
        &url,
        &format!(
            "CREATE SCHEMA {schema}; CREATE TABLE {schema}.t (v int); \
             CREATE TABLE {schema}.jobs (id int PRIMARY KEY, state text, last_fencing_token bigint)"
        ),
    );
    let dir = store.home.path().join("objects");
    std::fs::create_dir(&dir).unwrap();
    let object = format!("file://{}/o.txt", dir.display());
    let from = store.home.path().join("payload");
    std::fs::write(&from, "payload").unwrap();
    let from = from.to_str().unwrap().to_owned();
    let insert = format!("INSERT INTO {schema}.t VALUES (1)");
    let jobs = format!("{schema}.jobs");

    let a = store.fence().acquire("r", &["--owner", "a", "--ttl", "1h"]);
    let write_as = |token: i64, args: &[&str]| {
        let token = token.to_string();
        json(
            &store,
            &[&["write", "r", "--token", &token][..], args].concat(),
        )
    };
    let write = |args: &[&str]| write_as(a.token, args);
    let token = a.token.to_string();

    let mut shapes = Vec::new();
    let mut pin = |what: &str, shape: String| shapes.push(format!("{what} {shape}"));
    pin(
        "write",
        answer(write(&["--target", &url, "--sql", &insert]), 0),
    );
    let once = ["--target", &url, "--sql", &insert, "--id", "w1"];
    pin("write --id", answer(write(&once), 0));
    pin("write --id replayed", answer(write(&once), 0));
    let row = [
        "--target", &url, "--table", &jobs, "--key", "id=1", "--set", "state=x",
    ];
    pin(
        "write --table",
        answer(write(&[&row[..], &["--upsert"][..]].concat()), 0),
    );
    pin(
        "write --from",
        answer(write(&["--target", &object, "--from", &from]), 0),
    );
    let once = ["--target", &object, "--from", &from, "--id", "o1"];
    pin("write --from --id", answer(write(&once), 0));
    pin("write --from --id replayed", answer(write(&once), 0));

    // A refused acquire (busy, counted), a takeover after expiry, a stale write and a late
    // renew (refused), a release.
    json(&store, &["acquire", "r", "--owner", "b"]).expect(3);
    json(&store, &["release", "r", "--owner", "a", "--token", &token]).expect(0);
    let b = store
        .fence()
        .acquire("r", &["--owner", "b", "--ttl", "100ms"]);
    common::wait_for("the lease of b to expire", Duration::from_secs(30), || {
        json(&store, &["inspect", "r"]).expect(0).json()["resources"][0]["state"] == "expired"
    });
    let c = store.fence().acquire("r", &["--owner", "c", "--ttl", "1h"]);
    assert!(c.token > b.token);
    write_as(c.token, &["--target", &url, "--sql", &insert]).expect(0);
    write(&["--target", &url, "--sql", &insert]).expect(4);
    let stale = ["renew", "r", "--owner", "a", "--token", &token];
    json(&store, &stale).expect(4);

    pin("inspect", answer(json(&store, &["inspect"]), 0));
    pin("inspect r", answer(json(&store, &["inspect", "r"]), 0));
    pin(
        "inspect --history",
        answer(json(&store, &["inspect", "r", "--history", "50"]), 0),
    );
    pin(
        "inspect --target",
        answer(json(&store, &["inspect", "r", "--target", &url]), 0),
    );
    pin(
        "inspect --target object",
        answer(json(&store, &["inspect", "r", "--target", &object]), 0),
    );
    for (target, id) in [
        (&url, "w1"),
        (&url, "never"),
        (&object, "o1"),
        (&object, "never"),
    ] {
        let out = json(&store, &["inspect", "r", "--target", target, "--id", id]);
        pin(&format!("inspect --id {id}"), answer(out, 0));
    }
    pin("log", answer(json(&store, &["log"]), 0));
    pin(
        "log --target",
        answer(json(&store, &["log", "--target", &url]), 0),
    );
    pin(
        "log --target object",
        answer(json(&store, &["log", "--target", &object]), 0),
    );
    let ndjson = store
        .fence()
        .args(["log", "--target", &url, "--format", "ndjson"])
        .run();
    pin("log ndjson", lines(ndjson).join("\n"));
    let truncated = ["log", "--limit", "1", "--format", "ndjson"];
    pin(
        "log ndjson --limit",
        lines(store.fence().args(truncated).run()).join("\n"),
    );
    pin("metrics", answer(json(&store, &["metrics"]), 0));
    pin(
        "metrics --target",
        answer(json(&store, &["metrics", "--target", &url]), 0),
    );
    pin(
        "run",
        answer(json(&store, &["run", "job", "--", "true"]), 0),
    );
    pin(
        "run exit 3",
        answer(json(&store, &["run", "job", "--", "sh", "-c", "exit 3"]), 3),
    );
    pin(
        "run --id",
        answer(json(&store, &["run", "job", "--id", "d1", "--", "true"]), 0),
    );
    pin(
        "run --id skipped",
        answer(json(&store, &["run", "job", "--id", "d1", "--", "true"]), 0),
    );
    let table = ["inspect", "--target", &url, "--table", &jobs];
    pin("inspect --table", answer(json(&store, &table), 0));
    let protect = [
        "protect",
        "--target",
        &url,
        "--table",
        &jobs,
        "--resource",
        "r",
    ];
    json(&store, &protect).expect(0);
    pin("inspect --table protected", answer(json(&store, &table), 0));
    // The test's role owns the table it protected, so doctor fails the target
    // (`postgres.protection`): the answer's shape is the same as a passing one's.
    pin(
        "doctor",
        answer(
            json(&store, &["doctor", "--target", &url, "--target", &object]),
            2,
        ),
    );

    // An object that accepted a token the store never issued: integrity warnings.
    write_as(999, &["--target", &object, "--from", &from]).expect(0);
    let ahead = ["inspect", "r", "--target", &object];
    pin(
        "inspect --target object ahead",
        answer(json(&store, &ahead), 0),
    );
    let ahead = ["log", "--target", &object];
    pin("log --target object ahead", answer(json(&store, &ahead), 0));
    let ndjson = store.fence().args(ahead).args(["--format", "ndjson"]).run();
    pin("log ndjson ahead", lines(ndjson).join("\n"));
    assert_eq!(shapes.join("\n"), EXPECTED);
}

/// `bench`'s answer: its keys in order (its figures are floats or `null` by how the run went).
#[test]
fn bench_keeps_its_keys_in_order() {
    let store = Store::file();
    let out = json(&store, &["bench", "--duration", "200ms", "--workers", "2"]).expect(0);
    let value = out.json();
    assert_eq!(
        out.stdout.trim_end(),
        serde_json::to_string(&value).unwrap()
    );
    let keys: Vec<&str> = value
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "ok",
            "op",
            "mode",
            "workers",
            "resources",
            "prefilled",
            "duration_ms",
            "critical_sections",
            "critical_sections_per_s",
            "refused",
            "refused_per_s",
            "acquire_p50_ms",
            "acquire_p99_ms",
            "handoff_p50_ms",
            "handoff_p99_ms",
            "renewals",
            "stale_rejections",
            "store"
        ]
    );
}

const EXPECTED: &str = r#"write {ok:bool,op:str,resource:str,token:int,target:str,form:str,write_id:null,replayed:bool,statements:[{rows_affected:int,columns:[],rows:[]}]}
write --id {ok:bool,op:str,resource:str,token:int,target:str,form:str,write_id:str,replayed:bool,statements:[{rows_affected:int,columns:[],rows:[]}]}
write --id replayed {ok:bool,op:str,resource:str,token:int,target:str,form:str,write_id:str,replayed:bool,applied:{at:str,token:int,owner:null},statements:[]}
write --table {ok:bool,op:str,resource:str,token:int,target:str,form:str,table:str,status:str}
write --from {ok:bool,op:str,resource:str,token:int,target:str,form:str,write_id:null,replayed:bool,version:str,previous_version:null,bytes:int}
write --from --id {ok:bool,op:str,resource:str,token:int,target:str,form:str,write_id:str,replayed:bool,version:str,previous_version:str,bytes:int}
write --from --id replayed {ok:bool,op:str,resource:str,token:int,target:str,form:str,write_id:str,replayed:bool,applied:{at:str,token:int,owner:null,version:str},bytes:int}
inspect {ok:bool,op:str,resources:[{resource:str,state:str,owner:str,token:int,acquired_at:str,held_for_ms:int,renewed_at:str,expires_at:str,expires_in_ms:int,events:[],waiters:[]}],store:str}
inspect r {ok:bool,op:str,resources:[{resource:str,state:str,owner:str,token:int,acquired_at:str,held_for_ms:int,renewed_at:str,expires_at:str,expires_in_ms:int,events:[{at:str,kind:str,owner:str,token:int,detail:null}|{at:str,kind:str,owner:str,token:int,detail:str}],waiters:[]}],store:str}
inspect --history {ok:bool,op:str,resources:[{resource:str,state:str,owner:str,token:int,acquired_at:str,held_for_ms:int,renewed_at:str,expires_at:str,expires_in_ms:int,events:[{at:str,kind:str,owner:str,token:int,detail:null}|{at:str,kind:str,owner:str,token:int,detail:str}],waiters:[]}],store:str}
inspect --target {ok:bool,op:str,resources:[{resource:str,state:str,owner:str,token:int,acquired_at:str,held_for_ms:int,renewed_at:str,expires_at:str,expires_in_ms:int,events:[{at:str,kind:str,owner:str,token:int,detail:null}|{at:str,kind:str,owner:str,token:int,detail:str}],waiters:[]}],targets:[{target:str,resource:str,highest_token:int,updated_at:str,updated_by:null,accepted_writes:int,rejected_writes:int}],store:str}
inspect --target object {ok:bool,op:str,resources:[{resource:str,state:str,owner:str,token:int,acquired_at:str,held_for_ms:int,renewed_at:str,expires_at:str,expires_in_ms:int,events:[{at:str,kind:str,owner:str,token:int,detail:null}|{at:str,kind:str,owner:str,token:int,detail:str}],waiters:[]}],targets:[{target:str,resource:str,highest_token:int,version:str,updated_at:str,updated_by:null}],store:str}
inspect --id w1 {ok:bool,op:str,resource:str,target:str,write_id:str,applied:bool,entry:{at:str,token:int,owner:null}}
inspect --id never {ok:bool,op:str,resource:str,target:str,write_id:str,applied:bool,entry:null}
inspect --id o1 {ok:bool,op:str,resource:str,target:str,write_id:str,applied:bool,entry:{at:str,token:int,owner:null,version:str}}
inspect --id never {ok:bool,op:str,resource:str,target:str,write_id:str,applied:bool,entry:null}
log {ok:bool,op:str,events:[{at:str,resource:str,source:str,kind:str,owner:str,token:int,count:int,last_at:str,detail:str}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,detail:null}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,detail:str}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,ttl_ms:int,expires_at:str,derived:bool,detail:str}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,ttl_ms:int,expires_at:str,detail:null}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,ttl_ms:int,expires_at:str,previous_expires_at:str,detail:null}],truncated:bool,integrity_ok:bool,warnings:[],store:str}
log --target {ok:bool,op:str,events:[{at:str,resource:str,source:str,kind:str,owner:null,token:int,target:str,detail:str}|{at:str,resource:str,source:str,kind:str,owner:null,token:int,target:str,rows:int,detail:null}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,count:int,last_at:str,detail:str}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,detail:null}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,detail:str}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,ttl_ms:int,expires_at:str,derived:bool,detail:str}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,ttl_ms:int,expires_at:str,detail:null}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,ttl_ms:int,expires_at:str,previous_expires_at:str,detail:null}],truncated:bool,integrity_ok:bool,warnings:[],store:str}
log --target object {ok:bool,op:str,events:[{at:str,resource:str,source:str,kind:str,owner:null,token:int,target:str,detail:str}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,count:int,last_at:str,detail:str}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,detail:null}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,detail:str}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,ttl_ms:int,expires_at:str,derived:bool,detail:str}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,ttl_ms:int,expires_at:str,detail:null}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,ttl_ms:int,expires_at:str,previous_expires_at:str,detail:null}],truncated:bool,integrity_ok:bool,warnings:[],store:str}
log ndjson {at:str,resource:str,source:str,kind:str,owner:null,token:int,target:str,detail:str}
{at:str,resource:str,source:str,kind:str,owner:null,token:int,target:str,rows:int,detail:null}
{at:str,resource:str,source:str,kind:str,owner:str,token:int,count:int,last_at:str,detail:str}
{at:str,resource:str,source:str,kind:str,owner:str,token:int,detail:null}
{at:str,resource:str,source:str,kind:str,owner:str,token:int,detail:str}
{at:str,resource:str,source:str,kind:str,owner:str,token:int,ttl_ms:int,expires_at:str,derived:bool,detail:str}
{at:str,resource:str,source:str,kind:str,owner:str,token:int,ttl_ms:int,expires_at:str,detail:null}
{at:str,resource:str,source:str,kind:str,owner:str,token:int,ttl_ms:int,expires_at:str,previous_expires_at:str,detail:null}
log ndjson --limit {at:str,resource:str,source:str,kind:str,owner:str,token:int,detail:str}
{kind:str,message:str}
metrics {ok:bool,op:str,metrics:[{name:str,labels:{resource:str,op:str},value:float}|{name:str,labels:{resource:str,owner:str},value:float}|{name:str,labels:{resource:str},value:float}],store:str}
metrics --target {ok:bool,op:str,metrics:[{name:str,labels:{resource:str,op:str},value:float}|{name:str,labels:{resource:str,owner:str},value:float}|{name:str,labels:{resource:str},value:float}|{name:str,labels:{target:str,resource:str},value:float}],store:str}
run {ok:bool,op:str,resource:str,owner:str,token:int,exit_status:int,run_id:str,store:str}
run exit 3 {ok:bool,op:str,resource:str,owner:str,token:int,exit_status:int,run_id:str,store:str}
run --id {ok:bool,op:str,resource:str,owner:str,token:int,exit_status:int,run_id:str,store:str}
run --id skipped {ok:bool,op:str,resource:str,run_id:str,skipped:bool,completed:{at:str,owner:str},store:str}
inspect --table {ok:bool,op:str,target:str,tables:[{table:str,parent:null,kind:str,protected:bool,resource:null,enabled:null}],covers_later_partitions:bool}
inspect --table protected {ok:bool,op:str,target:str,tables:[{table:str,parent:null,kind:str,protected:bool,resource:str,enabled:str}],covers_later_partitions:bool}
doctor {ok:bool,op:str,findings:[{subject:str,check:str,severity:str,message:str,fix:str}],summary:{ok:int,warn:int,fail:int},store:str}
inspect --target object ahead {ok:bool,op:str,resources:[{resource:str,state:str,owner:str,token:int,acquired_at:str,held_for_ms:int,renewed_at:str,expires_at:str,expires_in_ms:int,events:[{at:str,kind:str,owner:str,token:int,detail:null}|{at:str,kind:str,owner:str,token:int,detail:str}],waiters:[]}],integrity_ok:bool,warnings:[{resource:str,kind:str,message:str}],targets:[{target:str,resource:str,highest_token:int,version:str,updated_at:str,updated_by:null}],store:str}
log --target object ahead {ok:bool,op:str,events:[{at:str,resource:str,source:str,kind:str,owner:null,token:int,target:str,detail:str}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,count:int,last_at:str,detail:str}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,detail:null}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,detail:str,run:{run_id:str,exit_status:int,duration_ms:int}}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,detail:str,run:{run_id:str,host:str,pid:int,group:int,program:str,command:str}}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,detail:str,run:{run_id:str,host:str,pid:int,group:int,program:str}}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,detail:str}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,ttl_ms:int,expires_at:str,derived:bool,detail:str}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,ttl_ms:int,expires_at:str,detail:null}|{at:str,resource:str,source:str,kind:str,owner:str,token:int,ttl_ms:int,expires_at:str,previous_expires_at:str,detail:null}],truncated:bool,integrity_ok:bool,warnings:[{resource:str,kind:str,message:str}],store:str}
log ndjson ahead {at:str,resource:str,source:str,kind:str,owner:null,token:int,target:str,detail:str}
{at:str,resource:str,source:str,kind:str,owner:str,token:int,count:int,last_at:str,detail:str}
{at:str,resource:str,source:str,kind:str,owner:str,token:int,detail:null}
{at:str,resource:str,source:str,kind:str,owner:str,token:int,detail:str,run:{run_id:str,exit_status:int,duration_ms:int}}
{at:str,resource:str,source:str,kind:str,owner:str,token:int,detail:str,run:{run_id:str,host:str,pid:int,group:int,program:str,command:str}}
{at:str,resource:str,source:str,kind:str,owner:str,token:int,detail:str,run:{run_id:str,host:str,pid:int,group:int,program:str}}
{at:str,resource:str,source:str,kind:str,owner:str,token:int,detail:str}
{at:str,resource:str,source:str,kind:str,owner:str,token:int,ttl_ms:int,expires_at:str,derived:bool,detail:str}
{at:str,resource:str,source:str,kind:str,owner:str,token:int,ttl_ms:int,expires_at:str,detail:null}
{at:str,resource:str,source:str,kind:str,owner:str,token:int,ttl_ms:int,expires_at:str,previous_expires_at:str,detail:null}
{resource:str,kind:str,message:str,warning:str}"#;
