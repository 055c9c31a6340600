//! Upload bodies that report their progress: sent in 64 KiB frames, each counted on a
//! progress bar when the HTTP client asks for it (so the bar follows the socket, not the
//! memory copy). `fence write` shows the bar on a terminal for large objects; everywhere else
//! the bar is hidden and counting costs nothing. And [`exchange`]: every S3 and GCS request
//! with its answer, under fence's own timer.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use indicatif::ProgressBar;

const FRAME: usize = 64 * 1024;

/// A request body that counts the bytes handed to the client on `bar`. It may be made of
/// several parts (a multipart upload's envelope around the object's bytes), sent in order
/// without ever being copied into one buffer: an upload holds the object's bytes once.
pub struct Counted {
    parts: std::collections::VecDeque<Bytes>,
    bar: ProgressBar,
}

impl Counted {
    /// A body of `parts`, one after the other. Starts the bar over: a retried request sends
    /// everything again.
    pub fn parts(parts: Vec<Bytes>, bar: ProgressBar) -> Counted {
        let parts: std::collections::VecDeque<Bytes> =
            parts.into_iter().filter(|p| !p.is_empty()).collect();
        bar.set_length(parts.iter().map(|p| p.len() as u64).sum());
        bar.set_position(0);
        Counted { parts, bar }
    }

    fn remaining(&self) -> u64 {
        self.parts.iter().map(|p| p.len() as u64).sum()
    }
}

impl Body for Counted {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let Some(part) = self.parts.front_mut() else {
            return Poll::Ready(None);
        };
        let n = part.len().min(FRAME);
        let frame = part.split_to(n);
        if part.is_empty() {
            self.parts.pop_front();
        }
        self.bar.inc(n as u64);
        Poll::Ready(Some(Ok(Frame::data(frame))))
    }

    fn is_end_stream(&self) -> bool {
        self.parts.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining())
    }
}

/// How long a request carrying `bytes` may take: 30 s, plus a second per MiB (a link slower
/// than 1 MiB/s times out rather than hangs).
pub fn timeout(bytes: usize) -> Duration {
    Duration::from_secs(30 + (bytes as u64 >> 20))
}

/// Why a request got no answer fence can use.
#[derive(Debug, thiserror::Error)]
pub enum NoAnswer {
    #[error("{0}")]
    Http(#[from] reqwest::Error),
    #[error("the request and its answer did not complete within {}", crate::time::duration(*.0))]
    Timeout(Duration),
    #[error(transparent)]
    Redirected(#[from] Redirected),
}

/// The server answered with a redirect, which fence never follows (its clients are built
/// with [`reqwest::redirect::Policy::none`]): the request's credentials (an S3 session token
/// is a plain header, which reqwest keeps on a redirect to another host) would go to another
/// server, and a conditional write would be judged by a server fence never checked. Nothing
/// was applied: the server answered without doing it.
#[derive(Debug, thiserror::Error)]
#[error("the server at `{from}` answered with a redirect (HTTP {status}{}), which fence does not follow", .to.as_ref().map(|to| format!(" to `{to}`")).unwrap_or_default())]
pub struct Redirected {
    pub status: u16,
    /// The server that answered so: the origin (scheme, host and port) of the request.
    pub from: String,
    /// Where to: the origin of its `Location`, never its path or query (a presigned URL's
    /// signature) or user.
    pub to: Option<String>,
    /// The bucket's region, when S3 names it (`x-amz-bucket-region`): a bucket asked for in
    /// the wrong region is answered 301.
    pub region: Option<String>,
}

impl Redirected {
    /// A redirect, if `status` is one (not 304 Not Modified, 305 or 306).
    fn of(status: u16, from: &reqwest::Url, headers: &http::HeaderMap) -> Option<Redirected> {
        if ![300, 301, 302, 303, 307, 308].contains(&status) {
            return None;
        }
        let origin = |url: &reqwest::Url| {
            Some(url.origin().ascii_serialization()).filter(|origin| origin != "null")
        };
        let to = headers
            .get(http::header::LOCATION)
            .and_then(|location| location.to_str().ok())
            .and_then(|location| from.join(location).ok())
            .and_then(|url| origin(&url));
        let region = headers
            .get("x-amz-bucket-region")
            .and_then(|region| region.to_str().ok())
            .filter(|region| {
                !region.is_empty()
                    && region
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            })
            .map(str::to_owned);
        Some(Redirected {
            status,
            from: origin(from).unwrap_or_else(|| from.scheme().to_owned()),
            to,
            region,
        })
    }
}

/// A client for an object store: no redirect is followed (see [`Redirected`]), and no
/// timeout of reqwest's ([`exchange`] bounds every request by fence's timer).
pub fn client(builder: reqwest::ClientBuilder) -> reqwest::Result<reqwest::Client> {
    crate::sys::crypto_ready();
    builder.redirect(reqwest::redirect::Policy::none()).build()
}

/// Sends `request` and reads its answer whole (head and body) within `limit`, by fence's
/// timer, not reqwest's, which looks at its timer before the answer: a pause past the limit
/// gets a last look ([`crate::time::answer_within`]), so an answer that came while fence was
/// stopped is read, not timed out. A refusal (not 2xx) whose body cannot be read, or has not
/// come [`REFUSAL_BODY_WITHIN`] after its head, keeps its status, with an empty body: the
/// status says what it means. A redirect is an error ([`Redirected`]).
pub async fn exchange(
    client: &reqwest::Client,
    request: reqwest::Request,
    limit: Duration,
) -> Result<(http::response::Parts, Bytes), NoAnswer> {
    let started = tokio::time::Instant::now();
    let url = request.url().clone();
    let response = crate::time::answer_within(limit, client.execute(request))
        .await
        .map_err(|_| NoAnswer::Timeout(limit))??;
    let (parts, body) = http::Response::<reqwest::Body>::from(response).into_parts();
    if let Some(redirect) = Redirected::of(parts.status.as_u16(), &url, &parts.headers) {
        return Err(redirect.into());
    }
    let left = limit.saturating_sub(started.elapsed());
    let body = http_body_util::BodyExt::collect(body);
    if parts.status.is_success() {
        let body = crate::time::answer_within(left, body)
            .await
            .map_err(|_| NoAnswer::Timeout(limit))??;
        return Ok((parts, body.to_bytes()));
    }
    // A refusal: its status says what it means, its body only explains it. A body that
    // cannot be read, or does not come (a server or proxy stalled mid-answer), is left out
    // rather than turning a definite refusal into no answer.
    let body = match crate::time::answer_within(left.min(REFUSAL_BODY_WITHIN), body).await {
        Ok(Ok(body)) => body.to_bytes(),
        Ok(Err(_)) | Err(_) => Bytes::new(),
    };
    Ok((parts, body))
}

/// How long the body of a refusal (not 2xx) may take once its head came.
const REFUSAL_BODY_WITHIN: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// The object stores' HTTP client (TLS with AWS-LC, which AWS-LC's constructor no longer
    /// prepares: `.cargo/config.toml`) has AWS-LC learn the CPU first.
    #[test]
    fn the_client_readies_aws_lc_first() {
        client(reqwest::Client::builder()).unwrap();
        assert!(crate::sys::aws_lc_knows_the_cpu());
    }

    #[tokio::test]
    async fn frames_add_up_to_the_body_and_are_counted() {
        let data: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let bar = ProgressBar::hidden();
        let body = Counted::parts(vec![Bytes::from(data.clone())], bar.clone());
        assert_eq!(body.size_hint().exact(), Some(200_000));
        let sent = body.collect().await.unwrap().to_bytes();
        assert_eq!(sent.as_ref(), data.as_slice());
        assert_eq!((bar.position(), bar.length()), (200_000, Some(200_000)));

        let parts = vec![
            Bytes::from_static(b"head"),
            Bytes::from(data.clone()),
            Bytes::new(),
            Bytes::from_static(b"tail"),
        ];
        let body = Counted::parts(parts, bar.clone());
        assert_eq!(body.size_hint().exact(), Some(200_008));
        let sent = body.collect().await.unwrap().to_bytes();
        assert_eq!(&sent[..4], b"head");
        assert_eq!(&sent[4..200_004], data.as_slice());
        assert_eq!(&sent[200_004..], b"tail");
        assert_eq!(bar.position(), 200_008);
    }
}
