//! Randomised workloads of real fence processes under injected faults, judged by a history
//! checker; and the protocols as models, checked exhaustively (`protocol`).

mod adversarial;
mod protocol;
