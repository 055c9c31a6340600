//! The signals that ask fence to stop (SIGINT, SIGTERM, SIGHUP), caught instead of dying so
//! that what fence started is never left half done: `run` passes them on to its command,
//! `write` cancels its transaction on the server and reports what really happened.

use std::future::Future;

use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::error::Error;

pub struct Interrupts {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
}

impl Interrupts {
    /// Installs the handlers. Fails (never panics) when the process cannot, e.g. when it is
    /// out of file descriptors.
    pub fn install() -> Result<Interrupts, Error> {
        let handler = |kind| {
            signal(kind).map_err(|err| {
                Error::internal(
                    format!("cannot handle signals: {err}"),
                    "check the process's limits (`ulimit -n`: open files); nothing was done",
                )
            })
        };
        Ok(Interrupts {
            interrupt: handler(SignalKind::interrupt())?,
            terminate: handler(SignalKind::terminate())?,
            hangup: handler(SignalKind::hangup())?,
        })
    }

    /// A stop signal that already arrived, without waiting for one.
    pub fn pending(&mut self) -> Option<&'static str> {
        let next = std::pin::pin!(self.next());
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match next.poll(&mut cx) {
            std::task::Poll::Ready((_, name)) => Some(name),
            std::task::Poll::Pending => None,
        }
    }

    /// The next stop signal and its name.
    pub async fn next(&mut self) -> (rustix::process::Signal, &'static str) {
        use rustix::process::Signal;
        tokio::select! {
            _ = self.interrupt.recv() => (Signal::INT, "SIGINT"),
            _ = self.terminate.recv() => (Signal::TERM, "SIGTERM"),
            _ = self.hangup.recv() => (Signal::HUP, "SIGHUP"),
        }
    }
}
