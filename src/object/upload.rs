//! Upload bodies that report their progress: sent in 64 KiB frames, each counted on a
//! progress bar when the HTTP client asks for it (so the bar follows the socket, not the
//! memory copy). `fence write` shows the bar on a terminal for large objects; everywhere else
//! the bar is hidden and counting costs nothing.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use indicatif::ProgressBar;

const FRAME: usize = 64 * 1024;

/// A request body that counts the bytes handed to the client on `bar`.
pub struct Counted {
    data: Bytes,
    bar: ProgressBar,
}

impl Counted {
    /// Starts the bar over: a retried request sends everything again.
    pub fn new(data: Bytes, bar: ProgressBar) -> Counted {
        bar.set_length(data.len() as u64);
        bar.set_position(0);
        Counted { data, bar }
    }
}

impl Body for Counted {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.data.is_empty() {
            return Poll::Ready(None);
        }
        let n = self.data.len().min(FRAME);
        let frame = self.data.split_to(n);
        self.bar.inc(n as u64);
        Poll::Ready(Some(Ok(Frame::data(frame))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.len() as u64)
    }
}

/// How long a request carrying `bytes` may take: 30 s, plus a second per MiB (a link slower
/// than 1 MiB/s times out rather than hangs).
pub fn timeout(bytes: usize) -> Duration {
    Duration::from_secs(30 + (bytes as u64 >> 20))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn frames_add_up_to_the_body_and_are_counted() {
        let data: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let bar = ProgressBar::hidden();
        let body = Counted::new(Bytes::from(data.clone()), bar.clone());
        assert_eq!(body.size_hint().exact(), Some(200_000));
        let sent = body.collect().await.unwrap().to_bytes();
        assert_eq!(sent.as_ref(), data.as_slice());
        assert_eq!((bar.position(), bar.length()), (200_000, Some(200_000)));
    }
}
