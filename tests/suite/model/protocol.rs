//! Model-checked lease and fencing protocols (issue 36), the PostgreSQL coordinator first.
//!
//! `postgres` is the coordinator's one-shot statements and the target's guard as a
//! [stateright](https://docs.rs/stateright) model; the tests here check it exhaustively for
//! I1, I3 and the fencing property (DESIGN §6), breadth first and one state for each class
//! of states that differ only in the names of clients and resources; show that it is not
//! vacuous (its `sometimes` properties have examples); and that each of its mutants (a bug
//! brought back) yields a counterexample, a shortest one. `replay` links the model to the
//! code: a history recorded from the real coordinator and target is run through the model,
//! step by step. `directory` is the local directory store, checked the same way; the object
//! store model is still to come.

mod directory;
mod ghost;
mod postgres;
mod replay;

use std::collections::BTreeSet;
use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Path};

use directory::DirModel;
use postgres::{Mutant, PgModel, FENCING, I1, I3};

/// The reachable states of [`PgModel::bounded`]: the check is complete only when it visited
/// exactly these (a bound that changes the model changes this number, and docs/guarantees.md).
const BOUNDED_STATES: usize = 146_725;

/// The actions of a path, one a line.
fn steps<S, A: std::fmt::Debug>(path: Path<S, A>) -> String {
    path.into_actions()
        .iter()
        .enumerate()
        .map(|(i, action)| format!("{:>3}. {action:?}", i + 1))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_postgres_model_keeps_i1_i3_and_fencing_in_every_reachable_state() {
    let started = Instant::now();
    let checker = PgModel::bounded().checker().threads(1).spawn_bfs().join();
    let elapsed = started.elapsed();
    println!(
        "PostgreSQL model: {} states ({} generated), depth {}, in {:.1?}",
        checker.unique_state_count(),
        checker.state_count(),
        checker.max_depth(),
        elapsed
    );
    for always in [I1, I3, FENCING] {
        if let Some(path) = checker.discovery(always) {
            panic!("counterexample to `{always}`:\n{}", steps(path));
        }
    }
    assert_eq!(
        checker.unique_state_count(),
        BOUNDED_STATES,
        "not every reachable state was checked (or the model changed: update BOUNDED_STATES \
         and docs/guarantees.md)"
    );
    // Not vacuous: every `sometimes` property has an example.
    checker.assert_properties();
}

/// A shortest counterexample to `property` in the model with `mutant`: the check is run to
/// depths 1, 2, … until one is found (a check to a depth records the last counterexample
/// it met, which may be longer than needed).
fn counterexample(mutant: Mutant, property: &'static str) -> String {
    shortest(|| PgModel::with(mutant), &format!("{mutant:?}"), property)
}

/// As [`counterexample`], for any model.
fn shortest<M>(model: impl Fn() -> M, name: &str, property: &'static str) -> String
where
    M: Model + Send + Sync + 'static,
    M::State: std::hash::Hash + Eq + Send + Sync + std::fmt::Debug + Clone + 'static,
    M::Action: std::fmt::Debug + Eq + Clone + Send + Sync + 'static,
{
    for depth in 1..=30 {
        let checker = model()
            .checker()
            .threads(1)
            .target_max_depth(depth)
            // A mutant's state space can be far larger than the model's (AsyncCommit's fills
            // gigabytes): a check that meets no counterexample stops here.
            .target_state_count(1_000_000)
            .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
            .spawn_bfs()
            .join();
        if let Some(path) = checker.discovery(property) {
            let steps = steps(path);
            println!("{name} breaks `{property}`:\n{steps}");
            return steps;
        }
    }
    panic!("{name}: no counterexample to `{property}` in 30 steps");
}

#[test]
fn a_takeover_that_keeps_the_old_token_breaks_i1() {
    let steps = counterexample(Mutant::TakeoverKeepsToken, I1);
    assert!(
        steps.contains("Tick"),
        "a takeover needs an expiry:\n{steps}"
    );
}

#[test]
fn grants_answered_before_they_are_durable_break_i1_at_a_restart() {
    let steps = counterexample(Mutant::AsyncCommit, I1);
    assert!(steps.contains("Restart"), "{steps}");
}

#[test]
fn expiry_judged_by_the_client_s_clock_breaks_i3() {
    let steps = counterexample(Mutant::ClientClock, I3);
    // Client 2, whose clock is ahead, takes over a lease still live by the server's clock.
    assert!(
        steps.contains("Tick") && steps.contains("(2, Acquire"),
        "{steps}"
    );
}

#[test]
fn a_renewal_without_the_owner_check_breaks_i3() {
    let steps = counterexample(Mutant::RenewWithoutOwnerCheck, I3);
    assert!(steps.contains("Renew"), "{steps}");
}

#[test]
fn a_guard_that_commits_apart_from_the_effect_breaks_fencing() {
    let steps = counterexample(Mutant::GuardApartFromEffect, FENCING);
    assert!(steps.contains("Effect"), "{steps}");
}

/// The reachable states of [`DirModel::bounded`] (see [`BOUNDED_STATES`]).
const DIRECTORY_STATES: usize = 1_898_094;

#[test]
fn the_directory_model_keeps_i1_i3_and_fencing_in_every_reachable_state() {
    let started = Instant::now();
    let checker = DirModel::bounded().checker().threads(1).spawn_bfs().join();
    println!(
        "directory model: {} states ({} generated), depth {}, in {:.1?}",
        checker.unique_state_count(),
        checker.state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    for always in [I1, I3, FENCING] {
        if let Some(path) = checker.discovery(always) {
            panic!("counterexample to `{always}`:\n{}", steps(path));
        }
    }
    assert_eq!(
        checker.unique_state_count(),
        DIRECTORY_STATES,
        "not every reachable state was checked (or the model changed: update DIRECTORY_STATES \
         and docs/guarantees.md)"
    );
    checker.assert_properties();
}

fn directory_counterexample(mutant: directory::Mutant, property: &'static str) -> String {
    shortest(
        || DirModel::with(mutant),
        &format!("directory {mutant:?}"),
        property,
    )
}

#[test]
fn a_directory_store_that_ignores_its_mark_reissues_a_token_after_a_power_loss() {
    let steps = directory_counterexample(directory::Mutant::IgnoreMark, I1);
    assert!(steps.contains("PowerLoss"), "{steps}");
}

#[test]
fn a_mark_written_without_sync_reissues_a_token_after_a_power_loss() {
    let steps = directory_counterexample(directory::Mutant::MarkNotSynced, I1);
    assert!(steps.contains("PowerLoss"), "{steps}");
}

#[test]
fn a_directory_takeover_that_keeps_the_old_token_breaks_i1() {
    let steps = directory_counterexample(directory::Mutant::TakeoverKeepsToken, I1);
    // The lease taken over ended by the clock, or with the boot it was granted in.
    assert!(
        steps.contains("Tick") || steps.contains("PowerLoss"),
        "{steps}"
    );
}

#[test]
fn a_directory_renewal_without_the_owner_check_breaks_i3() {
    let steps = directory_counterexample(directory::Mutant::RenewWithoutOwnerCheck, I3);
    assert!(steps.contains("Renew"), "{steps}");
}

#[test]
fn expiry_by_the_wall_clock_breaks_i3_on_the_directory_store() {
    let steps = directory_counterexample(directory::Mutant::WallClock, I3);
    assert!(steps.contains("(2, Acquire"), "{steps}");
}
