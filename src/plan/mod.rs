//! The plan-level rewrites: what differentiating a query needs beyond one
//! expression, built on the engine ([`crate::engine`]).
//!
//! - [`analyzer`]: the analyzer rule installed with the markers, and its
//!   rewrites through aggregates and scalar subqueries (child modules);
//! - [`lineage`]: where a column a marker reads comes from (derived columns
//!   inlined, re-reads of the variable's rows refused);
//! - [`reverse`]: relational reverse mode, the gradient of a loss query
//!   with respect to every row of a parameter relation (a backward pass
//!   over the loss's plan, one transpose per relational operator);
//! - [`free_variables`]: variables from outside the rows (outer references,
//!   `PREPARE` parameters) localized as columns;
//! - [`expand`]: one marker call as self-contained expressions (what
//!   `simplify` returns);
//! - [`bindings`]: the projections that bind shared parts, written back
//!   inline for the text export and DML;
//! - [`dml`]: `UPDATE`/`DELETE` over computed columns;
//! - [`overwrite`]: `UPDATE` with a gradient with respect to the table's
//!   own rows, as a replacement of its contents;
//! - [`broadcast`]: the physical rule that broadcasts a global aggregate;
//! - [`shared`]: subplans read several times (the forward aggregates a
//!   backward pass reads again) computed once per query;
//! - [`iterate`]: recursive queries whose recursive term reads the work
//!   table more than once (a training step's loss over its parameters);
//! - [`iterations`]: the bound on a recursive query's iterations, and their
//!   progress;
//! - [`invariant`]: the parts of a recursive term that do not read the work
//!   table (a training loop's data), computed once for all iterations;
//! - [`split_scan`]: a loop's data file of one row group read by every
//!   core;
//! - [`serial_iterations`]: the rows an iteration passes on kept in their
//!   partitions (no round-robin repartition per iteration);
//! - [`step_projections`]: a recursive term's stacked projections evaluated
//!   by one operator;
//! - [`adjoint_loop`]: reverse mode through a recursive query's iterations
//!   (each row's iterations replayed forwards, then backwards).
//!
//! ```sql
//! -- through an aggregate: d/dw avg((w·x − y)²), one value per group
//! SELECT g, grad(avg(power(w * x - y, 2)), w) FROM t GROUP BY g, w;
//! ```

pub mod adjoint_loop;
pub mod analyzer;
pub mod bindings;
pub mod broadcast;
pub mod dml;
pub mod expand;
pub mod free_variables;
pub mod invariant;
pub mod iterate;
pub mod iterations;
pub mod lineage;
pub mod overwrite;
pub mod reverse;
pub mod serial_iterations;
pub mod shared;
pub mod split_scan;
pub mod step_projections;

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::common::{internal_err, NullEquality};
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, Join, JoinConstraint, JoinType, LogicalPlan};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning};
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::recursive_query::RecursiveQueryExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, PlanProperties};

/// A rewrite of a physical plan, saying whether it changed it.
pub(crate) type PlanRewrite =
    dyn Fn(Arc<dyn ExecutionPlan>) -> Result<Transformed<Arc<dyn ExecutionPlan>>>;

/// `plan` with the recursive term of every recursive query in it
/// (DataFusion's `RecursiveQueryExec`, our [`iterate::IterateExec`])
/// rewritten by `term`; static terms, run once, are left as they are. The
/// physical rules about loops use it.
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
        let rewritten = term(recursive_term)?;
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

/// Every column of `plan`'s output, as column expressions (a projection
/// passing its input on).
pub(crate) fn columns(plan: &LogicalPlan) -> Vec<Expr> {
    plan.schema()
        .columns()
        .into_iter()
        .map(Expr::Column)
        .collect()
}

/// Every row of `rows` with the row of `table` whose columns equal its own
/// `on` (NULLs equal; none: NULLs): how a gradient table is joined to the
/// rows it is of.
pub(crate) fn left_join_by_identity(
    rows: LogicalPlan,
    table: LogicalPlan,
    on: Vec<(Expr, Expr)>,
) -> Result<LogicalPlan> {
    Ok(LogicalPlan::Join(Join::try_new(
        Arc::new(rows),
        Arc::new(table),
        on,
        None,
        JoinType::Left,
        JoinConstraint::On,
        NullEquality::NullEqualsNull,
        false,
    )?))
}

/// `plan` where it is a round-robin repartition that does not keep the
/// rows' order: it deals batches to partitions, and no rows depend on where
/// they land.
pub(crate) fn dealt(plan: &Arc<dyn ExecutionPlan>) -> Option<&RepartitionExec> {
    let r = plan.downcast_ref::<RepartitionExec>()?;
    (matches!(r.partitioning(), Partitioning::RoundRobinBatch(_)) && !r.preserve_order())
        .then_some(r)
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

/// `e` without its top-level aliases.
pub(crate) fn unalias(e: &Expr) -> &Expr {
    match e {
        Expr::Alias(a) => unalias(&a.expr),
        e => e,
    }
}
