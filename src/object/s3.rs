//! S3 objects through `object_store`: `PutMode::Create` sends `If-None-Match: *`,
//! `PutMode::Update` sends `If-Match: <etag>`, fence metadata travels as `x-amz-meta-*`.
//!
//! Configuration is the usual AWS environment (`AmazonS3Builder::from_env`: `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`, …) with `AWS_ENDPOINT_URL` for
//! S3-compatible servers (path-style requests, plain HTTP allowed for `http://` endpoints).
//! S3's `Last-Modified` has whole-second resolution, so expiry is rounded by a second.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use http_body_util::BodyExt;
use indicatif::ProgressBar;
use object_store::aws::AmazonS3Builder;
use object_store::client::{
    ClientOptions, HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse,
    HttpResponseBody, HttpService,
};
use object_store::path::Path;
use object_store::{
    Attribute, AttributeValue, Attributes, GetOptions, ObjectStore, ObjectStoreExt, PutMode,
    PutOptions, PutPayload, RetryConfig, UpdateVersion,
};

use crate::error::Error;
use crate::object::upload;
use crate::object::{
    put_unknown, refused, retry_pause, transient, unavailable, Cond, Fetched, Meta, ObjectApi, Put,
    VersionKinds,
};

/// Where S3 credentials come from, as messages name them.
const CREDENTIALS: &str = "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN";

/// The HTTP status of the server's answer in an object_store error, with the text after it
/// (object_store keeps the status only in its message once it wrapped the error).
fn status_of(err: &object_store::Error) -> Option<(u16, String)> {
    let text = err.to_string();
    let at = text.find("status code: ")? + "status code: ".len();
    let status = text.get(at..at + 3)?.parse().ok()?;
    Some((status, text[at + 3..].to_owned()))
}

/// Whether the server answered (no HTTP status failed, no connection or transfer failed: no
/// `HttpError` anywhere in the error's sources) and the client could not make sense of the
/// answer, as with a metadata header that is not UTF-8 (written raw by another client): the
/// same answer comes again on every retry.
fn answered_unreadably(err: &object_store::Error) -> bool {
    if status_of(err).is_some() || matches!(err, object_store::Error::NotFound { .. }) {
        return false;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(current) = source {
        if current
            .downcast_ref::<object_store::client::HttpError>()
            .is_some()
        {
            return false;
        }
        source = current.source();
    }
    matches!(err, object_store::Error::Generic { .. })
}

/// What to do with a failed request.
enum Failure {
    /// Worth another attempt after this pause.
    Retry(std::time::Duration),
    /// Final.
    Fail(Error),
}

pub struct S3Objects {
    store: Arc<dyn ObjectStore>,
    display: String,
    bucket: String,
    /// The `Date` of successful PUT answers, by decoded URL path (see [`Dates`]).
    dates: Dates,
}

/// S3 gives no Last-Modified in a PUT's answer, and reading it back would cost a request per
/// write. Every answer carries the server's `Date`, though, taken after the object was stored:
/// whole seconds, rounded down like Last-Modified, so it is Last-Modified or a second later
/// at most (for a PUT answered within a second). fence reports a lease's expiry from it: never
/// later than others may take over (Last-Modified + TTL + the 1 s resolution); others judge
/// by the Last-Modified they read. Kept per path, so concurrent writes cannot mix them up.
type Dates = Arc<std::sync::Mutex<std::collections::HashMap<String, i64>>>;

/// An HTTP date (`Fri, 04 Dec 2026 12:53:57 GMT`) in milliseconds since the epoch.
fn http_date_ms(text: &str) -> Option<i64> {
    let parts: Vec<&str> = text.split_whitespace().collect();
    let [_, day, month, year, time, "GMT"] = parts.as_slice() else {
        return None;
    };
    let months = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = months.iter().position(|m| m == month)? + 1;
    let at = humantime::parse_rfc3339(&format!("{year}-{month:02}-{day:0>2}T{time}Z")).ok()?;
    let ms = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis();
    i64::try_from(ms).ok()
}

impl S3Objects {
    /// `bar`, when visible, counts the bytes of uploads as they are sent (through an HTTP
    /// client of ours, which also keeps the `Date` of PUT answers).
    pub fn new(bucket: &str, bar: ProgressBar) -> Result<S3Objects, Error> {
        // Retries are fence's own (`Failure`): object_store would retry a 501 or a 4xx-like
        // answer it cannot tell from a transient one, and a definite answer must not be asked
        // again.
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_retry(RetryConfig {
                max_retries: 0,
                ..RetryConfig::default()
            });
        let dates = Dates::default();
        builder = builder.with_http_connector(Reporting {
            bar,
            dates: dates.clone(),
        });
        if std::env::var_os("AWS_REGION").is_none()
            && std::env::var_os("AWS_DEFAULT_REGION").is_none()
        {
            builder = builder.with_region("us-east-1");
        }
        if let Ok(endpoint) = std::env::var("AWS_ENDPOINT_URL") {
            builder = builder
                .with_allow_http(endpoint.starts_with("http://"))
                .with_virtual_hosted_style_request(false)
                .with_endpoint(endpoint);
        }
        let store = builder.build().map_err(|err| {
            Error::usage(
                format!("cannot configure S3 for bucket `{bucket}`: {err}"),
                "check AWS_REGION, AWS_ENDPOINT_URL and the AWS_* credential variables",
            )
        })?;
        Ok(S3Objects {
            store: Arc::new(store),
            display: format!("s3://{bucket}"),
            bucket: bucket.to_owned(),
            dates,
        })
    }

    fn meta(meta: &object_store::ObjectMeta, attributes: &Attributes) -> Meta {
        let metadata = attributes
            .iter()
            .filter_map(|(key, value)| match key {
                Attribute::Metadata(name) => Some((name.to_string(), value.to_string())),
                _ => None,
            })
            .collect();
        Meta {
            version: meta.e_tag.clone().unwrap_or_default(),
            last_modified_ms: meta.last_modified.timestamp_millis(),
            metadata,
        }
    }

    /// Classifies a failed request (`attempt` counts from 0): transient answers and lost
    /// connections are retried a few times; a definite answer fails at once. `unknown` makes
    /// the error of a write that may have applied.
    fn failure(
        &self,
        what: &str,
        err: &object_store::Error,
        attempt: usize,
        unknown: Option<&str>,
    ) -> Failure {
        let status = status_of(err);
        let retry = match &status {
            Some((code, _)) => transient(*code),
            // No answer: for a read, try again; for a write, it may have applied.
            None => unknown.is_none(),
        };
        if retry {
            if let Some(pause) = retry_pause(attempt) {
                return Failure::Retry(pause);
            }
        }
        Failure::Fail(match (status, unknown) {
            (Some((code, body)), _) if !transient(code) => {
                refused(&self.display, what, code, &body, CREDENTIALS)
            }
            (Some((429, body)), _) => refused(&self.display, what, 429, &body, CREDENTIALS),
            (_, Some(key)) => put_unknown(&self.display, key, err),
            (_, None) => unavailable(&self.display, what, err),
        })
    }

    async fn fetch(&self, key: &str, head: bool) -> Result<Option<Fetched>, Error> {
        let what = format!("read `{key}`");
        let mut attempt = 0;
        loop {
            let options = GetOptions {
                head,
                ..GetOptions::default()
            };
            let err = match self.store.get_opts(&Path::from(key), options).await {
                Ok(result) => {
                    let meta = Self::meta(&result.meta, &result.attributes);
                    if head {
                        return Ok(Some(Fetched {
                            meta,
                            body: Vec::new(),
                        }));
                    }
                    match result.bytes().await {
                        Ok(bytes) => {
                            return Ok(Some(Fetched {
                                meta,
                                body: bytes.to_vec(),
                            }))
                        }
                        Err(err) => err,
                    }
                }
                Err(err @ object_store::Error::NotFound { .. }) => {
                    // A GET's answer names a missing bucket in its error code; a HEAD's has
                    // no body. The code, not the message: the message quotes the key.
                    let answer = std::error::Error::source(&err).map(ToString::to_string);
                    if super::error_code(answer.as_deref().unwrap_or("")).as_deref()
                        == Some("NoSuchBucket")
                    {
                        return Err(refused(&self.display, &what, 404, "", CREDENTIALS));
                    }
                    return Ok(None);
                }
                Err(err) => err,
            };
            if answered_unreadably(&err) {
                return Err(Error::internal(
                    format!(
                        "cannot {what} at `{}`: the server answered, but its answer cannot be read: {err}",
                        self.display
                    ),
                    "another client probably stored metadata fence's S3 client cannot read (a value that is not ASCII): rewrite the object without it (e.g. `aws s3 cp` onto itself with `--metadata-directive REPLACE`), and write fenced objects only through fence",
                ));
            }
            match self.failure(&what, &err, attempt, None) {
                Failure::Retry(pause) => tokio::time::sleep(pause).await,
                Failure::Fail(err) => return Err(err),
            }
            attempt += 1;
        }
    }
}

#[async_trait(?Send)]
impl ObjectApi for S3Objects {
    async fn get(&self, key: &str) -> Result<Option<Fetched>, Error> {
        self.fetch(key, false).await
    }

    async fn head(&self, key: &str) -> Result<Option<Meta>, Error> {
        Ok(self.fetch(key, true).await?.map(|f| f.meta))
    }

    async fn put(
        &self,
        key: &str,
        body: Vec<u8>,
        cond: &Cond,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Put, Error> {
        let mut attributes = Attributes::new();
        for (name, value) in metadata {
            attributes.insert(
                Attribute::Metadata(name.clone().into()),
                AttributeValue::from(value.clone()),
            );
        }
        let mode = match cond {
            Cond::None => PutMode::Overwrite,
            Cond::Create => PutMode::Create,
            Cond::Match(etag) => PutMode::Update(UpdateVersion {
                e_tag: Some(etag.clone()),
                version: None,
            }),
        };
        let options = PutOptions {
            mode,
            attributes,
            ..PutOptions::default()
        };
        let path = Path::from(key);
        let payload = PutPayload::from(body);
        let what = format!("write `{key}`");
        let mut attempt = 0;
        let written = loop {
            match self
                .store
                .put_opts(&path, payload.clone(), options.clone())
                .await
            {
                Ok(written) => break written,
                Err(
                    object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. },
                ) => return Ok(Put::Lost),
                Err(err) => match self.failure(&what, &err, attempt, Some(key)) {
                    // A retried conditional put that had applied after all answers 412: the
                    // caller reads again and sees its own write (lease bodies carry a nonce).
                    Failure::Retry(pause) => tokio::time::sleep(pause).await,
                    Failure::Fail(err) => return Err(err),
                },
            }
            attempt += 1;
        };
        // Path-style URLs end in `/bucket/key` (fence asks for them with an endpoint; AWS
        // itself gets them too, object_store's default).
        let date = self
            .dates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&format!("/{}/{key}", self.bucket));
        if let (Some(version), Some(last_modified_ms)) = (written.e_tag, date) {
            return Ok(Put::Done(Meta {
                version,
                last_modified_ms,
                metadata: metadata.clone(),
            }));
        }
        // No usable answer (no Date or ETag): read the object's state back.
        match self.fetch(key, true).await? {
            Some(fetched) => Ok(Put::Done(fetched.meta)),
            None => Err(put_unknown(
                &self.display,
                key,
                "the object vanished right after it was written",
            )),
        }
    }

    async fn put_blind(&self, key: &str, body: Vec<u8>) -> Result<(), Error> {
        let path = Path::from(key);
        let payload = PutPayload::from(body);
        let what = format!("write `{key}`");
        let mut attempt = 0;
        loop {
            match self.store.put(&path, payload.clone()).await {
                Ok(_) => return Ok(()),
                Err(err) => match self.failure(&what, &err, attempt, Some(key)) {
                    Failure::Retry(pause) => tokio::time::sleep(pause).await,
                    Failure::Fail(err) => return Err(err),
                },
            }
            attempt += 1;
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, Error> {
        let path = Path::from(prefix);
        let mut attempt = 0;
        let listed = loop {
            match self.store.list_with_delimiter(Some(&path)).await {
                Ok(listed) => break listed,
                Err(err) => match self.failure("list objects", &err, attempt, None) {
                    Failure::Retry(pause) => tokio::time::sleep(pause).await,
                    Failure::Fail(err) => return Err(err),
                },
            }
            attempt += 1;
        };
        Ok(listed
            .objects
            .iter()
            .filter_map(|o| o.location.filename().map(str::to_owned))
            .collect())
    }

    async fn delete(&self, key: &str) -> Result<(), Error> {
        let mut attempt = 0;
        loop {
            match self.store.delete(&Path::from(key)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => return Ok(()),
                Err(err) => match self.failure("delete an object", &err, attempt, None) {
                    Failure::Retry(pause) => tokio::time::sleep(pause).await,
                    Failure::Fail(err) => return Err(err),
                },
            }
            attempt += 1;
        }
    }

    fn clock_resolution_ms(&self) -> i64 {
        1000
    }

    fn version_kinds(&self) -> VersionKinds {
        VersionKinds {
            etag: true,
            generation: false,
        }
    }
}

/// An HTTP client for object_store that sends request bodies as [`upload::Counted`] frames.
struct Reporting {
    bar: ProgressBar,
    dates: Dates,
}

impl std::fmt::Debug for Reporting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reporting")
    }
}

impl HttpConnector for Reporting {
    fn connect(&self, _options: &ClientOptions) -> object_store::Result<HttpClient> {
        // object_store's defaults, but the total timeout grows with the body (per request).
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(5))
            .build()
            .map_err(|err| object_store::Error::Generic {
                store: "S3",
                source: Box::new(err),
            })?;
        Ok(HttpClient::new(ReportingService {
            client,
            bar: self.bar.clone(),
            dates: self.dates.clone(),
        }))
    }
}

struct ReportingService {
    client: reqwest::Client,
    bar: ProgressBar,
    dates: Dates,
}

impl std::fmt::Debug for ReportingService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReportingService")
    }
}

/// The kind object_store's own client gives a reqwest error (its retries depend on it).
fn kind(err: &reqwest::Error) -> HttpErrorKind {
    if err.is_timeout() {
        HttpErrorKind::Timeout
    } else if err.is_connect() {
        HttpErrorKind::Connect
    } else if err.is_decode() {
        HttpErrorKind::Decode
    } else if err.is_body() || err.is_request() {
        HttpErrorKind::Request
    } else {
        HttpErrorKind::Unknown
    }
}

#[async_trait]
impl HttpService for ReportingService {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let (parts, body) = req.into_parts();
        let url = parts
            .uri
            .to_string()
            .parse()
            .map_err(|err| HttpError::new(HttpErrorKind::Request, err))?;
        let put = parts.method == http::Method::PUT;
        let path = crate::url::percent_decode(parts.uri.path());
        let mut request = reqwest::Request::new(parts.method, url);
        *request.headers_mut() = parts.headers;
        let data = body.collect().await?.to_bytes();
        *request.timeout_mut() = Some(upload::timeout(data.len()));
        if !data.is_empty() {
            *request.body_mut() = Some(reqwest::Body::wrap(upload::Counted::new(
                data,
                self.bar.clone(),
            )));
        }
        let response = self
            .client
            .execute(request)
            .await
            .map_err(|err| HttpError::new(kind(&err), err))?;
        let (parts, body) = http::Response::<reqwest::Body>::from(response).into_parts();
        if put && parts.status.is_success() {
            let date = parts.headers.get(http::header::DATE);
            if let (Some(path), Some(ms)) =
                (path, date.and_then(|d| http_date_ms(d.to_str().ok()?)))
            {
                self.dates
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(path, ms);
            }
        }
        let body = HttpResponseBody::new(body.map_err(|err| HttpError::new(kind(&err), err)));
        Ok(HttpResponse::from_parts(parts, body))
    }
}
