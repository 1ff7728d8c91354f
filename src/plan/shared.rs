//! Shared subplans: a subplan that a rewrite reads several times, computed
//! once per query.
//!
//! Relational reverse mode ([`crate::plan::reverse`]) reads the forward
//! plan's aggregates again in its backward pass: the loss's value, and each
//! aggregate as a leaf of the block above it and as the rows its adjoints
//! join. Planned as they are, DataFusion would compute each occurrence
//! anew — the whole forward query two or three times. A rewrite marks such
//! a subplan with [`share`] (a [`Shared`] logical node, which holds the
//! subplan without making it an input: the plan stays a DAG, however many
//! blocks read the subplan). When the plan is made physical, the subplan
//! is optimized and planned once, and every [`Shared`] node over an equal
//! subplan becomes a [`SharedExec`](crate::exec::shared::SharedExec) over it and one cache: the first of
//! them to run collects all of the subplan's partitions, and every
//! occurrence reads them. (A relational MLP's backward plan as a tree,
//! each shared subplan repeated at every read, took seconds to plan.)
//!
//! The cache is taken from the query's memory pool. A result that does not
//! fit is not kept, and every occurrence computes its input itself, as
//! without sharing. A subplan that reads the rows of a recursive query's
//! previous iteration ([`super::iterate`]) is kept for one iteration and
//! computed again in the next; any other is kept for the whole query (over
//! the iterations of a recursive query too).
//!
//! [`SharingPlanner`](crate::physical_planner::SharingPlanner), the query planner installed by [`crate::register`],
//! plans the [`Shared`] nodes; a planner that does not know them gets the
//! plan from [`unshare`].

use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::DFSchemaRef;
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, Extension, LogicalPlan, UserDefinedLogicalNodeCore};

use super::kit;

/// `plan`, marked to be computed once however often the query reads it
/// (see the [module docs](self)). A plan with parameters (`$1`, of a
/// `PREPARE`d statement) is left as it is, read anew where it is read: the
/// node hides its subplan from DataFusion, whose `EXECUTE` would not give
/// them their values there.
pub(crate) fn share(plan: LogicalPlan) -> LogicalPlan {
    if shared_input(&plan).is_some() || has_parameters(&plan) {
        return plan;
    }
    LogicalPlan::Extension(Extension {
        node: Arc::new(Shared {
            schema: Arc::clone(plan.schema()),
            fingerprint: fingerprint(&plan),
            input: Arc::new(plan),
        }),
    })
}

/// Whether `plan` (its subqueries and shared subplans too) has a
/// parameter placeholder (`$1`).
fn has_parameters(plan: &LogicalPlan) -> bool {
    let mut found = false;
    let searched = plan.apply_with_subqueries(|node| {
        found = match shared_input(node) {
            Some(input) => has_parameters(input),
            None => node.expressions().iter().any(|e| {
                e.exists(|e| Ok(matches!(e, Expr::Placeholder(_))))
                    .unwrap_or(true)
            }),
        };
        Ok(match found {
            true => TreeNodeRecursion::Stop,
            false => TreeNodeRecursion::Continue,
        })
    });
    found || searched.is_err()
}

/// The subplan `plan` holds if it is a [`Shared`] node.
pub(crate) fn shared_input(plan: &LogicalPlan) -> Option<&LogicalPlan> {
    match plan {
        LogicalPlan::Extension(e) => e
            .node
            .as_any()
            .downcast_ref::<Shared>()
            .map(|s| s.input.as_ref()),
        _ => None,
    }
}

/// The subplan of `plan` if it is a [`Shared`] node, else `plan`.
pub(crate) fn unshared(plan: &LogicalPlan) -> &LogicalPlan {
    shared_input(plan).unwrap_or(plan)
}

/// `plan` with every [`Shared`] node replaced by its input: the same
/// results, for a planner (Ballista's, an exporter) that does not know the
/// node.
pub fn unshare(plan: LogicalPlan) -> Result<LogicalPlan> {
    plan.transform_up_with_subqueries(|p| match shared_input(&p) {
        // Its subplan is not a child of the node: unshared on its own.
        Some(input) => Ok(Transformed::yes(unshare(input.clone())?)),
        None => Ok(Transformed::no(p)),
    })
    .map(|t| t.data)
}

/// The hash of `plan`, computed once when it is shared: the plan of a
/// backward pass holds the same subplan in many [`Shared`] nodes, nested,
/// and DataFusion hashes the whole plan at every optimizer pass (its
/// `LogicalPlanSignature`): hashing each node's subplan there would hash it
/// once per path that reaches it.
pub(super) fn fingerprint(plan: &LogicalPlan) -> u64 {
    let mut hasher = DefaultHasher::new();
    plan.hash(&mut hasher);
    hasher.finish()
}

/// A subplan computed once per query: the logical node of [`share`].
///
/// The subplan is not an input of the node (a leaf to DataFusion's
/// optimizer): the plan of a backward pass reads one shared subplan from
/// many places, and as a child it would be optimized and planned once per
/// read. [`SharingPlanner`](crate::physical_planner::SharingPlanner) optimizes and plans it once per query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shared {
    /// The input's hash (equal inputs, equal fingerprints): first, so that
    /// `Eq` tells different inputs apart before comparing them.
    fingerprint: u64,
    pub(crate) input: Arc<LogicalPlan>,
    /// The input's schema.
    pub(crate) schema: DFSchemaRef,
}

/// Hashes the input's fingerprint only (a nested [`Shared`] node's subplan
/// is not hashed again): consistent with `Eq`, which compares the inputs.
impl Hash for Shared {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.fingerprint.hash(state);
    }
}

impl PartialOrd for Shared {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        self.input.partial_cmp(&other.input)
    }
}

impl UserDefinedLogicalNodeCore for Shared {
    kit::node_without_expressions!("Shared", []);

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "Shared")
    }
}
