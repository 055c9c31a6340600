//! Direct reads of the S3 (moto, LocalStack) and GCS (fake-gcs-server) test servers that
//! `tests/run` starts on loopback, so tests can assert on what is durably stored, not on what
//! fence said.
//! Requests go through `curl` to 127.0.0.1 only; moto accepts unsigned requests and
//! fake-gcs-server needs no credentials.

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;

use super::env_or_panic;

/// Which object service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    S3,
    Gcs,
}

/// One test server and bucket.
#[derive(Clone, Debug)]
pub struct Server {
    pub service: Service,
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
    pub bucket: String,
}

/// A stored object: its bytes, its user metadata (`fence-token`, …) and its version (S3: the
/// ETag; GCS and `file://`: the generation), all of one version.
#[derive(Clone, Debug)]
pub struct Stored {
    pub body: Vec<u8>,
    pub metadata: BTreeMap<String, String>,
    pub version: Option<String>,
}

impl Stored {
    pub fn token(&self) -> Option<i64> {
        self.metadata
            .get("fence-token")
            .and_then(|t| t.parse().ok())
    }
}

impl Server {
    pub fn new(service: Service) -> Server {
        let (endpoint, bucket) = match service {
            Service::S3 => ("FENCE_TEST_S3_ENDPOINT", "FENCE_TEST_S3_BUCKET"),
            Service::Gcs => ("FENCE_TEST_GCS_ENDPOINT", "FENCE_TEST_GCS_BUCKET"),
        };
        Server::at(service, env_or_panic(endpoint), env_or_panic(bucket))
    }

    /// LocalStack's S3, which `tests/run` starts beside moto (same bucket name).
    pub fn localstack() -> Server {
        Server::at(
            Service::S3,
            env_or_panic("FENCE_TEST_LOCALSTACK_ENDPOINT"),
            env_or_panic("FENCE_TEST_S3_BUCKET"),
        )
    }

    /// A server `tests/run` did not start (a test's own: `common::gcs_server`).
    pub fn at(service: Service, endpoint: String, bucket: String) -> Server {
        let server = Server {
            service,
            endpoint,
            bucket,
        };
        assert!(
            server.endpoint.starts_with("http://127.0.0.1:"),
            "the test servers must be on loopback: {server:?}"
        );
        server
    }

    /// The server's loopback address (for a proxy in front of it).
    pub fn addr(&self) -> std::net::SocketAddr {
        self.endpoint
            .trim_start_matches("http://")
            .parse()
            .expect("the endpoint is http://127.0.0.1:PORT")
    }

    /// The environment a `fence` process needs to reach this server, and nothing else: fixed
    /// test credentials, no instance metadata lookups.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        match self.service {
            Service::S3 => vec![
                ("AWS_ENDPOINT_URL", self.endpoint.clone()),
                ("AWS_ACCESS_KEY_ID", "fence-test".into()),
                ("AWS_SECRET_ACCESS_KEY", "fence-test-secret".into()),
                ("AWS_REGION", "us-east-1".into()),
                ("AWS_EC2_METADATA_DISABLED", "true".into()),
            ],
            Service::Gcs => vec![("FENCE_GCS_ENDPOINT", self.endpoint.clone())],
        }
    }

    /// curl with this server's credentials (S3 requests are signed: moto keeps objects
    /// private to the account that wrote them).
    fn curl(&self, args: &[&str]) -> Option<Vec<u8>> {
        match self.service {
            Service::S3 => {
                let mut all = vec![
                    "--aws-sigv4",
                    "aws:amz:us-east-1:s3",
                    "--user",
                    "fence-test:fence-test-secret",
                ];
                all.extend_from_slice(args);
                curl(&all)
            }
            Service::Gcs => curl(args),
        }
    }

    /// `s3://bucket/key` or `gs://bucket/key`.
    pub fn url(&self, key: &str) -> String {
        let scheme = match self.service {
            Service::S3 => "s3",
            Service::Gcs => "gs",
        };
        format!("{scheme}://{}/{key}", self.bucket)
    }

    /// Every key under `prefix/`, sorted.
    pub fn list(&self, prefix: &str) -> Vec<String> {
        let prefix = format!("{}/", prefix.trim_end_matches('/'));
        let mut keys = Vec::new();
        let mut page: Option<String> = None;
        loop {
            match self.service {
                Service::S3 => {
                    let mut url = format!(
                        "{}/{}?list-type=2&prefix={}",
                        self.endpoint,
                        self.bucket,
                        encode(&prefix)
                    );
                    if let Some(token) = &page {
                        url.push_str(&format!("&continuation-token={}", encode(token)));
                    }
                    let xml = String::from_utf8(self.curl(&["-sf", &url]).expect("list objects"))
                        .expect("XML");
                    keys.extend(tags(&xml, "Key"));
                    page = tags(&xml, "NextContinuationToken").next();
                }
                Service::Gcs => {
                    let mut url = format!(
                        "{}/storage/v1/b/{}/o?prefix={}",
                        self.endpoint,
                        self.bucket,
                        encode(&prefix)
                    );
                    if let Some(token) = &page {
                        url.push_str(&format!("&pageToken={}", encode(token)));
                    }
                    let v: Value =
                        serde_json::from_slice(&self.curl(&["-sf", &url]).expect("list objects"))
                            .expect("JSON listing");
                    if let Some(items) = v["items"].as_array() {
                        keys.extend(items.iter().map(|i| i["name"].as_str().unwrap().to_owned()));
                    }
                    page = v["nextPageToken"].as_str().map(str::to_owned);
                }
            }
            if page.is_none() {
                break;
            }
        }
        keys.sort();
        keys
    }

    /// The object's bytes and metadata, or `None` when it does not exist. One GET, so the
    /// bytes and the metadata are those of the same version.
    pub fn get(&self, key: &str) -> Option<Stored> {
        let (url, meta_prefix) = match self.service {
            Service::S3 => (
                format!("{}/{}/{}", self.endpoint, self.bucket, encode_path(key)),
                "x-amz-meta-",
            ),
            Service::Gcs => (
                format!(
                    "{}/storage/v1/b/{}/o/{}?alt=media",
                    self.endpoint,
                    self.bucket,
                    encode(key)
                ),
                "x-goog-meta-",
            ),
        };
        let response = self.curl(&["-sfi", &url])?;
        let split = response
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("an HTTP response with headers");
        let head = String::from_utf8_lossy(&response[..split]);
        let version_header = match self.service {
            Service::S3 => "etag",
            Service::Gcs => "x-goog-generation",
        };
        let version = head.lines().find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case(version_header)
                .then(|| value.trim().to_owned())
        });
        let metadata = head
            .lines()
            .filter_map(|line| {
                let (name, value) = line.split_once(':')?;
                let name = name.trim().to_ascii_lowercase();
                let name = name.strip_prefix(meta_prefix)?;
                Some((name.to_owned(), value.trim().to_owned()))
            })
            .collect();
        Some(Stored {
            body: response[split + 4..].to_vec(),
            metadata,
            version,
        })
    }

    /// The object's version and its Last-Modified by the server's clock, in ms (S3: the
    /// header, whole seconds; GCS: `updated`, to the millisecond, as fence reads it), or
    /// `None` when it does not exist.
    pub fn stat(&self, key: &str) -> Option<(String, i64)> {
        match self.service {
            Service::S3 => {
                let url = format!("{}/{}/{}", self.endpoint, self.bucket, encode_path(key));
                let head = String::from_utf8(self.curl(&["-sfI", &url])?).expect("headers");
                let header = |name: &str| {
                    head.lines().find_map(|line| {
                        let (n, value) = line.split_once(':')?;
                        n.trim()
                            .eq_ignore_ascii_case(name)
                            .then(|| value.trim().to_owned())
                    })
                };
                let version = header("etag").expect("an ETag");
                let modified = header("last-modified").expect("a Last-Modified");
                Some((version, http_date_ms(&modified)))
            }
            Service::Gcs => {
                let url = format!(
                    "{}/storage/v1/b/{}/o/{}",
                    self.endpoint,
                    self.bucket,
                    encode(key)
                );
                let v: Value = serde_json::from_slice(&self.curl(&["-sf", &url])?)
                    .expect("object metadata is JSON");
                let version = match &v["generation"] {
                    Value::String(g) => g.clone(),
                    other => other.to_string(),
                };
                let updated = v["updated"].as_str().expect("`updated`");
                Some((version, rfc3339_ms(updated)))
            }
        }
    }

    /// Stores bytes directly, bypassing fence (an unfenced writer).
    pub fn put(&self, key: &str, body: &[u8]) {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), body).unwrap();
        let data = format!("@{}", file.path().display());
        // Without a content type, curl sends the body as a form, which moto stores empty.
        let binary = "Content-Type: application/octet-stream";
        let ok = match self.service {
            Service::S3 => self.curl(&[
                "-sf",
                "-X",
                "PUT",
                "-H",
                binary,
                "--data-binary",
                &data,
                &format!("{}/{}/{}", self.endpoint, self.bucket, encode_path(key)),
            ]),
            Service::Gcs => self.curl(&[
                "-sf",
                "-X",
                "POST",
                "-H",
                binary,
                "--data-binary",
                &data,
                &format!(
                    "{}/upload/storage/v1/b/{}/o?uploadType=media&name={}",
                    self.endpoint,
                    self.bucket,
                    encode(key)
                ),
            ]),
        };
        ok.expect("direct put");
        // The harness checks itself: a put that stored other bytes would make tests vacuous.
        assert_eq!(
            self.get(key).map(|stored| stored.body).as_deref(),
            Some(body),
            "the direct put of `{key}` stored other bytes"
        );
    }
}

impl Server {
    /// Deletes an object directly, bypassing fence (an operator's clean-up, a lifecycle
    /// rule), and checks it is gone.
    pub fn delete(&self, key: &str) {
        let url = match self.service {
            Service::S3 => format!("{}/{}/{}", self.endpoint, self.bucket, encode_path(key)),
            Service::Gcs => format!(
                "{}/storage/v1/b/{}/o/{}",
                self.endpoint,
                self.bucket,
                encode(key)
            ),
        };
        self.curl(&["-sf", "-X", "DELETE", &url])
            .expect("direct delete");
        assert!(
            self.get(key).is_none(),
            "`{key}` is still there after its delete"
        );
    }

    /// Stores bytes with user metadata of the writer's choosing, bypassing fence (a raw
    /// writer forging fence's metadata, or a copy tool that keeps it).
    pub fn put_with_metadata(&self, key: &str, body: &[u8], metadata: &[(&str, &str)]) {
        if self.service == Service::Gcs {
            // A multipart upload: the object's resource (name, metadata), then its bytes.
            let boundary = "fence-test-boundary-7d1f";
            let resource = serde_json::json!({
                "name": key,
                "metadata": metadata
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
                    .collect::<serde_json::Map<_, _>>(),
            });
            let mut multipart = format!(
                "--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{resource}\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n"
            )
            .into_bytes();
            multipart.extend_from_slice(body);
            multipart.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
            let file = tempfile::NamedTempFile::new().unwrap();
            std::fs::write(file.path(), &multipart).unwrap();
            let data = format!("@{}", file.path().display());
            let content_type = format!("Content-Type: multipart/related; boundary={boundary}");
            let url = format!(
                "{}/upload/storage/v1/b/{}/o?uploadType=multipart",
                self.endpoint, self.bucket
            );
            self.curl(&[
                "-sf",
                "-X",
                "POST",
                "-H",
                &content_type,
                "--data-binary",
                &data,
                &url,
            ])
            .expect("direct multipart put with metadata");
            return;
        }
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), body).unwrap();
        let data = file.path().display().to_string();
        let headers: Vec<String> = metadata
            .iter()
            .map(|(name, value)| format!("x-amz-meta-{name}: {value}"))
            .collect();
        let mut args = vec!["-sf", "-T", &data];
        for header in &headers {
            args.extend(["-H", header]);
        }
        let url = format!("{}/{}/{}", self.endpoint, self.bucket, encode_path(key));
        args.push(&url);
        self.curl(&args).expect("direct put with metadata");
    }
}

/// A `file://` object and its sidecar, read under the object's lock as fence does, so the
/// bytes and the metadata are from the same write (a write a crash interrupted is not settled
/// here: fence settles it under the lock before its next read or write).
pub fn read_local(path: &std::path::Path) -> Option<Stored> {
    use std::os::fd::AsRawFd;
    let dir = path.parent().unwrap();
    let name = path.file_name().unwrap().to_str().unwrap();
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(dir.join(format!(".{name}.fence.lock")))
        .unwrap();
    // SAFETY: flock on a descriptor we own; released when `lock` is dropped.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    let body = std::fs::read(path).ok()?;
    let sidecar: Value = std::fs::read(dir.join(format!(".{name}.fence.json")))
        .ok()
        .map(|text| serde_json::from_slice(&text).unwrap())
        .unwrap_or_default();
    let metadata = sidecar["metadata"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                .collect()
        })
        .unwrap_or_default();
    drop(lock);
    Some(Stored {
        body,
        metadata,
        version: sidecar["generation"].as_u64().map(|g| g.to_string()),
    })
}

/// fence's key encoding of a resource name: `[A-Za-z0-9-]` stay, other bytes become `_XX`.
pub fn encode_key(resource: &str) -> String {
    resource
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' {
                (b as char).to_string()
            } else {
                format!("_{b:02X}")
            }
        })
        .collect()
}

/// Milliseconds since the epoch of an HTTP date (`Fri, 04 Dec 2026 17:07:54 GMT`).
fn http_date_ms(text: &str) -> i64 {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let parts: Vec<&str> = text.split_whitespace().collect();
    let [_, day, month, year, time, "GMT"] = parts[..] else {
        panic!("not an HTTP date: {text:?}");
    };
    let month = MONTHS
        .iter()
        .position(|m| *m == month)
        .unwrap_or_else(|| panic!("not an HTTP date: {text:?}"))
        + 1;
    let day: u32 = day
        .parse()
        .unwrap_or_else(|_| panic!("not an HTTP date: {text:?}"));
    super::timestamp_ms(&format!("{year}-{month:02}-{day:02}T{time}.000Z"))
}

/// Milliseconds since the epoch of an RFC 3339 UTC time with any number of fractional digits
/// (`2026-12-04T17:07:54.369836Z`), truncated as fence truncates it.
fn rfc3339_ms(text: &str) -> i64 {
    let text = text.trim_end_matches('Z');
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let millis: String = fraction.chars().chain("000".chars()).take(3).collect();
    super::timestamp_ms(&format!("{whole}.{millis}Z"))
}

/// Runs curl; `None` when the request failed (for `-f`: an HTTP error such as 404).
fn curl(args: &[&str]) -> Option<Vec<u8>> {
    let out = Command::new("curl")
        .args(["--max-time", "20"])
        .args(args)
        .output()
        .expect("curl is installed by tests/run");
    out.status.success().then_some(out.stdout)
}

fn tags(xml: &str, tag: &str) -> impl Iterator<Item = String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    xml.split(open.as_str())
        .skip(1)
        .filter_map(|part| part.split(close.as_str()).next())
        .map(unescape_xml)
        .collect::<Vec<_>>()
        .into_iter()
}

fn unescape_xml(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

/// Percent-encodes everything but unreserved characters.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Percent-encodes a key for a URL path, keeping its `/`.
fn encode_path(key: &str) -> String {
    key.split('/').map(encode).collect::<Vec<_>>().join("/")
}
