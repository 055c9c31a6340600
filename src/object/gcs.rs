//! GCS objects through the JSON API: object_store's GCS client speaks the XML API, whose
//! preconditions compatible test servers do not honour (DESIGN §7), so this is a small
//! client of our own on `reqwest` (the major version object_store already pulls in).
//!
//! Writes are multipart uploads (`uploadType=multipart`) carrying the metadata in the same
//! request, conditioned with `ifGenerationMatch` (0 = create only). Generations increase
//! strictly, so versions never repeat (no ABA). `updated` has millisecond resolution.
//!
//! Endpoint: `FENCE_GCS_ENDPOINT`, else `STORAGE_EMULATOR_HOST`, else
//! `https://storage.googleapis.com`. Credentials: see [`super::gcs_auth`]
//! (`GOOGLE_OAUTH_ACCESS_TOKEN`, or a service-account key in `GOOGLE_APPLICATION_CREDENTIALS`);
//! fence never asks a metadata server.

use std::collections::BTreeMap;

use async_trait::async_trait;
use indicatif::ProgressBar;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::error::Error;
use crate::object::gcs_auth::Auth;
use crate::object::{
    put_unknown, redirected, refused, retry_pause, transient, unavailable, upload, Cond, Fetched,
    Meta, ObjectApi, Put, VersionKinds,
};

use crate::object::GCS_DEFAULT_ENDPOINT as DEFAULT_ENDPOINT;

/// The settings that name the server fence's GCS client talks to, as messages name them.
const SERVERS: &str = "FENCE_GCS_ENDPOINT, else STORAGE_EMULATOR_HOST";

pub struct GcsObjects {
    client: reqwest::Client,
    /// Counts the bytes of uploads sent (hidden unless `fence write` shows it).
    bar: ProgressBar,
    endpoint: String,
    bucket: String,
    auth: std::sync::Arc<Auth>,
    display: String,
    /// When the last request was sent (its last attempt: retries after 429 or 503 included).
    last_sent: std::cell::Cell<Option<tokio::time::Instant>>,
}

/// Percent-encodes an object name for a URL path segment or query value.
fn enc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Why an answer's body could not be read as JSON.
#[derive(Debug, thiserror::Error)]
enum BodyError {
    #[error("{0}")]
    Read(#[source] reqwest::Error),
    #[error("the answer is not JSON: {0}")]
    Json(#[source] serde_json::Error),
}

/// A response body as JSON.
async fn json_body(response: reqwest::Response) -> Result<Value, BodyError> {
    let bytes = response.bytes().await.map_err(BodyError::Read)?;
    serde_json::from_slice(&bytes).map_err(BodyError::Json)
}

/// Sends the request `builder` holds and reads its answer whole ([`upload::exchange`]),
/// within the request's own timeout ([`upload::timeout`] of an empty body when it sets none).
pub(crate) async fn exchange(
    client: &reqwest::Client,
    builder: reqwest::RequestBuilder,
) -> Result<reqwest::Response, upload::NoAnswer> {
    let mut request = builder.build()?;
    let limit = request
        .timeout_mut()
        .take()
        .unwrap_or_else(|| upload::timeout(0));
    let (parts, body) = upload::exchange(client, request, limit).await?;
    Ok(reqwest::Response::from(http::Response::from_parts(
        parts, body,
    )))
}

impl GcsObjects {
    pub fn new(bucket: &str, bar: ProgressBar) -> Result<GcsObjects, Error> {
        let endpoint = crate::object::gcs_endpoint();
        // No timeout of reqwest's ([`exchange`] bounds every request), no redirect followed.
        let client = upload::client(reqwest::Client::builder()).map_err(|err| {
            Error::internal(format!("cannot set up HTTP: {err}"), "report this bug")
                .with_source(err)
        })?;
        Ok(GcsObjects {
            client,
            bar,
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            bucket: bucket.to_owned(),
            auth: Auth::from_env()?,
            display: format!("gs://{bucket}"),
            last_sent: std::cell::Cell::new(None),
        })
    }

    fn object_url(&self, key: &str) -> String {
        format!(
            "{}/storage/v1/b/{}/o/{}",
            self.endpoint,
            enc(&self.bucket),
            enc(key)
        )
    }

    fn meta(&self, value: &Value) -> Result<Meta, Error> {
        let bad = |what: &str| {
            unavailable(
                &self.display,
                "read object metadata",
                format!("the answer has no valid `{what}`"),
            )
        };
        let version = match &value["generation"] {
            Value::String(g) => g.clone(),
            Value::Number(g) => g.to_string(),
            _ => return Err(bad("generation")),
        };
        let updated = value["updated"].as_str().ok_or_else(|| bad("updated"))?;
        let at = humantime::parse_rfc3339_weak(updated.trim_end_matches('Z'))
            .map_err(|err| bad("updated").with_source(err))?;
        let last_modified_ms = at
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let metadata = value["metadata"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
        Ok(Meta {
            version,
            last_modified_ms,
            metadata,
        })
    }

    /// Sends the request `make` builds (anew for each attempt, with the current bearer token).
    /// Transient answers (429, 5xx but 501) are retried with back-off, and so are lost
    /// connections of reads; a 401 is retried once with a fresh token when the credentials can
    /// be refreshed (a service account's token expired early or was revoked). `write`: the
    /// key of a write, whose lost connection or exhausted retries leave its outcome unknown.
    /// Any other answer is the caller's to read.
    async fn call(
        &self,
        what: &str,
        write: Option<&str>,
        make: &dyn Fn() -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, Error> {
        let mut attempt = 0;
        let mut refreshed = false;
        loop {
            let mut builder = make();
            if let Some(token) = self.auth.bearer(&self.client).await? {
                builder = builder.bearer_auth(token);
            }
            let pause = retry_pause(attempt);
            attempt += 1;
            self.last_sent.set(Some(tokio::time::Instant::now()));
            match exchange(&self.client, builder).await {
                Err(upload::NoAnswer::Redirected(redirect)) => {
                    return Err(redirected(&self.display, what, &redirect, SERVERS, None))
                }
                Err(err) => match (write, pause) {
                    (None, Some(pause)) => tokio::time::sleep(pause).await,
                    (None, None) => {
                        return Err(unavailable(&self.display, what, &err).with_source(err))
                    }
                    (Some(key), _) => {
                        return Err(put_unknown(&self.display, key, &err).with_source(err))
                    }
                },
                Ok(response)
                    if response.status() == StatusCode::UNAUTHORIZED
                        && !refreshed
                        && self.auth.refreshable() =>
                {
                    self.auth.forget();
                    refreshed = true;
                }
                Ok(response) if transient(response.status().as_u16()) => {
                    let status = response.status();
                    match (pause, write) {
                        (Some(pause), _) => tokio::time::sleep(pause).await,
                        (None, _) if status == StatusCode::TOO_MANY_REQUESTS => {
                            return Err(self.failed(what, response).await)
                        }
                        (None, Some(key)) => {
                            return Err(put_unknown(&self.display, key, format!("HTTP {status}")))
                        }
                        (None, None) => return Err(self.failed(what, response).await),
                    }
                }
                Ok(response) => return Ok(response),
            }
        }
    }

    /// The error for an answer fence cannot use: a definite refusal (4xx, 501) says what it
    /// means; anything else is the store being unavailable.
    async fn failed(&self, what: &str, response: reqwest::Response) -> Error {
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        if status.is_client_error()
            || status == StatusCode::NOT_IMPLEMENTED
            || status == StatusCode::TOO_MANY_REQUESTS
        {
            return refused(
                &self.display,
                what,
                status.as_u16(),
                &text,
                self.auth.describe(),
            );
        }
        unavailable(
            &self.display,
            what,
            format!(
                "HTTP {status}: {}",
                text.chars().take(300).collect::<String>()
            ),
        )
    }
}

#[async_trait(?Send)]
impl ObjectApi for GcsObjects {
    async fn get(&self, key: &str) -> Result<Option<Fetched>, Error> {
        // Metadata first, then exactly that generation's bytes; retried if it was replaced
        // in between, so bytes and metadata always belong together.
        for _ in 0..5 {
            let Some(meta) = self.head(key).await? else {
                return Ok(None);
            };
            let url = format!(
                "{}?alt=media&ifGenerationMatch={}",
                self.object_url(key),
                meta.version
            );
            let response = self
                .call("read an object", None, &|| self.client.get(&url))
                .await?;
            match response.status() {
                StatusCode::OK => {
                    let body = response.bytes().await.map_err(|err| {
                        unavailable(&self.display, "read an object", &err).with_source(err)
                    })?;
                    return Ok(Some(Fetched {
                        meta,
                        body: body.to_vec(),
                    }));
                }
                StatusCode::PRECONDITION_FAILED | StatusCode::NOT_FOUND => continue,
                _ => return Err(self.failed("read an object", response).await),
            }
        }
        Err(unavailable(
            &self.display,
            &format!("read `{key}`"),
            "it kept changing while being read",
        ))
    }

    async fn head(&self, key: &str) -> Result<Option<Meta>, Error> {
        let url = self.object_url(key);
        let response = self
            .call("read object metadata", None, &|| self.client.get(&url))
            .await?;
        match response.status() {
            StatusCode::NOT_FOUND => Ok(None),
            StatusCode::OK => {
                let value = json_body(response).await.map_err(|err| {
                    unavailable(&self.display, "read object metadata", &err).with_source(err)
                })?;
                Ok(Some(self.meta(&value)?))
            }
            _ => Err(self.failed("read object metadata", response).await),
        }
    }

    async fn put(
        &self,
        key: &str,
        body: Vec<u8>,
        cond: &Cond,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Put, Error> {
        let mut url = format!(
            "{}/upload/storage/v1/b/{}/o?uploadType=multipart",
            self.endpoint,
            enc(&self.bucket)
        );
        match cond {
            Cond::None => {}
            Cond::Create => url.push_str("&ifGenerationMatch=0"),
            Cond::Match(generation) => {
                url.push_str(&format!("&ifGenerationMatch={}", enc(generation)));
            }
        }
        let boundary = format!("fence-{:016x}", crate::sys::random_u64());
        let head = json!({ "name": key, "metadata": metadata }).to_string();
        // The envelope around the bytes, which are sent as they are (never copied).
        let opening = bytes::Bytes::from(format!(
            "--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{head}\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n"
        ));
        let closing = bytes::Bytes::from(format!("\r\n--{boundary}--\r\n"));
        let body = bytes::Bytes::from(body);
        let length = opening.len() + body.len() + closing.len();
        let what = format!("write `{key}`");
        // A retried conditional write that had applied after all answers 412: the caller
        // reads again and sees its own write (lease bodies carry a nonce).
        let response = self
            .call(&what, Some(key), &|| {
                self.client
                    .post(&url)
                    .header(
                        reqwest::header::CONTENT_TYPE,
                        format!("multipart/related; boundary={boundary}"),
                    )
                    .header(reqwest::header::CONTENT_LENGTH, length)
                    .timeout(upload::timeout(length))
                    .body(reqwest::Body::wrap(upload::Counted::parts(
                        vec![opening.clone(), body.clone(), closing.clone()],
                        self.bar.clone(),
                    )))
            })
            .await?;
        match response.status() {
            StatusCode::PRECONDITION_FAILED => Ok(Put::Lost),
            status if status.is_success() => {
                let value = json_body(response)
                    .await
                    .map_err(|err| put_unknown(&self.display, key, &err).with_source(err))?;
                Ok(Put::Done(self.meta(&value)?))
            }
            status if status.is_server_error() && status != StatusCode::NOT_IMPLEMENTED => {
                Err(put_unknown(&self.display, key, format!("HTTP {status}")))
            }
            _ => Err(self.failed(&what, response).await),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, Error> {
        let prefix = format!("{}/", prefix.trim_end_matches('/'));
        let mut names = Vec::new();
        let mut page: Option<String> = None;
        loop {
            let mut url = format!(
                "{}/storage/v1/b/{}/o?delimiter=%2F&prefix={}",
                self.endpoint,
                enc(&self.bucket),
                enc(&prefix)
            );
            if let Some(token) = &page {
                url.push_str(&format!("&pageToken={}", enc(token)));
            }
            let response = self
                .call("list objects", None, &|| self.client.get(&url))
                .await?;
            if !response.status().is_success() {
                return Err(self.failed("list objects", response).await);
            }
            let value = json_body(response)
                .await
                .map_err(|err| unavailable(&self.display, "list objects", &err).with_source(err))?;
            for item in value["items"].as_array().into_iter().flatten() {
                if let Some(name) = item["name"].as_str().and_then(|n| n.strip_prefix(&prefix)) {
                    if !name.is_empty() && !name.contains('/') {
                        names.push(name.to_owned());
                    }
                }
            }
            match value["nextPageToken"].as_str() {
                Some(token) if !token.is_empty() => page = Some(token.to_owned()),
                _ => return Ok(names),
            }
        }
    }

    async fn delete(&self, key: &str) -> Result<(), Error> {
        let url = self.object_url(key);
        let response = self
            .call("delete an object", None, &|| self.client.delete(&url))
            .await?;
        match response.status() {
            status if status.is_success() || status == StatusCode::NOT_FOUND => Ok(()),
            _ => Err(self.failed("delete an object", response).await),
        }
    }

    fn body_fits_metadata(&self) -> bool {
        true
    }

    fn min_ttl(&self) -> Option<(i64, &'static str)> {
        // Google Cloud Storage allows about one write per second to one object name (429
        // beyond): renewals at a third of the TTL stay within it from 3 s. Emulators have no
        // such limit (and the test suite uses short TTLs on them).
        // However the endpoint is spelled (`:443`, capitals, a trailing slash).
        (crate::object::verify::normalize(&self.endpoint) == DEFAULT_ENDPOINT).then_some((
            3_000,
            "Google Cloud Storage allows about one write per second to one object, and a holder renews at a third of its TTL",
        ))
    }

    fn clock_resolution_ms(&self) -> i64 {
        1
    }

    fn last_sent(&self) -> Option<tokio::time::Instant> {
        self.last_sent.get()
    }

    fn version_kinds(&self) -> VersionKinds {
        VersionKinds {
            etag: false,
            generation: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer that is not JSON says so as before, and keeps the parser's error as its source.
    #[test]
    fn a_body_that_is_not_json_keeps_its_cause() {
        let err = BodyError::Json(serde_json::from_slice::<Value>(b"<html>").unwrap_err());
        let failed = unavailable("gs://b", "list objects", &err).with_source(err);
        assert!(
            failed
                .to_string()
                .starts_with("cannot list objects at `gs://b`: the answer is not JSON: "),
            "{failed}"
        );
        let source = std::error::Error::source(&failed).expect("kept");
        let body = source
            .downcast_ref::<BodyError>()
            .expect("the body's error");
        assert!(std::error::Error::source(body).is_some_and(|s| s.is::<serde_json::Error>()));
    }
}
