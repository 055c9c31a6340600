//! GCS credentials: a bearer token given in `GOOGLE_OAUTH_ACCESS_TOKEN`, or a service-account
//! key file named by `GOOGLE_APPLICATION_CREDENTIALS`, exchanged for an access token (OAuth 2.0
//! JWT bearer grant, RS256, at the key's `token_uri`). Nothing else: fence never asks a
//! metadata server. Neither the key nor a token ever appears in a message.
//!
//! Access tokens expire (Google's after an hour; `expires_in` says when), and a `fence run`
//! may hold a lease far longer: a service account's token is exchanged again once three
//! quarters of its lifetime have passed, and at once after a 401 (revoked or expired early).
//! A static `GOOGLE_OAUTH_ACCESS_TOKEN` cannot be renewed: a 401 names it as expired.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{RsaKeyPair, RSA_PKCS1_SHA256};
use serde::Deserialize;
use serde_json::json;

use crate::error::Error;

const SCOPE: &str = "https://www.googleapis.com/auth/devstorage.read_write";
const DEFAULT_TOKEN_URI: &str = "https://oauth2.googleapis.com/token";

pub enum Auth {
    /// No credentials (emulators, public buckets).
    Anonymous,
    Token(String),
    ServiceAccount {
        key: ServiceKey,
        /// The key's private key, parsed once.
        signer: Box<RsaKeyPair>,
        /// The current access token, when to exchange the key again, and until when the
        /// token itself may still be used should that exchange fail.
        token: Mutex<Option<Fresh>>,
    },
}

/// The credentials of this process, read once: a command that talks to GCS twice (a `gs://`
/// coordinator and a `gs://` target) reads the key file and exchanges it once.
static SHARED: OnceLock<Arc<Auth>> = OnceLock::new();

#[derive(Deserialize)]
pub struct ServiceKey {
    client_email: String,
    private_key: String,
    #[serde(default)]
    private_key_id: Option<String>,
    #[serde(default)]
    token_uri: Option<String>,
    /// Where the key came from, for messages.
    #[serde(skip)]
    path: String,
}

fn bad_key(path: &str, why: impl std::fmt::Display) -> Error {
    Error::usage(
        format!("cannot use the GCS service-account key `{path}` (GOOGLE_APPLICATION_CREDENTIALS): {why}"),
        "point GOOGLE_APPLICATION_CREDENTIALS at a service-account JSON key file (IAM → Service accounts → Keys), or give GOOGLE_OAUTH_ACCESS_TOKEN instead",
    )
}

impl Auth {
    /// This process's credentials (see [`Auth::read_env`]), shared once read.
    pub fn from_env() -> Result<Arc<Auth>, Error> {
        if let Some(auth) = SHARED.get() {
            return Ok(auth.clone());
        }
        let auth = Arc::new(Auth::read_env()?);
        Ok(SHARED.get_or_init(|| auth).clone())
    }

    /// From the environment: `GOOGLE_OAUTH_ACCESS_TOKEN` first, then
    /// `GOOGLE_APPLICATION_CREDENTIALS`, else anonymous. A key file is read and checked now.
    fn read_env() -> Result<Auth, Error> {
        if let Some(token) = std::env::var("GOOGLE_OAUTH_ACCESS_TOKEN")
            .ok()
            .filter(|t| !t.is_empty())
        {
            return Ok(Auth::Token(token));
        }
        let Some(path) = std::env::var("GOOGLE_APPLICATION_CREDENTIALS")
            .ok()
            .filter(|p| !p.is_empty())
        else {
            return Ok(Auth::Anonymous);
        };
        let text = std::fs::read(&path).map_err(|err| bad_key(&path, err))?;
        let value: serde_json::Value = serde_json::from_slice(&text)
            .map_err(|err| bad_key(&path, format!("it is not JSON ({err})")))?;
        let kind = value["type"].as_str().unwrap_or_default();
        if kind != "service_account" {
            return Err(bad_key(
                &path,
                format!("its type is `{kind}`, and fence reads only `service_account` keys"),
            ));
        }
        let mut key: ServiceKey = serde_json::from_value(value)
            .map_err(|err| bad_key(&path, format!("not a service-account key ({err})")))?;
        key.path = path;
        // Fail now, not at the first request, if the key cannot sign.
        let signer = Box::new(key.signer()?);
        Ok(Auth::ServiceAccount {
            key,
            signer,
            token: Mutex::new(None),
        })
    }
}

/// An access token, when to exchange the key again (three quarters of its lifetime), and
/// until when it may still be used should the exchange fail (its lifetime less an eighth, at
/// most a minute: a request sent then still arrives before the token expires).
#[derive(Clone)]
pub(crate) struct Fresh {
    value: String,
    due: Instant,
    usable_until: Instant,
}

impl ServiceKey {
    fn signer(&self) -> Result<RsaKeyPair, Error> {
        let body: String = self
            .private_key
            .lines()
            .filter(|line| !line.starts_with("-----"))
            .collect();
        let der = STANDARD
            .decode(body.trim())
            .map_err(|_| bad_key(&self.path, "its private_key is not PEM"))?;
        RsaKeyPair::from_pkcs8(&der).map_err(|err| {
            bad_key(
                &self.path,
                format!("its private_key is not a PKCS#8 RSA key ({err})"),
            )
        })
    }

    fn token_uri(&self) -> &str {
        self.token_uri.as_deref().unwrap_or(DEFAULT_TOKEN_URI)
    }

    /// A signed JWT asking for a one-hour token for Cloud Storage.
    fn assertion(&self, signer: &RsaKeyPair) -> Result<String, Error> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut header = json!({ "alg": "RS256", "typ": "JWT" });
        if let Some(kid) = &self.private_key_id {
            header["kid"] = json!(kid);
        }
        let claims = json!({
            "iss": self.client_email,
            "scope": SCOPE,
            "aud": self.token_uri(),
            "iat": now,
            "exp": now + 3600,
        });
        let message = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let mut signature = vec![0; signer.public().modulus_len()];
        signer
            .sign(
                &RSA_PKCS1_SHA256,
                &SystemRandom::new(),
                message.as_bytes(),
                &mut signature,
            )
            .map_err(|_| bad_key(&self.path, "signing with its private_key failed"))?;
        Ok(format!("{message}.{}", URL_SAFE_NO_PAD.encode(signature)))
    }

    /// Exchanges the signed assertion for an access token at `token_uri`, with when to
    /// exchange again: after three quarters of the lifetime the endpoint gives (`expires_in`,
    /// one hour when absent).
    async fn fetch(&self, signer: &RsaKeyPair, client: &reqwest::Client) -> Result<Fresh, Error> {
        let asked = Instant::now();
        let uri = self.token_uri();
        let unavailable = |why: String| {
            Error::unavailable(
                format!("cannot get a GCS access token from `{uri}`: {why}"),
                "check the network and the token endpoint, then retry",
            )
        };
        let form = format!(
            "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion={}",
            self.assertion(signer)?
        );
        let request = client
            .post(uri)
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(form);
        let response = match crate::object::gcs::exchange(client, request).await {
            Ok(response) => response,
            // Asking again will not help: the key names a token endpoint that sends it away.
            Err(crate::object::upload::NoAnswer::Redirected(redirect)) => {
                return Err(bad_key(
                    &self.path,
                    format!("its token_uri: {redirect}; the signed assertion was not sent on"),
                ))
            }
            Err(err) => return Err(unavailable(err.to_string())),
        };
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|err| unavailable(err.to_string()))?;
        let body: serde_json::Value = serde_json::from_slice(&bytes).map_err(|err| {
            unavailable(format!("HTTP {status}, and the answer is not JSON: {err}"))
        })?;
        if status.is_client_error() {
            // `error` / `error_description` name the problem; they carry no secret.
            let why = ["error", "error_description"]
                .iter()
                .filter_map(|k| body[*k].as_str())
                .collect::<Vec<_>>()
                .join(": ");
            return Err(bad_key(
                &self.path,
                format!("`{uri}` refused it (HTTP {status}: {why})"),
            ));
        }
        let lifetime = Duration::from_secs(body["expires_in"].as_u64().unwrap_or(3600));
        match body["access_token"].as_str() {
            Some(token) if status.is_success() && !token.is_empty() => Ok(Fresh {
                value: token.to_owned(),
                due: asked + lifetime * 3 / 4,
                usable_until: asked + lifetime - (lifetime / 8).min(Duration::from_secs(60)),
            }),
            _ => Err(unavailable(format!(
                "HTTP {status} without an access_token"
            ))),
        }
    }
}

/// How soon an exchange that failed is tried again while the current token still works.
const RETRY_EXCHANGE: Duration = Duration::from_secs(2);

impl Auth {
    /// The bearer token for a request, if any (for a service account: exchanged on first use
    /// and again when it is due).
    pub async fn bearer(&self, client: &reqwest::Client) -> Result<Option<String>, Error> {
        match self {
            Auth::Anonymous => Ok(None),
            Auth::Token(token) => Ok(Some(token.clone())),
            Auth::ServiceAccount { key, signer, token } => {
                let current = token.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let now = Instant::now();
                match current {
                    Some(fresh) if now < fresh.due => Ok(Some(fresh.value)),
                    _ => match key.fetch(signer, client).await {
                        Ok(fresh) => {
                            let value = fresh.value.clone();
                            *token.lock().unwrap_or_else(|e| e.into_inner()) = Some(fresh);
                            Ok(Some(value))
                        }
                        // The endpoint is down for now (or refuses, or redirects, as a
                        // misconfigured one might start to), but the token still works: keep
                        // it, and ask again in a few seconds (a run's token is not thrown away
                        // at three quarters of its life by a failing endpoint; the error
                        // stands once no usable token is left).
                        Err(_) if current.as_ref().is_some_and(|f| now < f.usable_until) => {
                            let mut kept = current.expect("checked");
                            kept.due = now + RETRY_EXCHANGE;
                            let value = kept.value.clone();
                            *token.lock().unwrap_or_else(|e| e.into_inner()) = Some(kept);
                            Ok(Some(value))
                        }
                        Err(err) => Err(err),
                    },
                }
            }
        }
    }

    /// Whether a refused token can be replaced by a fresh one.
    pub fn refreshable(&self) -> bool {
        matches!(self, Auth::ServiceAccount { .. })
    }

    /// Drops the current token (the server refused it): the next request exchanges the key.
    pub fn forget(&self) {
        if let Auth::ServiceAccount { token, .. } = self {
            *token.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }

    /// Where the credentials come from, for messages.
    pub fn describe(&self) -> &'static str {
        match self {
            Auth::Anonymous => {
                "no credentials: neither GOOGLE_OAUTH_ACCESS_TOKEN nor GOOGLE_APPLICATION_CREDENTIALS is set"
            }
            Auth::Token(_) => "the static token in GOOGLE_OAUTH_ACCESS_TOKEN, which expires and cannot be renewed by fence",
            Auth::ServiceAccount { .. } => {
                "the service-account key in GOOGLE_APPLICATION_CREDENTIALS"
            }
        }
    }
}
