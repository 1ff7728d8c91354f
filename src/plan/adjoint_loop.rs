//! Reverse mode through a recursive query's iterations: each row replays
//! the iterations that led to it, forwards from a copy of its first row,
//! then backwards with the cotangents of its columns.
//!
//! The analyzer (`analyzer/reverse_recursion.rs`) gives the rows of a
//! recursive CTE the iteration that produced them and a copy of the first
//! row they derive from, computes at the marker the cotangent of `f` with
//! respect to each of the CTE's columns (the seeds), and puts an
//! [`AdjointLoop`] over those rows. Its [`AdjointLoopExec`](crate::exec::adjoint_loop::AdjointLoopExec) takes, for each
//! row produced by iteration `t`, the state of iteration 0 and runs the
//! loop's step (the recursive term's update, a row-wise function of the
//! previous row) `t` times, keeping every `k`-th state
//! (`datafusion_grad.checkpoint_every`; by default `k ≈ √t`, so memory grows
//! like √t states), then goes back from iteration `t` to 0, recomputing the
//! states between two kept ones, each step's cotangents the vector-Jacobian
//! product of the update (`adjoints`, from the differentiation engine).
//! The derivative with respect to the variable is the sum of the first
//! row's cotangents over the columns that copy it there.
//!
//! Rows of one batch with the same iteration count are replayed together,
//! one vectorized step for all of them.
//!
//! ```sql
//! -- 30 residual steps of a 3-element state, gradient w.r.t. the initial state
//! SET datafusion_grad.recursion_mode = 'reverse';
//! WITH RECURSIVE s(step, v, v0) AS (
//!   SELECT 0, v0, v0 FROM (SELECT tensor([0.1, 0.2, 0.3], 3) AS v0) i
//!   UNION ALL
//!   SELECT step + 1, tensor_add(v, scale(tensor_tanh(v), 0.1)), v0 FROM s WHERE step < 30)
//! SELECT grad(tensor_total(tensor_mul(v, v)), v0) FROM s WHERE step = 30;
//! ```

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::common::DFSchemaRef;
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};

use crate::plan::kit;
use crate::reserved::reverse_column;

/// The step of a row-wise loop and its vector-Jacobian product.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LoopStep {
    /// The recursive CTE's name (for EXPLAIN).
    pub name: String,
    /// A row of the CTE (its columns, unqualified).
    pub state: DFSchemaRef,
    /// Each column's value in the next iteration, over `state`.
    pub updates: Vec<Expr>,
    /// The columns with a cotangent (floats and float tensors), by index.
    pub differentiable: Vec<usize>,
    /// `state`, then one cotangent column per differentiable column.
    pub adjoint_schema: DFSchemaRef,
    /// The previous row's cotangents, one per differentiable column, over
    /// `adjoint_schema`.
    pub adjoints: Vec<Expr>,
}

/// One derivative an [`AdjointLoop`] computes for each row.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd)]
pub struct Wanted {
    /// Whether the row's cotangent of each differentiable column is in the
    /// input (`seed_column(k, c)`); 0 where not.
    pub seeded: Vec<bool>,
    /// The differentiable columns (positions in `differentiable`) whose
    /// first value is the variable's: their cotangents sum to the result.
    pub copies: Vec<usize>,
}

/// The logical node: its input's rows, and one derivative column per
/// [`Wanted`] (`reverse_column(k)`). See the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AdjointLoop {
    pub(crate) input: LogicalPlan,
    pub(crate) step: Arc<LoopStep>,
    pub(crate) wanted: Vec<Wanted>,
    pub(crate) schema: DFSchemaRef,
}

impl PartialOrd for AdjointLoop {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        fn key(n: &AdjointLoop) -> (&LogicalPlan, &String, &Vec<Expr>, &Vec<Wanted>) {
            (&n.input, &n.step.name, &n.step.updates, &n.wanted)
        }
        key(self).partial_cmp(&key(other))
    }
}

impl AdjointLoop {
    /// The node over `input` (which holds the iteration, the initial
    /// columns and the seeds), with the derivatives typed as `types`.
    pub fn try_new(
        input: LogicalPlan,
        step: Arc<LoopStep>,
        wanted: Vec<Wanted>,
        types: &[DataType],
    ) -> Result<Self> {
        let fields: Vec<Field> = types
            .iter()
            .enumerate()
            .map(|(k, t)| Field::new(reverse_column(k), t.clone(), true))
            .collect();
        let extra = datafusion::common::DFSchema::from_unqualified_fields(
            fields.into(),
            Default::default(),
        )?;
        let mut schema = input.schema().as_ref().clone();
        schema.merge(&extra);
        Ok(Self {
            input,
            step,
            wanted,
            schema: Arc::new(schema),
        })
    }
}

impl UserDefinedLogicalNodeCore for AdjointLoop {
    kit::node_without_expressions!("AdjointLoop", [input]);

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "AdjointLoop: through={}, derivatives={}",
            self.step.name,
            self.wanted.len()
        )
    }
}
