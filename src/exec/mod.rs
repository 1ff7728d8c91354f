//! The operators and physical rules: how derivatives *run*, as
//! `datafusion-physical-plan` and `datafusion-physical-optimizer` are to
//! DataFusion's logical layer. No file here differentiates or reads a
//! logical node of [`crate::plan`]; [`crate::physical_planner`] plans those
//! into these operators.
//!
//! - [`broadcast_aggregate`]: the physical rule that broadcasts a global
//!   aggregate, and its operator;
//! - [`contraction`]: the physical rule that computes a `GROUP BY` of sums
//!   of products over an inner equijoin (a matrix product, or a chain of
//!   two joins: a matrix factorization's prediction) without the joined
//!   rows, and its operator;
//! - [`shared`]: a subplan computed once per query, read by every
//!   occurrence;
//! - [`iterate`]: recursive queries whose recursive term reads the work
//!   table more than once, iterated by an operator of our own;
//! - [`iterations`]: the bound on a recursive query's iterations, and their
//!   progress;
//! - [`loop_invariant`]: the parts of a recursive term that do not read the
//!   work table (a training loop's data), computed once for all iterations;
//! - [`kept_join`]: a recursive term's hash join over such a part, its hash
//!   table built once for all iterations;
//! - [`split_scan`]: a loop's data file of one row group read by every
//!   core;
//! - [`serial_iterations`]: the rows an iteration passes on kept in their
//!   partitions (no round-robin repartition per iteration);
//! - [`step_projections`]: a recursive term's stacked projections evaluated
//!   by one operator;
//! - [`adjoint_loop`]: each row's iterations replayed forwards, then
//!   backwards through the step's vector-Jacobian product;
//! - [`history`]: a training loop's rows passed on with checkpoints kept,
//!   and each backward step's row of the iteration before, replayed from
//!   them;
//! - [`overwrite`]: a table's contents replaced by an `UPDATE`'s rows;
//! - [`group_join`], [`row_index`]: a gradient table summed into the
//!   parameter rows.
//!
//! What every operator writes alike (its name, children, properties when
//! they are its input's or its own) is written once, in `kit`.

pub mod adjoint_loop;
pub mod broadcast_aggregate;
pub mod contraction;
pub mod group_join;
pub mod history;
pub mod iterate;
pub mod iterations;
pub mod kept_join;
pub(crate) mod kit;
pub mod loop_invariant;
pub mod overwrite;
pub mod row_index;
pub(crate) mod runs;
pub mod serial_iterations;
pub mod shared;
pub mod split_scan;
pub mod step_projections;

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::compute::BatchCoalescer;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::internal_err;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::error::Result;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning};
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode, PhysicalGroupBy};
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::recursive_query::RecursiveQueryExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, PlanProperties};

use shared::SharedExec;

/// A rewrite of a physical plan, saying whether it changed it.
pub(crate) type PlanRewrite =
    dyn Fn(Arc<dyn ExecutionPlan>) -> Result<Transformed<Arc<dyn ExecutionPlan>>>;

/// `plan` with the recursive term of every recursive query in it
/// (DataFusion's `RecursiveQueryExec`, our [`iterate::IterateExec`])
/// rewritten by `term`, and so the inputs of the shared subplans it reads
/// that are computed in every iteration (a loss's forward pass that a
/// gradient's backward pass reads again); static terms, run once, are left
/// as they are. The physical rules about loops use it.
pub(crate) fn rewrite_recursive_terms(
    plan: Arc<dyn ExecutionPlan>,
    term: &PlanRewrite,
) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let recursive = node.downcast_ref::<RecursiveQueryExec>().is_some()
            || node.downcast_ref::<iterate::IterateExec>().is_some();
        if !recursive {
            return Ok(Transformed::no(node));
        }
        let children: Vec<Arc<dyn ExecutionPlan>> = node.children().into_iter().cloned().collect();
        let [static_term, recursive_term] = <[_; 2]>::try_from(children)
            .or_else(|_| internal_err!("a recursive query has two children"))?;
        let rewritten = with_shared_inputs(recursive_term, term, &mut HashMap::new())?;
        match rewritten.transformed {
            true => Ok(Transformed::yes(replace_children_if_necessary(
                node,
                vec![static_term, rewritten.data],
            )?)),
            false => Ok(Transformed::no(node)),
        }
    })
    .data()
}

/// `plan` rewritten by `rewrite`, and the inputs of the shared subplans in
/// it that are computed in every iteration too (each input once: `done`,
/// by the input's address, with the input itself so that the address stays
/// its own). A rewritten input that would change what its readers were
/// planned for (its partitioning, its order) is left as it was.
fn with_shared_inputs(
    plan: Arc<dyn ExecutionPlan>,
    rewrite: &PlanRewrite,
    done: &mut SharedInputs,
) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
    rewrite(plan)?.transform_parent(|plan| {
        plan.transform_down(|node| {
            let Some(shared) = node.downcast_ref::<SharedExec>() else {
                return Ok(Transformed::no(node));
            };
            if !shared.reads_iterations() {
                return Ok(Transformed::no(node));
            }
            let was = shared.input();
            let key = Arc::as_ptr(was) as *const () as usize;
            let input = match done.get(&key) {
                Some((_, input)) => Arc::clone(input),
                None => {
                    let new = with_shared_inputs(Arc::clone(was), rewrite, done)?.data;
                    let same_output = serves(new.output_partitioning(), was.output_partitioning())
                        && new.output_ordering() == was.output_ordering();
                    let input = match same_output {
                        true => new,
                        false => Arc::clone(was),
                    };
                    done.insert(key, (Arc::clone(was), Arc::clone(&input)));
                    input
                }
            };
            Ok(match Arc::ptr_eq(&input, was) {
                true => Transformed::no(node),
                false => {
                    Transformed::yes(Arc::new(shared.with_input(input)) as Arc<dyn ExecutionPlan>)
                }
            })
        })
    })
}

/// A coalescer of rows to keep in memory (a shared subplan's result, a
/// loop's rows for its next iteration): batches of fewer than half of
/// `size` rows compacted into batches of `size`, larger ones kept as they
/// are. Each batch kept costs its arrays' buffers and headers and every
/// reader one more step (a table made by a `CROSS JOIN` of series, or by
/// many `INSERT`s, arrives in hundreds of small batches).
pub(crate) fn compactor(schema: SchemaRef, size: usize) -> BatchCoalescer {
    BatchCoalescer::new(schema, size).with_biggest_coalesce_batch_size(Some(size / 2))
}

/// Whether rows split as `given` serve a reader planned for rows split as
/// `wanted`: hashed alike where it was planned for hashed rows, else in as
/// many partitions. (`Partitioning`'s own `==` never holds for
/// `UnknownPartitioning`, nothing being known of either; a reader planned
/// for rows not hashed reads any split into n partitions alike.)
pub(crate) fn serves(given: &Partitioning, wanted: &Partitioning) -> bool {
    given == wanted
        || (!matches!(wanted, Partitioning::Hash(..))
            && given.partition_count() == wanted.partition_count())
}

/// The shared inputs rewritten so far, by the address of the input: the
/// input and its rewrite.
type SharedInputs = HashMap<usize, (Arc<dyn ExecutionPlan>, Arc<dyn ExecutionPlan>)>;

/// What a top-down rewrite of a physical plan ([`rewrite_down`]) does at
/// one node.
pub(crate) enum Visit {
    /// Puts this plan in the node's place.
    Replace(Arc<dyn ExecutionPlan>),
    /// Leaves the node and everything under it as they are.
    Stop,
    /// Visits the node's children.
    Descend,
}

/// What [`rewrite_down`] does at a node, given its parent's flag.
pub(crate) type VisitNode<'a> = &'a dyn Fn(&Arc<dyn ExecutionPlan>, bool) -> Result<Visit>;

/// The flag [`rewrite_down`] gives a node's child `i`, from the node and its
/// own flag.
pub(crate) type PassOn<'a> = &'a dyn Fn(&Arc<dyn ExecutionPlan>, usize, bool) -> bool;

/// `plan` rewritten from its root down by `visit`, which sees each node
/// with the flag its parent passed on (`flag` at the root); `pass_on(parent,
/// i, flag)` is the flag of the parent's child `i`. A node whose children
/// changed is rebuilt, its properties recomputed (a child may now have
/// other partitions). The physical rules whose choice at a node depends on
/// what lies above it use it.
pub(crate) fn rewrite_down(
    plan: Arc<dyn ExecutionPlan>,
    flag: bool,
    visit: VisitNode,
    pass_on: PassOn,
) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
    match visit(&plan, flag)? {
        Visit::Replace(new) => return Ok(Transformed::yes(new)),
        Visit::Stop => return Ok(Transformed::no(plan)),
        Visit::Descend => {}
    }
    let mut changed = false;
    let mut children = Vec::new();
    for (i, child) in plan.children().into_iter().enumerate() {
        let child = rewrite_down(Arc::clone(child), pass_on(&plan, i, flag), visit, pass_on)?;
        changed |= child.transformed;
        children.push(child.data);
    }
    Ok(match changed {
        true => Transformed::yes(replace_children_if_necessary(plan, children)?),
        false => Transformed::no(plan),
    })
}

/// `plan` where it is a round-robin repartition that does not keep the
/// rows' order: it deals batches to partitions, and no rows depend on where
/// they land.
pub(crate) fn dealt(plan: &Arc<dyn ExecutionPlan>) -> Option<&RepartitionExec> {
    let r = plan.downcast_ref::<RepartitionExec>()?;
    (matches!(r.partitioning(), Partitioning::RoundRobinBatch(_)) && !r.preserve_order())
        .then_some(r)
}

/// `aggregate`'s aggregates (and their filters) in `mode`, grouped by
/// `group_by`, over `input`: one step of an aggregate made of another (a
/// single aggregate split into its partial and final steps, or the two
/// joined again).
pub(crate) fn aggregate_as(
    aggregate: &AggregateExec,
    mode: AggregateMode,
    group_by: PhysicalGroupBy,
    input: Arc<dyn ExecutionPlan>,
) -> Result<AggregateExec> {
    AggregateExec::try_new(
        mode,
        group_by,
        aggregate.aggr_expr().to_vec(),
        aggregate.filter_expr().to_vec(),
        input,
        aggregate.input_schema(),
    )
}

/// The one child in `children` (what `ExecutionPlan::with_new_children`
/// gives an operator of one input, `name`), or an internal error.
pub(crate) fn only_child(
    children: Vec<Arc<dyn ExecutionPlan>>,
    name: &str,
) -> Result<Arc<dyn ExecutionPlan>> {
    match <[_; 1]>::try_from(children) {
        Ok([child]) => Ok(child),
        Err(_) => internal_err!("{name} has one child"),
    }
}

/// `plan` with `left` and `right` as the inputs of its first join of type
/// `J` (from the top): how an operator that replaces an aggregate and its
/// join is rebuilt over new inputs, and travels to Ballista's executors as
/// the plan it replaces.
pub(crate) fn at_join<J: ExecutionPlan + 'static>(
    plan: Arc<dyn ExecutionPlan>,
    left: Arc<dyn ExecutionPlan>,
    right: Arc<dyn ExecutionPlan>,
) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_down(|node| {
        Ok(match node.downcast_ref::<J>() {
            Some(_) => Transformed::new(
                replace_children_if_necessary(node, vec![Arc::clone(&left), Arc::clone(&right)])?,
                true,
                TreeNodeRecursion::Jump,
            ),
            None => Transformed::no(node),
        })
    })
    .data()
}

/// The properties of an operator that computes all its rows before it
/// returns any, in one partition, of `schema`.
pub(crate) fn one_final_partition(schema: &SchemaRef) -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(Arc::clone(schema)),
        Partitioning::UnknownPartitioning(1),
        EmissionType::Final,
        Boundedness::Bounded,
    ))
}
