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
    PutOptions, PutPayload, UpdateVersion,
};

use crate::error::Error;
use crate::object::upload;
use crate::object::{put_unknown, unavailable, Cond, Fetched, Meta, ObjectApi, Put, VersionKinds};

pub struct S3Objects {
    store: Arc<dyn ObjectStore>,
    display: String,
}

impl S3Objects {
    /// `bar`, when visible, counts the bytes of uploads as they are sent (through an HTTP
    /// client of ours; otherwise object_store's own).
    pub fn new(bucket: &str, bar: ProgressBar) -> Result<S3Objects, Error> {
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
        if !bar.is_hidden() {
            builder = builder.with_http_connector(Reporting(bar));
        }
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

    async fn fetch(&self, key: &str, head: bool) -> Result<Option<Fetched>, Error> {
        let options = GetOptions {
            head,
            ..GetOptions::default()
        };
        match self.store.get_opts(&Path::from(key), options).await {
            Ok(result) => {
                let meta = Self::meta(&result.meta, &result.attributes);
                let body = if head {
                    Vec::new()
                } else {
                    result
                        .bytes()
                        .await
                        .map_err(|err| unavailable(&self.display, "read an object", err))?
                        .to_vec()
                };
                Ok(Some(Fetched { meta, body }))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(err) => Err(unavailable(&self.display, &format!("read `{key}`"), err)),
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
        match self
            .store
            .put_opts(&path, PutPayload::from(body), options)
            .await
        {
            Ok(_) => {}
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => return Ok(Put::Lost),
            Err(err) => return Err(put_unknown(&self.display, key, err)),
        }
        // S3 does not return Last-Modified on a put: read it back (the store's clock).
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
        self.store
            .put(&Path::from(key), PutPayload::from(body))
            .await
            .map(drop)
            .map_err(|err| put_unknown(&self.display, key, err))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, Error> {
        let path = Path::from(prefix);
        let listed = self
            .store
            .list_with_delimiter(Some(&path))
            .await
            .map_err(|err| unavailable(&self.display, "list objects", err))?;
        Ok(listed
            .objects
            .iter()
            .filter_map(|o| o.location.filename().map(str::to_owned))
            .collect())
    }

    async fn delete(&self, key: &str) -> Result<(), Error> {
        match self.store.delete(&Path::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(err) => Err(unavailable(&self.display, "delete an object", err)),
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
struct Reporting(ProgressBar);

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
            bar: self.0.clone(),
        }))
    }
}

struct ReportingService {
    client: reqwest::Client,
    bar: ProgressBar,
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
        let body = HttpResponseBody::new(body.map_err(|err| HttpError::new(kind(&err), err)));
        Ok(HttpResponse::from_parts(parts, body))
    }
}
