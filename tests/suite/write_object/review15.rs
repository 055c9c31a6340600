//! Review 15 (adversarial review of object writes): each test states a behaviour the
//! contract (docs/DESIGN.md §6, §10, §12; docs/object-stores.md) promises and that the
//! reviewed code did not keep. Every test asserts on what is durably stored, read back from
//! the server or the directory without fence, and on the exit status.

use crate::common;

use common::objects::{read_local, Service};
use common::{Backend, Out, Store};

/// `fence write RESOURCE --token TOKEN --target TARGET --from <file holding body>` on
/// `store`'s coordinator (`fence` given as `fence_at(store_url)`), JSON answer.
fn write_through(
    store: &Store,
    store_url: &str,
    resource: &str,
    token: i64,
    target: &str,
    body: &[u8],
) -> Out {
    let file = store
        .home
        .path()
        .join(format!("body-{token}-{}", body.len()));
    std::fs::write(&file, body).unwrap();
    store
        .fence_at(store_url)
        .args(["write", resource, "--token", &token.to_string()])
        .args(["--target", target, "--from"])
        .args([&file])
        .args(["--format", "json"])
        .run()
}

fn write(store: &Store, resource: &str, token: i64, target: &str, body: &[u8]) -> Out {
    write_through(store, &store.url, resource, token, target, body)
}

// ---------------------------------------------------------------------------------------------
// 1. An S3 write whose coordinator cannot be asked is not silently unchecked.
// ---------------------------------------------------------------------------------------------

/// docs/object-stores.md, "The S3 ETag ABA window": fence asks the store that issued the token
/// for the highest one right before an S3 put, and "without a reachable store, fence warns
/// that it could not check". It warns only when the store was opened and then failed to
/// answer; a store that cannot be opened at all (a PostgreSQL server that is down, a
/// directory store that is not there) leaves the write unchecked with exit 0 and no word,
/// so a paused writer meeting a newer token's identical bytes lands its stale write
/// silently. The write may go ahead (documented), but it must say it was not confirmed.
#[test]
fn s3_a_write_whose_store_cannot_be_reached_warns_that_its_token_was_not_confirmed() {
    let store = Store::new(Backend::S3);
    let token = common::acquire(&store, "res", "A");
    let (server, prefix) = store.server();
    let key = format!("{prefix}/objects/unconfirmed");
    let target = server.url(&key);
    let unreachable = [
        // A PostgreSQL coordinator that is down (nothing listens on port 1).
        "postgres://fence@127.0.0.1:1/fence".to_owned(),
        // A directory store that is not there (a typo in FENCE_STORE).
        format!("file://{}/no-such-store", store.home.path().display()),
    ];
    for (n, url) in unreachable.iter().enumerate() {
        let body = format!("write {n}");
        let out = write_through(&store, url, "res", token, &target, body.as_bytes());
        assert_eq!(out.code, 0, "{out:?}");
        let stored = server.get(&key).expect("the object");
        assert_eq!(stored.body, body.as_bytes());
        let notices = out.json()["notices"].to_string();
        assert!(
            notices.contains("could not confirm"),
            "the write to S3 went ahead without the store's highest token and said nothing (store `{url}`): {out:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 2. An S3 write with a token the reachable store never issued.
// ---------------------------------------------------------------------------------------------

/// DESIGN §10 "Trust nothing unverified: … a target refuses tokens never issued where it can
/// see the coordinator." An S3 write asks the coordinator for the resource's highest token
/// right before its put, and then uses the answer only against a *newer* token: a token above
/// every one issued (a typo, `--token 1001` for `1`) is written, the object then refuses the
/// lease's real holder (exit 4) until someone runs `acquire --above`. The answer the write
/// already has says the token was never issued: exit 6 `never_issued`, nothing written, as
/// on a PostgreSQL target that holds its coordinator.
#[test]
fn s3_a_token_the_reachable_store_never_issued_is_refused_not_written() {
    let store = Store::new(Backend::S3);
    let token = common::acquire(&store, "res", "A");
    let (server, prefix) = store.server();
    let key = format!("{prefix}/objects/minted");
    let target = server.url(&key);
    write(&store, "res", token, &target, b"by the holder").expect(0);

    let out = write(&store, "res", token + 1000, &target, b"by a typo");
    let stored = server.get(&key).expect("the object");
    assert_eq!(
        (stored.body.as_slice(), stored.token()),
        (&b"by the holder"[..], Some(token)),
        "a token the store never issued was written: {out:?}"
    );
    assert_eq!(out.code, 6, "{out:?}");
    assert!(out.stdout.contains("never_issued"), "{out:?}");
    // The holder still writes.
    write(&store, "res", token, &target, b"by the holder again").expect(0);
}

/// The same when the store that answers has never leased the resource at all (the store
/// named is not the one that issued the token): no token of it was ever issued there.
#[test]
fn s3_a_token_for_a_resource_the_reachable_store_never_leased_is_refused() {
    let store = Store::new(Backend::S3);
    let token = common::acquire(&store, "res", "A");
    let other = Store::new(Backend::S3);
    common::acquire(&other, "elsewhere", "A");
    let (server, prefix) = store.server();
    let key = format!("{prefix}/objects/other-store");
    let target = server.url(&key);
    let out = write_through(&store, &other.url, "res", token, &target, b"unchecked");
    assert_eq!(out.code, 6, "{out:?}");
    assert!(out.stdout.contains("never_issued"), "{out:?}");
    assert!(server.get(&key).is_none(), "written: {out:?}");
    write(&store, "res", token, &target, b"by the holder").expect(0);
}

// ---------------------------------------------------------------------------------------------
// 3. A stored token fence cannot read is not "no token".
// ---------------------------------------------------------------------------------------------

/// An object whose `fence-token` does not parse as a token (here one above i64, the kind of
/// value a forged or foreign writer leaves) is read as token 0, "unfenced", and any token —
/// the oldest one — replaces it with exit 0. Fail closed (DESIGN §10): fence's own damaged
/// state (a `file://` sidecar that is not JSON, a damaged lease record) is refused, not
/// taken for empty; an unreadable token must be too (an error, nothing written), never a
/// silent overwrite.
fn a_stored_token_that_does_not_parse_is_not_taken_for_no_token(service: Service) {
    let backend = match service {
        Service::S3 => Backend::S3,
        Service::Gcs => Backend::Gcs,
    };
    let store = Store::new(backend);
    let token = common::acquire(&store, "res", "A");
    let (server, prefix) = store.server();
    let key = format!("{prefix}/objects/unreadable");
    let huge = "9223372036854775808";
    server.put_with_metadata(
        &key,
        b"guarded",
        &[("fence-token", huge), ("fence-resource", "res")],
    );
    let out = write(&store, "res", token, &server.url(&key), b"stale");
    let stored = server.get(&key).expect("the object");
    assert_eq!(
        stored.body, b"guarded",
        "an object whose token fence could not read was overwritten by token {token}: {out:?}"
    );
    assert_eq!(
        stored.metadata.get("fence-token").map(String::as_str),
        Some(huge)
    );
    assert_ne!(out.code, 0, "{out:?}");
}

#[test]
fn s3_a_stored_token_that_does_not_parse_is_not_taken_for_no_token() {
    a_stored_token_that_does_not_parse_is_not_taken_for_no_token(Service::S3);
}

#[test]
fn gcs_a_stored_token_that_does_not_parse_is_not_taken_for_no_token() {
    a_stored_token_that_does_not_parse_is_not_taken_for_no_token(Service::Gcs);
}

/// The same on a `file://` object: its sidecar is valid JSON, its token is not a token.
#[test]
fn file_a_stored_token_that_does_not_parse_is_not_taken_for_no_token() {
    let store = Store::file();
    let token = common::acquire(&store, "res", "A");
    let dir = tempfile::tempdir().unwrap();
    let huge = "9223372036854775808";
    std::fs::write(dir.path().join("obj"), b"guarded").unwrap();
    std::fs::write(
        dir.path().join(".obj.fence.json"),
        format!(
            r#"{{"generation":3,"last_modified_ms":1,"metadata":{{"fence-token":"{huge}","fence-resource":"res"}}}}"#
        ),
    )
    .unwrap();
    let target = format!("file://{}/obj", dir.path().display());
    let out = write(&store, "res", token, &target, b"stale");
    let stored = read_local(&dir.path().join("obj")).expect("the object");
    assert_eq!(
        stored.body, b"guarded",
        "a file whose token fence could not read was overwritten by token {token}: {out:?}"
    );
    assert_eq!(
        stored.metadata.get("fence-token").map(String::as_str),
        Some(huge)
    );
    assert_ne!(out.code, 0, "{out:?}");
}

// ---------------------------------------------------------------------------------------------
// 4. Two names of one file.
// ---------------------------------------------------------------------------------------------

/// A `file://` object reached through a symbolic link (`current -> data`, the usual way of
/// publishing a file): the newer holder B writes `data`, the stale holder A (its lease
/// expired, a newer token granted) writes through `current`. fence keeps the token in a
/// sidecar named after the *link* (`.current.fence.json`), finds none, and renames A's bytes
/// over the link: exit 0, and every reader of `current` now reads the stale bytes instead of
/// B's — a stale write that landed where readers look (I2). Either the link is resolved (then
/// A meets B's token: exit 4) or a symlinked object is refused (exit 2); never replaced.
#[test]
fn a_stale_write_through_a_symlink_to_a_fenced_file_does_not_land() {
    let store = Store::file();
    let a = common::acquire_for(&store, "res", "A", "1s");
    store.wait_expired("res");
    let b = common::acquire(&store, "res", "B");
    assert!(b > a);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("data"), b"first").unwrap();
    std::os::unix::fs::symlink("data", dir.path().join("current")).unwrap();
    let data = format!("file://{}/data", dir.path().display());
    let current = format!("file://{}/current", dir.path().display());
    write(&store, "res", b, &data, b"by B").expect(0);

    let out = write(&store, "res", a, &current, b"by stale A");
    let link = dir.path().join("current");
    let still_a_link = std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink();
    assert_eq!(
        std::fs::read(&link).unwrap(),
        b"by B",
        "readers of `current` read the stale holder's bytes (still a link: {still_a_link}): {out:?}"
    );
    assert!(still_a_link, "the link was replaced: {out:?}");
    assert_ne!(out.code, 0, "{out:?}");
    assert_eq!(
        read_local(&dir.path().join("data")).unwrap().token(),
        Some(b)
    );
}

// ---------------------------------------------------------------------------------------------
// 5. The object written is the object named.
// ---------------------------------------------------------------------------------------------

/// docs/object-stores.md, "Names": "`s3://` and `gs://` keys are taken literally (`%41` is
/// three characters of the key)". On S3 the key goes through object_store's `Path`, which
/// percent-encodes `%` and every byte outside ASCII: `objects/a%41` is stored as
/// `objects/a%2541`, `objects/données` as `objects/donn%C3%A9es`. fence answers exit 0
/// naming the target, but the object at that key is untouched (another tool's reader or
/// writer of it is not fenced), and `inspect --target` looks at the other key too.
/// Runs on moto and LocalStack.
fn keys_are_stored_as_written(backend: Backend) {
    let store = Store::new(backend);
    let token = common::acquire(&store, "res", "A");
    let (server, prefix) = store.server();
    for name in ["a%41", "donn\u{e9}es"] {
        let key = format!("{prefix}/objects/{name}");
        let out = write(&store, "res", token, &server.url(&key), name.as_bytes());
        assert_eq!(out.code, 0, "{out:?}");
        let stored = server.get(&key);
        assert!(
            stored
                .as_ref()
                .is_some_and(|s| s.body == name.as_bytes() && s.token() == Some(token)),
            "`{key}` does not hold the write fence reported (the bucket holds {:?}): {out:?}",
            server.list(&format!("{prefix}/objects"))
        );
    }
}

/// An object an earlier fence stored under the escaped spelling of its key (`a%41` as
/// `a%2541`) is not started over at the key as named, where its token would not guard the
/// new object: the write is refused (exit 2) and names both keys; nothing is written.
#[test]
fn s3_an_object_an_earlier_fence_stored_escaped_is_not_started_over() {
    let store = Store::new(Backend::S3);
    let token = common::acquire(&store, "res", "A");
    let (server, prefix) = store.server();
    let escaped = format!("{prefix}/objects/b%2541");
    server.put_with_metadata(
        &escaped,
        b"guarded",
        &[("fence-token", "7"), ("fence-resource", "res")],
    );
    let key = format!("{prefix}/objects/b%41");
    let out = write(&store, "res", token, &server.url(&key), b"started over");
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stdout.contains("b%2541"), "{out:?}");
    assert!(server.get(&key).is_none(), "written: {out:?}");
    assert_eq!(
        server.get(&escaped).expect("the old object").body,
        b"guarded"
    );
}

#[test]
fn s3_keys_are_stored_as_written() {
    keys_are_stored_as_written(Backend::S3);
}

/// The same on LocalStack: the encoding is fence's client's, not moto's. (GCS, fence's own
/// client, stores both keys as written.)
#[test]
fn localstack_keys_are_stored_as_written() {
    keys_are_stored_as_written(Backend::LocalStack);
}
