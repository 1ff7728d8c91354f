//! What every logical node of ours writes alike, written once: the parts
//! of `impl UserDefinedLogicalNodeCore` that say nothing about what the
//! node means (the operators' own kit is `crate::exec`'s). Used inside the
//! node's `impl` block, so the block keeps only its `EXPLAIN` line:
//!
//! ```ignore
//! impl UserDefinedLogicalNodeCore for Overwrite {
//!     kit::node_without_expressions!("Overwrite", [input]);
//!
//!     fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result { … }
//! }
//! ```

/// `name`, `inputs`, `schema` and `expressions` of a node with no
/// expressions of its own, whose inputs are the listed fields (in that
/// order) and whose schema is its field `schema`; and
/// `with_exprs_and_inputs`, which puts new inputs in those fields (an
/// internal error for any other number of inputs, or any expression).
macro_rules! node_without_expressions {
    ($name:literal, [$($input:ident),*]) => {
        fn name(&self) -> &str {
            $name
        }

        fn inputs(&self) -> Vec<&::datafusion::logical_expr::LogicalPlan> {
            vec![$(&self.$input),*]
        }

        fn schema(&self) -> &::datafusion::common::DFSchemaRef {
            &self.schema
        }

        fn expressions(&self) -> Vec<::datafusion::logical_expr::Expr> {
            vec![]
        }

        fn with_exprs_and_inputs(
            &self,
            exprs: Vec<::datafusion::logical_expr::Expr>,
            inputs: Vec<::datafusion::logical_expr::LogicalPlan>,
        ) -> ::datafusion::error::Result<Self> {
            const INPUTS: usize = <[&str]>::len(&[$(stringify!($input)),*]);
            match <[::datafusion::logical_expr::LogicalPlan; INPUTS]>::try_from(inputs) {
                Ok([$($input),*]) if exprs.is_empty() => Ok(Self {
                    $($input,)*
                    ..self.clone()
                }),
                _ => ::datafusion::common::internal_err!(
                    "{} takes {} input plan(s) and no expressions",
                    $name,
                    INPUTS
                ),
            }
        }
    };
}

pub(crate) use node_without_expressions;
