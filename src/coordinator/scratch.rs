//! Scratch namespaces for `fence bench`: a throwaway schema, directory or prefix on the
//! store under test (and the same schema in a PostgreSQL write target), filled and removed
//! as a whole.

use crate::config::{StoreKind, StoreSpec};
use crate::error::Error;
use crate::url::Service;

/// A scratch namespace on the same store, for `fence bench`: schema `fence_bench_<pid>_<hex>`
/// on PostgreSQL, directory or prefix `bench-<pid>-<hex>` elsewhere. The random part keeps two
/// benches with one pid (pid 1 in two containers) out of each other's namespace, and a
/// namespace a killed bench left behind from being reused. Returns the spec and schema; fails
/// when a directory store may not be created (its parent is missing).
pub fn scratch(spec: &StoreSpec) -> Result<(StoreSpec, String), Error> {
    let pid = format!(
        "{}_{:08x}",
        std::process::id(),
        crate::sys::random_u64() as u32
    );
    let schema = format!("fence_bench_{pid}");
    let pid = pid.replace('_', "-");
    let spec = match &spec.kind {
        StoreKind::File(dir) => {
            // The store itself, as an acquire would create it (see `file::refused_parent`:
            // below an existing directory, or the embedded default with its parents), so that
            // the scratch directory inside it may be created; refused as an acquire would be,
            // naming the store given rather than the scratch directory.
            crate::coordinator::file::check_parent(dir)?;
            let _ = std::fs::create_dir_all(dir);
            let dir = dir.join(format!("bench-{pid}"));
            StoreSpec {
                url: format!("file://{}", dir.display()),
                display: format!("file://{}", dir.display()),
                kind: StoreKind::File(dir),
            }
        }
        StoreKind::Postgres(_) => spec.clone(),
        StoreKind::Object(url) => {
            let url = crate::url::ObjectUrl {
                key: url.join(&format!("bench-{pid}")),
                ..url.clone()
            };
            let service = match url.service {
                Service::Gcs => "gs",
                Service::S3 | Service::File => "s3",
            };
            let display = format!("{service}://{}/{}", url.bucket, url.key);
            StoreSpec {
                url: display.clone(),
                display: display.clone(),
                kind: StoreKind::Object(crate::url::ObjectUrl { display, ..url }),
            }
        }
    };
    Ok((spec, schema))
}

/// Creates resources `bench-0` … `bench-<count - 1>` as free leases (token 1) in a
/// [`scratch`] namespace, for `fence bench --prefill`. PostgreSQL only: there a lookup is an
/// index probe whose cost grows with the table; the local directory and object stores keep
/// one file or object per resource, found by name.
pub async fn prefill(spec: &StoreSpec, schema: &str, count: u32) -> Result<(), Error> {
    let StoreKind::Postgres(url) = &spec.kind else {
        return Err(Error::usage(
            format!("--prefill needs a PostgreSQL store, not `{}`", spec.display),
            "drop --prefill: on the local directory and object stores a lease is a file or object found by its name, however many there are",
        ));
    };
    let sql = format!(
        "INSERT INTO {schema}.leases (resource, token, ttl_ms, last_event) \
         SELECT 'bench-' || g, 1, 1000, 'released' FROM generate_series(0, {count} - 1) AS g \
         ON CONFLICT (resource) DO NOTHING; \
         ANALYZE {schema}.leases"
    );
    let (client, _notifications) = crate::pg::ConnectParams::resolve(url, &spec.display)?
        .connect()
        .await?;
    client.batch_execute(&sql).await.map_err(|err| {
        crate::pg::request_error(
            &err,
            &spec.display,
            "prefill the bench's scratch schema",
            true,
        )
    })
}

/// Removes a namespace made by [`scratch`] (and the same schema in an optional PostgreSQL
/// write target, given as its URL and display form). Lease records are never deleted one by one; the whole namespace goes.
pub async fn remove(
    spec: &StoreSpec,
    schema: &str,
    target_database: Option<(&str, &str)>,
) -> Result<(), Error> {
    let drop = format!("DROP SCHEMA IF EXISTS {schema} CASCADE");
    let mut databases: Vec<(&str, &str)> = target_database.into_iter().collect();
    match &spec.kind {
        StoreKind::File(dir) => match std::fs::remove_dir_all(dir) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::internal(
                    format!(
                        "cannot remove the bench's scratch directory `{}`: {err}",
                        dir.display()
                    ),
                    "remove it by hand",
                ))
            }
            _ => {}
        },
        StoreKind::Postgres(url) => databases.push((url.as_str(), spec.display.as_str())),
        StoreKind::Object(url) => super::object::remove_namespace(url).await?,
    }
    for (url, display) in databases {
        let (client, _notifications) = crate::pg::ConnectParams::resolve(url, display)?
            .connect()
            .await?;
        client.batch_execute(&drop).await.map_err(|err| {
            crate::pg::request_error(&err, display, "remove the bench's scratch schema", true)
        })?;
    }
    Ok(())
}
