//! DataFusion's `eliminate_cross_join` rule, kept from merging joins whose
//! NULL keys match differently.
//!
//! The rule flattens a tree of inner joins into its inputs and the pairs of
//! keys of all of them, and joins them again — every pair under the NULL
//! equality of the tree's top join (DataFusion 55). Where the tree mixes
//! `=` keys (NULL matches nothing) with `IS NOT DISTINCT FROM` keys (NULL
//! matches NULL) — the joins of group adjoints to their rows that the
//! backward passes write (`crate::plan::reverse`) over the joins of a loss,
//! or a user's own — a NULL key of an `=` join then matches a NULL: a row
//! joined that the query never joins, and a gradient sent to a parameter
//! row that no data row reached. [`CrossJoinsKeepingNulls`] takes the
//! rule's place in the optimizer and runs it only on trees whose joins agree
//! on NULLs (and that hold no tree that mixes them); a mixed tree is left as
//! written, its inputs optimized.
//!
//! ```sql
//! -- the row whose x.b and w.a are NULL is not joined
//! SELECT * FROM s JOIN (x JOIN w ON x.b = w.a) ON (s.k IS NOT DISTINCT FROM x.a);
//! ```

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::NullEquality;
use datafusion::error::Result;
use datafusion::logical_expr::{JoinType, LogicalPlan};
use datafusion::optimizer::eliminate_cross_join::EliminateCrossJoin;
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

/// DataFusion's [`EliminateCrossJoin`] where the joins it would merge agree
/// on NULL keys; see the [module docs](self). Installed in its place by
/// `crate::register`.
#[derive(Debug)]
pub struct CrossJoinsKeepingNulls {
    rule: EliminateCrossJoin,
}

impl Default for CrossJoinsKeepingNulls {
    fn default() -> Self {
        Self {
            rule: EliminateCrossJoin::new(),
        }
    }
}

impl OptimizerRule for CrossJoinsKeepingNulls {
    fn name(&self) -> &str {
        self.rule.name()
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        self.rule.apply_order()
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        if !holds_mixed(&plan)? {
            return self.rule.rewrite(plan, config);
        }
        // The rule would merge a mixed tree here or below: each input on
        // its own.
        plan.map_children(|child| self.rewrite(child, config))
    }
}

/// Whether `plan` holds a tree of inner joins (that the rule would flatten)
/// with both kinds of NULL equality.
fn holds_mixed(plan: &LogicalPlan) -> Result<bool> {
    let mut mixed = false;
    plan.apply(|node| {
        let mut seen = Vec::new();
        nulls_of_tree(node, &mut seen);
        mixed = seen.contains(&NullEquality::NullEqualsNull)
            && seen.contains(&NullEquality::NullEqualsNothing);
        Ok(match mixed {
            true => TreeNodeRecursion::Stop,
            false => TreeNodeRecursion::Continue,
        })
    })?;
    Ok(mixed)
}

/// The NULL equalities of the inner joins the rule flattens from `plan`
/// (an inner join, or a filter over one): it and its inner-join inputs,
/// down through inner joins.
fn nulls_of_tree(plan: &LogicalPlan, seen: &mut Vec<NullEquality>) {
    match plan {
        LogicalPlan::Filter(f) => {
            if matches!(f.input.as_ref(), LogicalPlan::Join(j) if j.join_type == JoinType::Inner) {
                nulls_of_tree(&f.input, seen);
            }
        }
        LogicalPlan::Join(j) if j.join_type == JoinType::Inner => {
            seen.push(j.null_equality);
            for input in [&j.left, &j.right] {
                if matches!(input.as_ref(), LogicalPlan::Join(c) if c.join_type == JoinType::Inner)
                {
                    nulls_of_tree(input, seen);
                }
            }
        }
        _ => {}
    }
}
