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
    put_unknown, redirected, refused, retry_pause, transient, unavailable, Cond, Fetched, Meta,
    ObjectApi, Put, VersionKinds,
};

/// Where S3 credentials come from, as messages name them.
const CREDENTIALS: &str = "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN";

/// The settings that name the servers S3's credentials come from, as messages name them.
const CREDENTIAL_SERVERS: &str =
    "AWS_METADATA_ENDPOINT, AWS_ENDPOINT_URL_STS or AWS_CONTAINER_CREDENTIALS_FULL_URI for credentials";

/// Where object_store's message names the HTTP status of the server's answer.
const STATUS_MARK: &str = "status code: ";

/// The HTTP status of the server's answer in an object_store error, with the text after it
/// (the reason phrase and the answer's body). object_store 0.14 keeps the status in a
/// `RetryError` whose module is private: no `source()` of the error can be downcast to
/// anything that has it (apache/arrow-rs-object-store#737), so it is read from the message
/// that error writes, `… Server returned non-2xx status code: 503 Service Unavailable: BODY`.
/// That text is pinned for object_store 0.14.2 (Cargo.lock) by `statuses_of_real_answers`
/// below, which has object_store make its errors from answers of each kind: a version that
/// words them otherwise fails it.
fn status_of(err: &object_store::Error) -> Option<(u16, String)> {
    let text = err.to_string();
    let at = text.find(STATUS_MARK)? + STATUS_MARK.len();
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
    source_of::<object_store::client::HttpError>(err).is_none()
        && matches!(err, object_store::Error::Generic { .. })
}

/// The first error of type `T` in `err`'s chain of sources (`err` itself included): a
/// redirect fence did not follow ([`upload::Redirected`]), a transport failure.
fn source_of<T: std::error::Error + 'static>(err: &object_store::Error) -> Option<&T> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(current) = source {
        if let Some(found) = current.downcast_ref::<T>() {
            return Some(found);
        }
        source = current.source();
    }
    None
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
    /// The variable that names the endpoint, if one does (AWS's default otherwise).
    endpoint_var: Option<String>,
    /// Whether keys are objects a URL names, kept exactly as written (see [`Self::path`]).
    exact: bool,
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

/// An HTTP date (`Fri, 04 Dec 2026 12:53:57 GMT`, RFC 2822's form) in milliseconds since the
/// epoch.
fn http_date_ms(text: &str) -> Option<i64> {
    Some(
        chrono::DateTime::parse_from_rfc2822(text)
            .ok()?
            .timestamp_millis(),
    )
}

impl S3Objects {
    /// `bar`, when visible, counts the bytes of uploads as they are sent (through an HTTP
    /// client of ours, which also keeps the `Date` of PUT answers).
    /// `exact`: the keys are objects a URL names (see [`Self::path`]).
    pub fn new(bucket: &str, bar: ProgressBar, exact: bool) -> Result<S3Objects, Error> {
        // Its requests are signed with AWS-LC's HMAC and SHA-256, TLS or not.
        crate::sys::crypto_ready();
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
        let endpoint = crate::object::s3_endpoint()?;
        if let Some((var, endpoint)) = &endpoint {
            let plain = endpoint
                .get(..7)
                .is_some_and(|scheme| scheme.eq_ignore_ascii_case("http://"));
            // As object_store reads it: the last of its spellings; empty is unset.
            let allow = crate::object::aws_vars("aws_allow_http")
                .pop()
                .filter(|(_, value)| !value.is_empty());
            match allow {
                // Not set: an http:// endpoint allows plain HTTP.
                None => builder = builder.with_allow_http(plain),
                Some((name, allowed)) if plain && !truthy(&allowed).unwrap_or(true) => {
                    return Err(Error::usage(
                        format!("{var} is a plain-HTTP endpoint (`{}`), and {name} is `{allowed}`", crate::url::redact_url(endpoint)),
                        format!("use an https:// endpoint, or set {name}=true (or unset it) to send requests to {var} in the clear"),
                    ));
                }
                Some(_) => {}
            }
            builder = builder
                .with_virtual_hosted_style_request(false)
                .with_endpoint(endpoint);
        }
        let store = builder.build().map_err(|err| {
            Error::usage(
                format!("cannot configure S3 for bucket `{bucket}`: {err}"),
                "check AWS_REGION, AWS_ENDPOINT_URL and the AWS_* credential variables",
            )
            .with_source(err)
        })?;
        Ok(S3Objects {
            store: Arc::new(store),
            display: format!("s3://{bucket}"),
            bucket: bucket.to_owned(),
            dates,
            endpoint_var: endpoint.map(|(var, _)| var),
            exact,
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
        err: object_store::Error,
        attempt: usize,
        unknown: Option<&str>,
    ) -> Failure {
        if let Some(redirect) = source_of::<upload::Redirected>(&err) {
            let bucket = self.endpoint_var.as_deref().unwrap_or("AWS_ENDPOINT_URL");
            let settings = format!("{bucket} for the bucket; {CREDENTIAL_SERVERS}");
            let failed = redirected(
                &self.display,
                what,
                redirect,
                &settings,
                self.endpoint_var.as_deref(),
            );
            return Failure::Fail(failed.with_source(err));
        }
        let status = status_of(&err);
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
        let failed = match (status, unknown) {
            (Some((code, body)), _) if !transient(code) => {
                refused(&self.display, what, code, &body, CREDENTIALS)
            }
            (Some((429, body)), _) => refused(&self.display, what, 429, &body, CREDENTIALS),
            (_, Some(key)) => put_unknown(&self.display, key, &err),
            (_, None) => unavailable(&self.display, what, &err),
        };
        Failure::Fail(failed.with_source(err))
    }

    /// Where `key` is in the bucket. An object a URL names is its key exactly as written
    /// (object_store's `Path::from` escapes `%`, bytes outside ASCII and a few more, so
    /// `a%41` was stored as `a%2541` and `données` as `donn%C3%A9es`: review 15); a store's
    /// own objects stay where every earlier fence put them, so that no token starts over.
    fn path(&self, key: &str) -> Result<Path, Error> {
        if !self.exact {
            return Ok(Path::from(key));
        }
        Path::parse(key).map_err(|err| {
            Error::usage(
                format!("`s3://{}/{key}` is not an object key fence can write: {err}", self.bucket),
                "name the object without control characters and without empty, `.` or `..` path segments",
            )
        })
    }

    /// [`Self::fetch_at`] of `key`'s [`Self::path`]. An object a URL names that is not at its
    /// key but where an earlier fence stored it (escaped) is refused rather than started over
    /// beside it, where its token would not guard the new one.
    async fn fetch(&self, key: &str, head: bool) -> Result<Option<Fetched>, Error> {
        let found = self.fetch_at(key, &self.path(key)?, head).await?;
        let escaped = Path::from(key);
        if found.is_some() || !self.exact || escaped.as_ref() == key {
            return Ok(found);
        }
        match self.fetch_at(key, &escaped, true).await? {
            Some(old) if old.meta.metadata.contains_key(super::META_TOKEN) => Err(Error::usage(
                format!(
                    "`s3://{bucket}/{key}` was written by an earlier fence as `s3://{bucket}/{escaped}` (its S3 client escaped `%` and bytes outside ASCII in keys); fence now writes the key as named, and will not start it over beside the old object, whose token would not guard it; nothing was read or written",
                    bucket = self.bucket
                ),
                format!(
                    "copy the old object to the key as named with its metadata (`aws s3 cp {} {}`), delete the old one, then run fence again",
                    crate::error::shell_word(&format!("s3://{}/{escaped}", self.bucket)),
                    crate::error::shell_word(&format!("s3://{}/{key}", self.bucket)),
                ),
            )),
            _ => Ok(None),
        }
    }

    async fn fetch_at(&self, key: &str, path: &Path, head: bool) -> Result<Option<Fetched>, Error> {
        let what = format!("read `{key}`");
        let mut attempt = 0;
        loop {
            let options = GetOptions {
                head,
                ..GetOptions::default()
            };
            let err = match self.store.get_opts(path, options).await {
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
                        return Err(
                            refused(&self.display, &what, 404, "", CREDENTIALS).with_source(err)
                        );
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
                ).with_source(err));
            }
            match self.failure(&what, err, attempt, None) {
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
        let path = self.path(key)?;
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
                Err(err) => match self.failure(&what, err, attempt, Some(key)) {
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
        let path = self.path(key)?;
        let payload = PutPayload::from(body);
        let what = format!("write `{key}`");
        let mut attempt = 0;
        loop {
            match self.store.put(&path, payload.clone()).await {
                Ok(_) => return Ok(()),
                Err(err) => match self.failure(&what, err, attempt, Some(key)) {
                    Failure::Retry(pause) => tokio::time::sleep(pause).await,
                    Failure::Fail(err) => return Err(err),
                },
            }
            attempt += 1;
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, Error> {
        let path = self.path(prefix)?;
        let mut attempt = 0;
        let listed = loop {
            match self.store.list_with_delimiter(Some(&path)).await {
                Ok(listed) => break listed,
                Err(err) => match self.failure("list objects", err, attempt, None) {
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
            match self.store.delete(&self.path(key)?).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => return Ok(()),
                Err(err) => match self.failure("delete an object", err, attempt, None) {
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
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let client = upload::client(client_builder(options)?).map_err(|err| {
            object_store::Error::Generic {
                store: "S3",
                source: format!("cannot set up the HTTP client with the AWS client settings ({err}): check AWS_PROXY_CA_CERTIFICATE (a PEM certificate) and AWS_PROXY_URL").into(),
            }
        })?;
        Ok(HttpClient::new(ReportingService {
            client,
            bar: self.bar.clone(),
            dates: self.dates.clone(),
        }))
    }
}

/// The client settings of the AWS environment, as object_store's own client would apply
/// them (`AWS_ALLOW_HTTP`, `AWS_ALLOW_INVALID_CERTIFICATES`, `AWS_PROXY_URL`,
/// `AWS_PROXY_CA_CERTIFICATE`, `AWS_PROXY_EXCLUDES`, `AWS_USER_AGENT`, `AWS_HTTP1_ONLY`,
/// `AWS_HTTP2_ONLY`, `AWS_CONNECT_TIMEOUT`), none silently dropped. Not its timeouts of a
/// request or a read (fence bounds each request itself, [`upload::exchange`]), its connection
/// pool's tuning (a fence process makes a few requests), `AWS_RANDOMIZE_ADDRESSES` nor
/// `AWS_NO_SYSTEM_CERTIFICATES` (no other roots can be given): docs/object-stores.md.
fn client_builder(options: &ClientOptions) -> object_store::Result<reqwest::ClientBuilder> {
    use object_store::ClientConfigKey as Key;
    let invalid = |key: &str, value: &str, what: &str| object_store::Error::Generic {
        store: "S3",
        source: format!("AWS_{key} is `{value}`, not {what}").into(),
    };
    let flag = |key: Key, name: &str| -> object_store::Result<bool> {
        match options.get_config_value(&key) {
            None => Ok(false),
            Some(value) => truthy(&value).ok_or_else(|| invalid(name, &value, "true or false")),
        }
    };
    let connect_timeout = match options.get_config_value(&Key::ConnectTimeout) {
        None => std::time::Duration::from_secs(5),
        Some(value) => humantime::parse_duration(&value)
            .map_err(|_| invalid("CONNECT_TIMEOUT", &value, "a duration (`5s`)"))?,
    };
    let mut builder = reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        .https_only(!flag(Key::AllowHttp, "ALLOW_HTTP")?);
    if flag(Key::AllowInvalidCertificates, "ALLOW_INVALID_CERTIFICATES")? {
        builder = builder.danger_accept_invalid_certs(true);
    }
    if flag(Key::Http1Only, "HTTP1_ONLY")? {
        builder = builder.http1_only();
    }
    if flag(Key::Http2Only, "HTTP2_ONLY")? {
        builder = builder.http2_prior_knowledge();
    }
    // object_store keeps a user agent that is not a valid header value as none at all.
    // Read as from_env reads it (any case after `AWS_`, the last spelling).
    if let Some((_, agent)) = crate::object::aws_vars("aws_user_agent").pop() {
        let agent = http::HeaderValue::from_str(&agent)
            .map_err(|_| invalid("USER_AGENT", "(not shown)", "a valid HTTP header value"))?;
        builder = builder.user_agent(agent);
    }
    if let Some(url) = options.get_config_value(&Key::ProxyUrl) {
        let mut proxy = reqwest::Proxy::all(&url)
            .map_err(|_| invalid("PROXY_URL", "(not shown)", "a proxy URL"))?;
        if let Some(excludes) = options.get_config_value(&Key::ProxyExcludes) {
            proxy = proxy.no_proxy(reqwest::NoProxy::from_string(&excludes));
        }
        if let Some(pem) = options.get_config_value(&Key::ProxyCaCertificate) {
            // The certificate itself (PEM text), as object_store reads it, not a file's path:
            // a reader that finds no certificate in the text says nothing.
            let certificate = Some(&pem)
                .filter(|pem| pem.contains("-----BEGIN CERTIFICATE-----"))
                .and_then(|pem| reqwest::Certificate::from_pem(pem.as_bytes()).ok())
                .ok_or_else(|| {
                    invalid(
                        "PROXY_CA_CERTIFICATE",
                        "(not shown)",
                        "a PEM certificate (its text, not a file name)",
                    )
                })?;
            builder = builder.tls_certs_merge(std::iter::once(certificate));
        }
        builder = builder.proxy(proxy);
    }
    Ok(builder)
}

/// An AWS boolean setting as object_store reads it (`None`: not one).
fn truthy(value: &str) -> Option<bool> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" | "y" => Some(true),
        "0" | "false" | "off" | "no" | "n" => Some(false),
        _ => None,
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
        let limit = upload::timeout(data.len());
        if !data.is_empty() {
            *request.body_mut() = Some(reqwest::Body::wrap(upload::Counted::parts(
                vec![data],
                self.bar.clone(),
            )));
        }
        // Without the URL: a credential request may carry a token in its query string.
        let (parts, body) = upload::exchange(&self.client, request, limit)
            .await
            .map_err(|err| match err {
                upload::NoAnswer::Http(err) => HttpError::new(kind(&err), err.without_url()),
                timeout @ upload::NoAnswer::Timeout(_) => HttpError::new(
                    HttpErrorKind::Timeout,
                    std::io::Error::new(std::io::ErrorKind::TimedOut, timeout.to_string()),
                ),
                // Known again in `failure`, by its type.
                upload::NoAnswer::Redirected(redirect) => {
                    HttpError::new(HttpErrorKind::Request, redirect)
                }
            })?;
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
        let body = HttpResponseBody::from(body);
        Ok(HttpResponse::from_parts(parts, body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit::Exit;
    use crate::object::{error_code, RETRY_PAUSES_MS};

    /// object_store's HTTP client, answering every request with one canned answer: the errors
    /// below are object_store's own, made by its own code from real answers.
    #[derive(Debug, Clone)]
    struct Canned {
        status: u16,
        body: String,
    }

    impl HttpConnector for Canned {
        fn connect(&self, _options: &ClientOptions) -> object_store::Result<HttpClient> {
            Ok(HttpClient::new(self.clone()))
        }
    }

    #[async_trait]
    impl HttpService for Canned {
        async fn call(&self, _req: HttpRequest) -> Result<HttpResponse, HttpError> {
            let mut response = HttpResponse::new(HttpResponseBody::from(self.body.clone()));
            *response.status_mut() = http::StatusCode::from_u16(self.status).expect("a status");
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/xml"),
            );
            Ok(response)
        }
    }

    fn objects(status: u16, body: String) -> S3Objects {
        let store = AmazonS3Builder::new()
            .with_bucket_name("bucket")
            .with_region("us-east-1")
            .with_access_key_id("key")
            .with_secret_access_key("secret")
            .with_endpoint("http://127.0.0.1:1")
            .with_allow_http(true)
            .with_retry(RetryConfig {
                max_retries: 0,
                ..RetryConfig::default()
            })
            .with_http_connector(Canned { status, body })
            .build()
            .expect("a store");
        S3Objects {
            store: Arc::new(store),
            display: "s3://bucket".into(),
            bucket: "bucket".into(),
            dates: Dates::default(),
            endpoint_var: None,
            exact: true,
        }
    }

    /// What object_store returns for a conditional create answered with `status` and `body`.
    async fn put_error(status: u16, body: String) -> object_store::Error {
        let options = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        let put = objects(status, body)
            .store
            .put_opts(&Path::from("k"), PutPayload::from_static(b"x"), options)
            .await;
        match put {
            Ok(_) => panic!("HTTP {status} was taken for success"),
            Err(err) => err,
        }
    }

    #[test]
    fn http_dates() {
        assert_eq!(
            http_date_ms("Fri, 04 Dec 2026 12:53:57 GMT"),
            Some(1_796_388_837_000)
        );
        assert_eq!(
            http_date_ms("Fri, 4 Dec 2026 12:53:57 GMT"),
            Some(1_796_388_837_000)
        );
        assert_eq!(http_date_ms("2026-12-04T12:53:57Z"), None);
        assert_eq!(http_date_ms(""), None);
    }

    /// An S3 error answer with this code.
    fn s3_error(code: &str) -> String {
        format!("<?xml version=\"1.0\"?><Error><Code>{code}</Code><Message>m</Message></Error>")
    }

    /// Pins [`status_of`] to object_store 0.14.2 (Cargo.lock): the status and the server's
    /// answer are read from the errors it makes of each kind of answer fence classifies.
    #[tokio::test(flavor = "current_thread")]
    async fn statuses_of_real_answers() {
        for (status, code) in [
            (400, "ExpiredToken"),
            (403, "AccessDenied"),
            (429, "SlowDown"),
            (500, "InternalError"),
            (501, "NotImplemented"),
            (503, "ServiceUnavailable"),
        ] {
            let err = put_error(status, s3_error(code)).await;
            let (found, body) = status_of(&err).unwrap_or_else(|| panic!("no status in {err}"));
            assert_eq!(found, status, "{err}");
            assert_eq!(error_code(&body).as_deref(), Some(code), "{err}");
            assert!(!answered_unreadably(&err), "{err}");
        }
        // The answers object_store gives a variant of their own keep their status too (a
        // create's 412 is `AlreadyExists`, which `put` takes for a lost race).
        let err = put_error(412, s3_error("PreconditionFailed")).await;
        assert!(
            matches!(err, object_store::Error::AlreadyExists { .. }),
            "{err:?}"
        );
        assert_eq!(status_of(&err).map(|s| s.0), Some(412), "{err}");
        // A missing bucket is told from a missing key by the code in the answer, which a
        // NotFound error carries in its source.
        let get = objects(404, s3_error("NoSuchBucket"))
            .store
            .get_opts(&Path::from("k"), GetOptions::default())
            .await;
        let Err(err @ object_store::Error::NotFound { .. }) = get else {
            panic!("not NotFound: {get:?}");
        };
        let answer = std::error::Error::source(&err).map(ToString::to_string);
        assert_eq!(
            error_code(answer.as_deref().unwrap_or("")).as_deref(),
            Some("NoSuchBucket")
        );
    }

    /// The errors fence makes of S3's answers keep object_store's error as their source.
    #[tokio::test(flavor = "current_thread")]
    async fn failures_keep_the_object_store_error() {
        let cases = [
            (
                403,
                "AccessDenied",
                Exit::Unavailable,
                "credentials were refused",
            ),
            (501, "NotImplemented", Exit::Usage, "does not implement"),
        ];
        for (status, code, exit, says) in cases {
            let err = objects(status, s3_error(code))
                .put("k", b"x".to_vec(), &Cond::Create, &BTreeMap::new())
                .await
                .expect_err("refused");
            assert_eq!(err.exit(), exit, "{err}");
            assert!(err.to_string().contains(says), "{err}");
            let source = std::error::Error::source(&err).expect("a source");
            assert!(source.is::<object_store::Error>(), "{source:?}");
        }
        // A write that kept getting 503 (its retries used up) may have applied.
        let busy = objects(503, s3_error("ServiceUnavailable"));
        let err = put_error(503, s3_error("ServiceUnavailable")).await;
        let Failure::Fail(err) = busy.failure("write", err, RETRY_PAUSES_MS.len(), Some("k"))
        else {
            panic!("retried after its last attempt");
        };
        assert_eq!(err.exit(), Exit::OutcomeUnknown, "{err}");
        assert!(std::error::Error::source(&err).is_some_and(|s| s.is::<object_store::Error>()));
        // A missing bucket, told by its code.
        let err = objects(404, s3_error("NoSuchBucket"))
            .get("k")
            .await
            .expect_err("no bucket");
        assert_eq!(err.exit(), Exit::Usage, "{err}");
        assert!(err.to_string().contains("does not exist"), "{err}");
        assert!(std::error::Error::source(&err).is_some_and(|s| s.is::<object_store::Error>()));
    }
}
