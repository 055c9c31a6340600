//! `fence doctor` (issue 21) on real set-ups, asserted on its JSON findings: a healthy
//! PostgreSQL, one with an asynchronous streaming standby (a second cluster made with
//! pg_basebackup), a target whose schema the connecting role owns, directory stores, and the
//! directories of `file://` object targets.

use crate::common;

use common::cluster::Cluster;
use common::{Fence, Store};
use serde_json::Value;

fn doctor(fence: Fence) -> (i32, Value) {
    doctor_with(fence, &[])
}

fn doctor_with(fence: Fence, extra: &[&str]) -> (i32, Value) {
    let out = fence.args(["doctor", "--format", "json"]).args(extra).run();
    let json = out.json();
    (out.code, json)
}

/// The findings of `check`, as (severity, message).
fn finding(json: &Value, check: &str) -> Vec<(String, String)> {
    json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == check)
        .map(|f| {
            (
                f["severity"].as_str().unwrap().to_owned(),
                f["message"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn a_healthy_postgresql_has_no_failures() {
    let store = Store::postgres();
    store.fence().args(["init"]).run().expect(0);
    let (code, json) = doctor(store.fence());
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["ok"], true);
    assert_eq!(finding(&json, "postgres.replication")[0].0, "ok", "{json}");
    assert_eq!(finding(&json, "postgres.pooler")[0].0, "ok", "{json}");
    assert_eq!(finding(&json, "postgres.version")[0].0, "ok", "{json}");
    assert_eq!(
        finding(&json, "postgres.public_grants")[0].0,
        "ok",
        "{json}"
    );
}

#[test]
fn an_asynchronous_standby_is_named() {
    let primary = Cluster::start();
    let _standby = primary.standby("standby_b");
    // Wait until the primary sees the standby streaming.
    let mut json = Value::Null;
    let warned = common::process::becomes(std::time::Duration::from_secs(60), || {
        let home = tempfile::tempdir().unwrap();
        json = doctor(Fence::bare(home.path()).args(["--store", &primary.url()])).1;
        finding(&json, "postgres.replication")[0].0 == "warn"
    });
    assert!(warned, "the standby never showed: {json}");
    let replication = finding(&json, "postgres.replication");
    assert!(replication[0].1.contains("standby_b"), "{json}");
    assert!(replication[0].1.contains("asynchronously"), "{json}");
}

#[test]
fn a_target_schema_owned_by_the_connecting_role_is_flagged() {
    let store = Store::postgres();
    let schema = store.schema.clone().unwrap();
    common::pg_exec(
        &store.url,
        &format!("CREATE SCHEMA {schema}; CREATE TABLE {schema}.t (v int)"),
    );
    store
        .fence()
        .args([
            "protect",
            "--target",
            &store.url,
            "--table",
            &format!("{schema}.t"),
        ])
        .args(["--resource", "r"])
        .run()
        .expect(0);
    let (_, json) = doctor_with(store.fence(), &["--target", &store.url]);
    let owner: Vec<_> = json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "postgres.schema_owner" && f["subject"] != "store")
        .collect();
    assert_eq!(owner.len(), 1, "{json}");
    assert_eq!(owner[0]["severity"], "fail", "{json}");
    assert!(
        owner[0]["message"].as_str().unwrap().contains("protect"),
        "{json}"
    );
}

#[test]
fn a_local_directory_store_is_fine_and_an_unwritable_one_fails() {
    let store = Store::file();
    store.fence().args(["acquire", "r"]).run().expect(0);
    let (code, json) = doctor(store.fence());
    assert_eq!(code, 0, "{json}");
    assert_eq!(finding(&json, "directory.filesystem")[0].0, "ok", "{json}");
    // /proc is not a place for a store; as root every directory is writable, so use a
    // pseudo-filesystem's directory that nobody can write into.
    let home = tempfile::tempdir().unwrap();
    let (code, json) = doctor(Fence::bare(home.path()).args(["--store", "file:///proc/1"]));
    assert_eq!(code, 2, "{json}");
    assert_eq!(json["ok"], false);
    assert!(json["summary"]["fail"].as_u64().unwrap() >= 1, "{json}");
    // A file, or a path below one, can never hold a store.
    let file = home.path().join("plain-file");
    std::fs::write(&file, "x").unwrap();
    for path in [file.clone(), file.join("sub")] {
        let (code, json) = doctor(
            Fence::bare(home.path()).args(["--store", &format!("file://{}", path.display())]),
        );
        assert_eq!(code, 2, "{json}");
        assert_eq!(finding(&json, "directory.path")[0].0, "fail", "{json}");
    }
}

/// Issue 33, 7: a directory store every local user may write (sticky bit or not, the store
/// or a directory in it), or one on tmpfs (a reboot empties it, and tokens start again at 1),
/// fails `doctor` (exit 2), naming the finding and the fix; the same store made private on a
/// disk passes.
#[test]
fn a_directory_store_open_to_every_user_or_on_tmpfs_fails() {
    use std::os::unix::fs::PermissionsExt;
    let home = tempfile::tempdir().unwrap();
    let store_at = |dir: &std::path::Path| {
        Fence::bare(home.path()).args(["--store", &format!("file://{}", dir.display())])
    };
    let dir = home.path().join("store");
    store_at(&dir).args(["acquire", "r"]).run().expect(0);
    let sub = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.is_dir())
        .expect("the store has a directory in it");
    let chmod = |path: &std::path::Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    for (path, mode) in [(&dir, 0o1777), (&sub, 0o777)] {
        chmod(path, mode);
        let (code, json) = doctor(store_at(&dir));
        assert_eq!(code, 2, "{json}");
        let found = finding(&json, "directory.permissions");
        assert_eq!(found.len(), 1, "{json}");
        assert_eq!(found[0].0, "fail", "{json}");
        assert!(
            found[0].1.contains("any local user may write")
                && found[0].1.contains(&path.display().to_string()),
            "{json}"
        );
        chmod(path, 0o755);
    }
    let (code, json) = doctor(store_at(&dir));
    assert_eq!(code, 0, "{json}");
    assert_eq!(finding(&json, "directory.permissions")[0].0, "ok", "{json}");

    // tmpfs: one of the test's own (root may mount; skipped otherwise).
    let tmpfs = home.path().join("tmpfs");
    std::fs::create_dir(&tmpfs).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=8m", "fence-test"])
        .arg(&tmpfs)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped the tmpfs half: cannot mount a tmpfs here (needs root)");
        return;
    }
    let (code, json) = doctor(store_at(&tmpfs.join("store")));
    let _ = std::process::Command::new("umount").arg(&tmpfs).status();
    assert_eq!(code, 2, "{json}");
    let found = finding(&json, "directory.durability");
    assert_eq!(found.len(), 1, "{json}");
    assert_eq!(found[0].0, "fail", "{json}");
    assert!(
        found[0].1.contains("tmpfs") && found[0].1.contains("start again at 1"),
        "{json}"
    );
}

/// A `file://` object target is judged by its directory, never as an object store: a private
/// directory is fine, one every user may write into is a warning with the sticky bit (others
/// can plant files, not replace ours) and a failure without it, a missing one fails.
#[test]
fn a_file_target_s_directory_is_checked() {
    use std::os::unix::fs::PermissionsExt;
    let store = Store::file();
    let dirs: Vec<_> = [0o700, 0o1777, 0o777]
        .into_iter()
        .map(|mode| {
            let dir = tempfile::tempdir().unwrap();
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(mode)).unwrap();
            dir
        })
        .collect();
    let mut targets: Vec<String> = dirs
        .iter()
        .map(|d| format!("file://{}/obj", d.path().display()))
        .collect();
    targets.push(format!("file://{}/missing/obj", dirs[0].path().display()));
    let args: Vec<&str> = targets.iter().flat_map(|t| ["--target", t]).collect();
    let (code, json) = doctor_with(store.fence(), &args);
    assert_eq!(code, 2, "{json}");
    let of = |target: &str, check: &str| -> Vec<String> {
        json["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["subject"] == target && f["check"] == check)
            .map(|f| f["severity"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(of(&targets[0], "directory.permissions"), ["ok"], "{json}");
    assert_eq!(of(&targets[0], "directory.filesystem"), ["ok"], "{json}");
    assert_eq!(of(&targets[1], "directory.permissions"), ["warn"], "{json}");
    assert_eq!(of(&targets[2], "directory.permissions"), ["fail"], "{json}");
    assert_eq!(of(&targets[3], "directory.exists"), ["fail"], "{json}");
    assert!(
        json["findings"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["check"] != "object.endpoint"),
        "{json}"
    );
}

#[test]
fn a_pooler_in_between_is_named() {
    let store = Store::postgres();
    let pooled = common::env_or_panic("FENCE_TEST_PGBOUNCER_URL");
    let home = tempfile::tempdir().unwrap();
    let (code, json) = doctor(Fence::bare(home.path()).args([
        "--store",
        &pooled,
        "--schema",
        store.schema.as_deref().unwrap(),
    ]));
    assert_eq!(code, 0, "{json}");
    let pooler = finding(&json, "postgres.pooler");
    assert_eq!(pooler[0].0, "warn", "{json}");
    assert!(pooler[0].1.contains("LISTEN"), "{json}");
}

/// An S3 server that ignores preconditions (moto behind a proxy that strips them) fails;
/// the same server without the proxy passes.
#[test]
fn an_object_store_that_ignores_preconditions_fails() {
    use std::sync::Arc;

    use common::proxy::{HttpProxy, Verdict};

    let store = Store::new(common::Backend::S3);
    let upstream = store.server().0.addr();
    let stripping = HttpProxy::start(
        upstream,
        Arc::new(|request| {
            request.remove_header("if-match");
            request.remove_header("if-none-match");
            Verdict::Forward
        }),
    );
    let (code, json) = doctor(store.fence().env("AWS_ENDPOINT_URL", stripping.endpoint()));
    assert_eq!(code, 2, "{json}");
    let check = finding(&json, "object.preconditions");
    assert_eq!(check[0].0, "fail", "{json}");
    assert!(check[0].1.contains("does not enforce"), "{json}");
    let (code, json) = doctor(store.fence());
    assert_eq!(code, 0, "{json}");
    assert_eq!(finding(&json, "object.preconditions")[0].0, "ok", "{json}");
}

/// Connection sizing (issue 25): a role whose CONNECTION LIMIT is below what one busy
/// resource can use is named in a warning with the limit to set; a role with room for a
/// couple of busy resources, below the server's slots, gets no warning.
#[test]
fn connection_limits_are_sized() {
    let check = |limit: u32| {
        let (role, url) = common::pg_limited_role(limit);
        let home = tempfile::tempdir().unwrap();
        let (code, json) = doctor(Fence::bare(home.path()).args(["--store", &url]));
        assert_eq!(code, 0, "{json}");
        (role, finding(&json, "postgres.connections"), json)
    };
    let (role, found, json) = check(4);
    assert_eq!(found.len(), 1, "{json}");
    assert_eq!(found[0].0, "warn", "{json}");
    assert!(
        found[0]
            .1
            .contains(&format!("role `{role}` has CONNECTION LIMIT 4")),
        "{json}"
    );
    let fix = json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "postgres.connections")
        .unwrap()["fix"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        fix.contains(&format!("ALTER ROLE {role} CONNECTION LIMIT 10")),
        "{fix}"
    );

    let (role, found, json) = check(20);
    assert_eq!(found.len(), 1, "{json}");
    assert_eq!(found[0].0, "ok", "{json}");
    assert!(
        found[0].1.contains(&format!(
            "role `{role}` may open 20 of the server's 197 slots"
        )),
        "{json}"
    );
    assert!(found[0].1.contains("enough for 2 busy resources"), "{json}");

    // A store that lets 24 waiters of a resource keep their connection (`fence init
    // --held-waiters 24`) needs 26 per busy resource: the same limit of 20 is now too low.
    let (role, url) = common::pg_limited_role(20);
    let mut store = Store::postgres();
    // The role owns the schema, so that the store's clean-up (as `url`) can drop it.
    store.url = url;
    store
        .fence()
        .args(["init", "--held-waiters", "24", "-q"])
        .run()
        .expect(0);
    let (code, json) = doctor(store.fence());
    assert_eq!(code, 0, "{json}");
    let found = finding(&json, "postgres.connections");
    assert_eq!(found[0].0, "warn", "{json}");
    assert!(
        found[0].1.contains(&format!(
            "role `{role}` has CONNECTION LIMIT 20, below the 26 connections one busy resource can use"
        )) && found[0].1.contains("up to 24 waiters"),
        "{json}"
    );
    // A setting no limit below the server's slots can fit, and one written by hand that
    // waiters cannot use: each named, with the setting to give.
    let schema = store.schema.clone().unwrap();
    common::pg_exec(
        &common::pg_superuser(),
        &format!("UPDATE {schema}.meta SET value = '1000' WHERE key = 'held_waiters'"),
    );
    let (_, json) = doctor(store.fence());
    let text = json.to_string();
    assert!(
        text.contains("one busy resource can use 1002 connections")
            && text.contains("fence init --held-waiters 96"),
        "{json}"
    );
    assert!(!text.contains("CONNECTION LIMIT 1002"), "{json}");
    common::pg_exec(
        &common::pg_superuser(),
        &format!("UPDATE {schema}.meta SET value = 'lots' WHERE key = 'held_waiters'"),
    );
    let (_, json) = doctor(store.fence());
    assert!(
        json.to_string()
            .contains("held_waiters is `lots`, not a number from 2 to 1000: waiters use 8"),
        "{json}"
    );

    // The test server's own role has no limit: it could take every slot.
    let store = Store::postgres();
    let (_, json) = doctor(store.fence());
    let found = finding(&json, "postgres.connections");
    assert_eq!(found[0].0, "warn", "{json}");
    assert!(found[0].1.contains("has no CONNECTION LIMIT"), "{json}");
}

/// The login role decides whether `protect` holds, not the role it switches to: a login role
/// that is a member of the schema's owner but whose default role (`ALTER ROLE … SET role`) is
/// an unprivileged one still logs in as itself and can `RESET ROLE` to write `bindings`.
#[test]
fn a_login_role_that_switches_to_another_is_judged_by_itself() {
    let store = Store::postgres();
    let schema = store.schema.clone().unwrap();
    let pid = std::process::id();
    let (owner, login, mask) = (
        format!("doc_own_{pid}"),
        format!("doc_login_{pid}"),
        format!("doc_mask_{pid}"),
    );
    let db = std::env::var("FENCE_TEST_PG_DB").unwrap();
    common::pg_exec(
        &common::pg_superuser(),
        &format!(
            "CREATE ROLE {owner} NOLOGIN; CREATE ROLE {mask} NOLOGIN;
             CREATE ROLE {login} LOGIN IN ROLE {owner}, {mask};
             GRANT CONNECT ON DATABASE {db} TO {login};
             ALTER ROLE {login} SET role = '{mask}';
             CREATE SCHEMA {schema} AUTHORIZATION {owner};"
        ),
    );
    let url = common::pg_socket_url(&login);
    let whoami: String =
        common::pg_query(&url, "SELECT session_user || ' ' || current_user")[0].get(0);
    assert_eq!(
        whoami,
        format!("{login} {mask}"),
        "the set-up must switch roles"
    );
    let home = tempfile::tempdir().unwrap();
    let (_, json) = doctor_with(
        Fence::bare(home.path()).args(["--store", &store.url, "--schema", &schema]),
        &["--target", &url],
    );
    let owner_findings: Vec<_> = json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "postgres.schema_owner" && f["subject"] != "store")
        .collect();
    assert_eq!(owner_findings.len(), 1, "{json}");
    assert_eq!(owner_findings[0]["severity"], "fail", "{json}");
    assert!(
        owner_findings[0]["message"]
            .as_str()
            .unwrap()
            .contains(&login),
        "{json}"
    );
    common::pg_exec(
        &common::pg_superuser(),
        &format!(
            "DROP SCHEMA {schema} CASCADE; REASSIGN OWNED BY {login}, {mask}, {owner} TO CURRENT_USER;
             DROP OWNED BY {login}, {mask}, {owner}; DROP ROLE {login}; DROP ROLE {mask}; DROP ROLE {owner};"
        ),
    );
}

/// `fence doctor` says what `fence run` contains on this host (issue 31): every descendant,
/// with the limits named, where subreapers, /proc and CLOCK_BOOTTIME all work; a failure
/// where /proc cannot be read (the supervisor and the descendant scan need it), shown in a
/// mount namespace with /proc hidden when the test may make one (as root).
#[test]
fn the_host_s_run_containment_is_reported() {
    let home = tempfile::tempdir().unwrap();
    let (code, json) = doctor(Fence::bare(home.path()));
    assert_eq!(code, 0, "{json}");
    let found = finding(&json, "host.run_containment");
    assert_eq!(found.len(), 1, "{json}");
    let (severity, message) = &found[0];
    assert_eq!(severity, "ok", "{json}");
    for said in ["every descendant", "setsid", "systemd-run", "stops both"] {
        assert!(message.contains(said), "{said}: {message}");
    }
    let fence = env!("CARGO_BIN_EXE_fence");
    let hidden = std::process::Command::new("unshare")
        .args(["--mount", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs none /proc && exec '{fence}' doctor --format json"
        ))
        .env_clear()
        .env("HOME", home.path())
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    if !hidden.status.success() && hidden.stdout.is_empty() {
        eprintln!(
            "no mount namespace here (not root?): the /proc case is not run: {}",
            String::from_utf8_lossy(&hidden.stderr)
        );
        return;
    }
    let json: Value = serde_json::from_slice(&hidden.stdout).unwrap();
    assert_eq!(hidden.status.code(), Some(2), "{json}");
    let found = finding(&json, "host.run_containment");
    assert_eq!(found[0].0, "fail", "{json}");
    assert!(found[0].1.contains("/proc"), "{json}");
}

/// The expiry clock of an object store is the time its answers carry (issue 32, 4): on S3
/// the `Date` header, which a front proxy may write from its own clock. `doctor` compares the
/// time of a write's answer with the object's own timestamp read back: a proxy 25 s ahead
/// fails `object.clock`, naming the offset; the store itself is ok, on S3 and on GCS.
#[test]
fn a_date_header_from_another_clock_is_found() {
    use std::sync::Arc;

    use common::proxy::{HttpProxy, Verdict};

    for backend in [
        common::Backend::S3,
        common::Backend::LocalStack,
        common::Backend::Gcs,
    ] {
        let store = Store::new(backend);
        let (code, json) = doctor(store.fence());
        assert_eq!(code, 0, "{json}");
        assert_eq!(finding(&json, "object.clock")[0].0, "ok", "{json}");
    }
    // moto and LocalStack: S3 answers a put with no time but its `Date`.
    for backend in [common::Backend::S3, common::Backend::LocalStack] {
        let store = Store::new(backend);
        let upstream = store.server().0.addr();
        let ahead = HttpProxy::start(
            upstream,
            Arc::new(|_| Verdict::ForwardSettingAnswerHeader {
                name: "Date".into(),
                value: common::proxy::http_date(
                    std::time::SystemTime::now() + std::time::Duration::from_secs(25),
                ),
            }),
        );
        let (code, json) = doctor(store.fence().env("AWS_ENDPOINT_URL", ahead.endpoint()));
        assert_eq!(code, 2, "{backend:?}: {json}");
        let clock = finding(&json, "object.clock");
        assert_eq!(clock[0].0, "fail", "{backend:?}: {json}");
        assert!(
            clock[0].1.contains("ahead of") && clock[0].1.contains("Date"),
            "{backend:?}: {json}"
        );
    }
}

/// The high-water objects (`tokens/<resource>`) catch an older copy of a lease object written
/// back, but fence keeps them best effort (a raise that fails only warns), so `doctor` checks
/// them: every state a resource's object can be in against its lease record, named resource
/// by resource, on S3 and GCS; and a store whose credentials may not write under `tokens/`
/// (a proxy refusing those writes with 403, as a bucket policy written before `tokens/`
/// existed would) fails `object.high_water_writes`, while grants through it still work and
/// warn, as the finding says.
#[test]
fn the_high_water_objects_are_checked() {
    use std::sync::Arc;

    use common::objects;
    use common::proxy::{HttpProxy, Verdict};

    for backend in [common::Backend::S3, common::Backend::Gcs] {
        let store = Store::new(backend);
        let (server, prefix) = store.server();
        let tokens = |r: &str| format!("{prefix}/tokens/{}", objects::encode_key(r));
        let lease = |r: &str| format!("{prefix}/leases/{}", objects::encode_key(r));
        let grant = |r: &str, owner: &str| {
            store
                .fence()
                .args(["acquire", r, "--owner", owner, "--ttl", "10m", "-q"])
                .run()
                .expect(0);
        };
        let release = |r: &str, owner: &str| {
            store
                .fence()
                .args(["release", r, "--owner", owner, "--token", "1", "-q"])
                .run()
                .expect(0);
        };
        for r in ["fine", "behind", "restored", "missing", "damaged"] {
            grant(r, "a");
        }
        let (code, json) = doctor(store.fence());
        assert_eq!(code, 0, "{backend:?}: {json}");
        let high = finding(&json, "object.high_water");
        assert_eq!(high.len(), 1, "{backend:?}: {json}");
        assert_eq!(high[0].0, "ok", "{backend:?}: {json}");
        assert!(high[0].1.starts_with("5 resources"), "{backend:?}: {json}");
        assert_eq!(
            finding(&json, "object.high_water_writes")[0].0,
            "ok",
            "{backend:?}: {json}"
        );
        // The probe leaves nothing behind.
        assert_eq!(
            server.list(&format!("{prefix}/tokens")).len(),
            5,
            "{backend:?}"
        );

        // behind: token 2 granted, its high-water object written back to 1.
        release("behind", "a");
        grant("behind", "b");
        server.put(&tokens("behind"), b"1\n");
        // restored: token 1's record written back after token 2 was issued.
        let old = server.get(&lease("restored")).unwrap();
        release("restored", "a");
        grant("restored", "b");
        server.put(&lease("restored"), &old.body);
        server.delete(&tokens("missing"));
        server.put(&tokens("damaged"), b"garbage");
        let (code, json) = doctor(store.fence());
        assert_eq!(code, 0, "warnings only: {backend:?}: {json}");
        let high = finding(&json, "object.high_water");
        let says = |needle: &str| {
            high.iter()
                .filter(|(severity, message)| severity == "warn" && message.contains(needle))
                .count()
        };
        assert_eq!(high.len(), 4, "{backend:?}: {json}");
        assert_eq!(
            says("of `behind` says 1, below its lease record's token 2"),
            1,
            "{backend:?}: {json}"
        );
        assert_eq!(
            says("of `restored` holds token 1, below its high-water object's 2"),
            1,
            "{backend:?}: {json}"
        );
        assert_eq!(
            says("1 of 5 resources have no high-water object (`missing`)"),
            1,
            "{backend:?}: {json}"
        );
        assert_eq!(says("`damaged` hold no token"), 1, "{backend:?}: {json}");
        // doctor changed none of it.
        assert!(server.get(&tokens("missing")).is_none(), "{backend:?}");
        assert_eq!(
            server.get(&tokens("behind")).unwrap().body,
            b"1\n",
            "{backend:?}"
        );
    }

    // Writes under tokens/ refused (S3 names the key in the path, GCS's upload in `name=`).
    let store = Store::new(common::Backend::S3);
    let upstream = store.server().0.addr();
    let refusing = HttpProxy::start(
        upstream,
        Arc::new(|request| {
            if request.method == "PUT" && request.target.contains("/tokens/") {
                Verdict::Answer {
                    status: 403,
                    body:
                        "<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
                            .into(),
                }
            } else {
                Verdict::Forward
            }
        }),
    );
    let through = || store.fence().env("AWS_ENDPOINT_URL", refusing.endpoint());
    let out = through()
        .args(["acquire", "r", "--owner", "a", "--format", "json"])
        .run()
        .expect(0);
    assert!(
        out.json()["notices"]
            .to_string()
            .contains("high-water object could not be raised"),
        "{out:?}"
    );
    let (code, json) = doctor(through());
    assert_eq!(code, 2, "{json}");
    let writes = finding(&json, "object.high_water_writes");
    assert_eq!(writes[0].0, "fail", "{json}");
    assert!(
        writes[0].1.contains("cannot keep its high-water objects"),
        "{json}"
    );
    let high = finding(&json, "object.high_water");
    assert!(
        high.iter()
            .any(|(s, m)| s == "warn"
                && m.contains("1 of 1 resources have no high-water object (`r`)")),
        "{json}"
    );
}
