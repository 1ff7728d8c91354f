//! The figures of a plan that runs as fresh copies, for `EXPLAIN ANALYZE`.
//!
//! A recursive query runs its recursive term once per iteration, each time
//! as a fresh copy of the planned term (`reset_plan_states`: a join's build
//! side and the like are kept in an operator's state), and a shared subplan
//! over an iteration's rows is computed again in each iteration the same
//! way; so the planned plan never runs, and `EXPLAIN ANALYZE` showed none
//! of its operators' figures (nor does DataFusion's own recursive query).
//! Under `EXPLAIN ANALYZE` ([`analyze`]) the first copy to run is kept and
//! shown in place of the planned plan, and each later copy's figures are
//! added into it: every operator shows its totals over all iterations.
//! Only then: the kept copy holds its operators' state (a join's build
//! side) until the query ends.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use datafusion::physical_plan::ExecutionPlan;

use super::iterate::IterateExec;
use super::shared::SharedExec;

/// The copies of one plan that ran; see the [module docs](self).
#[derive(Debug, Default)]
pub(crate) struct Runs {
    /// Whether the plan is under `EXPLAIN ANALYZE`.
    analyzed: AtomicBool,
    /// The first copy that ran, with the later copies' figures added.
    first: OnceLock<Arc<dyn ExecutionPlan>>,
}

impl Runs {
    /// No copy run yet, under `EXPLAIN ANALYZE` where `runs` is.
    pub(crate) fn like(runs: &Runs) -> Self {
        let analyzed = AtomicBool::new(runs.analyzed.load(Ordering::Acquire));
        Self {
            analyzed,
            first: OnceLock::new(),
        }
    }

    /// The plan to show for `planned`: the first copy, once one has run.
    pub(crate) fn shown<'a>(
        &'a self,
        planned: &'a Arc<dyn ExecutionPlan>,
    ) -> &'a Arc<dyn ExecutionPlan> {
        self.first.get().unwrap_or(planned)
    }

    /// `copy`, a fresh copy of the planned plan, has run: kept if it is the
    /// first, else its figures added into the first's (under `EXPLAIN
    /// ANALYZE` only).
    pub(crate) fn ran(&self, copy: &Arc<dyn ExecutionPlan>) {
        if !self.analyzed.load(Ordering::Acquire) {
            return;
        }
        if let Err(copy) = self.first.set(Arc::clone(copy)) {
            let first = self.first.get().expect("set before");
            add_figures(first, &copy);
        }
    }
}

/// Marks the loops and shared subplans of `plan` (an `EXPLAIN ANALYZE`'s
/// input) to keep the figures of the copies they run.
pub(crate) fn analyze(plan: &Arc<dyn ExecutionPlan>) {
    mark(plan, &mut HashSet::new());
}

/// [`analyze`]; each shared input walked once (`seen`, by address).
fn mark(plan: &Arc<dyn ExecutionPlan>, seen: &mut HashSet<usize>) {
    if let Some(iterate) = plan.downcast_ref::<IterateExec>() {
        iterate.runs().analyzed.store(true, Ordering::Release);
    }
    if let Some(shared) = plan.downcast_ref::<SharedExec>() {
        if seen.insert(Arc::as_ptr(shared.input()) as *const () as usize) {
            shared.runs().analyzed.store(true, Ordering::Release);
            mark(shared.input(), seen);
        }
    }
    for child in plan.children() {
        mark(child, seen);
    }
}

/// Adds the figures of `from`'s operators into those of the same operators
/// of `into` (the same plan's first copy that ran). A figure that the copy
/// shares with it (an operator whose copies keep one set of metrics) is
/// not added again; one `into` did not register is left out, and so is an
/// operator (with its inputs) that is not the same in both (a shared
/// subplan computed by another occurrence's rewrite of it).
fn add_figures(into: &Arc<dyn ExecutionPlan>, from: &Arc<dyn ExecutionPlan>) {
    if into.name() != from.name() || into.children().len() != from.children().len() {
        return;
    }
    if let (Some(kept), Some(added)) = (into.metrics(), from.metrics()) {
        for metric in added.iter() {
            let same = kept.iter().find(|m| {
                m.partition() == metric.partition()
                    && m.value().name() == metric.value().name()
                    && m.labels() == metric.labels()
            });
            match same {
                Some(m) if !Arc::ptr_eq(m, metric) => {
                    // Counts, times and timestamps are shared cells: a clone
                    // adds into the operator's own.
                    m.value().clone().aggregate(metric.value());
                }
                _ => {}
            }
        }
    }
    for (into, from) in into.children().into_iter().zip(from.children()) {
        add_figures(into, from);
    }
}
