//! Randomised workloads of real fence processes under injected faults, judged by a history checker.

mod adversarial;
